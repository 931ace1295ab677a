"""Kafka 4's topic configs set as Kafka's tools set them (confluent-kafka CreateTopics and
IncrementalAlterConfigs, kafka-python AlterConfigs for the broker-wide defaults), on a broker
whose journal policy never fsyncs on its own: flush.messages and flush.ms are accepted,
described with Kafka's sources and synonyms, and produces to the topic are acknowledged (the
fsync each ack waits for is seen by the storage tests, tests/unit/storage/test_topic_flush.py);
the configs without effect on one broker are accepted and described back."""

from __future__ import annotations

import itertools

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from kafka import KafkaConsumer
from kafka import TopicPartition as KPTopicPartition
from kafka.admin import ConfigResource as KPConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kafka.record.default_records import DefaultRecordBatch

from .helpers import Msg, admin, consume, create_topic, produce
from .rawclient import fetch_batches

pytestmark = [pytest.mark.timeout(90), pytest.mark.broker_settings(journal_flush_policy="never")]

LONG_MAX = str(2**63 - 1)
DYNAMIC_TOPIC_CONFIG = 1
DYNAMIC_BROKER_CONFIG = 2
DEFAULT_CONFIG = 5


def _configs(bootstrap: str, topic: str) -> dict[str, object]:
    client = admin(bootstrap)  # kept referenced until its future resolves
    resource = ConfigResource(ResourceType.TOPIC, topic)
    futures = client.describe_configs([resource], request_timeout=15)
    return futures[resource].result(timeout=20)


def test_flush_configs_are_accepted_and_produces_acked(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b, config={"flush.messages": "1", "flush.ms": "0"})
    configs = _configs(b, topic)
    assert configs["flush.messages"].value == "1"
    assert configs["flush.messages"].source == DYNAMIC_TOPIC_CONFIG
    assert configs["flush.ms"].value == "0"
    offsets = produce(b, topic, [Msg(None, b"v%d" % i) for i in range(20)], acks="all")
    assert offsets == list(range(20))
    assert [m.value for m in consume(b, topic, 20)] == [b"v%d" % i for i in range(20)]


