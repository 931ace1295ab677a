"""RecordBatch v2 header: parse, CRC, validation errors, offset/time patches, record decoding."""

import random
import struct
import sys
import threading
import time

import cramjam
import lz4.frame
import pytest
import zstandard
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


# -- the record walk: C and Python twins, Kafka's record rules -----------------------------------
def body_of(batch: bytearray) -> bytes:
    return bytes(batch[rb.HEADER_SIZE :])


@pytest.mark.slow  # a property run of several seconds: in the full suite, not the fast set
@settings(max_examples=300, deadline=None)
@given(records=records_st, data=st.data())
def test_the_c_walk_and_its_python_twin_agree_on_any_bytes(records, data) -> None:
    """Valid records, and the same bytes with bytes flipped, cut or added: both walks give
    the same answer, and the valid ones pass."""
    body = bytearray(body_of(build(records)))
    count = len(records)
    assert rb.scan_records_py(body, 0, len(body), count)[0] == 0
    for _ in range(data.draw(st.integers(0, 4))):
        action = data.draw(st.sampled_from(["flip", "cut", "add", "count"]))
        if action == "flip" and body:
            body[data.draw(st.integers(0, len(body) - 1))] ^= data.draw(st.integers(1, 255))
        elif action == "cut" and body:
            del body[data.draw(st.integers(0, len(body) - 1)) :]
        elif action == "add":
            body += data.draw(st.binary(min_size=1, max_size=8))
        else:
            count = data.draw(st.integers(0, len(records) + 2))
    assert rb.scan_records(bytes(body), 0, len(body), count) == rb.scan_records_py(
        body, 0, len(body), count
    )
    # with the records' bounds asked for: the same answer, the same bounds
    c_bounds, py_bounds = bytearray(16 * count), bytearray(16 * count)
    c_answer = rb.scan_records(bytes(body), 0, len(body), count, c_bounds)
    assert c_answer == rb.scan_records_py(body, 0, len(body), count, py_bounds)
    if c_answer[0] == 0:
        assert c_bounds == py_bounds
        pairs = struct.unpack(f"={2 * count}q", c_bounds)
        starts, ends = pairs[0::2], pairs[1::2]
        assert all(0 < s < e <= len(body) for s, e in zip(starts, ends, strict=True))


def test_the_walk_gives_each_record_its_bounds() -> None:
    batch = rb.encode_batch(0, [(1000, b"k", b"v" * n, []) for n in (0, 5, 200)])
    stored = rb.read_batch(batch, bounds=True)
    assert stored.bounds is not None
    pairs = struct.unpack("=6q", stored.bounds)
    ends = [rb.HEADER_SIZE, *pairs[1::2]]
    for i, (start, end) in enumerate(zip(pairs[0::2], pairs[1::2], strict=True)):
        length, after = rb.read_varint(batch, ends[i])
        assert (after, after + length) == (start, end)
    assert pairs[-1] == len(batch)
    with pytest.raises(ValueError):  # a bounds buffer too small is refused, never overrun
        rb.scan_records(batch, rb.HEADER_SIZE, len(batch), 3, bytearray(47))


def test_the_c_walk_is_built() -> None:
    """CI builds the extension (setup.py); without it produce would walk records in Python,
    and with a build older than the bounds argument so would the tiering decoder."""
    assert rb.scan_records is not rb.scan_records_py
    assert rb._recordscan.VERSION >= 2


def test_the_c_walk_of_a_small_batch_keeps_the_gil() -> None:
    """A walk of a small batch does not hand the GIL to a waiting thread: it woke that thread
    (the splitter's, at 10,000 partitions) and waited to get the GIL back, several times the
    walk's own 0.2 us. With a long switch interval a thread that always wants the GIL can only
    run during the walks if they release it."""
    batch = rb.encode_batch(0, [(1000, b"k", b"v" * 1000, [])])
    count = rb.parse_header(batch).record_count
    stop = threading.Event()
    ran = [0]

    def spin() -> None:  # pure Python: it wants the GIL all the time
        while not stop.is_set():
            ran[0] += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(0.5)
    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        time.sleep(0.01)  # the spinner runs; this thread gets the GIL back by a forced switch
        before = ran[0]  # and holds it for the next 0.5 s unless it gives it away
        for _ in range(200):
            assert rb.scan_records(batch, rb.HEADER_SIZE, len(batch), count)[0] == 0
        during = ran[0] - before
    finally:
        stop.set()
        spinner.join()
        sys.setswitchinterval(old)
    assert before > 0
    assert during == 0, f"another thread ran {during} steps during 200 walks of a 1 KiB batch"


