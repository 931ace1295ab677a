"""Segment bytes -> archive rows -> re-encoded batches: exact content, valid for clients."""

from __future__ import annotations

import pytest
from kafka.record.default_records import DefaultRecordBatch
from tier_helpers import client_batch, control_batch, data_segments, expected_records, record

from stonemq.protocol.record_batch import crc_ok, iter_batches, iter_records, parse_header
from stonemq.tiering.rows import ARROW_SCHEMA, decode_segment, encode_batch, encode_rows


def _reencoded(table, max_bytes=None) -> bytes:  # type: ignore[no-untyped-def]
    return b"".join(batch for _, batch in encode_rows(table, max_bytes))


def test_round_trip_every_codec_keeps_records_exactly() -> None:
    segments = data_segments(2, 5, 9)
    data = b"".join(b"".join(s) for s in segments)
    table = decode_segment(data, "t", 3, 0, 10**9)
    assert table.schema == ARROW_SCHEMA
    expected = expected_records(segments)
    assert table.column("offset").to_pylist() == sorted(expected)
    assert set(table.column("partition").to_pylist()) == {3}
    out = _reencoded(table)
    got = {}
    for pos, header in iter_batches(out):
        assert crc_ok(out, pos, header)
        assert not header.is_control
        for r in iter_records(out[pos : pos + header.size]):
            got[r.offset] = (r.timestamp, r.key, r.value, r.headers)
    assert got == expected


def test_control_batches_never_become_rows() -> None:
    data = (
        client_batch(0, [record(0), record(1)], "none")
        + control_batch(2, 5)
        + client_batch(3, [record(3)], "zstd")
    )
    table = decode_segment(data, "t", 0, 0, 100)
    assert table.column("offset").to_pylist() == [0, 1, 3]


def test_range_limits_rows() -> None:
    data = client_batch(10, [record(i) for i in range(10)], "lz4")
    table = decode_segment(data, "t", 0, 13, 16)
    assert table.column("offset").to_pylist() == [13, 14, 15, 16]


def test_kafka_python_parses_reencoded_batches() -> None:
    segments = data_segments(1, 4, 6)
    table = decode_segment(b"".join(segments[0]), "t", 0, 0, 10**9)
    out = _reencoded(table)
    expected = expected_records(segments)
    seen = {}
    pos = 0
    while pos < len(out):
        size = parse_header(out, pos).size
        batch = DefaultRecordBatch(bytes(out[pos : pos + size]))
        assert batch.validate_crc()
        for rec in batch:
            headers = tuple((k, v) for k, v in rec.headers)
            seen[rec.offset] = (rec.timestamp, rec.key, rec.value, headers)
        pos += size
    assert seen == expected


def test_batches_break_at_offset_gaps_and_respect_max_bytes() -> None:
    data = (
        client_batch(0, [record(0), record(1)], "none")
        + control_batch(2, 5)
        + client_batch(3, [record(3), record(4)], "gzip")
    )
    table = decode_segment(data, "t", 0, 0, 100)
    batches = [parse_header(b) for _, b in encode_rows(table)]
    assert [(h.base_offset, h.last_offset) for h in batches] == [(0, 1), (3, 4)]
    first_only = list(encode_rows(table, max_bytes=1))
    assert len(first_only) == 1  # at least one whole batch, never more than asked after it


def test_log_append_time_is_kept() -> None:
    body = encode_batch(0, [(0, 77, b"k", b"v", ()), (1, 77, None, b"w", ())], log_append_time=True)
    table = decode_segment(body, "t", 0, 0, 10)
    assert table.column("timestamp_type").to_pylist() == ["LogAppendTime"] * 2
    out = _reencoded(table)
    header = parse_header(out)
    assert header.timestamp_type == 1 and header.max_timestamp == 77


@pytest.mark.parametrize("n", [1, 1000, 2500])
def test_large_batches_split_by_record_count(n: int) -> None:
    body = encode_batch(0, [(i, 5 + i, None, b"x", ()) for i in range(n)])
    table = decode_segment(body, "t", 0, 0, n)
    out = _reencoded(table)
    offsets = [
        r.offset for pos, h in iter_batches(out) for r in iter_records(out[pos : pos + h.size])
    ]
    assert offsets == list(range(n))
