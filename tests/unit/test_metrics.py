"""The broker's metrics settings: ``metrics.listen`` parsing and validation (the endpoint
itself: tests/integration/test_replication_metrics.py)."""

from __future__ import annotations

import pytest

from stonemq.server.metrics import parse_listen


@pytest.mark.parametrize(
    ("value", "expected"),
    [("127.0.0.1:9404", ("127.0.0.1", 9404)), (":0", ("", 0)), ("[::1]:80", ("::1", 80))],
)
def test_parse_listen(value: str, expected: tuple[str, int]) -> None:
    assert parse_listen(value) == expected


@pytest.mark.parametrize("value", ["9404", "host:", "host:port", "h:70000", ""])
def test_parse_listen_refuses(value: str) -> None:
    with pytest.raises(ValueError):
        parse_listen(value)


def test_settings_refuse_a_bad_metrics_listen() -> None:
    from pydantic import ValidationError

    from stonemq.config import Settings

    assert Settings(metrics_listen="127.0.0.1:0").metrics_listen == "127.0.0.1:0"
    with pytest.raises(ValidationError):
        Settings(metrics_listen="nope")
