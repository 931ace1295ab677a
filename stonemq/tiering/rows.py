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

import array
import itertools
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from crc32c import crc32c

from stonemq.protocol.record_batch import (
    COMPRESSION_NONE,
    CorruptRecordError,
    RecordBatchError,
    decompress,
)
from stonemq.tiering.record_columns import Run, decode_run, record_bounds

CREATE_TIME = "CreateTime"
LOG_APPEND_TIME = "LogAppendTime"
_CREATE_TIME_UTF8 = CREATE_TIME.encode()
_LOG_APPEND_TIME_UTF8 = LOG_APPEND_TIME.encode()

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


_HEAD = struct.Struct(">qiibIhiqqqhii")  # RecordBatch v2 header, as record_batch parses it
_HEADER_SIZE = 61
_LOG_OVERHEAD = 12
_ATTR_COMPRESSION = 0x07
_ATTR_TIMESTAMP_TYPE = 0x08
_ATTR_CONTROL = 0x20
_HEADERS_TYPE = ARROW_SCHEMA.field("headers").type


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint at ``pos``: (value, next position); one-byte values take one test."""
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    raw = b & 0x7F
    shift = 7
    while True:
        pos += 1
        b = buf[pos]
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos + 1
        shift += 7
        if shift > 63:
            raise CorruptRecordError("varint too long")


class _Columns:
    """The decoded columns as flat Python lists (no per-record objects), turned into Arrow
    arrays once per segment."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.stamps: list[int] = []  # milliseconds
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.header_counts: list[int] = []
        self.header_keys: list[str] = []
        self.header_values: list[bytes | None] = []
        self.types: list[bytes | None] = []  # UTF-8
        self.producers: list[int] = []

    def part(self) -> dict[str, pa.Array]:
        """The columns decoded so far (all but topic and partition) as Arrow arrays."""
        header_items = pa.StructArray.from_arrays(
            [
                _varlen(pa.string(), [k.encode() for k in self.header_keys]),
                _varlen(pa.binary(), self.header_values),
            ],
            fields=list(HEADER_TYPE),
        )
        return {
            "offset": _fixed(pa.int64(), "q", self.offsets),
            "timestamp": _fixed(pa.timestamp("ms", tz="UTC"), "q", self.stamps),
            "timestamp_type": _varlen(pa.string(), self.types),
            "key": _varlen(pa.binary(), self.keys),
            "value": _varlen(pa.binary(), self.values),
            "headers": pa.ListArray.from_arrays(
                _fixed(pa.int32(), "i", itertools.accumulate(self.header_counts, initial=0)),
                header_items,
                type=_HEADERS_TYPE,
            ),
            "producer_id": _fixed(pa.int64(), "q", self.producers),
        }


def _no_headers(n: int) -> pa.Array:
    """``n`` empty header lists."""
    items = pa.StructArray.from_arrays(
        [_varlen(pa.string(), []), _varlen(pa.binary(), [])], fields=list(HEADER_TYPE)
    )
    offsets = pa.Array.from_buffers(
        pa.int32(), n + 1, [None, pa.py_buffer(np.zeros(n + 1, np.int32))]
    )
    return pa.ListArray.from_arrays(offsets, items, type=_HEADERS_TYPE)


def _table(parts: list[dict[str, pa.Array]], topic: str, partition: int) -> pa.Table:
    """One table from the decoded parts, in order; parts without headers get empty lists."""
    if not parts:
        parts = [_Columns().part()]
    n = sum(len(p["offset"]) for p in parts)
    for p in parts:
        if "headers" not in p:
            p["headers"] = _no_headers(len(p["offset"]))

    def col(name: str) -> pa.Array:
        return pa.concat_arrays([p[name] for p in parts])

    name = topic.encode()
    return pa.Table.from_arrays(
        [
            pa.Array.from_buffers(
                pa.string(),
                n,
                [
                    None,
                    pa.py_buffer(np.arange(n + 1, dtype=np.int32) * len(name)),
                    pa.py_buffer(name * n),
                ],
            ),
            pa.Array.from_buffers(
                pa.int32(), n, [None, pa.py_buffer(np.full(n, partition, np.int32))]
            ),
            col("offset"),
            col("timestamp").cast(ARROW_SCHEMA.field("timestamp").type),
            col("timestamp_type"),
            col("key"),
            col("value"),
            col("headers"),
            col("producer_id"),
        ],
        schema=ARROW_SCHEMA,
    )


# Arrow arrays straight from buffers: ``pa.array`` on a Python list imports pandas (~0.4 s,
# once per process: every Spark Python worker of a run paid it), these never do.
def _fixed(type_: pa.DataType, code: str, values: Iterable[int]) -> pa.Array:
    """A fixed-width array (``code``: the ``array`` module's typecode of its width)."""
    buf = array.array(code, values)
    return pa.Array.from_buffers(type_, len(buf), [None, pa.py_buffer(buf)])


