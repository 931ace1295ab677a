"""The archive's row format: the Arrow/Spark schema of the Parquet tables, decoding stored
RecordBatch v2 bytes into those rows, and re-encoding rows into RecordBatch v2 for fetches.

Columns (one row per data record; control records never appear)::

    topic string, partition int, offset long, timestamp timestamp (UTC, from the record's
    milliseconds), timestamp_type string ('CreateTime' | 'LogAppendTime'), key binary,
    value binary, headers array<struct<key:string, value:binary>>, producer_id long

Re-encoded batches keep every record's offset, key, value, headers and timestamp; a batch
never spans an offset gap, a producer or a timestamp type, and is uncompressed, so every
fetch version and client can read it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from crc32c import crc32c

from stonemq.protocol.record_batch import (
    TIMESTAMP_LOG_APPEND_TIME,
    RecordBatchError,
    iter_batches,
    iter_records,
)

CREATE_TIME = "CreateTime"
LOG_APPEND_TIME = "LogAppendTime"

HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
ARROW_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestamp_type", pa.string()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", pa.list_(pa.field("element", HEADER_TYPE))),
        pa.field("producer_id", pa.int64()),
    ]
)
SPARK_SCHEMA = (
    "topic string, partition int, offset long, timestamp timestamp, timestamp_type string, "
    "key binary, value binary, headers array<struct<key:string,value:binary>>, producer_id long"
)


def decode_segment(
    data: bytes | memoryview, topic: str, partition: int, first: int, last: int
) -> pa.Table:
    """Rows for the data records with offsets in ``first..last`` of a segment's bytes
    (control batches skipped; a torn tail ignored)."""
    cols: dict[str, list[Any]] = {f.name: [] for f in ARROW_SCHEMA}
    try:
        for pos, header in iter_batches(data):
            if header.last_offset < first:
                continue
            if header.base_offset > last:
                break
            if header.is_control:
                continue
            ts_type = (
                LOG_APPEND_TIME
                if header.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
                else CREATE_TIME
            )
            for rec in iter_records(data[pos : pos + header.size]):
                if not first <= rec.offset <= last:
                    continue
                cols["offset"].append(rec.offset)
                cols["timestamp"].append(rec.timestamp * 1000)
                cols["timestamp_type"].append(ts_type)
                cols["key"].append(rec.key)
                cols["value"].append(rec.value)
                cols["headers"].append([{"key": k, "value": v} for k, v in rec.headers])
                cols["producer_id"].append(header.producer_id)
    except RecordBatchError:
        pass  # a torn tail: the whole batches before it are what the segment holds
    n = len(cols["offset"])
    cols["topic"] = [topic] * n
    cols["partition"] = [partition] * n
    return pa.Table.from_pydict(cols, schema=ARROW_SCHEMA)


# -- encoding --------------------------------------------------------------------------------
_BATCH_HEAD = struct.Struct(">qiibIhiqqqhii")
_ATTR_LOG_APPEND_TIME = 0x08
_CRC_START = 21
MAX_BATCH_RECORDS = 1000
TARGET_BATCH_BYTES = 64 * 1024


def _varint(value: int, out: bytearray) -> None:
    raw = (value << 1) ^ (value >> 63)
    while raw & ~0x7F:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)


def _bytes_field(value: bytes | None, out: bytearray) -> None:
    if value is None:
        _varint(-1, out)
    else:
        _varint(len(value), out)
        out += value


def encode_batch(
    base_offset: int,
    records: Sequence[tuple[int, int, bytes | None, bytes | None, Sequence[Any]]],
    *,
    log_append_time: bool = False,
    producer_id: int = -1,
) -> bytes:
    """One uncompressed RecordBatch v2 of ``(offset, timestamp_ms, key, value, headers)``
    records; headers are ``(key, value)`` pairs or ``{"key", "value"}`` mappings."""
    body = bytearray()
    base_ts = records[0][1]
    max_ts = max(r[1] for r in records)
    for offset, ts, key, value, headers in records:
        rec = bytearray(b"\x00")
        _varint(ts - base_ts, rec)
        _varint(offset - base_offset, rec)
        _bytes_field(key, rec)
        _bytes_field(value, rec)
        _varint(len(headers), rec)
        for h in headers:
            hkey, hval = (h["key"], h["value"]) if isinstance(h, dict) else h
            _bytes_field(hkey.encode() if hkey is not None else b"", rec)
            _bytes_field(hval, rec)
        _varint(len(rec), body)
        body += rec
    attributes = _ATTR_LOG_APPEND_TIME if log_append_time else 0
    last_delta = records[-1][0] - base_offset
    head = bytearray(
        _BATCH_HEAD.pack(
            base_offset,
            _BATCH_HEAD.size - 12 + len(body),
            0,  # partition leader epoch
            2,  # magic
            0,  # crc, set below
            attributes,
            last_delta,
            base_ts,
            max_ts,
            producer_id,
            -1,  # producer epoch
            -1,  # base sequence
            len(records),
        )
    )
    batch = head + body
    struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[_CRC_START:]))
    return bytes(batch)


def encode_rows(table: pa.Table, max_bytes: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(last offset, batch bytes) for the table's rows in offset order; stops once
    ``max_bytes`` is reached (the first batch always comes whole)."""
    offsets = table.column("offset").to_pylist()
    stamps = table.column("timestamp").cast(pa.int64()).to_pylist()
    types = table.column("timestamp_type").to_pylist()
    keys = table.column("key").to_pylist()
    values = table.column("value").to_pylist()
    headers = table.column("headers").to_pylist()
    pids = table.column("producer_id").to_pylist()
    produced = 0
    i = 0
    n = len(offsets)
    target = TARGET_BATCH_BYTES if max_bytes is None else min(TARGET_BATCH_BYTES, max_bytes)
    while i < n:
        start = i
        size = 0
        group = []
        while i < n:
            if i > start and (
                offsets[i] != offsets[i - 1] + 1
                or types[i] != types[start]
                or pids[i] != pids[start]
                or (types[start] == LOG_APPEND_TIME and stamps[i] != stamps[start])
                or i - start >= MAX_BATCH_RECORDS
                or size >= target
            ):
                break
            group.append((offsets[i], stamps[i] // 1000, keys[i], values[i], headers[i] or ()))
            size += len(keys[i] or b"") + len(values[i] or b"") + 16
            i += 1
        batch = encode_batch(
            offsets[start],
            group,
            log_append_time=types[start] == LOG_APPEND_TIME,
            producer_id=pids[start] if pids[start] is not None else -1,
        )
        if max_bytes is not None and produced and produced + len(batch) > max_bytes:
            return
        produced += len(batch)
        yield offsets[i - 1], batch
