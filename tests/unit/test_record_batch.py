"""RecordBatch v2 header: parse, CRC, validation errors, offset/time patches, record decoding."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from stonemq.protocol import record_batch as rb

records_st = st.lists(
    st.tuples(
        st.one_of(st.none(), st.binary(max_size=50)),
        st.one_of(st.none(), st.binary(max_size=300)),
        st.lists(
            st.tuples(st.text(max_size=10), st.one_of(st.none(), st.binary(max_size=20))),
            max_size=3,
        ),
        st.integers(min_value=0, max_value=2**40),
    ),
    min_size=1,
    max_size=30,
)


def build(records, codec=0, producer_id=-1, base_sequence=-1) -> bytearray:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=base_sequence,
        batch_size=1 << 24,
    )
    for i, (key, value, headers, ts) in enumerate(records):
        builder.append(i, timestamp=ts, key=key, value=value, headers=headers)
    return bytearray(builder.build())


@settings(max_examples=60, deadline=None)
@given(records=records_st, codec=st.sampled_from([0, 1, 2, 3, 4]), base=st.integers(0, 2**40))
def test_round_trip_through_header_and_records(records, codec, base) -> None:
    batch = build(records, codec)
    header = rb.validate_produce_records(batch)
    assert header.record_count == len(records)
    rb.set_base_offset(batch, 0, base)
    assert rb.crc_ok(batch, 0, rb.parse_header(batch))  # base offset lies outside the CRC
    decoded = list(rb.iter_records(batch))
    assert [r.offset for r in decoded] == list(range(base, base + len(records)))
    for (key, value, headers, ts), rec in zip(records, decoded, strict=True):
        assert (rec.key, rec.value, rec.timestamp) == (key, value, ts)
        assert list(rec.headers) == [(k, v) for k, v in headers]


@settings(max_examples=60, deadline=None)
@given(records=records_st, data=st.data())
def test_any_flipped_byte_in_crc_range_is_corrupt(records, data) -> None:
    batch = build(records)
    pos = data.draw(st.integers(min_value=rb.CRC_START, max_value=len(batch) - 1))
    batch[pos] ^= 0xFF
    with pytest.raises((rb.CorruptRecordError, rb.InvalidRecordError)):
        rb.validate_produce_records(batch)


def test_length_field_that_lies_is_corrupt() -> None:
    batch = build([(b"k", b"v", [], 1)])
    struct.pack_into(">i", batch, 8, len(batch) + 100)
    with pytest.raises(rb.CorruptRecordError):
        rb.validate_produce_records(batch)


def test_two_batches_in_one_produce_are_invalid() -> None:
    batch = build([(b"k", b"v", [], 1)])
    with pytest.raises(rb.InvalidRecordError):
        rb.validate_produce_records(batch + batch)


@pytest.mark.parametrize("magic", [0, 1, 3])
def test_other_magic_is_unsupported(magic: int) -> None:
    batch = build([(b"k", b"v", [], 1)])
    batch[16] = magic
    with pytest.raises(rb.UnsupportedMagicError):
        rb.validate_produce_records(batch)


def test_truncated_header_is_corrupt() -> None:
    with pytest.raises(rb.CorruptRecordError):
        rb.parse_header(build([(b"k", b"v", [], 1)])[:40])


def test_log_append_time_sets_type_and_max_timestamp_and_keeps_crc_valid() -> None:
    batch = build([(b"a", b"1", [], 10), (b"b", b"2", [], 20)])
    rb.set_log_append_time(batch, 0, 123456)
    header = rb.parse_header(batch)
    assert header.timestamp_type == rb.TIMESTAMP_LOG_APPEND_TIME
    assert header.max_timestamp == 123456
    assert rb.crc_ok(batch, 0, header)
    assert [r.timestamp for r in rb.iter_records(batch)] == [123456, 123456]


def test_iter_batches_stops_at_a_partial_batch() -> None:
    one = build([(b"k", b"v", [], 1)])
    data = bytes(one + one + one[:30])
    assert [pos for pos, _ in rb.iter_batches(data)] == [0, len(one)]


def test_sequence_fields() -> None:
    batch = build([(None, b"v", [], 1)] * 3, producer_id=7, base_sequence=10)
    header = rb.parse_header(batch)
    assert (header.producer_id, header.base_sequence, header.last_sequence) == (7, 10, 12)
