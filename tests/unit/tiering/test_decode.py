"""The archive's segment decoder (``rows.decode_segment``, one pass with flat column lists)
gives exactly the records producers put in the batches, and the same rows as decoding record
by record with the protocol's ``iter_records`` (the decoder it replaced)."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tier_helpers import CODECS, client_batch, control_batch

from stonemq.protocol.record_batch import (
    TIMESTAMP_LOG_APPEND_TIME,
    RecordBatchError,
    iter_batches,
    iter_records,
    set_log_append_time,
)
from stonemq.tiering.rows import ARROW_SCHEMA, decode_segment, encode_batch

Row = tuple[int, int, str, bytes | None, bytes | None, list[tuple[str, bytes | None]], int]


def reference_rows(data: bytes, first: int, last: int) -> list[Row]:
    """The replaced decoder, record by record through ``iter_records``, keeping whole
    batches only (a corrupt batch ends the segment after the batches before it)."""
    out: list[Row] = []
    try:
        for pos, header in iter_batches(data):
            if header.last_offset < first or header.is_control:
                continue
            if header.base_offset > last:
                break
            ts_type = (
                "LogAppendTime"
                if header.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
                else "CreateTime"
            )
            batch = [
                (
                    r.offset,
                    r.timestamp,
                    ts_type,
                    r.key,
                    r.value,
                    list(r.headers),
                    header.producer_id,
                )
                for r in iter_records(data[pos : pos + header.size])
                if first <= r.offset <= last
            ]
            out += batch  # whole batches only
    except RecordBatchError:
        pass
    return out


def table_rows(
    data: bytes, first: int, last: int, topic: str = "t", partition: int = 7
) -> list[Row]:
    table = decode_segment(data, topic, partition, first, last)
    assert table.schema == ARROW_SCHEMA
    assert set(table.column("topic").to_pylist()) <= {topic}
    assert set(table.column("partition").to_pylist()) <= {partition}
    stamps = table.column("timestamp").cast("int64").to_pylist()
    return [
        (off, us // 1000, tt, k, v, [(h["key"], h["value"]) for h in hs], pid)
        for off, us, tt, k, v, hs, pid in zip(
            table.column("offset").to_pylist(),
            stamps,
            table.column("timestamp_type").to_pylist(),
            table.column("key").to_pylist(),
            table.column("value").to_pylist(),
            table.column("headers").to_pylist(),
            table.column("producer_id").to_pylist(),
            strict=True,
        )
    ]


_bytes = st.one_of(st.none(), st.binary(max_size=300))
_header = st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20)))
_record = st.tuples(
    st.integers(1_600_000_000_000, 1_800_000_000_000),
    _bytes,
    _bytes,
    st.lists(_header, max_size=3),
)
_batch = st.one_of(
    st.tuples(
        st.just("data"),
        st.sampled_from(sorted(CODECS)),
        st.lists(_record, min_size=1, max_size=12),
        st.booleans(),  # LogAppendTime
    ),
    st.tuples(st.just("control"), st.just("none"), st.just([]), st.just(False)),
)


def build(batches: list[Any]) -> tuple[bytes, list[Row]]:
    """Segment bytes from client-built batches, and the rows producers put in them."""
    data = bytearray()
    expected: list[Row] = []
    offset = 0
    for kind, codec, records, log_append in batches:
        if kind == "control":
            data += control_batch(offset, 1_700_000_000_000)
            offset += 1
            continue
        buf = bytearray(client_batch(offset, records, codec))
        append_ms = 1_750_000_000_123
        if log_append:
            set_log_append_time(buf, 0, append_ms)
        for i, (ts, key, value, headers) in enumerate(records):
            stamp = append_ms if log_append else ts
            ts_type = "LogAppendTime" if log_append else "CreateTime"
            expected.append((offset + i, stamp, ts_type, key, value, list(headers), 42))
        offset += len(records)
        data += buf
    return bytes(data), expected


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(_batch, min_size=1, max_size=8),
    bounds=st.tuples(st.integers(0, 60), st.integers(0, 60)),
    torn=st.integers(0, 70),
)
@pytest.mark.slow  # a property run of several seconds: in the full suite, not the fast set
def test_decoder_gives_what_producers_wrote_and_what_iter_records_gives(
    batches: list[Any], bounds: tuple[int, int], torn: int
) -> None:
    data, expected = build(batches)
    first, last = min(bounds), max(bounds)
    in_range = [r for r in expected if first <= r[0] <= last]
    assert table_rows(data, first, last) == in_range
    assert table_rows(data, 0, 10**9) == expected
    assert table_rows(data, first, last) == reference_rows(data, first, last)
    # a torn tail: the whole batches before it, as the reference decoder sees them
    cut = data[: max(len(data) - torn, 0)]
    assert table_rows(cut, first, last) == reference_rows(cut, first, last)


def test_corrupt_batch_ends_the_segment_after_the_whole_batches_before_it() -> None:
    good = client_batch(0, [(1, b"a", b"b", []), (2, None, b"c", [("h", b"x")])], "none")
    recs = [(2, 3, b"k", b"v", ()), (3, 4, b"k2", b"v2", ())]
    bad = bytearray(encode_batch(2, recs))
    first_record = len(encode_batch(2, recs[:1])) - 61
    bad[61 + first_record] = 0x7E  # the second record's length (63) runs past the batch
    after = client_batch(4, [(5, b"z", b"z", [])], "none")
    data = good + bytes(bad) + after
    rows = table_rows(data, 0, 100)
    assert [r[0] for r in rows] == [0, 1]  # not offset 2, though its record was whole
    assert rows[1] == (1, 2, "CreateTime", None, b"c", [("h", b"x")], 42)


def test_null_header_key_and_unicode_key_are_kept_as_before() -> None:
    batch = bytearray(encode_batch(0, [(0, 5, b"k", b"v", [("ключ", b"1"), (None, None)])]))
    rows = table_rows(bytes(batch), 0, 0)
    assert rows == [(0, 5, "CreateTime", b"k", b"v", [("ключ", b"1"), ("", None)], -1)]
    assert rows == reference_rows(bytes(batch), 0, 0)


def test_multi_byte_varints_long_values_and_offsets() -> None:
    value = bytes(range(256)) * 70  # 17920 bytes: a 3-byte length varint
    records = [(i, 1_700_000_000_000 + 300_000 * i, b"k" * 200, value, ()) for i in range(300)]
    batch = encode_batch(1_000_000_000, [(1_000_000_000 + r[0], *r[1:]) for r in records])
    (count,) = struct.unpack_from(">i", batch, 57)
    assert count == 300
    rows = table_rows(batch, 0, 2 * 10**9)
    assert [r[0] for r in rows] == list(range(1_000_000_000, 1_000_000_300))
    assert all(r[4] == value and r[3] == b"k" * 200 for r in rows)
    assert [r[1] for r in rows] == [1_700_000_000_000 + 300_000 * i for i in range(300)]
    assert rows == reference_rows(batch, 0, 2 * 10**9)


def test_encode_rows_in_fetch_sized_steps_gives_every_record_once() -> None:
    """Cold fetches: 1 KiB-ish records read back in 1 MiB steps across the encoder's row
    chunks (256, 512, ... rows), each step within its byte limit and contiguous."""
    from stonemq.tiering.rows import encode_rows

    recs = [
        (i, 1_700_000_000_000 + i, None, bytes([i % 251]) * (900 + i % 200), ())
        for i in range(5000)
    ]
    table = decode_segment(
        encode_batch(0, recs[:2500]) + encode_batch(2500, recs[2500:]), "t", 0, 0, 10**9
    )
    seen: list[tuple[int, bytes]] = []
    pos = 0
    while pos < table.num_rows:
        step = list(encode_rows(table.slice(pos), 1024 * 1024))
        assert step
        assert len(step) == 1 or sum(len(b) for _, b in step) <= 1024 * 1024
        for _, batch in step:
            seen += [(r.offset, r.value) for r in iter_records(batch)]
        pos = seen[-1][0] + 1
    assert seen == [(r[0], r[3]) for r in recs]
    whole = [r.offset for _, b in encode_rows(table) for r in iter_records(b)]
    assert whole == list(range(5000))


_plain_record = st.tuples(
    st.integers(1_600_000_000_000, 1_800_000_000_000), _bytes, _bytes, st.just([])
)
_plain_batch = st.tuples(
    st.just("data"),
    st.sampled_from(sorted(CODECS)),
    st.lists(_plain_record, min_size=1, max_size=40),
    st.booleans(),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(st.one_of(_plain_batch, _batch), min_size=1, max_size=10),
    bounds=st.tuples(st.integers(0, 200), st.integers(0, 200)),
    torn=st.integers(0, 70),
)
@pytest.mark.slow  # a property run of several seconds: in the full suite, not the fast set
def test_records_without_headers_decoded_at_once_match_record_by_record(
    batches: list[Any], bounds: tuple[int, int], torn: int
) -> None:
    """Batches without headers take the vectorized path (record_columns.decode_run); mixed
    with batches that have headers (record by record), control batches, compressed batches
    and torn tails, the rows are the producers' rows in offset order."""
    data, expected = build(batches)
    first, last = min(bounds), max(bounds)
    assert table_rows(data, 0, 10**9) == expected
    assert table_rows(data, first, last) == [r for r in expected if first <= r[0] <= last]
    cut = data[: max(len(data) - torn, 0)]
    assert table_rows(cut, first, last) == reference_rows(cut, first, last)


