"""Produce and Fetch semantics checked on the wire: batches stored as produced (never
recompressed), response fields, LogAppendTime, zstd only to Fetch v10+, long polling."""

from __future__ import annotations

import dataclasses
import struct
import threading
import time
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, TopicPartition
from conftest import free_port
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kio.static.primitive import i32, i64

from .helpers import (
    CODECS,
    assert_same,
    broker_counters,
    consume,
    consumer,
    create_topic,
    produce,
    sample_messages,
)
from .rawclient import (
    RawConnection,
    build,
    build_batch,
    fetch_batches,
    fetch_raw,
    fetch_request,
    ms,
    produce_raw,
    schema,
    split_batches,
    wait_visible,
)

pytestmark = pytest.mark.timeout(90)

CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
OFFSET_OUT_OF_RANGE = 1
UNSUPPORTED_COMPRESSION_TYPE = 76
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47


def connect(broker) -> RawConnection:
    return RawConnection(broker.host, broker.port, timeout=15)


@pytest.mark.parametrize("codec", CODECS)
def test_batches_are_stored_as_produced(module_broker, codec):
    """The batch bytes a client sent come back unchanged but for the base offset."""
    topic = create_topic(module_broker.bootstrap)
    sent = []
    with connect(module_broker) as conn:
        for i in range(3):
            batch = build_batch(
                [(b"k%d" % j, b"value-%d-%d" % (i, j) * 20) for j in range(10)],
                timestamp=1_700_000_000_000 + i,
                compression=CODEC_IDS[codec],
            )
            part = produce_raw(conn, topic, 0, bytes(batch))
            assert part.error_code == 0, part
            assert part.base_offset == 10 * i
            assert part.log_start_offset == 0
            sent.append(bytes(batch))
    stored = fetch_batches(module_broker, topic, 0, 0, end=30)
    assert len(stored) == 3
    for i, (want, got) in enumerate(zip(sent, stored, strict=True)):
        assert struct.unpack_from(">q", got, 0)[0] == 10 * i  # base offset assigned
        assert got[8:] == want[8:], f"batch {i} changed in storage (recompressed?)"
        parsed = DefaultRecordBatch(got)
        assert parsed.compression_type == CODEC_IDS[codec]
        assert parsed.validate_crc()


def test_produce_response_fields_create_time(module_broker):
    topic = create_topic(module_broker.bootstrap)
    with connect(module_broker) as conn:
        part = produce_raw(conn, topic, 0, bytes(build_batch([(b"k", b"v")] * 3)), version=8)
        assert part.error_code == 0
        assert part.base_offset == 0
        assert part.log_append_time is None  # -1: the topic uses CreateTime
        assert part.log_start_offset == 0
        fetched = wait_visible(conn, topic, 0, 3)
        assert fetched.error_code == 0
        assert fetched.high_watermark == 3
        assert fetched.last_stable_offset == 3
        assert fetched.log_start_offset == 0


def test_log_append_time_topic(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b, config={"message.timestamp.type": "LogAppendTime"})
    msgs = sample_messages(5)  # their CreateTimes are an hour old
    before = int(time.time() * 1000)
    produce(b, topic, msgs, acks="all")
    after = int(time.time() * 1000)
    c = consumer(b)
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 5 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m)
        assert len(got) == 5
        for m, want in zip(got, msgs, strict=True):
            ts_type, ts = m.timestamp()
            assert ts_type == TIMESTAMP_LOG_APPEND_TIME
            assert before - 1000 <= ts <= after + 1000
            assert (m.key(), m.value()) == (want.key, want.value)
    finally:
        c.close()
    with connect(module_broker) as conn:
        part = produce_raw(conn, topic, 0, bytes(build_batch([(b"k", b"v")])), version=8)
        assert part.error_code == 0
        assert part.log_append_time is not None  # the broker's append time is returned
        appended_ms = int(part.log_append_time.timestamp() * 1000)
        assert abs(appended_ms - time.time() * 1000) < 60_000


def test_zstd_needs_fetch_v10(module_broker):
    topic = create_topic(module_broker.bootstrap)
    with connect(module_broker) as conn:
        part = produce_raw(conn, topic, 0, bytes(build_batch([(b"k", b"v")] * 5, compression=4)))
        assert part.error_code == 0
        assert wait_visible(conn, topic, 0, 5).high_watermark == 5
        old = fetch_raw(conn, topic, 0, 0, version=9)
        assert old.error_code == UNSUPPORTED_COMPRESSION_TYPE, old.error_code
        assert not old.records
        new = fetch_raw(conn, topic, 0, 0, version=10)
        assert new.error_code == 0
        assert new.records


