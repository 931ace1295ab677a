"""The columnar record encoder (stonemq/protocol/arrow_records.py) writes the bytes the record
codec's :func:`encode_records` writes for the same records, for any keys, values, headers
(nulls, empty, long enough for multi-byte varints), offset deltas and sliced or string
columns; and a batch wrapped around them is accepted by the validator and read back by
kafka-python's reader."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

from stonemq.protocol import arrow_records
from stonemq.protocol import record_batch as rb
from stonemq.protocol.arrow_records import encode_columns, encode_columns_numpy, record_sizes

_HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
_bytes = st.one_of(st.none(), st.binary(max_size=20), st.binary(min_size=60, max_size=300))
_header = st.tuples(st.one_of(st.none(), st.text(max_size=70)), _bytes)
_row = st.tuples(_bytes, _bytes, st.one_of(st.none(), st.lists(_header, max_size=3)))


def _codec_records(rows: list[Any], deltas: list[int]) -> bytes:
    out = bytearray()
    rb.encode_records(
        (
            (d, 0, k, v, [(hk if hk is not None else "", hv) for hk, hv in (h or [])])
            for d, (k, v, h) in zip(deltas, rows, strict=True)
        ),
        out,
    )
    return bytes(out)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(_row, min_size=1, max_size=30),
    skip=st.integers(0, 3),
    key_as_string=st.booleans(),
    with_headers=st.booleans(),
    first_delta=st.sampled_from([0, 1, 63, 64, 8191, 8192, 2**20]),
)
def test_columns_encode_as_the_codec_does(
    rows: list[Any], skip: int, key_as_string: bool, with_headers: bool, first_delta: int
) -> None:
    rows = [(k, v, h if with_headers else None) for k, v, h in rows]
    padding = [(b"pad", b"pad", [("p", b"p")] if with_headers else None)] * skip
    keys = pa.array([r[0] for r in padding + rows], pa.binary())
    if key_as_string:  # string keys: each row's text as UTF-8 (hex keeps it valid)
        rows = [(k.hex().encode() if k is not None else None, v, h) for k, v, h in rows]
        keys = pa.array(
            [r[0].decode() if r[0] is not None else None for r in padding + rows], pa.string()
        )
    values = pa.array([r[1] for r in padding + rows], pa.binary())
    headers = (
        pa.array(
            [
                [{"key": hk, "value": hv} for hk, hv in h] if h is not None else None
                for _, _, h in padding + rows
            ],
            _HEADER_TYPE,
        )
        if with_headers
        else None
    )
    deltas = [first_delta + i for i in range(len(rows))]
    args = (
        keys.slice(skip),
        values.slice(skip),
        headers.slice(skip) if headers is not None else None,
        np.array(deltas),
    )
    encoded = encode_columns(*args)
    want = _codec_records(rows, deltas)
    assert bytes(encoded.section(0, len(rows))) == want
    if headers is not None:  # header sections written beforehand, as the producer does
        sections = arrow_records.header_sections(args[2], len(rows))[0]
        for encode in (encode_columns, encode_columns_numpy):
            pre = encode(args[0], args[1], None, args[3], sections)
            assert bytes(pre.section(0, len(rows))) == want
        assert list(record_sizes(args[0], args[1], None, sections)) == list(record_sizes(*args[:3]))
    by_numpy = encode_columns_numpy(*args)  # the path without the C extension
    assert bytes(by_numpy.section(0, len(rows))) == want
    assert list(by_numpy.starts) == list(encoded.starts)
    # every record on its own too: the starts are each record's bounds
    for i in range(len(rows)):
        assert bytes(encoded.section(i, i + 1)) == _codec_records(
            rows[i : i + 1], deltas[i : i + 1]
        )
    sizes = record_sizes(
        keys.slice(skip), values.slice(skip), headers.slice(skip) if headers is not None else None
    )
    for i in range(len(rows)):  # an upper bound, exact but for the offset delta's varint
        real = len(encoded.section(i, i + 1))
        if deltas[i] < 2**20:  # a batch of fewer than 2**20 records
            assert real <= sizes[i] <= real + 3
        else:
            assert real - 2 <= sizes[i] < real


def test_the_c_encoder_is_built_here() -> None:
    """The fast path is what the suite measures (CI builds the extension)."""
    assert arrow_records._native_encode is not None


def test_the_c_encoder_refuses_a_field_outside_its_buffer() -> None:
    starts = np.empty(2, dtype=np.int64)
    one = np.array([0], dtype=np.int64)
    with pytest.raises(ValueError, match="outside its buffer"):
        arrow_records._native_encode(
            starts, one, None, None, None, b"abc", one, np.array([4]), None, None, None
        )
    with pytest.raises(ValueError, match="outside its buffer"):
        arrow_records._native_encode(
            starts, one, None, None, None, b"abc", np.array([-1]), np.array([2]), None, None, None
        )


def test_the_c_encoder_checks_again_what_changed_between_its_passes() -> None:
    """starts_out overlapping the key lengths: the first pass's writes change the lengths
    the second pass would copy by (a review's probe of this crashed the process)."""
    n = 4
    shared = np.zeros(2 * n + 2, dtype=np.int64)
    shared[:n] = 3  # the key lengths, and the first n + 1 starts
    kst = np.array([0, 3, 6, 9], dtype=np.int64)
    with pytest.raises(ValueError, match="changed while being encoded"):
        arrow_records._native_encode(
            shared[: n + 1], np.arange(n), b"abcdefghijkl", kst, shared[:n], *[None] * 6
        )


@settings(max_examples=50, deadline=None)
@given(
    rows=st.lists(_row, min_size=1, max_size=20),
    codec=st.sampled_from([0, 1, 2, 3, 4]),
)
def test_a_wrapped_batch_is_valid_and_reads_back(rows: list[Any], codec: int) -> None:
    keys = pa.array([r[0] for r in rows], pa.binary())
    values = pa.array([r[1] for r in rows], pa.binary())
    headers = pa.array(
        [[{"key": hk, "value": hv} for hk, hv in h] if h is not None else None for *_, h in rows],
        _HEADER_TYPE,
    )
    encoded = encode_columns(keys, values, headers, np.arange(len(rows)))
    batch = rb.wrap_records(
        encoded.section(0, len(rows)),
        len(rows),
        base_timestamp=1_700_000_000_000,
        max_timestamp=1_700_000_000_000,
        producer_id=7,
        producer_epoch=0,
        base_sequence=41,
        codec=codec,
    )
    header = rb.check_batch(batch)
    assert (header.producer_id, header.base_sequence, header.record_count) == (7, 41, len(rows))
    assert (
        rb.check_records(batch, header, rb.RecordLimits(), 1_700_000_000_000) == 1_700_000_000_000
    )
    read = list(DefaultRecordBatch(batch))
    assert [(r.key, r.value) for r in read] == [(k, v) for k, v, _ in rows]
    assert [list(r.headers) for r in read] == [
        [(hk if hk is not None else "", hv) for hk, hv in (h or [])] for *_, h in rows
    ]
    assert {r.timestamp for r in read} == {1_700_000_000_000}
