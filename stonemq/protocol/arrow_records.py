"""The record codec's columnar encoder: Arrow columns of keys, values and headers to the
records of RecordBatch v2 without a Python object per record.

It writes the bytes :func:`stonemq.protocol.record_batch.encode_records` writes for the same
records (tests/unit/test_arrow_records.py holds both paths below to it), with every record's
timestamp delta 0 (a producer's batch stamped once, as Kafka's Java client stamps a record
when ``send`` is called). Where the C extension is built (``_recordscan.encode``) one pass
writes each record's varints and copies its key, value and header section out of the Arrow
buffers (bounds checked against them first). Without it, :func:`encode_columns_numpy` writes
the same bytes: every variable-length integer computed at once with numpy (zigzag, then seven
bits a byte), the records' fixed parts laid out as one byte matrix, and Arrow's
``binary_join_element_wise`` joining each record's pieces. Header sections (the count, then
each header's lengths and bytes) are joined with Arrow in both.

Used by the Spark sink's producer (:mod:`stonemq.spark.produce_write`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_MAX_VARINT = 10  # bytes of a 64-bit varint
_NOTHING = pa.scalar(b"", pa.large_binary())  # the joins' separator


def zigzag(values: np.ndarray) -> np.ndarray:
    """Kafka's zigzag encoding of int64 values, as uint64."""
    v = values.astype(np.int64, copy=False)
    return ((v << 1) ^ (v >> 63)).astype(np.uint64)


def varint_sizes(z: np.ndarray) -> np.ndarray:
    """Bytes of the unsigned varint of each (zigzagged) value."""
    sizes = np.ones(len(z), dtype=np.int64)
    for k in range(1, _MAX_VARINT):
        sizes += z >= np.uint64(1 << (7 * k))
    return sizes


def _varint_columns(z: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, used) matrices of shape (n, width): byte k of each value's varint, and
    whether the value's varint has a byte k."""
    sizes = varint_sizes(z)
    if len(z) and int(sizes.max()) > width:
        raise ValueError(f"a varint longer than {width} bytes")
    ks = np.arange(width, dtype=np.uint64)
    groups = (z[:, None] >> (np.uint64(7) * ks[None, :])) & np.uint64(0x7F)
    used = ks[None, :] < sizes[:, None].astype(np.uint64)
    more = ks[None, :] + np.uint64(1) < sizes[:, None].astype(np.uint64)
    data = (groups | (more.astype(np.uint64) << np.uint64(7))).astype(np.uint8)
    return data, used


def _binary(data: np.ndarray, used: np.ndarray) -> pa.LargeBinaryArray:
    """A binary array whose row i is the bytes of ``data[i]`` where ``used[i]`` holds."""
    counts = used.sum(axis=1, dtype=np.int64)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    flat = np.ascontiguousarray(data[used])
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(counts), [None, pa.py_buffer(offsets), pa.py_buffer(flat)]
    )


def _lengths(column: pa.Array) -> np.ndarray:
    """Byte lengths of a binary column, -1 for null."""
    lengths = pc.binary_length(column).fill_null(-1)
    return lengths.to_numpy(zero_copy_only=False).astype(np.int64)


def _as_large_binary(column: pa.Array) -> pa.Array:
    if pa.types.is_large_binary(column.type):
        return column
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.large_string()).view(pa.large_binary())
        return column
    return column.cast(pa.large_binary())


def _filled(column: pa.Array) -> pa.Array:
    """The column as large binary with nulls as empty bytes (a null's length says -1)."""
    column = _as_large_binary(column)
    return column.fill_null(b"") if column.null_count else column


