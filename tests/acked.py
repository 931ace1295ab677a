"""What a producer's acknowledgements promise about the stored records, checked one way for
every test that produces across faults (tests/ is on sys.path through the root conftest)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def check_acknowledged(
    acked: Iterable[tuple[int, int | None, bytes]], stored: Mapping[tuple[int, int], bytes]
) -> None:
    """Every acknowledged (partition, offset, value) is stored at its offset, and nothing is
    stored that was not acknowledged. librdkafka acknowledges a batch whose answer was lost
    without an offset (None) once a later batch of the same producer succeeds
    (``rd_kafka_dr_implicit_ack``): such a record is held by value, once in its partition."""
    acked = list(acked)
    at = {(p, off): v for p, off, v in acked if off is not None}
    by_value = {(p, v) for p, off, v in acked if off is None}
    assert len(at) + len(by_value) == len(acked), "two acknowledgements of one record"
    lost = set(at.items()) - set(stored.items())
    assert not lost, f"acknowledged and not stored at its offset: {sorted(lost)[:5]}"
    rest = {(p, v) for (p, off), v in stored.items() if (p, off) not in at}
    assert rest == by_value, (
        f"stored {len(stored)} records, acknowledged {len(at)} at an offset and "
        f"{len(by_value)} without: {sorted(rest ^ by_value)[:5]}"
    )
    assert len({(p, v) for (p, _), v in stored.items()}) == len(stored), "a record stored twice"


def check_held(
    acked: Iterable[tuple[int, int | None, bytes]], stored: Mapping[tuple[int, int], bytes]
) -> None:
    """Every acknowledged (partition, offset, value) is stored at its offset, one without an
    offset (librdkafka's implicit acknowledgement, as :func:`check_acknowledged` says) once
    in its partition by value; records stored but not acknowledged (in flight when the
    producer stopped) are not looked at."""
    by_value: dict[tuple[int, bytes], int] = {}
    for (p, _), v in stored.items():
        by_value[(p, v)] = by_value.get((p, v), 0) + 1
    for p, off, v in acked:
        if off is None:
            assert by_value.get((p, v)) == 1, f"{v!r} acknowledged without an offset in {p}"
        else:
            assert stored.get((p, off)) == v, (p, off, v, stored.get((p, off)))
