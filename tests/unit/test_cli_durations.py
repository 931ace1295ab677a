"""``--by-duration`` of ``stonemq groups reset-offsets`` reads durations as Java's
``Duration.parse`` does (kafka-consumer-groups.sh hands its argument to it)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stonemq.cli.groups import parse_duration_ms


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("PT1H", 3_600_000),
        ("P1D", 86_400_000),
        ("PT1H30M", 5_400_000),
        ("pt15m", 900_000),
        ("-PT10S", -10_000),
        ("PT0.5S", 500),
        ("PT-0.5S", -500),
        ("P2DT3H4M5.006S", 2 * 86_400_000 + 3 * 3_600_000 + 4 * 60_000 + 5_006),
        ("+PT1S", 1000),
    ],
)
def test_durations_as_java_reads_them(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "P", "PT", "P1DT", "1H", "PT1H30", "P1H", "PT1.5H", "PT1S "])
def test_what_java_refuses_is_refused(text: str) -> None:
    if text.endswith(" "):  # surrounding blanks are the shell's: stripped
        assert parse_duration_ms(text) == 1000
        return
    with pytest.raises(ValueError, match="ISO-8601 duration"):
        parse_duration_ms(text)


@given(
    st.integers(0, 400),
    st.integers(0, 23),
    st.integers(0, 59),
    st.integers(0, 59),
    st.integers(0, 999),
    st.booleans(),
)
def test_any_duration_round_trips(d: int, h: int, m: int, s: int, milli: int, neg: bool) -> None:
    text = f"{'-' if neg else ''}P{d}DT{h}H{m}M{s}.{milli:03d}S"
    want = ((d * 24 + h) * 60 + m) * 60_000 + s * 1000 + milli
    assert parse_duration_ms(text) == (-want if neg else want)
