"""Hostile record batches over a real broker: the reproduced defects 4 and 5 of the
hostile-input issue. A batch Kafka's LogValidator refuses is answered with its error code and
never stored; a decompression bomb is refused without stalling other clients or growing the
broker's memory.
"""

from __future__ import annotations

import gzip
import struct
import threading
import time
from pathlib import Path

import lz4.frame
import pytest
import zstandard
from confluent_kafka import Consumer, TopicPartition
from crc32c import crc32c

from .helpers import create_topic
from .rawclient import RawConnection, build_batch, produce_raw

pytestmark = pytest.mark.timeout(120)

CORRUPT_MESSAGE = 2
MESSAGE_TOO_LARGE = 10
RECORD_LIST_TOO_LARGE = 18
INVALID_TIMESTAMP = 32
INVALID_RECORD = 87
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
HEADER = 61


def reseal(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return bytes(batch)


def with_records(codec: int, records: bytes, count: int) -> bytes:
    """A batch whose header (CRC included) is right and whose records are ``records``."""
    head = bytearray(build_batch([(b"k", b"v")])[:HEADER])
    payload = {
        0: lambda d: d,
        1: gzip.compress,
        2: lambda d: __import__("cramjam").snappy.compress_raw(d),
        3: lz4.frame.compress,
        4: lambda d: zstandard.ZstdCompressor().compress(d),
    }[codec](records)
    batch = head + bytes(payload)
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">h", batch, 21, codec)
    struct.pack_into(">i", batch, 23, count - 1)
    struct.pack_into(">i", batch, 57, count)
    return reseal(batch)


def offsets_for_time_answered(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "hostile-records"})
    try:
        (found,) = consumer.offsets_for_times([TopicPartition(topic, 0, 0)], timeout=10)
        assert found.error is None
        return found.offset
    finally:
        consumer.close()


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4], ids=["none", "gzip", "snappy", "lz4", "zstd"])
def test_crc_valid_garbage_records_are_refused_and_never_stored(module_broker, codec) -> None:
    """Reproduced: a batch with a correct CRC and garbage records (plain or any codec) was
    stored with error 0, and afterwards every ListOffsets by timestamp on the partition got
    no answer."""
    topic = create_topic(module_broker.bootstrap)
    with RawConnection(module_broker.host, module_broker.port) as conn:
        part = produce_raw(conn, topic, 0, with_records(codec, b"\x55" * 300, 4))
        assert part.error_code in (INVALID_RECORD, CORRUPT_MESSAGE), part
        good = produce_raw(conn, topic, 0, bytes(build_batch([(b"k", b"good")])))
        assert (good.error_code, good.base_offset) == (0, 0), "the garbage was stored"
    assert offsets_for_time_answered(module_broker.bootstrap, topic) == 0


@pytest.mark.parametrize(
    ("change", "error"),
    [
        pytest.param(
            lambda b: struct.pack_into(">qhi", b, 43, 7, 0, -1),
            INVALID_RECORD,
            id="pid-without-sequence",
        ),
        pytest.param(
            lambda b: struct.pack_into(">h", b, 21, 0x08),
            INVALID_TIMESTAMP,
            id="client-log-append-time",
        ),
        pytest.param(
            lambda b: struct.pack_into(">ii", b, 53, -1, 3), INVALID_RECORD, id="count-not-records"
        ),
        pytest.param(  # Kafka: TRANSACTIONAL_ID_AUTHORIZATION_FAILED without a transactional id
            lambda b: (
                struct.pack_into(">h", b, 21, 0x10),
                struct.pack_into(">qhi", b, 43, 7, 0, 0),
            ),
            TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            id="transactional-without-a-transaction",
        ),
    ],
)
def test_batches_kafka_refuses_are_refused(module_broker, change, error) -> None:
    """Reproduced: accepted with error 0 where Kafka refuses. (The record count case keeps
    the header's own fields consistent: the batch says 3 records and holds 1.)"""
    topic = create_topic(module_broker.bootstrap)
    batch = bytearray(build_batch([(b"k", b"v")]))
    change(batch)
    if error == INVALID_RECORD and batch[57:61] == struct.pack(">i", 3):
        struct.pack_into(">i", batch, 23, 2)  # last offset delta agrees with the count
    with RawConnection(module_broker.host, module_broker.port) as conn:
        assert produce_raw(conn, topic, 0, reseal(batch)).error_code == error
        good = produce_raw(conn, topic, 0, bytes(build_batch([(b"k", b"good")])))
        assert (good.error_code, good.base_offset) == (0, 0)


