"""confluent-kafka (librdkafka) producer and assign()-based consumer against a real broker."""

from __future__ import annotations

import os
import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import OffsetSpec

from .helpers import (
    CODECS,
    Msg,
    admin,
    assert_same,
    consume,
    consumer,
    create_topic,
    produce,
    producer_config,
    sample_messages,
    unique_topic,
    wait_for_topic,
    wait_high_watermark,
)

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("acks", ["all", "1"])
def test_round_trip_with_acks(module_broker, acks):
    b = module_broker.bootstrap
    topic = create_topic(b)
    msgs = sample_messages(20)
    offsets = produce(b, topic, msgs, acks=acks)
    assert offsets == list(range(20))
    assert_same(consume(b, topic, 20, offset=OFFSET_BEGINNING), msgs)


def test_round_trip_acks_zero(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b)
    msgs = sample_messages(20)
    produce(b, topic, msgs, acks="0")  # no offsets come back with acks=0
    # acks=0 answers nothing, so wait for the records to become visible
    c = consumer(b)
    try:
        deadline = time.monotonic() + 10
        while c.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)[1] < 20:
            assert time.monotonic() < deadline, "acks=0 records never became visible"
            time.sleep(0.1)
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=5) == (0, 20)
    finally:
        c.close()
    assert_same(consume(b, topic, 20), msgs)


@pytest.mark.parametrize("codec", CODECS)
def test_compressed_round_trip(module_broker, codec):
    b = module_broker.bootstrap
    topic = create_topic(b)
    msgs = sample_messages(200, tag=codec)
    offsets = produce(b, topic, msgs, acks="all", **{"compression.type": codec, "linger.ms": 50})
    assert offsets == list(range(200))
    assert_same(consume(b, topic, 200), msgs)
    # and from an offset in the middle of a compressed batch
    assert_same(consume(b, topic, 63, offset=137), msgs[137:])


def test_one_million_byte_message(module_broker):
    """Kafka's default max.message.bytes (1048588) admits a 1,000,000-byte value."""
    b = module_broker.bootstrap
    topic = create_topic(b)
    big = Msg(b"big", os.urandom(1_000_000), (("h", b"x"),), int(time.time() * 1000))
    msgs = [Msg(b"before", b"1", (), big.timestamp), big, Msg(b"after", b"2", (), big.timestamp)]
    # librdkafka's own client-side cap (message.max.bytes) defaults to exactly 1,000,000
    offsets = produce(b, topic, msgs, acks="all", **{"message.max.bytes": 2_000_000})
    assert offsets == [0, 1, 2]
    assert_same(consume(b, topic, 3), msgs)


def test_message_larger_than_max_message_bytes_is_rejected(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b)
    p = Producer(producer_config(b, acks="all", **{"message.max.bytes": 3_000_000}))
    errors = []
    p.produce(topic, os.urandom(1_100_000), partition=0, on_delivery=lambda e, m: errors.append(e))
    assert p.flush(30) == 0
    assert len(errors) == 1 and errors[0] is not None, errors
    assert errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE, errors[0]
    c = consumer(b)
    try:
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 0)
    finally:
        c.close()


@pytest.mark.slow
def test_topic_max_message_bytes_raised(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b, config={"max.message.bytes": "3000000"})
    msgs = [Msg(b"k", os.urandom(2_000_000), (), int(time.time() * 1000))]
    assert produce(b, topic, msgs, acks="all", **{"message.max.bytes": 3_000_000}) == [0]
    assert_same(consume(b, topic, 1), msgs)


def test_consume_from_offset_and_out_of_range(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b)
    msgs = sample_messages(30)
    produce(b, topic, msgs, acks="all", **{"linger.ms": 100})  # few batches of many records
    for start in (0, 1, 17, 29):
        got = consume(b, topic, 30 - start, offset=start)
        assert [m.offset for m in got] == list(range(start, 30))
        assert_same(got, msgs[start:])
    # past the end with auto.offset.reset=error: librdkafka reports the reset failure
    c = consumer(b)
    try:
        c.assign([TopicPartition(topic, 0, 1000)])
        deadline = time.monotonic() + 20
        err = None
        while time.monotonic() < deadline and err is None:
            msg = c.poll(0.5)
            if msg is not None and msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                err = msg.error()
            elif msg is not None:
                pytest.fail(f"a record at offset {msg.offset()} past the end")
        assert err is not None, "no error for an out-of-range fetch offset"
        assert err.code() == KafkaError._AUTO_OFFSET_RESET, err
        assert "out of range" in err.str().lower() or "OFFSET_OUT_OF_RANGE" in err.str(), err
    finally:
        c.close()


