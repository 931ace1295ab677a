"""The broker's log levels at runtime: Kafka's BROKER_LOGGER config resource (type 8).

``kafka-configs --entity-type broker-loggers`` (DescribeConfigs and IncrementalAlterConfigs on
resource ``<broker id>``) lists and changes the levels of the broker's loggers, as Kafka's
``Log4jController`` and ``RuntimeLoggerManager`` do for log4j: every logger that exists (and
``root``) with its effective level, source DYNAMIC_BROKER_LOGGER_CONFIG; SET gives a logger a
level, DELETE takes its own level away (it inherits again; not ``root``); APPEND and SUBTRACT
are INVALID_REQUEST; an unknown logger or level is INVALID_CONFIG. Every operation of a
resource is checked before any is applied. Python's ``logging`` is the logging system: Kafka's
level names map onto its levels (WARN is WARNING, FATAL is CRITICAL, TRACE a level below
DEBUG); changes last until the broker stops, as Kafka's do.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from stonemq.topic_configs import (
    ConfigEntry,
    ConfigOp,
    ConfigSource,
    ConfigType,
    InvalidConfigError,
    InvalidRequestError,
)

ROOT_LOGGER = "root"
TRACE = 5
"""Kafka's TRACE, below Python's DEBUG (10)."""
LEVELS = {
    "TRACE": TRACE,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
    "FATAL": logging.CRITICAL,
}
"""Kafka's valid log levels (LogLevelConfig.VALID_LOG_LEVELS) and Python's."""
_VALID = ", ".join(sorted(LEVELS))

logging.addLevelName(TRACE, "TRACE")


def level_name(level: int) -> str:
    """A Python level under Kafka's name: the highest Kafka level at or below it."""
    best = "TRACE"
    for name, value in sorted(LEVELS.items(), key=lambda kv: kv[1]):
        if value <= level:
            best = name
    return best


def _existing(name: str) -> logging.Logger | None:
    if name == ROOT_LOGGER:
        return logging.getLogger()
    found = logging.Logger.manager.loggerDict.get(name)
    return found if isinstance(found, logging.Logger) else None


def loggers() -> dict[str, str]:
    """Every logger that exists and ``root``, with its effective level (Kafka's names)."""
    out = {ROOT_LOGGER: level_name(logging.getLogger().getEffectiveLevel())}
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger):
            out[name] = level_name(logger.getEffectiveLevel())
    return out


def check_node(resource_name: str, broker_id: int, *, describe: bool) -> None:
    """The resource names this broker, as Kafka's ConfigHelper (describe) and
    RuntimeLoggerManager (alter) require; INVALID_REQUEST otherwise."""
    if describe and not resource_name:
        raise InvalidRequestError("Broker id must not be empty")
    try:
        node = int(resource_name)
    except ValueError:
        raise InvalidRequestError(
            f"Node id must be an integer, but it is: {resource_name}"
        ) from None
    if node != broker_id:
        raise InvalidRequestError(
            f"Unexpected broker id, expected {broker_id} but received {resource_name}"
        )


def describe(resource_name: str, broker_id: int) -> list[ConfigEntry]:
    """DescribeConfigs of BROKER_LOGGER ``resource_name``: one entry per logger."""
    check_node(resource_name, broker_id, describe=True)
    return [
        ConfigEntry(
            name=name,
            value=level,
            source=ConfigSource.DYNAMIC_BROKER_LOGGER_CONFIG,
            type=ConfigType.UNKNOWN,
            read_only=False,
            is_sensitive=False,
            documentation="",
            synonyms=(),
        )
        for name, level in sorted(loggers().items())
    ]


def alter(
    resource_name: str,
    broker_id: int,
    ops: Sequence[tuple[str, int, str | None]],
    *,
    validate_only: bool,
) -> None:
    """IncrementalAlterConfigs of BROKER_LOGGER ``resource_name``: ``ops`` are (logger,
    operation, level); all are checked, then (unless ``validate_only``) applied."""
    check_node(resource_name, broker_id, describe=False)
    for name, op, value in ops:
        if op == ConfigOp.SET:
            if _existing(name) is None:
                raise InvalidConfigError(f"Logger {name} does not exist!")
            if value not in LEVELS:
                raise InvalidConfigError(
                    f"Cannot set the log level of {name} to {value} as it is not a supported "
                    f"log level. Valid log levels are {_VALID}"
                )
        elif op == ConfigOp.DELETE:
            if _existing(name) is None:
                raise InvalidConfigError(f"Logger {name} does not exist!")
            if name == ROOT_LOGGER:
                raise InvalidRequestError(
                    f"Removing the log level of the {ROOT_LOGGER} logger is not allowed"
                )
        elif op in (ConfigOp.APPEND, ConfigOp.SUBTRACT):
            raise InvalidRequestError(
                f"{ConfigOp(op).name} operation is not allowed for the BROKER_LOGGER resource"
            )
        else:
            raise InvalidRequestError(
                f"Unknown operation type {op} is not allowed for the BROKER_LOGGER resource"
            )
    if validate_only:
        return
    log = logging.getLogger("stonemq.admin")
    for name, op, value in ops:
        logger = _existing(name)
        assert logger is not None  # checked above
        if op == ConfigOp.SET:
            assert value is not None
            logger.setLevel(LEVELS[value])
            log.warning("Updated the log level of %s to %s", name, value)
        else:
            logger.setLevel(logging.NOTSET)
            log.warning("Unset the log level of %s", name)
