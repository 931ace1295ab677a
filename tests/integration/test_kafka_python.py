"""kafka-python 3: the default KafkaProducer (idempotent, acks=all) and KafkaConsumer.assign()."""

from __future__ import annotations

import os
import time

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.record.default_records import DefaultRecordBatch

from .helpers import (
    CODECS,
    Msg,
    assert_same,
    consume,
    create_topic,
    sample_messages,
    wait_high_watermark,
)
from .rawclient import fetch_batches

pytestmark = pytest.mark.timeout(90)


def kp_produce(bootstrap: str, topic: str, msgs: list[Msg], partition: int = 0, **conf):
    """Produce with kafka-python's defaults (plus ``conf``); returns the offsets."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, **conf)
    try:
        # the default producer is the idempotent one: that is the point of these tests
        assert producer.config["enable_idempotence"] is True or "enable_idempotence" in conf
        futures = [
            producer.send(
                topic,
                value=m.value,
                key=m.key,
                headers=list(m.headers),
                partition=partition,
                timestamp_ms=m.timestamp,
            )
            for m in msgs
        ]
        producer.flush(timeout=30)
        return [f.get(timeout=30).offset for f in futures]
    finally:
        producer.close(timeout=10)


def kp_consume(
    bootstrap: str, topic: str, count: int, partition: int = 0, offset: int | None = None
) -> list[Msg]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",
        fetch_max_wait_ms=100,
    )
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        if offset is None:
            consumer.seek_to_beginning(tp)
        else:
            consumer.seek(tp, offset)
        out: list[Msg] = []
        deadline = time.monotonic() + 30
        while len(out) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                for r in records:
                    assert r.timestamp_type == 0, "expected CreateTime"
                    out.append(
                        Msg(
                            r.key,
                            r.value,
                            tuple(r.headers),
                            r.timestamp,
                            offset=r.offset,
                            partition=r.partition,
                        )
                    )
        assert len(out) == count, f"consumed {len(out)} of {count}"
        # nothing more after the expected records
        extra = consumer.poll(timeout_ms=300)
        assert not any(extra.values()), f"unexpected extra records: {extra}"
        return out
    finally:
        consumer.close()


def test_default_idempotent_producer_round_trip(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b)
    msgs = sample_messages(30, tag="kp", null_headers=False, null_key_and_value=False)
    assert kp_produce(b, topic, msgs) == list(range(30))
    got = kp_consume(b, topic, 30)
    assert [m.offset for m in got] == list(range(30))
    assert_same(got, msgs)
    # and librdkafka reads the very same records
    assert_same(consume(b, topic, 30), msgs)


def test_idempotent_batches_carry_producer_id(module_broker):
    """The stored batches keep the producer id, epoch and sequences the producer wrote."""
    b = module_broker.bootstrap
    topic = create_topic(b)
    msgs = sample_messages(5, tag="pid", null_headers=False, null_key_and_value=False)
    kp_produce(b, topic, msgs, linger_ms=0)
    batches = fetch_batches(module_broker, topic, 0, 0, end=5)
    assert batches, "no batches fetched"
    parsed = [DefaultRecordBatch(bytes(raw)) for raw in batches]
    pids = {batch.producer_id for batch in parsed}
    assert len(pids) == 1 and next(iter(pids)) >= 0, pids
    sequences = []
    for batch in parsed:
        assert batch.producer_epoch >= 0
        n = len(list(batch))
        sequences.extend(range(batch.base_sequence, batch.base_sequence + n))
    assert sequences == list(range(5))


@pytest.mark.slow  # one broker round trip per codec; confluent and kcat cover codecs fast
@pytest.mark.parametrize("codec", CODECS)
def test_compression_round_trip(module_broker, codec):
    b = module_broker.bootstrap
    topic = create_topic(b)
    msgs = sample_messages(100, tag=codec, null_headers=False, null_key_and_value=False)
    assert kp_produce(b, topic, msgs, compression_type=codec, linger_ms=20) == list(range(100))
    assert_same(kp_consume(b, topic, 100), msgs)
    assert_same(kp_consume(b, topic, 42, offset=58), msgs[58:])


@pytest.mark.slow
def test_one_million_byte_message(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b)
    msgs = [Msg(b"big", os.urandom(1_000_000), (("h", b"1"),), int(time.time() * 1000))]
    assert kp_produce(b, topic, msgs) == [0]
    assert_same(kp_consume(b, topic, 1), msgs)


def test_offsets_for_times(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b)
    base = int(time.time() * 1000) - 5_000_000
    msgs = [Msg(b"k%d" % i, b"v" * 300, (), base + 100 * i) for i in range(300)]
    kp_produce(b, topic, msgs, linger_ms=0, batch_size=2000)
    assert wait_high_watermark(b, topic, 300) == (0, 300)
    consumer = KafkaConsumer(bootstrap_servers=b, group_id=None, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, 0)
        cases = {base - 1: 0, base: 0, base + 1: 1, base + 150: 2, base + 100 * 299: 299}
        for ts, want in cases.items():
            found = consumer.offsets_for_times({tp: ts}, timeout_ms=10000)[tp]
            assert found is not None, f"no offset for {ts - base:+d}"
            assert found.offset == want, f"offsets_for_times({ts - base:+d}) = {found}"
            assert found.timestamp == base + 100 * want
        # after the last record: no offset
        assert consumer.offsets_for_times({tp: base + 100 * 299 + 1}, timeout_ms=10000)[tp] is None
        assert consumer.beginning_offsets([tp], timeout_ms=10000) == {tp: 0}
        assert consumer.end_offsets([tp], timeout_ms=10000) == {tp: 300}
    finally:
        consumer.close()


def test_non_idempotent_acks_1(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b)
    msgs = sample_messages(10, tag="a1", null_headers=False, null_key_and_value=False)
    assert kp_produce(b, topic, msgs, enable_idempotence=False, acks=1) == list(range(10))
    assert_same(kp_consume(b, topic, 10), msgs)
