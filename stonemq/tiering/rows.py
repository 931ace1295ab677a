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
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stonemq.protocol import record_batch as codec
from stonemq.protocol.record_batch import (
    HEADER_SIZE,
    RecordBatchError,
    check_framing,
    iter_record_fields,
    parse_header,
    read_batch,
)
from stonemq.tiering.record_columns import Run, decode_run

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


_HEADERS_TYPE = ARROW_SCHEMA.field("headers").type


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
    body: bytes,
    start: int,
    count: int,
    base_offset: int,
    timestamp: int | None,
    base_timestamp: int,
    first: int,
    last: int,
    cols: _Columns,
) -> int:
    """Append the ``count`` records at ``body[start:]`` (validated by
    :func:`~stonemq.protocol.record_batch.read_batch`, decoded by the codec's
    :func:`~stonemq.protocol.record_batch.iter_record_fields`) with offsets in
    ``first..last`` to ``cols``; ``timestamp`` is the batch's LogAppendTime (else each
    record's CreateTime is ``base_timestamp`` + its delta). Returns how many were kept."""
    offsets, stamps = cols.offsets, cols.stamps
    keys, values, counts = cols.keys, cols.values, cols.header_counts
    hkeys, hvalues = cols.header_keys, cols.header_values
    whole = first <= base_offset and base_offset + count - 1 <= last
    kept = 0
    for offset_delta, ts_delta, key, value, headers in iter_record_fields(body, start, count):
        offset = base_offset + offset_delta
        if not whole and not first <= offset <= last:
            continue
        offsets.append(offset)
        stamps.append(base_timestamp + ts_delta if timestamp is None else timestamp)
        keys.append(key)
        values.append(value)
        counts.append(len(headers))
        for hkey, hvalue in headers:
            hkeys.append(hkey)
            hvalues.append(hvalue)
        kept += 1
    return kept


class DecodeProgress:
    """How far :func:`decode_segment` walked: ``walked_to`` is the last offset of the whole
    batches it accepted (or the offset before the first batch past ``last``), -1 before
    any. Below ``last`` the segment ended early (a refused batch, a torn or short tail):
    its offsets past ``walked_to`` are not in the rows."""

    __slots__ = ("log_bytes", "walked_to")

    def __init__(self) -> None:
        self.walked_to = -1
        self.log_bytes = 0  # the bytes of the whole batches accepted within first..last


def decode_segment(
    data: bytes | memoryview,
    topic: str,
    partition: int,
    first: int,
    last: int,
    on_refused: Callable[[int, RecordBatchError], None] | None = None,
    progress: DecodeProgress | None = None,
) -> pa.Table:
    """Rows for the data records with offsets in ``first..last`` of a segment's bytes
    (control batches skipped; whole batches only: a torn tail ends the segment).

    Every batch is validated by the record codec's validator, the rules a produce of it is
    checked by (:func:`~stonemq.protocol.record_batch.check_framing`, CRC and record count,
    for each; :func:`~stonemq.protocol.record_batch.read_batch`, every record walked and
    decompression bounded, for those whose records are read); a batch it
    refuses ends the segment after the batches before it, and ``on_refused`` is told its
    position and the error (the same CorruptRecordError or InvalidRecordError a produce of
    it would get). The walk also gives each record's bounds: consecutive uncompressed batches
    form one run read in place, a compressed batch's decompressed records a run of their
    own, and each run's fields are read at once
    (:func:`stonemq.tiering.record_columns.decode_run`); the batches it leaves (headers,
    10-byte varints) are decoded record by record by the codec."""
    buf = data if isinstance(data, bytes) else bytes(data)
    parts: list[dict[str, pa.Array]] = []
    run = Run(buf)
    pos = 0
    size = len(buf)
    while size - pos >= HEADER_SIZE:
        try:
            header = parse_header(buf, pos)
        except RecordBatchError as exc:  # not a v2 batch
            if on_refused is not None:
                on_refused(pos, exc)
            break
        if pos + header.size > size:
            break  # a torn tail: the whole batches before it are the data
        start, pos = pos, pos + header.size
        try:
            header = check_framing(buf, start, pos)  # every batch, also those skipped
            if header.base_offset > last:
                if progress is not None:
                    progress.walked_to = max(progress.walked_to, header.base_offset - 1)
                break
            if header.last_offset < first or header.is_control:
                if progress is not None:
                    progress.walked_to = header.last_offset
                    if header.last_offset >= first:  # a control batch of the range
                        progress.log_bytes += header.size
                continue
            stored = read_batch(buf, start, pos, bounds=True, header=header)
        except RecordBatchError as exc:
            if on_refused is not None:
                on_refused(start, exc)
            break  # keep the whole batches before it
        if progress is not None:
            progress.walked_to = header.last_offset
            progress.log_bytes += header.size
        target = run if stored.body is buf else Run(stored.body)
        target.add(stored, first <= header.base_offset and header.last_offset <= last)
        if target is not run:
            _decode(run, first, last, parts)
            _decode(target, first, last, parts)
            run = Run(buf)
    _decode(run, first, last, parts)
    return _table(parts, topic, partition)