def test_flush_defaults_and_incremental_alter(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b)
    configs = _configs(b, topic)
    for name in ("flush.messages", "flush.ms"):
        assert configs[name].value == LONG_MAX
        assert configs[name].source == DEFAULT_CONFIG
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("flush.ms", "250", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    client = admin(b)
    client.incremental_alter_configs([resource])[resource].result(timeout=20)
    assert _configs(b, topic)["flush.ms"].value == "250"
    assert produce(b, topic, [Msg(None, b"x")]) == [0]


@pytest.mark.parametrize(("name", "value"), [("flush.messages", "0"), ("flush.ms", "-1")])
def test_flush_configs_out_of_range_are_invalid_config(module_broker, name, value):
    with pytest.raises(KafkaException) as info:
        create_topic(module_broker.bootstrap, config={name: value})
    assert info.value.args[0].code() == 40  # INVALID_CONFIG


def test_broker_wide_flush_defaults_reach_topics(module_broker):
    """log.flush.interval.messages / log.flush.interval.ms are the topics' defaults, set
    dynamically as on Kafka; a topic without an override reports them as its synonym."""
    b = module_broker.bootstrap
    topic = create_topic(b)
    client = KafkaAdminClient(bootstrap_servers=b, request_timeout_ms=15000)
    try:
        client.alter_configs(
            [
                KPConfigResource(
                    ConfigResourceType.BROKER, "1", {"log.flush.interval.messages": "1000"}
                )
            ]
        )
        entry = _configs(b, topic)["flush.messages"]
        assert entry.value == "1000"
        assert entry.source == DYNAMIC_BROKER_CONFIG
        assert produce(b, topic, [Msg(None, b"x")]) == [0]
    finally:
        client.alter_configs([KPConfigResource(ConfigResourceType.BROKER, "1", {})])
        client.close()


ACCEPTED = {
    "segment.jitter.ms": "1000",
    "delete.retention.ms": "1000",
    "min.compaction.lag.ms": "10",
    "max.compaction.lag.ms": "100000",
    "min.cleanable.dirty.ratio": "0.25",
    "file.delete.delay.ms": "0",
    "preallocate": "true",
    "unclean.leader.election.enable": "true",
    "leader.replication.throttled.replicas": "0:1",
    "follower.replication.throttled.replicas": "*",
    "compression.gzip.level": "9",
    "compression.lz4.level": "17",
    "compression.zstd.level": "-5",
    "remote.log.copy.disable": "false",
    "remote.log.delete.on.disable": "false",
}


def test_every_other_kafka_4_topic_config_is_accepted(module_broker):
    """Configs that have no effect on one broker without compaction are accepted as Kafka
    accepts them (infrastructure-as-code sets them), kept and described back; the topic
    works as usual (each one's reason is its documentation, stonemq/topic_configs.py)."""
    b = module_broker.bootstrap
    topic = create_topic(b, config=ACCEPTED)
    configs = _configs(b, topic)
    assert {name: configs[name].value for name in ACCEPTED} == ACCEPTED
    assert {configs[name].source for name in ACCEPTED} == {DYNAMIC_TOPIC_CONFIG}
    assert produce(b, topic, [Msg(None, b"x")]) == [0]
    # and the defaults without overrides are Kafka's
    plain = _configs(b, create_topic(b))
    assert plain["min.cleanable.dirty.ratio"].value == "0.5"
    assert plain["delete.retention.ms"].value == "86400000"
    assert plain["compression.zstd.level"].value == "3"
    assert plain["unclean.leader.election.enable"].value == "false"


# -- compression.type ---------------------------------------------------------------------------
CODEC_IDS = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def _stored_codecs(broker, topic: str, count: int) -> list[int]:  # type: ignore[no-untyped-def]
    return [
        DefaultRecordBatch(batch).compression_type
        for batch in fetch_batches(broker, topic, 0, 0, end=count)
    ]


@pytest.mark.parametrize("topic_codec", list(CODEC_IDS))
@pytest.mark.parametrize("producer_codec", ["none", "gzip", "zstd"])
def test_batches_are_stored_in_the_topics_codec(module_broker, topic_codec, producer_codec):
    """A batch whose codec differs from the topic's compression.type is recompressed (Kafka's
    LogValidator); consumers (librdkafka, kafka-python) read the same records."""
    b = module_broker.bootstrap
    topic = create_topic(b, config={"compression.type": topic_codec})
    sent = [Msg(b"k%d" % i, b"value %d " % i * 30) for i in range(40)]
    produce(b, topic, sent, **{"compression.type": producer_codec, "batch.num.messages": 10})
    codecs = _stored_codecs(module_broker, topic, 40)
    assert codecs and set(codecs) == {CODEC_IDS[topic_codec]}
    got = consume(b, topic, 40)
    assert [(m.key, m.value) for m in got] == [(m.key, m.value) for m in sent]
    consumer = KafkaConsumer(
        bootstrap_servers=b, auto_offset_reset="earliest", consumer_timeout_ms=10000
    )
    try:
        consumer.assign([KPTopicPartition(topic, 0)])
        values = [r.value for r in itertools.islice(consumer, 40)]
    finally:
        consumer.close()
    assert values == [m.value for m in sent]


def test_producer_keeps_each_batch_as_produced(module_broker):
    b = module_broker.bootstrap
    topic = create_topic(b)
    # compressible: librdkafka sends a batch uncompressed when compressing does not pay
    produce(b, topic, [Msg(None, b"a" * 1000)], **{"compression.type": "gzip"})
    produce(b, topic, [Msg(None, b"b" * 1000)], **{"compression.type": "lz4"})
    assert _stored_codecs(module_broker, topic, 2) == [1, 3]


def test_altering_compression_type_applies_to_new_batches(broker):
    """After IncrementalAlterConfigs the next batches are stored in the new codec (the old
    ones stay as they are, as in Kafka); a restart, which re-splits the journal tail, keeps
    every batch readable."""
    b = broker.bootstrap
    topic = create_topic(b, config={"compression.type": "snappy"})
    produce(b, topic, [Msg(None, b"before")], **{"compression.type": "none"})
    client = admin(b)
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("compression.type", "zstd", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry(
                "compression.zstd.level", "19", incremental_operation=AlterConfigOpType.SET
            ),
        ],
    )
    client.incremental_alter_configs([resource])[resource].result(timeout=20)
    produce(b, topic, [Msg(None, b"after")], **{"compression.type": "none"})
    assert _stored_codecs(broker, topic, 2) == [2, 4]
    broker.restart()
    assert [m.value for m in consume(b, topic, 2)] == [b"before", b"after"]
    assert _stored_codecs(broker, topic, 2) == [2, 4]