def test_fetch_out_of_range(module_broker):
    topic = create_topic(module_broker.bootstrap)
    with connect(module_broker) as conn:
        assert produce_raw(conn, topic, 0, bytes(build_batch([(b"k", b"v")] * 2))).error_code == 0
        assert wait_visible(conn, topic, 0, 2).high_watermark == 2
        at_end = fetch_raw(conn, topic, 0, 2)  # the log end is a valid position: no records
        assert at_end.error_code == 0 and not at_end.records and at_end.high_watermark == 2
        past = fetch_raw(conn, topic, 0, 3)
        assert past.error_code == OFFSET_OUT_OF_RANGE
        negative = fetch_raw(conn, topic, 0, -5)
        assert negative.error_code == OFFSET_OUT_OF_RANGE


def test_a_partition_named_twice_in_a_fetch_is_answered_once(module_broker):
    """Reproduced (an independent audit): a partition named twice in one Fetch (in one topic
    entry, or in two entries of the topic) was read and answered twice. Kafka's KafkaApis
    keeps a Fetch's partitions in an ordered map: one answer, where the partition was first
    named, for its last entry (here fetch offset 2, so only the second batch)."""
    import dataclasses

    from .rawclient import fetch_request, split_batches

    topic = create_topic(module_broker.bootstrap)
    response = schema("fetch", 12, "response").FetchResponse
    with connect(module_broker) as conn:
        for _ in range(2):
            batch = bytes(build_batch([(b"k", b"v")] * 2))
            assert produce_raw(conn, topic, 0, batch).error_code == 0
        wait_visible(conn, topic, 0, 4)
        one = fetch_request(topic, 0, 0)
        (entry,) = one.topics
        (first,) = entry.partitions
        later = dataclasses.replace(first, fetch_offset=i64(2))
        twice_in_one = dataclasses.replace(
            one, topics=(dataclasses.replace(entry, partitions=(first, later)),)
        )
        in_two = dataclasses.replace(
            one, topics=(entry, dataclasses.replace(entry, partitions=(later,)))
        )
        for request in (twice_in_one, in_two):
            answer = conn.request(request, response)
            assert [
                (t.topic, [p.partition_index for p in t.partitions]) for t in answer.responses
            ] == [(topic, [0])]
            (part,) = answer.responses[0].partitions
            assert [DefaultRecordBatch(b).base_offset for b in split_batches(part.records)] == [2]


def test_fetch_inside_a_batch_returns_the_whole_batch(module_broker):
    topic = create_topic(module_broker.bootstrap)
    with connect(module_broker) as conn:
        batch = bytes(build_batch([(b"k%d" % i, b"v") for i in range(10)]))
        assert produce_raw(conn, topic, 0, batch).error_code == 0
        assert wait_visible(conn, topic, 0, 10).high_watermark == 10
        part = fetch_raw(conn, topic, 0, 7)
        assert part.error_code == 0
        assert part.records and struct.unpack_from(">q", part.records, 0)[0] == 0
        assert bytes(part.records)[8:] == batch[8:]


def test_long_poll_is_woken_by_new_data(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b)
    produced_at: list[float] = []

    def later() -> None:
        time.sleep(1.0)
        produced_at.append(time.monotonic())
        produce(b, topic, sample_messages(1), acks="all")

    with connect(module_broker) as conn:
        t = threading.Thread(target=later)
        start = time.monotonic()
        t.start()
        part = fetch_raw(conn, topic, 0, 0, max_wait_ms=10_000)
        answered = time.monotonic()
        t.join()
    assert part.error_code == 0
    assert part.records, "long poll answered without the new data"
    assert answered - start >= 0.9, "long poll answered before there was data"
    assert answered - produced_at[0] < 3.0, "long poll not woken promptly by new data"


def test_empty_long_poll_waits_max_wait(module_broker):
    topic = create_topic(module_broker.bootstrap)
    with connect(module_broker) as conn:
        start = time.monotonic()
        part = fetch_raw(conn, topic, 0, 0, max_wait_ms=800)
        elapsed = time.monotonic() - start
    assert part.error_code == 0 and not part.records
    assert 0.7 <= elapsed < 5.0, elapsed