def header_sections(headers: pa.Array | None, n: int) -> tuple[pa.Array, np.ndarray]:
    """Each row's header section (the count, then each header's key length, key, value
    length, value) and its size; ``headers`` is a list of struct<key: string, value: binary>
    or None (no headers: one zero byte a row). A null header key is written empty (the
    codec's rule, :func:`stonemq.tiering.rows._header_pairs`)."""
    if headers is None or (headers.null_count == n) or n == 0:
        none = pa.LargeBinaryArray.from_buffers(
            pa.large_binary(),
            n,
            [None, pa.py_buffer(np.arange(n + 1, dtype=np.int64)), pa.py_buffer(bytes(n))],
        )
        return none, np.ones(n, dtype=np.int64)
    counts = pc.list_value_length(headers).fill_null(0).to_numpy(zero_copy_only=False)
    counts = counts.astype(np.int64)
    flat = pc.list_flatten(headers)
    hkeys = pc.struct_field(flat, [0])
    hvalues = pc.struct_field(flat, [1])
    key_lengths = np.maximum(_lengths(hkeys), 0)
    value_lengths = _lengths(hvalues)
    kz_data, kz_used = _varint_columns(zigzag(key_lengths), 5)
    vz_data, vz_used = _varint_columns(zigzag(value_lengths), 5)
    pieces = pc.binary_join_element_wise(
        _binary(kz_data, kz_used),
        _filled(hkeys),
        _binary(vz_data, vz_used),
        _filled(hvalues),
        _NOTHING,
    )
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    joined = pc.binary_join(pa.LargeListArray.from_arrays(pa.array(offsets), pieces), _NOTHING)
    count_data, count_used = _varint_columns(zigzag(counts), 5)
    sections = pc.binary_join_element_wise(_binary(count_data, count_used), joined, _NOTHING)
    sizes = pc.binary_length(sections).to_numpy(zero_copy_only=False).astype(np.int64)
    return sections, sizes


@dataclass(frozen=True, slots=True)
class EncodedRecords:
    """Records encoded back to back: record i is ``data[starts[i]:starts[i + 1]]``."""

    data: pa.Buffer
    starts: np.ndarray  # int64, n + 1 entries

    def section(self, first: int, end: int) -> memoryview:
        """The bytes of records ``[first, end)`` (consecutive in a batch)."""
        return memoryview(self.data)[int(self.starts[first]) : int(self.starts[end])]


OFFSET_DELTA_BYTES = 3  # a varint of an offset delta below 2**20 (records a batch)


def record_sizes(
    keys: pa.Array | None,
    values: pa.Array,
    headers: pa.Array | None,
    sections: pa.Array | None = None,
) -> np.ndarray:
    """The bytes each record takes at most in a batch of fewer than 2**20 records (its
    offset delta's varint counted at :data:`OFFSET_DELTA_BYTES`): what a producer cuts
    batches by before the offset deltas are known. ``sections``: the rows' header
    sections already written (:func:`header_sections`), used instead of ``headers``."""
    n = len(values)
    value_lengths = _lengths(values)
    body = 2 + OFFSET_DELTA_BYTES + varint_sizes(zigzag(value_lengths))
    body += np.maximum(value_lengths, 0)
    if keys is None:
        body += 1
    else:
        key_lengths = _lengths(keys)
        body += varint_sizes(zigzag(key_lengths)) + np.maximum(key_lengths, 0)
    if sections is None and headers is not None:
        sections = header_sections(headers, n)[0]
    body += _lengths(sections) if sections is not None else 1
    return body + varint_sizes(zigzag(body))


def _field_buffers(column: pa.Array | None) -> tuple[Any, Any, Any]:
    """(data, starts, lengths) of a binary or string column for the C encoder: the data
    buffer as it is, each row's start in it and length (-1 null) as int64; all None for no
    column."""
    if column is None:
        return None, None, None
    if not (
        pa.types.is_binary(column.type)
        or pa.types.is_string(column.type)
        or pa.types.is_large_binary(column.type)
        or pa.types.is_large_string(column.type)
    ):
        column = column.cast(pa.large_binary())
    buffers = column.buffers()
    wide = pa.types.is_large_binary(column.type) or pa.types.is_large_string(column.type)
    offsets = np.frombuffer(buffers[1], dtype=np.int64 if wide else np.int32)
    starts = offsets[column.offset : column.offset + len(column)].astype(np.int64)
    data = buffers[2] if buffers[2] is not None else b""
    return data, starts, _lengths(column)


