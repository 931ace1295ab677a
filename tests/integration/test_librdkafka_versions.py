"""librdkafka with and without ``api.version.request`` (without it, it takes the versions of
``broker.version.fallback``'s release: Produce v3 and Fetch v4 for any release since 0.11,
Kafka 4's baseline) and aiokafka: produce, consume in a group and commit,
offsets by time, seek to end."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition

from .helpers import create_topic, unique_topic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

BASE_MS = 1_700_000_000_000

# (api.version.request, broker.version.fallback)
LIBRDKAFKA = [(True, None), (False, "2.8.0"), (False, "0.11.0")]


def _config(bootstrap: str, request: bool, fallback: str | None) -> dict[str, object]:
    config: dict[str, object] = {"bootstrap.servers": bootstrap, "api.version.request": request}
    if fallback is not None:
        config["broker.version.fallback"] = fallback
    return config


@pytest.mark.parametrize(
    ("request_versions", "fallback"),
    LIBRDKAFKA,
    ids=["api-version-request", "fallback-2.8", "fallback-0.11"],
)
def test_librdkafka_with_and_without_api_version_request(module_broker, request_versions, fallback):
    bootstrap = module_broker.bootstrap
    topic = unique_topic("rdk-versions")
    create_topic(bootstrap, topic, partitions=1)
    base = _config(bootstrap, request_versions, fallback)
    producer = Producer({**base, "linger.ms": 5})
    offsets: list[int] = []
    for i in range(10):
        producer.produce(
            topic,
            b"v%d" % i,
            partition=0,
            timestamp=BASE_MS + i * 1000,
            on_delivery=lambda err, msg: offsets.append(-1 if err else msg.offset()),
        )
    assert producer.flush(30) == 0
    assert offsets == list(range(10))

    consumer = Consumer(
        {
            **base,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    try:
        consumer.subscribe([topic])
        values: list[bytes] = []
        for _ in range(300):
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
            if len(values) == 10:
                break
        assert values == [b"v%d" % i for i in range(10)]
        consumer.commit(asynchronous=False)
        (committed,) = consumer.committed([TopicPartition(topic, 0)], timeout=20)
        assert committed.offset == 10
        (found,) = consumer.offsets_for_times([TopicPartition(topic, 0, BASE_MS + 4500)], 20)
        assert found.offset == 5
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), 20) == (0, 10)
        (end,) = consumer.offsets_for_times([TopicPartition(topic, 0, BASE_MS + 99_000)], 20)
        assert end.offset == -1  # no record at or after that time: Kafka's "none"
        consumer.seek(TopicPartition(topic, 0, OFFSET_END))
        for _ in range(5):  # librdkafka resolves the end with a ListOffsets before it fetches
            assert consumer.poll(0.2) is None
        producer.produce(topic, b"after-seek", partition=0)
        assert producer.flush(30) == 0
        for _ in range(150):  # the next record read is the one produced after the seek
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                break
        assert msg is not None and (msg.offset(), msg.value()) == (10, b"after-seek")
    finally:
        consumer.close()


def test_aiokafka_group_offsets_by_time_and_seek_to_end(module_broker):
    """aiokafka 0.14 negotiates versions with ApiVersions always (its ``api_version`` is a
    no-op since 0.13), so it is run once, at the versions it picks."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as ATP

    bootstrap = module_broker.bootstrap
    topic = unique_topic("aio-versions")
    create_topic(bootstrap, topic, partitions=1)

    async def main() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            sent = [
                await producer.send_and_wait(
                    topic, b"v%d" % i, partition=0, timestamp_ms=BASE_MS + i * 1000
                )
                for i in range(10)
            ]
        finally:
            await producer.stop()
        assert [m.offset for m in sent] == list(range(10))
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=f"g-{uuid.uuid4().hex[:8]}",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
        )
        await consumer.start()
        try:
            values: list[bytes] = []
            while len(values) < 10:
                batch = await asyncio.wait_for(consumer.getmany(timeout_ms=500), 30)
                for records in batch.values():
                    values.extend(r.value for r in records)
            assert values == [b"v%d" % i for i in range(10)]
            await consumer.commit()
            tp = ATP(topic, 0)
            assert await consumer.committed(tp) == 10
            found = await consumer.offsets_for_times({tp: BASE_MS + 4500})
            assert found[tp].offset == 5 and found[tp].timestamp == BASE_MS + 5000
            assert await consumer.end_offsets([tp]) == {tp: 10}
            await consumer.seek_to_end(tp)
            assert await consumer.position(tp) == 10
        finally:
            await consumer.stop()

    asyncio.run(main())
