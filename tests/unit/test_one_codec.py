"""One record codec, one validator: the group log and the tiering decoder and encoder
round-trip through :mod:`stonemq.protocol.record_batch`, and a batch broken in any way is
refused the same way (the same error, with the same message) by every path that reads
records: produce, the codec's reader, ListOffsets by timestamp, the group log's loader and the
tiering decoder."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from stonemq.coordinator import group_log as glog
from stonemq.protocol import record_batch as rb
from stonemq.storage.engine import StorageError
from stonemq.storage.queue_log import first_record_at
from stonemq.tiering.rows import decode_segment, encode_rows

_name = st.text(min_size=1, max_size=12)
_int32 = st.integers(-(2**31), 2**31 - 1)
_int64 = st.integers(-(2**63), 2**63 - 1)
_offset_entry = st.tuples(
    st.builds(glog.OffsetKey, _name, _name, st.integers(0, 2**31 - 1)),
    st.one_of(
        st.none(),
        st.builds(glog.CommittedOffset, _int64, _int32, st.text(max_size=20), _int64),
    ),
)
_member = st.builds(
    glog.StoredMember,
    member_id=_name,
    group_instance_id=st.one_of(st.none(), _name),
    client_id=st.text(max_size=8),
    client_host=st.text(max_size=8),
    rebalance_timeout_ms=_int32,
    session_timeout_ms=_int32,
    subscription=st.binary(max_size=40),
    assignment=st.binary(max_size=40),
)
_group_entry = st.tuples(
    st.builds(glog.GroupKey, _name),
    st.one_of(
        st.none(),
        st.builds(
            glog.StoredGroup,
            protocol_type=st.text(max_size=8),
            generation=_int32,
            protocol=st.one_of(st.none(), st.text(max_size=8)),
            leader=st.one_of(st.none(), _name),
            state_timestamp_ms=_int64,
            members=st.lists(_member, max_size=3).map(tuple),
        ),
    ),
)


@settings(max_examples=150, deadline=None)
@given(
    entries=st.lists(st.one_of(_offset_entry, _group_entry), min_size=1, max_size=20),
    timestamp_ms=st.integers(0, 2**45),
)
@pytest.mark.slow  # a property run of several seconds: in the full suite, not the fast set
def test_the_group_log_round_trips_through_the_one_codec(
    entries: list[tuple[glog.Key, glog.Value]], timestamp_ms: int
) -> None:
    batch = glog.build_batch(glog.encode_records(entries), timestamp_ms)
    # what the group log writes passes the validator a produce of it would meet
    header = rb.validate_produce_records(batch, rb.RecordLimits(log_append_time=True))
    assert (header.record_count, header.max_timestamp) == (len(entries), timestamp_ms)
    decoded, unreadable = glog.decode_batch(bytes(batch))
    assert unreadable == 0
    assert decoded == [(i, key, value) for i, (key, value) in enumerate(entries)]
    records = list(rb.iter_records(batch))
    assert [(r.key, r.value) for r in records] == glog.encode_records(entries)


_bytes = st.one_of(st.none(), st.binary(max_size=200))
_header = st.tuples(st.text(max_size=6), st.one_of(st.none(), st.binary(max_size=12)))
_record = st.tuples(
    st.integers(1_600_000_000_000, 1_800_000_000_000),
    _bytes,
    _bytes,
    st.lists(_header, max_size=2).map(tuple),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(
        st.tuples(
            st.lists(_record, min_size=1, max_size=15),
            st.integers(-1, 2**40),  # LogAppendTime (>= 0) or CreateTime
            st.integers(-1, 1000),  # producer id
        ),
        min_size=1,
        max_size=6,
    )
)
@pytest.mark.slow  # a property run of several seconds: in the full suite, not the fast set
def test_tiering_round_trips_through_the_one_codec(batches: list[Any]) -> None:
    """Batches built by the codec -> archive rows (decode_segment) -> batches for cold reads
    (encode_rows): the records read back by the codec's reader are the ones written."""
    segment = bytearray()
    expected = []
    offset = 0
    for records, append_time, producer_id in batches:
        segment += rb.encode_batch(
            offset, records, log_append_time=append_time, producer_id=producer_id
        )
        for i, (ts, key, value, headers) in enumerate(records):
            stamp = append_time if append_time >= 0 else ts
            expected.append((offset + i, stamp, key, value, headers, producer_id))
        offset += len(records)
    refused: list[Any] = []
    table = decode_segment(bytes(segment), "t", 0, 0, 10**12, lambda *e: refused.append(e))
    assert not refused
    assert table.num_rows == len(expected)
    got = []
    for _, batch in encode_rows(table):
        stored = rb.read_batch(batch)  # the validator accepts what cold reads send
        got += [
            (r.offset, r.timestamp, r.key, r.value, r.headers, stored.header.producer_id)
            for r in rb.iter_records(batch)
        ]
    assert got == expected


# -- a broken batch is refused the same way by every reader --------------------------------
_NOW_MS = 1_700_000_000_000


def _reseal(batch: bytearray) -> None:
    struct.pack_into(">I", batch, 17, rb.crc32c(bytes(batch[rb.CRC_START :])))


def _set_length(batch: bytearray) -> None:
    struct.pack_into(">i", batch, 8, len(batch) - rb.LOG_OVERHEAD)