def encode_columns(
    keys: pa.Array | None,
    values: pa.Array,
    headers: pa.Array | None,
    offset_deltas: np.ndarray,
    sections: pa.Array | None = None,
) -> EncodedRecords:
    """Records of the rows (keys and values binary or string, nullable; ``headers`` a list
    of struct<key: string, value: binary>, or None; or ``sections``, their header sections
    already written) with attributes 0, timestamp delta 0 and ``offset_deltas[i]`` (each
    row's place in its batch). Written by the C extension's ``encode`` (one pass, a copy of
    each field) where it is built, else with numpy and Arrow (:func:`encode_columns_numpy`):
    the same bytes."""
    if _native_encode is None:
        return encode_columns_numpy(keys, values, headers, offset_deltas, sections)
    n = len(values)
    deltas = np.ascontiguousarray(offset_deltas, dtype=np.int64)
    if len(deltas) != n:
        raise ValueError(f"{len(deltas)} offset deltas for {n} rows")
    if sections is None and headers is not None and n and headers.null_count < n:
        sections = header_sections(headers, n)[0]
    starts = np.empty(n + 1, dtype=np.int64)
    data = _native_encode(
        starts, deltas, *_field_buffers(keys), *_field_buffers(values), *_field_buffers(sections)
    )
    return EncodedRecords(pa.py_buffer(data), starts)


def _native() -> Any:
    try:
        from stonemq.protocol import _recordscan
    except ImportError:  # built without a C compiler: the numpy path
        return None
    return _recordscan.encode if getattr(_recordscan, "VERSION", 1) >= 4 else None


_native_encode = _native()


def encode_columns_numpy(
    keys: pa.Array | None,
    values: pa.Array,
    headers: pa.Array | None,
    offset_deltas: np.ndarray,
    sections: pa.Array | None = None,
) -> EncodedRecords:
    """:func:`encode_columns`' records with numpy and Arrow alone (no C extension)."""
    n = len(values)
    if keys is None:
        keys = pa.nulls(n, pa.large_binary())
    key_lengths = _lengths(keys)
    value_lengths = _lengths(values)
    if sections is None:
        sections, section_sizes = header_sections(headers, n)
    else:
        section_sizes = _lengths(sections)
    kz = zigzag(key_lengths)
    vz = zigzag(value_lengths)
    oz = zigzag(np.asarray(offset_deltas, dtype=np.int64))
    o_data, o_used = _varint_columns(oz, 5)
    k_data, k_used = _varint_columns(kz, 5)
    v_data, v_used = _varint_columns(vz, 5)
    body = (
        2  # attributes, timestamp delta 0
        + o_used.sum(axis=1)
        + k_used.sum(axis=1)
        + np.maximum(key_lengths, 0)
        + v_used.sum(axis=1)
        + np.maximum(value_lengths, 0)
        + section_sizes
    )
    b_data, b_used = _varint_columns(zigzag(body), 5)
    # the record's head: length, attributes, timestamp delta, offset delta, key length
    zero = np.zeros((n, 2), dtype=np.uint8)
    head_data = np.concatenate([b_data, zero, o_data, k_data], axis=1)
    head_used = np.concatenate([b_used, np.ones((n, 2), dtype=bool), o_used, k_used], axis=1)
    joined = pc.binary_join_element_wise(
        _binary(head_data, head_used),
        _filled(keys),
        _binary(v_data, v_used),
        _filled(values),
        sections,
        _NOTHING,
    )
    if not isinstance(joined, pa.Array):
        joined = pa.array(joined)
    joined = joined.cast(pa.large_binary()) if not pa.types.is_large_binary(joined.type) else joined
    buffers = joined.buffers()
    starts = np.frombuffer(buffers[1], dtype=np.int64)[joined.offset : joined.offset + n + 1]
    data = buffers[2] if buffers[2] is not None else pa.py_buffer(b"")
    return EncodedRecords(data, starts)