def _decode(run: Run, first: int, last: int, parts: list[dict[str, pa.Array]]) -> None:
    """Append the rows of ``run`` to ``parts`` in batch order: its batches decoded at once,
    and those that could not be record by record."""
    if not len(run):
        return
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
        append_time = run.append_times[index]
        kept = _decode_records(
            run.buffer,
            run.bodies[index][0],
            run.counts[index],
            run.base_offsets[index],
            append_time if append_time >= 0 else None,
            run.base_timestamps[index],
            first,
            last,
            cols,
        )
        cols.types.extend([_LOG_APPEND_TIME_UTF8 if append_time >= 0 else _CREATE_TIME_UTF8] * kept)
        cols.producers.extend([run.producers[index]] * kept)
        parts.append(cols.part())
    fast_until(len(run))


# -- encoding: through the record codec -----------------------------------------------------
MAX_BATCH_RECORDS = 1000
TARGET_BATCH_BYTES = 64 * 1024


def _header_pairs(headers: Sequence[Any]) -> list[tuple[str, bytes | None]]:
    """Headers as the codec takes them: ``(key, value)`` pairs or ``{"key", "value"}``
    mappings (Arrow's rows); a null key is written empty, as it is read back."""
    pairs = []
    for h in headers:
        hkey, hval = (h["key"], h["value"]) if isinstance(h, dict) else h
        pairs.append((hkey if hkey is not None else "", hval))
    return pairs


def encode_batch(
    base_offset: int,
    records: Sequence[tuple[int, int, bytes | None, bytes | None, Sequence[Any]]],
    *,
    log_append_time: bool = False,
    producer_id: int = -1,
) -> bytes:
    """One uncompressed RecordBatch v2 of ``(offset, timestamp_ms, key, value, headers)``
    records at consecutive offsets from ``base_offset``, built by the record codec
    (:func:`stonemq.protocol.record_batch.encode_batch`; partition leader epoch 0);
    headers are ``(key, value)`` pairs or ``{"key", "value"}`` mappings."""
    if any(r[0] != base_offset + i for i, r in enumerate(records)):
        raise ValueError("a batch's records have consecutive offsets from its base offset")
    return codec.encode_batch(
        base_offset,
        [
            (ts, key, value, _header_pairs(headers) if headers else ())
            for _, ts, key, value, headers in records
        ],
        log_append_time=max(r[1] for r in records) if log_append_time else -1,
        producer_id=producer_id,
        partition_leader_epoch=0,
    )


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
    # headers as two flat lists and a count per row: no dict per header (to_pylist's form)
    header_lists = table.column("headers")
    header_counts = pc.list_value_length(header_lists).fill_null(0).to_pylist()
    flat = pc.list_flatten(header_lists)
    header_keys = pc.struct_field(flat, [0]).fill_null("").to_pylist()
    header_values = pc.struct_field(flat, [1]).to_pylist()
    next_header = 0
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
            n_headers = header_counts[i]
            if n_headers:
                stop = next_header + n_headers
                hdrs: Sequence[tuple[str, bytes | None]] = list(
                    zip(header_keys[next_header:stop], header_values[next_header:stop], strict=True)
                )
                next_header = stop
            else:
                hdrs = ()
            group.append((stamps[i] // 1000, keys[i], values[i], hdrs))
            size += len(keys[i] or b"") + len(values[i] or b"") + 16
            i += 1
        stamp = stamps[start] // 1000
        log_append = types[start] == LOG_APPEND_TIME
        batch = codec.encode_batch(
            offsets[start],
            group,
            log_append_time=stamp if log_append else -1,
            producer_id=pids[start] if pids[start] is not None else -1,
            partition_leader_epoch=0,
        )
        yield offsets[i - 1], batch