def reseal(batch: bytearray) -> bytearray:
    """Recompute the CRC: the garbage below is CRC-valid, as a buggy client would send it."""
    struct.pack_into(">I", batch, 17, rb.crc32c(bytes(batch[rb.CRC_START :])))
    return batch


def garbage_batch(codec: int, records: bytes, count: int) -> bytearray:
    """A batch whose header is right (CRC included) and whose records are ``records``."""
    head = bytearray(build([(b"k", b"v", [], 1000)])[: rb.HEADER_SIZE])
    payload = records
    if codec:
        payload = {
            1: lambda d: __import__("gzip").compress(d),
            2: lambda d: bytes(cramjam.snappy.compress_raw(d)),
            3: lambda d: lz4.frame.compress(d),
            4: lambda d: zstandard.ZstdCompressor().compress(d),
        }[codec](records)
    batch = head + payload
    struct.pack_into(">i", batch, 8, len(batch) - rb.LOG_OVERHEAD)
    struct.pack_into(">h", batch, 21, codec)
    struct.pack_into(">i", batch, 23, count - 1)
    struct.pack_into(">i", batch, 57, count)
    return reseal(batch)


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_crc_valid_garbage_records_are_invalid(codec: int) -> None:
    """Reproduced (hostile-input issue, item 4): a batch with a correct CRC and garbage records
    was stored with error 0; Kafka answers INVALID_RECORD (CORRUPT_MESSAGE for bad bytes of
    a codec) and never stores it."""
    with pytest.raises((rb.InvalidRecordError, rb.CorruptRecordError)):
        rb.validate_produce_records(garbage_batch(codec, b"\x55" * 200, 3))


def test_a_record_count_that_does_not_match_the_records_is_invalid() -> None:
    three = build([(b"k", b"v", [], 1000)] * 3)
    body = body_of(build([(b"k", b"v", [], 1000)] * 2))
    batch = three[: rb.HEADER_SIZE] + body  # says 3 records, holds 2
    struct.pack_into(">i", batch, 8, len(batch) - rb.LOG_OVERHEAD)
    with pytest.raises(rb.InvalidRecordError):
        rb.validate_produce_records(reseal(batch))


def test_a_producer_id_with_no_sequence_is_invalid() -> None:
    batch = build([(b"k", b"v", [], 1000)], producer_id=5, base_sequence=0)
    struct.pack_into(">i", batch, 53, -1)
    with pytest.raises(rb.InvalidRecordError, match="sequence"):
        rb.validate_produce_records(reseal(batch))