def test_a_long_poll_of_many_partitions_reads_only_what_advanced(broker_factory):
    """A fetch of 1,000 partitions waiting for 1 MiB read every partition again at each
    wake-up (any produce to any of them): 1,000 reads per produce, the whole event loop's
    time at 10,000 partitions (helper-74's audit, p5). Now a wake-up reads the partitions
    the splitter advanced, and every partition is read twice in all: for the first look
    and for the answer."""
    parts, produced = 1000, 12
    port = free_port()
    broker = broker_factory(**{"metrics.listen": f"127.0.0.1:{port}"})
    b = broker.bootstrap
    topic = create_topic(b, partitions=parts)

    def later() -> None:
        time.sleep(0.5)
        for i in range(produced):  # one wake-up each: every produce waits for the last
            produce(b, topic, sample_messages(1, tag=f"w{i}"), partition=0, acks="all")
            time.sleep(0.05)

    request = dataclasses.replace(
        fetch_request(topic, 0, 0, max_wait_ms=4000, more_partitions=tuple(range(1, parts))),
        min_bytes=i32(1 << 20),
    )
    response_type = schema("fetch", 12, "response").FetchResponse
    with connect(broker) as conn:
        before = broker_counters(port)["fetch_partition_reads"]
        t = threading.Thread(target=later)
        t.start()
        resp = conn.request(request, response_type)
        t.join()
        reads = broker_counters(port)["fetch_partition_reads"] - before
    (topic_resp,) = resp.responses
    first = next(p for p in topic_resp.partitions if p.partition_index == 0)
    assert len(split_batches(first.records)) == produced  # woken by each, answered with all
    assert len(topic_resp.partitions) == parts
    # old code: 1,000 per wake-up (12,000 or more); now 1,000 + 1,000 + one per wake-up
    assert 2 * parts <= reads <= 2 * parts + produced, reads


def test_many_partitions_round_trip(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b, partitions=50)
    expected = {}
    for p in range(0, 50, 7):
        expected[p] = sample_messages(3, tag=f"mp{p}")
        assert produce(b, topic, expected[p], partition=p, acks="all") == [0, 1, 2]
    for p, msgs in expected.items():
        assert_same(consume(b, topic, 3, partition=p), msgs)


def _idempotent_batch(producer_id: int, epoch: int, sequence: int, count: int) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        batch_size=1 << 20,
    )
    for i in range(count):
        builder.append(
            i, timestamp=1_700_000_000_000, key=None, value=b"seq-%d" % (sequence + i), headers=[]
        )
    return bytes(builder.build())


def _init_producer_id(conn: RawConnection) -> Any:
    """InitProducerId v4 without a transactional id: a new producer id, epoch 0."""
    request = schema("init_producer_id", 4, "request").InitProducerIdRequest
    return conn.request(
        build(
            request,
            transactional_id=None,
            transaction_timeout=ms(60000),
            producer_id=-1,
            producer_epoch=-1,
        ),
        schema("init_producer_id", 4, "response").InitProducerIdResponse,
    )


def test_idempotent_sequences_on_the_wire(module_broker):
    """Kafka's sequence rules: a duplicate is success with the original offset (and is not
    stored twice), a gap is OUT_OF_ORDER_SEQUENCE_NUMBER, an older epoch is fenced."""
    topic = create_topic(module_broker.bootstrap)
    with connect(module_broker) as conn:
        init = _init_producer_id(conn)
        assert init.error_code == 0 and init.producer_id >= 0 and init.producer_epoch == 0
        pid = init.producer_id

        first = produce_raw(conn, topic, 0, _idempotent_batch(pid, 0, 0, 3))
        assert (first.error_code, first.base_offset) == (0, 0)
        again = produce_raw(conn, topic, 0, _idempotent_batch(pid, 0, 0, 3))
        assert (again.error_code, again.base_offset) == (0, 0)
        gap = produce_raw(conn, topic, 0, _idempotent_batch(pid, 0, 5, 1))
        assert gap.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
        second = produce_raw(conn, topic, 0, _idempotent_batch(pid, 0, 3, 2))
        assert (second.error_code, second.base_offset) == (0, 3)
        bumped = produce_raw(conn, topic, 0, _idempotent_batch(pid, 1, 0, 1))
        assert (bumped.error_code, bumped.base_offset) == (0, 5)
        fenced = produce_raw(conn, topic, 0, _idempotent_batch(pid, 0, 5, 1))
        assert fenced.error_code == INVALID_PRODUCER_EPOCH
        part = wait_visible(conn, topic, 0, 6)
        assert part.high_watermark == 6
    values = [m.value for m in consume(module_broker.bootstrap, topic, 6)]
    assert values == [b"seq-0", b"seq-1", b"seq-2", b"seq-3", b"seq-4", b"seq-0"]


