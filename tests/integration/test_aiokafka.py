"""aiokafka 0.14: AIOKafkaProducer and AIOKafkaConsumer by assignment (no group)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from .helpers import CODECS, Msg, assert_same, consume, create_topic, sample_messages

pytestmark = pytest.mark.timeout(90)


async def aio_produce(
    bootstrap: str, topic: str, msgs: list[Msg], partition: int = 0, **conf
) -> list[int]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=15000, **conf)
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic,
                value=m.value,
                key=m.key,
                partition=partition,
                timestamp_ms=m.timestamp,
                headers=list(m.headers),
            )
            for m in msgs
        ]
        await producer.flush()
        results = await asyncio.wait_for(asyncio.gather(*futures), 30)
        return [r.offset for r in results]
    finally:
        await producer.stop()


async def aio_consume(
    bootstrap: str, topic: str, count: int, partition: int = 0, offset: int | None = None
) -> list[Msg]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",
        fetch_max_wait_ms=100,
        request_timeout_ms=15000,
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        if offset is None:
            await consumer.seek_to_beginning(tp)
        else:
            consumer.seek(tp, offset)
        out: list[Msg] = []
        deadline = time.monotonic() + 30
        while len(out) < count and time.monotonic() < deadline:
            batch = await consumer.getmany(tp, timeout_ms=500)
            for r in batch.get(tp, []):
                assert r.timestamp_type == 0, "expected CreateTime"
                out.append(
                    Msg(r.key, r.value, tuple(r.headers), r.timestamp, r.offset, r.partition)
                )
        assert len(out) == count, f"consumed {len(out)} of {count}"
        extra = await consumer.getmany(tp, timeout_ms=300)
        assert not extra.get(tp), f"unexpected extra records: {extra}"
        assert await consumer.position(tp) == (offset or 0) + count
        return out
    finally:
        await consumer.stop()


def test_round_trip(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b)
    msgs = sample_messages(25, tag="aio", null_key_and_value=False)
    assert asyncio.run(aio_produce(b, topic, msgs)) == list(range(25))
    got = asyncio.run(aio_consume(b, topic, 25))
    assert [m.offset for m in got] == list(range(25))
    assert_same(got, msgs)
    assert_same(consume(b, topic, 25), msgs)


def test_null_values_and_keys(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b)
    ts = int(time.time() * 1000)
    msgs = [
        Msg(b"k", None, (), ts),
        Msg(None, b"v", (("h", b"x"),), ts + 1),
        Msg(None, b"", (), ts + 2),  # aiokafka refuses a record with neither key nor value
        Msg(b"", b"", (("", b""),), ts + 3),  # empty is not null
    ]
    assert asyncio.run(aio_produce(b, topic, msgs)) == [0, 1, 2, 3]
    assert_same(asyncio.run(aio_consume(b, topic, 4)), msgs)


@pytest.mark.parametrize("codec", CODECS)
def test_compression_round_trip(module_broker, codec):
    b = module_broker.bootstrap
    topic = create_topic(b)
    msgs = sample_messages(120, tag=codec, null_key_and_value=False)
    offsets = asyncio.run(aio_produce(b, topic, msgs, compression_type=codec, linger_ms=20))
    assert offsets == list(range(120))
    assert_same(asyncio.run(aio_consume(b, topic, 120)), msgs)
    assert_same(asyncio.run(aio_consume(b, topic, 20, offset=100)), msgs[100:])


@pytest.mark.slow
def test_one_million_byte_message(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b)
    msgs = [Msg(b"big", os.urandom(1_000_000), (("h", b"1"),), int(time.time() * 1000))]
    assert asyncio.run(aio_produce(b, topic, msgs)) == [0]
    assert_same(asyncio.run(aio_consume(b, topic, 1)), msgs)


def test_idempotent_producer(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b)
    msgs = sample_messages(10, tag="idem", null_key_and_value=False)
    assert asyncio.run(aio_produce(b, topic, msgs, enable_idempotence=True)) == list(range(10))
    assert_same(asyncio.run(aio_consume(b, topic, 10)), msgs)