def test_unknown_compression_type_is_invalid_config(module_broker):
    with pytest.raises(KafkaException) as info:
        create_topic(module_broker.bootstrap, config={"compression.type": "brotli"})
    assert info.value.args[0].code() == 40
    assert "String must be one of" in info.value.args[0].str()


def test_a_cluster_default_of_a_topic_config_is_changed_at_runtime(broker) -> None:
    """Reproduced (an independent audit, f1): `kafka-configs --entity-type brokers
    --entity-default --add-config min.insync.replicas=2` (or compression.type) was refused. As
    in Kafka, the cluster-wide default is set at runtime, and a topic without its own value
    follows it at once: acks=all on this one broker is then NOT_ENOUGH_REPLICAS, and a
    topic created afterwards stores the default codec."""
    from confluent_kafka import Producer

    from .test_cluster_admin import _set_default

    topic = create_topic(broker.bootstrap)
    assert _set_default(broker, "min.insync.replicas", "2") == 0
    assert _set_default(broker, "compression.type", "gzip") == 0
    errors: list[object] = []
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "retries": 0})
    p.produce(topic, b"v", on_delivery=lambda err, msg: errors.append(err))
    p.flush(20)
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].name() == "NOT_ENOUGH_REPLICAS", errors[0]
    gzip_topic = create_topic(broker.bootstrap)
    produce(broker.bootstrap, gzip_topic, [Msg(b"k", b"v" * 100)], acks=1)
    assert _stored_codecs(broker, gzip_topic, 1) == [1]  # gzip, recompressed
    described = _configs(broker.bootstrap, gzip_topic)["compression.type"]
    assert described.value == "gzip"  # type: ignore[attr-defined]


@pytest.mark.broker_settings(**{"log.retention.check.interval.ms": 100})
def test_an_empty_cleanup_policy_keeps_what_retention_would_delete(broker) -> None:
    """Reproduced (an independent audit, f7): cleanup.policy="" was INVALID_CONFIG. Kafka 4
    takes the empty list, and then deletes by time and size only under delete: beside a
    topic with delete, whose old segments go, the same retention keeps everything."""
    import time

    from .helpers import low_watermark

    small = {"internal.segment.bytes": "2048", "retention.ms": "100"}
    kept = create_topic(broker.bootstrap, config={**small, "cleanup.policy": ""})
    deleted = create_topic(broker.bootstrap, config=small)
    for topic in (kept, deleted):
        produce(
            broker.bootstrap, topic, [Msg(b"k", b"v" * 500)] * 20, acks=1, **{"batch.size": 1024}
        )
    deadline = time.monotonic() + 20
    while low_watermark(broker.bootstrap, deleted) == 0:
        assert time.monotonic() < deadline, "retention never ran on the delete topic"
        time.sleep(0.2)
    time.sleep(1)  # several more retention rounds
    assert low_watermark(broker.bootstrap, kept) == 0
    assert _configs(broker.bootstrap, kept)["cleanup.policy"].value == ""  # type: ignore[attr-defined]
    # nor does DeleteRecords delete there: POLICY_VIOLATION, as Kafka's
    # Partition.deleteRecordsOnLeader without delete (an independent audit: it was applied)
    from kio.schema.errors import ErrorCode

    from .test_delete_records import raw_delete

    for version in (0, 1, 2):
        assert raw_delete(broker.port, version, kept, 0, 3) == (ErrorCode.policy_violation, -1)
    assert low_watermark(broker.bootstrap, kept) == 0
    assert raw_delete(broker.port, 2, deleted, 0, -1)[0] == ErrorCode.none