def test_a_duplicate_on_a_log_append_time_topic_answers_the_stored_time(module_broker):
    """Reproduced (an independent audit, p5): an idempotent producer's retry of a stored
    batch on a LogAppendTime topic was answered with the original offset but the retry's
    own arrival time as log_append_time, which the client reports as the record's timestamp
    while consumers read the stored one. Kafka's UnifiedLog answers a duplicate with the
    original batch's timestamp."""
    topic = create_topic(
        module_broker.bootstrap, config={"message.timestamp.type": "LogAppendTime"}
    )
    with connect(module_broker) as conn:
        pid = _init_producer_id(conn).producer_id
        first = produce_raw(conn, topic, 0, _idempotent_batch(pid, 0, 0, 2))
        assert (first.error_code, first.base_offset) == (0, 0)
        time.sleep(0.05)  # a retry's own append time would differ
        again = produce_raw(conn, topic, 0, _idempotent_batch(pid, 0, 0, 2))
        assert (again.error_code, again.base_offset) == (0, 0)
        (stored,) = fetch_batches(module_broker, topic, 0, 0, end=2)
    stored_time = DefaultRecordBatch(stored).max_timestamp
    assert first.log_append_time == again.log_append_time
    assert int(again.log_append_time.timestamp() * 1000) == stored_time


def test_a_transactional_producer_is_refused_at_once(module_broker):
    """Reproduced (an independent audit, p1): FindCoordinator for a transactional id was
    COORDINATOR_NOT_AVAILABLE, which clients retry until their own timeout (librdkafka's
    init_transactions then said "retry call to resume", forever for an application that
    does). StoneMQ has no transactions: the refusal, TRANSACTIONAL_ID_AUTHORIZATION_FAILED as
    Kafka answers a transactional id a client may not use, is fatal in the client at once."""
    import asyncio

    from aiokafka import AIOKafkaProducer
    from confluent_kafka import KafkaException, Producer

    p = Producer({"bootstrap.servers": module_broker.bootstrap, "transactional.id": "tx-1"})
    started = time.monotonic()
    with pytest.raises(KafkaException) as refused:
        p.init_transactions(30)
    error = refused.value.args[0]
    assert (error.name(), error.fatal()) == ("TRANSACTIONAL_ID_AUTHORIZATION_FAILED", True), error
    assert time.monotonic() - started < 10

    async def aiokafka_start() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=module_broker.bootstrap, transactional_id="tx-2"
        )
        try:
            await asyncio.wait_for(producer.start(), 15)
        finally:
            await producer.stop()

    with pytest.raises(Exception) as aio:
        asyncio.run(aiokafka_start())
    assert not isinstance(aio.value, asyncio.TimeoutError), "aiokafka's start never returned"


def test_a_failed_acks_0_produce_closes_the_connection(module_broker):
    """Reproduced (an independent audit, p2): an acks=0 produce that failed (here to a
    partition the topic does not have) left the connection open, so such a producer never
    learnt of it (in a cluster it kept sending to a broker that no longer leads, every record
    dropped, until its next periodic metadata refresh). Kafka's KafkaApis closes the
    connection: the producer's only sign. A good acks=0 produce keeps it open, and the
    responses of requests before the failed one are still sent."""
    from .rawclient import produce_request

    topic = create_topic(module_broker.bootstrap)
    batch = bytes(build_batch([(b"k", b"v")]))
    meta = schema("metadata", 9, "request")
    meta_r = schema("metadata", 9, "response")
    with RawConnection(module_broker.host, module_broker.port) as conn:
        conn.send_request(produce_request(topic, 0, batch, acks=0))
        assert not conn.wait_closed(timeout=1.0), "a good acks=0 produce closed it"
        cid = conn.send_request(
            meta.MetadataRequest(
                topics=None,
                allow_auto_topic_creation=False,
                include_cluster_authorized_operations=False,
                include_topic_authorized_operations=False,
            )
        )
        conn.send_request(produce_request(topic, 7, batch, acks=0))
        assert conn.recv_response(meta_r.MetadataResponse, cid).brokers  # sent before closing
        assert conn.wait_closed(timeout=10.0), "the failed acks=0 produce left it open"
    assert "acks=0 produce to " + topic + "-7 failed: UNKNOWN_TOPIC_OR_PARTITION" in (
        module_broker.log()
    )
