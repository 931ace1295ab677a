"""Kafka 4's topic configs set as Kafka's tools set them (confluent-kafka CreateTopics and
IncrementalAlterConfigs, kafka-python AlterConfigs for the broker-wide defaults), on a broker
whose journal policy never fsyncs on its own: flush.messages and flush.ms are accepted,
described with Kafka's sources and synonyms, and produces to the topic are acknowledged (the
fsync each ack waits for is seen by the storage tests, tests/unit/storage/test_topic_flush.py);
the configs without effect on one broker are accepted and described back."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from kafka.admin import ConfigResource as KPConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient

from .helpers import Msg, admin, consume, create_topic, produce

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
