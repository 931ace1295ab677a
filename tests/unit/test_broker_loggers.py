"""The BROKER_LOGGER resource's rules (stonemq/broker_loggers.py) against Python's logging."""

from __future__ import annotations

import logging

import pytest

from stonemq import broker_loggers as bl
from stonemq.topic_configs import ConfigOp, ConfigSource, InvalidConfigError, InvalidRequestError


@pytest.fixture
def logger():  # type: ignore[no-untyped-def]
    made = logging.getLogger("stonemq.test.loggers")
    made.setLevel(logging.NOTSET)
    yield made
    made.setLevel(logging.NOTSET)


def test_levels_map_to_kafkas_names() -> None:
    assert [bl.level_name(v) for v in (5, 10, 20, 30, 40, 50)] == [
        "TRACE",
        "DEBUG",
        "INFO",
        "WARN",
        "ERROR",
        "FATAL",
    ]
    assert bl.level_name(25) == "INFO" and bl.level_name(0) == "TRACE"


def test_set_then_delete_returns_to_the_parents_level(logger: logging.Logger) -> None:
    parent = logging.getLogger("stonemq.test").getEffectiveLevel()
    bl.alter("1", 1, [(logger.name, ConfigOp.SET, "TRACE")], validate_only=False)
    assert logger.level == bl.TRACE and bl.loggers()[logger.name] == "TRACE"
    entries = {e.name: e for e in bl.describe("1", 1)}
    assert entries[logger.name].value == "TRACE"
    assert entries[logger.name].source is ConfigSource.DYNAMIC_BROKER_LOGGER_CONFIG
    assert "root" in entries
    bl.alter("1", 1, [(logger.name, ConfigOp.DELETE, None)], validate_only=False)
    assert logger.getEffectiveLevel() == parent


def test_every_operation_is_checked_before_any_applies(logger: logging.Logger) -> None:
    ops = [(logger.name, ConfigOp.SET, "DEBUG"), ("no.such.logger.here", ConfigOp.SET, "INFO")]
    with pytest.raises(InvalidConfigError, match="does not exist"):
        bl.alter("1", 1, ops, validate_only=False)
    assert logger.level == logging.NOTSET
    bl.alter("1", 1, ops[:1], validate_only=True)
    assert logger.level == logging.NOTSET
    with pytest.raises(InvalidConfigError, match="Valid log levels are DEBUG, ERROR, FATAL"):
        bl.alter("1", 1, [(logger.name, ConfigOp.SET, "debug")], validate_only=False)
    with pytest.raises(InvalidRequestError, match="root logger is not allowed"):
        bl.alter("1", 1, [("root", ConfigOp.DELETE, None)], validate_only=False)
    for op in (ConfigOp.APPEND, ConfigOp.SUBTRACT):
        with pytest.raises(InvalidRequestError, match="not allowed for the BROKER_LOGGER"):
            bl.alter("1", 1, [(logger.name, op, "INFO")], validate_only=False)


def test_the_resource_names_this_broker() -> None:
    with pytest.raises(InvalidRequestError, match="must not be empty"):
        bl.describe("", 1)
    with pytest.raises(InvalidRequestError, match="expected 1 but received 2"):
        bl.describe("2", 1)
    with pytest.raises(InvalidRequestError, match="must be an integer"):
        bl.alter("x", 1, [], validate_only=False)