def _varlen(type_: pa.DataType, values: list[bytes | None]) -> pa.Array:
    """A binary or string (UTF-8 ``values``) array; None is null."""
    n = len(values)
    validity = None
    nulls = 0
    if None in values:
        present = [v is not None for v in values]
        nulls = n - sum(present)
        bits = bytearray((n + 7) // 8)
        if nulls < n:  # records without a key: often all of them
            for i, ok in enumerate(present):
                if ok:
                    bits[i >> 3] |= 1 << (i & 7)
        validity = pa.py_buffer(bits)
        values = [b"" if v is None else v for v in values]
    offsets = array.array("i", itertools.accumulate(map(len, values), initial=0))  # type: ignore[arg-type]
    data = b"".join(values)  # type: ignore[arg-type]
    return pa.Array.from_buffers(
        type_, n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls
    )


def _decode_records(
    buf: bytes,
    pos: int,
    end: int,
    count: int,
    base_offset: int,
    timestamp: int | None,
    base_timestamp: int,
    first: int,
    last: int,
    cols: _Columns,
) -> int:
    """Append the records ``buf[pos:end]`` holds (``count`` of them) with offsets in
    ``first..last`` to ``cols``; ``timestamp`` is the batch's LogAppendTime (else each
    record's CreateTime is ``base_timestamp`` + its delta). Returns how many were kept."""
    varint = _read_varint
    offsets, stamps = cols.offsets, cols.stamps
    keys, values, counts = cols.keys, cols.values, cols.header_counts
    hkeys, hvalues = cols.header_keys, cols.header_values
    whole = first <= base_offset and base_offset + count - 1 <= last
    kept = 0
    for _ in range(count):
        length, pos = varint(buf, pos)
        rec_end = pos + length
        if length < 0 or rec_end > end:
            raise CorruptRecordError("record runs past the end of its batch")
        ts_delta, pos = varint(buf, pos + 1)  # + 1: the record's attributes
        offset_delta, pos = varint(buf, pos)
        size, pos = varint(buf, pos)
        if size < 0:
            key = None
        else:
            key = buf[pos : pos + size]
            pos += size
        size, pos = varint(buf, pos)
        if size < 0:
            value = None
        else:
            value = buf[pos : pos + size]
            pos += size
        n_headers, pos = varint(buf, pos)
        if n_headers:
            if n_headers < 0:
                raise CorruptRecordError("negative header count")
            for _ in range(n_headers):
                size, pos = varint(buf, pos)
                hkey = buf[pos : pos + size] if size > 0 else b""
                pos += max(size, 0)
                size, pos = varint(buf, pos)
                if size < 0:
                    hvalue = None
                else:
                    hvalue = buf[pos : pos + size]
                    pos += size
                hkeys.append(hkey.decode("utf-8", "replace"))
                hvalues.append(hvalue)
        if pos != rec_end:
            raise CorruptRecordError("record length does not match its fields")
        offset = base_offset + offset_delta
        if not whole and not first <= offset <= last:
            if n_headers:
                del hkeys[-n_headers:], hvalues[-n_headers:]
            continue
        offsets.append(offset)
        stamps.append(base_timestamp + ts_delta if timestamp is None else timestamp)
        keys.append(key)
        values.append(value)
        counts.append(n_headers)
        kept += 1
    return kept


def decode_segment(
    data: bytes | memoryview, topic: str, partition: int, first: int, last: int
) -> pa.Table:
    """Rows for the data records with offsets in ``first..last`` of a segment's bytes
    (control batches skipped; whole batches only: a torn or corrupt batch ends the segment).

    Consecutive uncompressed batches form one run read in place, a compressed batch is
    decompressed once into a run of its own; each run's records are decoded at once
    (:func:`stonemq.tiering.record_columns.decode_run`), and the batches that cannot be
    (headers, odd varints, corruption) record by record with flat column lists."""
    buf = data if isinstance(data, bytes) else bytes(data)
    parts: list[dict[str, pa.Array]] = []
    run = Run(buf)
    pos = 0
    size = len(buf)
    while size - pos >= _HEADER_SIZE:
        (
            base_offset,
            batch_length,
            _epoch,
            magic,
            _crc,
            attributes,
            last_delta,
            base_timestamp,
            max_timestamp,
            producer_id,
            _producer_epoch,
            _base_sequence,
            count,
        ) = _HEAD.unpack_from(buf, pos)
        batch_end = pos + batch_length + _LOG_OVERHEAD
        if magic != 2 or batch_length < _HEADER_SIZE - _LOG_OVERHEAD or batch_end > size:
            break  # a torn tail (or not a v2 batch): the whole batches before it are the data
        start, pos = pos, batch_end
        if base_offset + last_delta < first or attributes & _ATTR_CONTROL:
            continue
        if base_offset > last:
            break
        codec = attributes & _ATTR_COMPRESSION
        target = run
        try:
            if codec == COMPRESSION_NONE:
                body, body_pos, body_end = buf, start + _HEADER_SIZE, batch_end
            else:
                body = decompress(codec, buf[start + _HEADER_SIZE : batch_end])
                body_pos, body_end = 0, len(body)
                target = Run(body)
            if count < 0:
                raise CorruptRecordError("negative record count")
            marks = len(target.starts), len(target.ends)
            try:
                record_bounds(body, body_pos, body_end, count, target)
            except (RecordBatchError, IndexError):
                del target.starts[marks[0] :], target.ends[marks[1] :]
                raise
        except (RecordBatchError, IndexError, ValueError, OSError):
            break  # a corrupt batch: keep the whole batches before it
        target.counts.append(count)
        target.base_offsets.append(base_offset)
        target.base_timestamps.append(base_timestamp)
        target.append_times.append(max_timestamp if attributes & _ATTR_TIMESTAMP_TYPE else -1)
        target.producers.append(producer_id)
        target.whole.append(first <= base_offset and base_offset + count - 1 <= last)
        target.bodies.append((body_pos, body_end))
        if target is not run:
            if not _decode(run, first, last, parts) or not _decode(target, first, last, parts):
                return _table(parts, topic, partition)
            run = Run(buf)
    _decode(run, first, last, parts)
    return _table(parts, topic, partition)


def _decode(run: Run, first: int, last: int, parts: list[dict[str, pa.Array]]) -> bool:
    """Append the rows of ``run`` to ``parts`` in batch order: its batches decoded at once,
    and those that could not be record by record. False when a batch turns out corrupt
    (its rows and the later batches' are then left out)."""
    if not len(run):
        return True
    decoded = decode_run(run, first, last)
    rows = decoded.batch_of_row
    done = 0  # batches before this one are in parts

    def fast_until(stop: int) -> None:
        lo, hi = np.searchsorted(rows, [done, stop])
        if hi > lo:
            parts.append({k: v.slice(lo, hi - lo) for k, v in decoded.columns.items()})

    for index in np.flatnonzero(decoded.slow).tolist():
        fast_until(index)
        done = index + 1
        cols = _Columns()
        body_pos, body_end = run.bodies[index]
        append_time = run.append_times[index]
        try:
            kept = _decode_records(
                run.buffer,
                body_pos,
                body_end,
                run.counts[index],
                run.base_offsets[index],
                append_time if append_time >= 0 else None,
                run.base_timestamps[index],
                first,
                last,
                cols,
            )
        except (RecordBatchError, IndexError, ValueError):
            return False
        cols.types.extend([_LOG_APPEND_TIME_UTF8 if append_time >= 0 else _CREATE_TIME_UTF8] * kept)
        cols.producers.extend([run.producers[index]] * kept)
        parts.append(cols.part())
    fast_until(len(run))
    return True


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


ENCODE_CHUNK_ROWS = 4 * MAX_BATCH_RECORDS


def encode_rows(table: pa.Table, max_bytes: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(last offset, batch bytes) for the table's rows in offset order; stops once
    ``max_bytes`` is reached (the first batch always comes whole).

    Rows become Python objects in chunks (256 rows, doubling up to ``ENCODE_CHUNK_ROWS``),
    so a 1 MiB fetch from a 16 MiB read-ahead table converts about what it sends, not the
    whole table (a batch never spans two chunks)."""
    produced = 0
    start = 0
    chunk = 256
    while start < table.num_rows:
        for last, batch in _encode_chunk(table.slice(start, chunk), max_bytes):
            if max_bytes is not None and produced and produced + len(batch) > max_bytes:
                return
            produced += len(batch)
            yield last, batch
        start += chunk
        chunk = min(2 * chunk, ENCODE_CHUNK_ROWS)


def _encode_chunk(table: pa.Table, max_bytes: int | None) -> Iterator[tuple[int, bytes]]:
    offsets = table.column("offset").to_pylist()
    stamps = table.column("timestamp").cast(pa.int64()).to_pylist()
    types = table.column("timestamp_type").to_pylist()
    keys = table.column("key").to_pylist()
    values = table.column("value").to_pylist()
    headers = table.column("headers").to_pylist()
    pids = table.column("producer_id").to_pylist()
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
        yield offsets[i - 1], batch
