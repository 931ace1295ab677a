"""kafka-python pinned to each Kafka release it knows (``api_version``): the versions it then
sends (ListOffsets v8 for 3.7, v10 for 4.0, ...) are served, and its version inference
(``api_version=None``) names a Kafka 4 release."""

from __future__ import annotations

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from .helpers import create_topic, unique_topic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

RELEASES = [(2, 8), (3, 0), (3, 7), (3, 9), (4, 0)]


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: f"{r[0]}.{r[1]}")
def test_pinned_release_produce_group_consume_offsets(module_broker, release):
    bootstrap = module_broker.bootstrap
    topic = unique_topic("kp-release")
    create_topic(bootstrap, topic, partitions=1)
    base_ms = 1_700_000_000_000
    producer = KafkaProducer(bootstrap_servers=bootstrap, api_version=release)
    try:
        futures = [
            producer.send(topic, value=b"v%d" % i, partition=0, timestamp_ms=base_ms + i * 1000)
            for i in range(10)
        ]
        producer.flush(timeout=30)
        assert [f.get(timeout=30).offset for f in futures] == list(range(10))
    finally:
        producer.close(timeout=10)

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        api_version=release,
        group_id=f"g-{topic}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
    )
    try:
        values: list[bytes] = []
        for _ in range(100):
            for records in consumer.poll(timeout_ms=500).values():
                values.extend(r.value for r in records)
            if len(values) >= 10:
                break
        assert values == [b"v%d" % i for i in range(10)]
        consumer.commit()
        tp = TopicPartition(topic, 0)
        assert consumer.committed(tp) == 10
        found = consumer.offsets_for_times({tp: base_ms + 4500})
        assert found[tp].offset == 5 and found[tp].timestamp == base_ms + 5000
        assert consumer.offsets_for_times({tp: base_ms + 99_000})[tp] is None
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 10}
        consumer.seek_to_end(tp)
        assert consumer.position(tp, timeout_ms=30_000) == 10
    finally:
        consumer.close()


def test_version_inference_names_kafka_4(module_broker):
    consumer = KafkaConsumer(bootstrap_servers=module_broker.bootstrap, api_version=None)
    try:
        assert consumer.config["api_version"] >= (4, 0)
    finally:
        consumer.close()