def test_a_field_that_overruns_its_record_ends_the_segment_on_the_fast_path_too() -> None:
    """A record whose length is right but whose key length runs past it: the vectorized
    decoder rejects the batch, the record-by-record one finds it corrupt, and the segment
    ends after the whole batches before it (as the reference decoder sees it)."""
    good = client_batch(0, [(1, b"a", b"b", []), (2, None, b"c", [])], "none")
    bad = bytearray(client_batch(2, [(3, b"kk", b"v", []), (4, b"k2", b"v2", [])], "none"))
    # record: length, attributes, ts delta, offset delta, key length (zigzag 2 -> 4)
    assert bad[61 + 4] == 4
    bad[61 + 4] = 40  # key length 20: past the record's end
    after = client_batch(4, [(5, b"z", b"z", [])], "none")
    data = good + bytes(bad) + after
    rows = table_rows(data, 0, 100)
    assert [r[0] for r in rows] == [0, 1]
    assert rows == reference_rows(data, 0, 100)


def test_batches_without_headers_are_decoded_at_once_and_with_headers_record_by_record() -> None:
    from stonemq.protocol.record_batch import read_batch
    from stonemq.tiering.record_columns import Run, decode_run

    plain = client_batch(0, [(1, b"a", b"b", []), (2, None, None, [])], "none")
    headed = client_batch(2, [(3, b"k", b"v", [("h", b"x")])], "none")
    buf = plain + headed
    run = Run(buf)
    for start, end in [(0, len(plain)), (len(plain), len(buf))]:
        run.add(read_batch(buf, start, end, bounds=True), whole=True)
    decoded = decode_run(run, 0, 100)
    assert decoded.slow.tolist() == [False, True]
    assert decoded.columns["offset"].to_pylist() == [0, 1]
    assert decoded.columns["key"].to_pylist() == [b"a", None]
    assert decoded.columns["value"].to_pylist() == [b"b", None]
    assert decoded.columns["timestamp_type"].to_pylist() == ["CreateTime"] * 2


def test_a_negative_record_count_ends_the_segment() -> None:
    good = client_batch(0, [(1, b"a", b"b", [])], "none")
    bad = bytearray(client_batch(1, [(2, b"k", b"v", [])], "none"))
    struct.pack_into(">i", bad, 57, -1)  # the header's record count
    data = good + bytes(bad) + client_batch(2, [(3, b"z", b"z", [])], "none")
    assert [r[0] for r in table_rows(data, 0, 100)] == [0]