def _source_batch(kind: str, records: list[tuple[bytes | None, bytes | None, list]]) -> bytearray:
    if kind == "group":
        entries = [
            (glog.OffsetKey("g", "t", i), glog.CommittedOffset(i, 0, "", _NOW_MS))
            for i in range(len(records))
        ]
        return glog.build_batch(glog.encode_records(entries), _NOW_MS)
    codec = {"plain": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}[kind]
    builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, 1 << 24)
    for i, (key, value, headers) in enumerate(records):
        builder.append(i, _NOW_MS + i, key, value, headers)
    return bytearray(builder.build())


def _mutate(batch: bytearray, data: st.DataObject) -> None:
    action = data.draw(
        st.sampled_from(["flip", "flip-resealed", "count", "cut", "add", "codec", "magic"])
    )
    records_at = rb.HEADER_SIZE
    if action.startswith("flip") and len(batch) > records_at:
        at = data.draw(st.integers(records_at, len(batch) - 1))
        batch[at] ^= data.draw(st.integers(1, 255))
    elif action == "count":
        count = data.draw(st.integers(-2, 40))
        struct.pack_into(">i", batch, 57, count)
        if data.draw(st.booleans()):
            struct.pack_into(">i", batch, 23, count - 1)
    elif action == "cut" and len(batch) > records_at:
        del batch[data.draw(st.integers(records_at, len(batch) - 1)) :]
        _set_length(batch)
    elif action == "add":
        batch += data.draw(st.binary(min_size=1, max_size=8))
        _set_length(batch)
    elif action == "codec":
        (attributes,) = struct.unpack_from(">h", batch, 21)
        struct.pack_into(">h", batch, 21, (attributes & ~7) | data.draw(st.integers(0, 7)))
    elif action == "magic":
        batch[16] = data.draw(st.sampled_from([0, 1, 3]))
    if action != "flip":
        _reseal(batch)


Outcome = tuple[type, str] | None


def _outcome(read: Callable[[], object]) -> Outcome:
    try:
        read()
    except StorageError as exc:  # ListOffsets by time wraps the codec's error
        cause = exc.__cause__
        assert isinstance(cause, rb.RecordBatchError), exc
        return type(cause), str(cause)
    except rb.RecordBatchError as exc:
        return type(exc), str(exc)
    return None


def _tiering(batch: bytes) -> None:
    refused: list[tuple[int, rb.RecordBatchError]] = []
    table = decode_segment(batch, "t", 0, 0, 10**12, lambda pos, exc: refused.append((pos, exc)))
    if refused:
        assert [pos for pos, _ in refused] == [0] and table.num_rows == 0
        raise refused[0][1]
    assert table.num_rows == rb.parse_header(batch).record_count


def _group_log(batch: bytes) -> None:
    glog.decode_batch(batch)


def _list_offsets_by_time(batch: bytes) -> None:
    assert first_record_at(batch, 2**62, 0) is None


def _readers(batch: bytes) -> dict[str, Outcome]:
    lax = rb.RecordLimits(log_append_time=True)  # no timestamp bounds: records are random
    return {
        "produce": _outcome(lambda: rb.validate_produce_records(batch, lax, _NOW_MS)),
        "read_batch": _outcome(lambda: rb.read_batch(batch)),
        "iter_records": _outcome(lambda: list(rb.iter_records(batch))),
        "list_offsets_by_time": _outcome(lambda: _list_offsets_by_time(batch)),
        "group_log": _outcome(lambda: _group_log(batch)),
        "tiering": _outcome(lambda: _tiering(batch)),
    }


_client_records = st.lists(
    st.tuples(_bytes, _bytes, st.lists(_header, max_size=2)), min_size=1, max_size=12
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["group", "plain", "gzip", "snappy", "lz4", "zstd"]),
    records=_client_records,
    mutations=st.integers(1, 3),
    data=st.data(),
)
@pytest.mark.slow  # a property run of several seconds: in the full suite, not the fast set
def test_a_broken_batch_is_refused_the_same_way_by_every_reader(
    kind: str, records: list[Any], mutations: int, data: st.DataObject
) -> None:
    batch = _source_batch(kind, records)
    assert set(_readers(bytes(batch)).values()) == {None}
    for _ in range(mutations):
        _mutate(batch, data)
    outcomes = _readers(bytes(batch))
    assert len(set(outcomes.values())) == 1, outcomes


@pytest.mark.parametrize(
    ("name", "mutate", "error"),
    [
        ("crc", lambda b: b.__setitem__(70, b[70] ^ 1), rb.CorruptRecordError),
        ("count", lambda b: (struct.pack_into(">i", b, 57, 3), _reseal(b)), rb.InvalidRecordError),
        (
            "trailing bytes",
            lambda b: (b.extend(b"\0"), _set_length(b), _reseal(b)),
            rb.InvalidRecordError,
        ),
        (
            "null header key",
            lambda b: (b.__setitem__(b.rindex(b"hk") - 1, 1), _reseal(b)),
            rb.InvalidRecordError,
        ),
    ],
)
def test_each_reader_refuses_a_known_break_with_its_kafka_error(
    name: str, mutate: Callable[[bytearray], object], error: type
) -> None:
    """One example per rule, named: CORRUPT_MESSAGE for a CRC mismatch, INVALID_RECORD for a
    record count that does not match, bytes after the last record, a null header key (the
    tiering decoder read such a key as empty before it used the codec's validator)."""
    batch = bytearray(
        rb.encode_batch(0, [(_NOW_MS, b"key", b"value-%d" % i, [("hk", b"1")]) for i in range(2)])
    )
    mutate(batch)
    outcomes = _readers(bytes(batch))
    assert {outcome[0] for outcome in outcomes.values() if outcome} == {error}
    assert None not in outcomes.values(), outcomes
    assert len(set(outcomes.values())) == 1, outcomes