def test_offsets_for_times(module_broker):
    """ListOffsets by timestamp: the first offset whose timestamp is >= the target."""
    b = module_broker.bootstrap
    topic = create_topic(b)
    base = int(time.time() * 1000) - 10_000_000
    n = 1500
    # many small batches of ~600-byte records so the sparse time index has many entries
    msgs = [Msg(b"k%d" % i, os.urandom(600), (), base + 10 * i) for i in range(n)]
    produce(b, topic, msgs, acks="all", **{"linger.ms": 0, "batch.num.messages": 7})
    assert wait_high_watermark(b, topic, n) == (0, n)
    c = consumer(b)
    try:
        cases = {
            base - 1_000_000: 0,  # before everything -> first offset
            base: 0,
            base + 1: 1,
            base + 10: 1,
            base + 15: 2,
            base + 10 * 700: 700,
            base + 10 * 700 - 3: 700,
            base + 10 * 1234 + 9: 1235,
            base + 10 * (n - 1): n - 1,
            base + 10 * (n - 1) + 1: -1,  # after the last record -> -1 (end)
            base + 10**9: -1,
        }
        for ts, want in cases.items():
            (tp,) = c.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=10)
            assert tp.error is None, tp
            assert tp.offset == want, f"offsets_for_times({ts - base:+d}): {tp.offset} != {want}"
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, n)
    finally:
        c.close()
    # the record found is really the one with that timestamp
    got = consume(b, topic, n - 700, offset=700)
    assert got[0].timestamp == base + 7000 and got[0].key == b"k700"


def test_list_offsets_specs(module_broker):
    """AdminClient.list_offsets: earliest, latest, max timestamp and by timestamp."""
    b = module_broker.bootstrap
    topic = create_topic(b)
    base = int(time.time() * 1000) - 1_000_000
    stamps = [base + 50, base + 10, base + 90, base + 30]  # max timestamp at offset 2
    msgs = [Msg(b"k", b"v%d" % i, (), ts) for i, ts in enumerate(stamps)]
    produce(b, topic, msgs, acks="all", **{"linger.ms": 0})
    assert wait_high_watermark(b, topic, 4) == (0, 4)
    tp = TopicPartition(topic, 0)
    specs = {
        "earliest": (OffsetSpec.earliest(), 0),
        "latest": (OffsetSpec.latest(), 4),
        "max_timestamp": (OffsetSpec.max_timestamp(), 2),
        "for_timestamp": (OffsetSpec.for_timestamp(base + 40), 0),
    }
    client = admin(b)
    for name, (spec, want) in specs.items():
        result = client.list_offsets({tp: spec}, request_timeout=10)[tp].result(timeout=15)
        assert result.offset == want, f"{name}: offset {result.offset} != {want}"
        if name == "max_timestamp":
            assert result.timestamp == base + 90


def test_watermarks_and_list_topics(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b, partitions=3)
    produce(b, topic, sample_messages(5), partition=0, acks="all")
    produce(b, topic, sample_messages(2), partition=2, acks="all")
    wait_high_watermark(b, topic, 5, partition=0)
    wait_high_watermark(b, topic, 2, partition=2)
    c = consumer(b)
    try:
        marks = [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(3)]
        assert marks == [(0, 5), (0, 0), (0, 2)]
        md = c.list_topics(timeout=10)
    finally:
        c.close()
    assert topic in md.topics
    tmd = md.topics[topic]
    assert tmd.error is None
    assert sorted(tmd.partitions) == [0, 1, 2]
    assert len(md.brokers) == 1
    (broker_md,) = md.brokers.values()
    assert (broker_md.host, broker_md.port) == ("127.0.0.1", module_broker.port)
    assert md.controller_id == broker_md.id
    for p in tmd.partitions.values():
        assert p.leader == broker_md.id
        assert p.replicas == [broker_md.id] and p.isrs == [broker_md.id]


def test_produce_to_partitions(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b, partitions=4)
    per_partition = {p: sample_messages(5 + p, tag=f"p{p}") for p in range(4)}
    for p, msgs in per_partition.items():
        assert produce(b, topic, msgs, partition=p, acks="all") == list(range(len(msgs)))
    for p, msgs in per_partition.items():
        got = consume(b, topic, len(msgs), partition=p)
        assert {m.partition for m in got} == {p}
        assert_same(got, msgs)


def test_auto_create_on_produce_uses_num_partitions(broker_factory):
    broker = broker_factory(num_partitions=3)
    b = broker.bootstrap
    topic = unique_topic("auto")
    msgs = sample_messages(4)
    assert produce(b, topic, msgs, partition=2, acks="all") == [0, 1, 2, 3]
    wait_for_topic(b, topic, 3)
    assert_same(consume(b, topic, 4, partition=2), msgs)
