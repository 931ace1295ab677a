"""Vectorized decoding of runs of RecordBatch v2 records into Arrow columns (numpy).

The archive job's decoder (:func:`stonemq.tiering.rows.decode_segment`) reads every batch
through the record codec's validator (:func:`stonemq.protocol.record_batch.read_batch`): the
framing and every rule (CRC, record count, each record's lengths, offset deltas, header
counts, trailing bytes, bounded decompression) are the codec's, with its errors
(CorruptRecordError, InvalidRecordError), the ones a produce of the same bytes gets; a batch
it refuses never reaches this module. Its record walk (in C) also returns where each record
starts and ends, and :func:`decode_run` reads the fields of a whole run of such validated
records at once with numpy, and gathers keys and values with Arrow's ``take`` over the
segment's own bytes: no per-record Python objects, no per-record slices (about ten times
the record-by-record decoder's rate: ``python -m bench.codec_cost``).

The varints here are read again in bulk, not checked: records with headers or a varint of
ten bytes are left out (:func:`decode_run` marks their batches ``slow``) and the caller
decodes those record by record with the codec's
:func:`~stonemq.protocol.record_batch.iter_record_fields`.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from stonemq.protocol.record_batch import StoredBatch

# pa.array on a Python list imports pandas (see rows._fixed): built from buffers instead
_TIMESTAMP_TYPES = pa.Array.from_buffers(
    pa.string(),
    2,
    [None, pa.py_buffer(array("i", [0, 10, 23])), pa.py_buffer(b"CreateTimeLogAppendTime")],
)
_MAX_VARINT_BYTES = 9  # longer ones (legal up to 10) are left to the record-by-record path


@dataclass
class Run:
    """Validated batches whose records lie in one buffer, with where each record starts and
    ends (the validator's walk gives them)."""

    buffer: bytes | bytearray | memoryview
    bounds: bytearray = field(default_factory=bytearray)  # (start, end) int64 per record
    counts: list[int] = field(default_factory=list)
    base_offsets: list[int] = field(default_factory=list)
    base_timestamps: list[int] = field(default_factory=list)
    append_times: list[int] = field(default_factory=list)  # -1: CreateTime
    producers: list[int] = field(default_factory=list)
    whole: list[bool] = field(default_factory=list)  # every record in the wanted range
    bodies: list[tuple[int, int]] = field(default_factory=list)  # the records' byte range

    def __len__(self) -> int:
        return len(self.counts)

    def add(self, batch: StoredBatch, whole: bool) -> None:
        """Add a batch :func:`~stonemq.protocol.record_batch.read_batch` validated (with
        ``bounds=True``) whose records lie in this run's buffer."""
        if batch.bounds is None or batch.body is not self.buffer:
            raise ValueError("a run holds validated batches of its own buffer, with bounds")
        header = batch.header
        self.bounds += batch.bounds
        self.counts.append(header.record_count)
        self.base_offsets.append(header.base_offset)
        self.base_timestamps.append(header.base_timestamp)
        self.append_times.append(header.max_timestamp if header.timestamp_type else -1)
        self.producers.append(header.producer_id)
        self.whole.append(whole)
        self.bodies.append((batch.start, batch.end))


def _varints(data: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The zigzag varints at ``pos``: (values, positions after them, longer than
    ``_MAX_VARINT_BYTES`` or past the end). The records were validated, so such a varint is
    one this reader leaves to the record-by-record path, never corruption; reads are clamped
    to the buffer all the same."""
    last = len(data) - 1
    b = data[np.minimum(pos, last)].astype(np.uint64)
    raw = b & np.uint64(0x7F)
    more = b >= 0x80
    size = np.ones(len(pos), np.int64)
    for shift in range(7, 7 * _MAX_VARINT_BYTES, 7):
        idx = np.flatnonzero(more)
        if not len(idx):
            break
        b = data[np.minimum(pos[idx] + size[idx], last)].astype(np.uint64)
        raw[idx] |= (b & np.uint64(0x7F)) << np.uint64(shift)
        size[idx] += 1
        more[idx] = b >= 0x80
    values = (raw >> np.uint64(1)).astype(np.int64) ^ -((raw & np.uint64(1)).astype(np.int64))
    return values, pos + size, more | (pos + size > len(data))


@dataclass
class Decoded:
    """A run's records decoded: the columns of the kept records of the batches that decoded
    here, and which batches did not (``slow``: decode them record by record)."""

    batch_of_row: np.ndarray  # batch index of each kept row, non-decreasing
    columns: dict[str, pa.Array]
    slow: np.ndarray  # bool per batch


def decode_run(run: Run, first: int, last: int) -> Decoded:
    """Decode every (validated) record of ``run`` at once; rows of batches marked slow are
    left out."""
    data = np.frombuffer(run.buffer, np.uint8)
    bounds = np.frombuffer(run.bounds, np.int64)
    starts, ends = bounds[0::2], bounds[1::2]
    counts = np.asarray(run.counts, np.int64)
    batch = np.repeat(np.arange(len(counts)), counts)
    limit = len(data)
    ts_delta, pos, bad = _varints(data, starts + 1)  # + 1: the record's attributes
    offset_delta, pos, bad2 = _varints(data, pos)
    bad |= bad2
    key_len, pos, bad2 = _varints(data, pos)
    bad |= bad2 | (key_len < -1) | (key_len > limit)
    key_pos = pos
    pos = pos + np.maximum(key_len, 0)
    value_len, pos, bad2 = _varints(data, pos)
    bad |= bad2 | (value_len < -1) | (value_len > limit)
    value_pos = pos
    pos = pos + np.maximum(value_len, 0)
    header_count, pos, bad2 = _varints(data, pos)
    bad |= bad2 | (header_count != 0) | (pos != ends)
    slow = np.zeros(len(counts), bool)
    slow[batch[bad]] = True
    offsets = np.asarray(run.base_offsets, np.int64)[batch] + offset_delta
    keep = ~slow[batch] & (
        np.asarray(run.whole, bool)[batch] | ((offsets >= first) & (offsets <= last))
    )
    batch = batch[keep]
    append_times = np.asarray(run.append_times, np.int64)[batch]
    log_append = append_times >= 0
    stamps = np.where(
        log_append, append_times, np.asarray(run.base_timestamps, np.int64)[batch] + ts_delta[keep]
    )
    columns = {
        "offset": _fixed(pa.int64(), offsets[keep]),
        "timestamp": _fixed(pa.timestamp("ms", tz="UTC"), stamps),
        "timestamp_type": _TIMESTAMP_TYPES.take(_fixed(pa.int8(), log_append.astype(np.int8))),
        "key": _slices(run.buffer, key_pos[keep], key_len[keep]),
        "value": _slices(run.buffer, value_pos[keep], value_len[keep]),
        "producer_id": _fixed(pa.int64(), np.asarray(run.producers, np.int64)[batch]),
    }
    return Decoded(batch, columns, slow)


def _fixed(type_: pa.DataType, values: np.ndarray) -> pa.Array:
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(values)])


def _slices(buf: bytes, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """``buf[start:start + length]`` for each row (a length of -1 is null) as one binary
    array: the bytes are gathered by Arrow's ``take`` from a view of ``buf`` whose pieces
    alternate between the wanted slices and the bytes between them (slices never overlap
    and come in buffer order)."""
    n = len(starts)
    if n == 0:
        return pa.Array.from_buffers(
            pa.binary(), 0, [None, pa.py_buffer(array("i", [0])), pa.py_buffer(b"")]
        )
    sizes = np.maximum(lengths, 0)
    bounds = np.empty(2 * n, np.int64)
    bounds[0::2] = starts
    bounds[1::2] = starts + sizes
    wide = bounds[-1] >= 2**31
    view_type = pa.large_binary() if wide else pa.binary()
    view = pa.Array.from_buffers(
        view_type,
        2 * n - 1,
        [None, pa.py_buffer(bounds if wide else bounds.astype(np.int32)), pa.py_buffer(buf)],
    )
    taken = view.take(_fixed(pa.int64(), np.arange(0, 2 * n, 2, dtype=np.int64)))
    if wide:
        taken = taken.cast(pa.binary())
    nulls = int(np.count_nonzero(lengths < 0))
    if not nulls:
        return taken
    validity = pa.py_buffer(np.packbits(lengths >= 0, bitorder="little"))
    _, value_offsets, value_data = taken.buffers()
    return pa.Array.from_buffers(
        pa.binary(), n, [validity, value_offsets, value_data], null_count=nulls
    )