def test_a_record_out_of_time_bounds_is_named_in_the_answer(module_broker) -> None:
    """Reproduced (an independent audit, p3 and p4): beside a record without timestamp (-1)
    a record two hours ahead was stored (error 0); alone it was refused with no
    record_errors. Kafka checks each record, skips -1, and answers INVALID_TIMESTAMP with
    KIP-467's record_errors (index and message) and its fixed error message (Produce v8+),
    which the Java producer uses to fail only the bad records."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    topic = create_topic(module_broker.bootstrap)
    now = int(time.time() * 1000)
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i, ts in enumerate((-1, now + 2 * 3_600_000, now)):
        builder.append(i, timestamp=ts, key=b"k", value=b"v", headers=[])
    with RawConnection(module_broker.host, module_broker.port) as conn:
        part = produce_raw(conn, topic, 0, bytes(builder.build()), version=9)
        assert part.error_code == INVALID_TIMESTAMP, part
        assert part.error_message == (
            "One or more records have been rejected due to invalid timestamp"
        )
        assert [e.batch_index for e in part.record_errors] == [1]
        assert "of message with offset 1 is out of range" in str(
            part.record_errors[0].batch_index_error_message
        )
        good = produce_raw(conn, topic, 0, bytes(build_batch([(b"k", b"good")])), version=9)
        assert (good.error_code, good.base_offset) == (0, 0), "the batch was stored"


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize(
    "codec", [pytest.param(1, marks=pytest.mark.slow), 4], ids=["gzip", "zstd"]
)
def test_a_decompression_bomb_is_refused_without_stalling_anyone(broker, codec) -> None:
    """Reproduced: a 33 KB zstd batch (or 1 MB gzip) holding 1 GiB of zeros was stored, and
    the first ListOffsets by timestamp decompressed it on the event loop: 8 s without
    answering anyone, RSS 47 -> 2,098 MB. Now it is refused (MESSAGE_TOO_LARGE) after at
    most batch.max.uncompressed.bytes were decompressed, in a thread: the broker keeps
    answering another client meanwhile and its memory stays bounded."""
    topic = create_topic(broker.bootstrap)
    zeros = b"\0" * (1 << 30)
    bomb = with_records(codec, zeros, 1)
    del zeros
    assert len(bomb) < 2 << 20
    before = rss_bytes(broker.proc.pid)  # type: ignore[union-attr]
    probe_times: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        with RawConnection(broker.host, broker.port) as conn:
            while not stop.is_set():
                start = time.monotonic()
                conn.api_versions()
                probe_times.append(time.monotonic() - start)
                time.sleep(0.01)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        with RawConnection(broker.host, broker.port, timeout=60) as conn:
            for _ in range(3):
                assert produce_raw(conn, topic, 0, bomb).error_code == MESSAGE_TOO_LARGE
    finally:
        stop.set()
        prober.join()
    grew = rss_bytes(broker.proc.pid) - before  # type: ignore[union-attr]
    assert grew < 256 << 20, f"RSS grew by {grew >> 20} MiB"
    assert probe_times and max(probe_times) < 1.0, f"slowest probe {max(probe_times):.2f} s"
    assert offsets_for_time_answered(broker.bootstrap, topic) == -1


def test_a_batch_larger_than_the_topics_segment_bytes_is_refused(module_broker) -> None:
    """Kafka's UnifiedLog.append refuses a batch a segment of the topic cannot hold
    (RECORD_LIST_TOO_LARGE); it was stored as a segment of its own, 79-171 KB under
    segment.bytes=20000 (an independent cluster check). A batch that fits is stored."""
    topic = create_topic(module_broker.bootstrap, config={"internal.segment.bytes": "20000"})
    big = bytes(build_batch([(None, b"x" * 1000)] * 25))
    small = bytes(build_batch([(None, b"y" * 1000)] * 5))
    assert len(big) > 20000 > len(small)
    with RawConnection(module_broker.host, module_broker.port) as conn:
        refused = produce_raw(conn, topic, 0, big)
        assert refused.error_code == RECORD_LIST_TOO_LARGE
        stored = produce_raw(conn, topic, 0, small)
        assert (stored.error_code, stored.base_offset) == (0, 0)


def test_a_batch_recompressed_past_the_topics_limits_is_kept_as_produced(module_broker) -> None:
    """A small zstd batch of 4 x 50 KB records to a topic of compression.type=uncompressed,
    segment.bytes and max.message.bytes 20,000: it passed the produce checks (about 200
    bytes) and the splitter's recompression stored a 200 KB batch, a segment of its own, ten
    times both limits (an independent config check; Kafka checks the sizes again after
    recompressing). Now such a batch is kept as produced: every stored batch stays within
    the limits, and consumers read the records back."""
    from fuzz import batches

    from .helpers import consume

    topic = create_topic(
        module_broker.bootstrap,
        config={
            "compression.type": "uncompressed",
            "internal.segment.bytes": "20000",
            "max.message.bytes": "20000",
        },
    )
    records = b"".join(batches.record(i, None, bytes([65 + i]) * 50_000) for i in range(4))
    packed = batches.batch(records, 4, codec=batches.ZSTD)
    small = bytes(build_batch([(None, b"s" * 100)]))  # recompressed (here: uncompressed) as usual
    with RawConnection(module_broker.host, module_broker.port) as conn:
        assert produce_raw(conn, topic, 0, packed).error_code == 0
        assert produce_raw(conn, topic, 0, small).error_code == 0
    got = consume(module_broker.bootstrap, topic, 5)
    assert [m.value for m in got] == [bytes([65 + i]) * 50_000 for i in range(4)] + [b"s" * 100]
    queue = Path(module_broker.data_dir) / "queues" / f"{topic}-0"
    sizes = [p.stat().st_size for p in queue.glob("*.log")]
    assert sizes and max(sizes) <= 20_000, sizes