def test_a_client_batch_flagged_log_append_time_is_an_invalid_timestamp() -> None:
    batch = build([(b"k", b"v", [], 1000)])
    struct.pack_into(">h", batch, 21, 0x08)
    with pytest.raises(rb.InvalidTimestampError):
        rb.validate_produce_records(reseal(batch))


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_a_decompression_bomb_stops_at_the_bound(codec: int) -> None:
    """Reproduced (item 5): a small batch of compressed zeros held a gigabyte. Nothing beyond
    the bound is produced, and the answer is MESSAGE_TOO_LARGE (RecordsTooLargeError)."""
    bomb = garbage_batch(codec, b"\0" * (64 << 20), 1)
    assert len(bomb) < 8 << 20
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(rb.RecordsTooLargeError):
            rb.check_records(bomb, rb.parse_header(bomb), rb.RecordLimits(), 0, 1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 24 << 20, f"decompressing toward the bound took {peak} bytes"


def test_timestamps_outside_the_topic_bounds_are_invalid() -> None:
    now = 10_000_000
    batch = build([(b"k", b"v", [], now + 3_600_001)])
    with pytest.raises(rb.InvalidTimestampError):
        rb.validate_produce_records(batch, rb.RecordLimits(), now)
    rb.validate_produce_records(batch, rb.RecordLimits(timestamp_after_max_ms=2**62), now)
    old = build([(b"k", b"v", [], 5)])
    with pytest.raises(rb.InvalidTimestampError):
        rb.validate_produce_records(old, rb.RecordLimits(timestamp_before_max_ms=1000), now)
    rb.validate_produce_records(old, rb.RecordLimits(log_append_time=True), now)


@pytest.mark.parametrize("codec", [0, 1, 4])
def test_each_record_timestamp_is_checked_and_one_without_is_skipped(codec: int) -> None:
    """Reproduced (an independent audit, p3 and p4): a batch with a record without timestamp
    (-1) skipped the bounds of every other record (only the batch's smallest and largest were
    looked at), so a record two hours ahead was stored; and a refusal named no record. As
    Kafka's LogValidator.validateTimestamp: each record is checked, -1 is not, and the error
    lists each record out of bounds (KIP-467's record_errors)."""
    now = 10_000_000_000
    ahead = now + 2 * 3_600_000
    batch = build([(b"k", b"a", [], -1), (b"k", b"b", [], ahead), (b"k", b"c", [], now)], codec)
    with pytest.raises(rb.InvalidTimestampError) as refused:
        rb.validate_produce_records(batch, rb.RecordLimits(), now)
    assert str(refused.value) == "One or more records have been rejected due to invalid timestamp"
    assert refused.value.record_errors == (
        (
            1,
            f"Timestamp {ahead} of message with offset 1 is out of range. The timestamp should "
            f"be within [{now - (2**63 - 1)}, {now + 3_600_000}]",
        ),
    )
    fine = build([(b"k", b"a", [], -1), (b"k", b"c", [], now)], codec)
    rb.validate_produce_records(fine, rb.RecordLimits(), now)
    rb.validate_produce_records(batch, rb.RecordLimits(log_append_time=True), now)


def test_encode_batch_round_trips_through_the_validator_and_decoder() -> None:
    records = [
        (1000 + i, b"k%d" % i, None if i == 2 else b"v" * i, [("h", b"x")]) for i in range(5)
    ]
    batch = rb.encode_batch(42, records, producer_id=3, producer_epoch=1, base_sequence=7)
    header = rb.validate_produce_records(batch, rb.RecordLimits(), 1500)
    assert (header.base_offset, header.record_count, header.max_timestamp) == (42, 5, 1004)
    decoded = list(rb.iter_records(batch))
    assert [(r.offset, r.timestamp, r.key, r.value) for r in decoded] == [
        (42 + i, ts, k, v) for i, (ts, k, v, _) in enumerate(records)
    ]
    assert decoded[0].headers == (("h", b"x"),)


# -- recompression (a topic's compression.type) -----------------------------------------------
LEVELS = {0: [-1], 1: [-1, 1, 9], 2: [-1], 3: [-1, 1, 17], 4: [-1, -5, 1, 22]}


@settings(max_examples=80, deadline=None)
@given(
    records=records_st,
    source=st.sampled_from([0, 1, 2, 3, 4]),
    target=st.sampled_from([0, 1, 2, 3, 4]),
    data=st.data(),
)
@pytest.mark.slow  # a property run of several seconds: in the full suite, not the fast set
def test_recompress_keeps_every_record_and_header_field(records, source, target, data) -> None:
    batch = build(records, source, producer_id=7, base_sequence=3)
    rb.set_base_offset(batch, 0, 1000)
    level = data.draw(st.sampled_from(LEVELS[target]))
    out = rb.recompress(batch, target, level)
    before, after = rb.parse_header(batch), rb.parse_header(out)
    assert after.compression == target
    assert after.size == len(out)
    assert rb.crc_ok(out, 0, after)
    for name in (
        "base_offset",
        "partition_leader_epoch",
        "last_offset_delta",
        "base_timestamp",
        "max_timestamp",
        "producer_id",
        "producer_epoch",
        "base_sequence",
        "record_count",
        "timestamp_type",
    ):
        assert getattr(after, name) == getattr(before, name), name
    assert list(rb.iter_records(out)) == list(rb.iter_records(batch))
    # a client's decoder (kafka-python's, with its own codecs) reads the same records
    from kafka.record.default_records import DefaultRecordBatch

    decoded = [(r.key, r.value, r.timestamp) for r in DefaultRecordBatch(out)]
    assert decoded == [(key, value, ts) for key, value, _, ts in records]
    assert rb.validate_produce_records(bytearray(out)).record_count == len(records)


def test_compressed_sizes_follow_the_level() -> None:
    rnd = random.Random(1)
    words = [bytes(rnd.choices(b"abcdefghij", k=rnd.randint(2, 9))) for _ in range(500)]
    data = b" ".join(rnd.choice(words) for _ in range(40_000))
    assert len(rb.compress(rb.COMPRESSION_ZSTD, data, 22)) < len(
        rb.compress(rb.COMPRESSION_ZSTD, data, -5)
    )
    assert len(rb.compress(rb.COMPRESSION_GZIP, data, 9)) <= len(
        rb.compress(rb.COMPRESSION_GZIP, data, 1)
    )


def _answer(check, buf):  # type: ignore[no-untyped-def]
    try:
        return check(buf)
    except rb.RecordBatchError as exc:
        return (type(exc), str(exc))


@settings(max_examples=300, deadline=None)
@given(records_st, st.sampled_from([0, 1, 2, 3, 4]), st.data())
def test_the_one_pass_batch_check_answers_as_the_rule_by_rule_one(records, codec, data) -> None:
    """``check_batch`` (one pass over the header for a batch that breaks no rule) and
    ``check_batch_reference`` (rule by rule) agree on any batch: the same header, or the
    same error with the same message, whichever bytes, lengths or fields are wrong."""
    batch = build(
        records,
        codec,
        producer_id=data.draw(st.sampled_from([-1, 7])),
        base_sequence=data.draw(st.sampled_from([-1, 0, 5])),
    )
    kind = data.draw(st.sampled_from(["as built", "flip", "field", "cut", "extend"]))
    if kind == "flip":
        at = data.draw(st.integers(0, len(batch) - 1))
        batch[at] ^= 1 << data.draw(st.integers(0, 7))
    elif kind == "field":  # a header field set to a chosen value, the CRC made to match
        at, size = data.draw(
            st.sampled_from([(8, 4), (16, 1), (21, 2), (23, 4), (43, 8), (51, 2), (53, 4), (57, 4)])
        )
        value = data.draw(st.integers(-(2 ** (8 * size - 1)), 2 ** (8 * size - 1) - 1))
        batch[at : at + size] = value.to_bytes(size, "big", signed=True)
        if data.draw(st.booleans()):
            reseal(batch)
    elif kind == "cut":
        batch = batch[: data.draw(st.integers(0, len(batch) - 1))]
    elif kind == "extend":
        batch += bytes(data.draw(st.integers(1, 70)))
    for buf in (bytes(batch), batch, memoryview(bytes(batch))):
        assert _answer(rb.check_batch, buf) == _answer(rb.check_batch_reference, buf)


def test_a_stored_batch_reads_back_under_the_brokers_raised_limit() -> None:
    """batch.max.uncompressed.bytes raised: a batch produce accepted past the default (64 MiB
    of records in a small zstd batch) reads back (ListOffsets by time, the max timestamp,
    storage checks) once the broker set the stored limit; read at the default, every later
    time lookup of its partition failed (an independent audit)."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=4,  # zstd: a few KB
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 28,
    )
    for i in range(65):  # 65 MiB of records
        assert builder.append(i, timestamp=1000 + i, key=None, value=bytes(1 << 20), headers=[])
    batch = bytearray(builder.build())
    limit = 128 << 20
    header = rb.validate_produce_records(
        batch, rb.RecordLimits(max_uncompressed_bytes=limit), now_ms=1000
    )
    assert header.record_count == 65
    with pytest.raises(rb.RecordBatchError):
        list(rb.iter_records(batch))  # the default limit
    try:
        rb.set_stored_limit(limit)
        got = list(rb.iter_records(batch))
        assert len(got) == 65 and got[-1].timestamp == 1064
        rb.set_stored_limit(1)  # never below the default
        assert rb._stored_limit == rb.MAX_UNCOMPRESSED_BYTES
    finally:
        rb.set_stored_limit(rb.MAX_UNCOMPRESSED_BYTES)
