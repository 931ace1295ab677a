"""Tests of the config registry: parsing, validation, precedence, sources and synonyms."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from stonemq.config import Settings
from stonemq.protocol.record_batch import COMPRESSION_LZ4, COMPRESSION_ZSTD
from stonemq.storage.engine import LogConfig
from stonemq.topic_configs import (
    BROKER_CONFIGS,
    DYNAMIC_BROKER_CONFIGS,
    TOPIC_CONFIGS,
    ConfigOp,
    ConfigSource,
    ConfigType,
    DynamicBrokerConfigs,
    InvalidConfigError,
    InvalidRequestError,
    apply_incremental,
    broker_value,
    describe_broker,
    describe_broker_defaults,
    format_value,
    resolve_topic,
    topic_config_type,
    validate_broker_configs,
    validate_topic_configs,
)
from stonemq.topic_configs import (
    NO_DYNAMIC_BROKER_CONFIGS as NONE,
)


def entry(config, name):  # type: ignore[no-untyped-def]
    return next(e for e in config.entries if e.name == name)


def test_registry_names_and_synonyms() -> None:
    assert {k: v.synonym for k, v in TOPIC_CONFIGS.items()} == {
        "cleanup.policy": "log.cleanup.policy",
        "retention.ms": "log.retention.ms",
        "retention.bytes": "log.retention.bytes",
        "segment.bytes": "log.segment.bytes",
        "internal.segment.bytes": None,
        "segment.ms": "log.roll.ms",
        "segment.index.bytes": "log.index.size.max.bytes",
        "index.interval.bytes": "log.index.interval.bytes",
        "max.message.bytes": "message.max.bytes",
        "message.timestamp.type": "log.message.timestamp.type",
        "message.timestamp.before.max.ms": "log.message.timestamp.before.max.ms",
        "message.timestamp.after.max.ms": "log.message.timestamp.after.max.ms",
        "compression.type": "compression.type",
        "min.insync.replicas": "min.insync.replicas",
        "remote.storage.enable": None,
        "local.retention.ms": "log.local.retention.ms",
        "local.retention.bytes": "log.local.retention.bytes",
        "flush.messages": "log.flush.interval.messages",
        "flush.ms": "log.flush.interval.ms",
        "segment.jitter.ms": "log.roll.jitter.ms",
        "delete.retention.ms": "log.cleaner.delete.retention.ms",
        "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
        "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
        "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
        "file.delete.delay.ms": "log.segment.delete.delay.ms",
        "preallocate": "log.preallocate",
        "unclean.leader.election.enable": "unclean.leader.election.enable",
        "leader.replication.throttled.replicas": None,
        "follower.replication.throttled.replicas": None,
        "compression.gzip.level": "compression.gzip.level",
        "compression.lz4.level": "compression.lz4.level",
        "compression.zstd.level": "compression.zstd.level",
        "remote.log.copy.disable": None,
        "remote.log.delete.on.disable": None,
    }
    # Every synonym is a broker config, so DescribeConfigs can show it.
    for key in TOPIC_CONFIGS.values():
        assert key.synonym is None or key.synonym in BROKER_CONFIGS


def test_single_valued_kafka_configs_accept_only_what_stonemq_does() -> None:
    ok = validate_topic_configs({"compression.type": "producer", "min.insync.replicas": "1"})
    assert ok == {"compression.type": "producer", "min.insync.replicas": "1"}
    with pytest.raises(InvalidConfigError, match="String must be one of"):
        validate_topic_configs({"compression.type": "brotli"})
    # min.insync.replicas is Kafka's (at least 1); a single node answers an acks=all produce
    # to a topic asking for more than its ISR of one with NOT_ENOUGH_REPLICAS
    assert validate_topic_configs({"min.insync.replicas": "2"}) == {"min.insync.replicas": "2"}
    with pytest.raises(InvalidConfigError, match="at least 1"):
        validate_topic_configs({"min.insync.replicas": "0"})


def test_defaults_come_from_settings_defaults() -> None:
    config = resolve_topic(Settings(), NONE, {})
    assert config.log_config == LogConfig()
    assert config.max_message_bytes == 1_048_588
    assert config.timestamp_type == "CreateTime"
    for e in config.entries:
        assert e.source is ConfigSource.DEFAULT_CONFIG
        assert len(e.synonyms) == 1
    assert entry(config, "cleanup.policy").value == "delete"
    assert entry(config, "cleanup.policy").type is ConfigType.LIST
    assert entry(config, "retention.ms").synonyms[0].name == "log.retention.ms"


def test_precedence_override_dynamic_static_default() -> None:
    settings = Settings(log_retention_ms=3000)
    dynamic = DynamicBrokerConfigs(own={"log.retention.ms": "2000"})
    overrides = {"retention.ms": "1000"}

    config = resolve_topic(settings, dynamic, overrides)
    e = entry(config, "retention.ms")
    assert (e.value, e.source) == ("1000", ConfigSource.DYNAMIC_TOPIC_CONFIG)
    assert [(s.name, s.value, s.source) for s in e.synonyms] == [
        ("retention.ms", "1000", ConfigSource.DYNAMIC_TOPIC_CONFIG),
        ("log.retention.ms", "2000", ConfigSource.DYNAMIC_BROKER_CONFIG),
        ("log.retention.ms", "3000", ConfigSource.STATIC_BROKER_CONFIG),
        ("log.retention.ms", "604800000", ConfigSource.DEFAULT_CONFIG),
    ]
    assert config.log_config.retention_ms == 1000

    config = resolve_topic(settings, dynamic, {})
    assert entry(config, "retention.ms").source is ConfigSource.DYNAMIC_BROKER_CONFIG
    assert config.log_config.retention_ms == 2000

    config = resolve_topic(settings, NONE, {})
    assert entry(config, "retention.ms").source is ConfigSource.STATIC_BROKER_CONFIG
    assert config.log_config.retention_ms == 3000


def test_retention_and_roll_in_minutes_and_hours_as_kafka() -> None:
    """Kafka's log.retention.minutes / .hours and log.roll.hours (its server.properties sets
    log.retention.hours=168): each name takes its highest level first, then .ms wins over
    .minutes over .hours, as KafkaConfig.logRetentionTimeMillis; a negative one is no time
    limit. They did not exist: in the settings file the broker refused to start, in the
    environment they were ignored and topics kept 7 days (audit35 p2)."""
    hours = resolve_topic(Settings(log_retention_hours=1, log_roll_hours=2), NONE, {})
    assert hours.log_config.retention_ms == 3_600_000
    assert hours.log_config.segment_ms == 7_200_000
    e = entry(hours, "retention.ms")
    assert (e.value, e.source) == ("3600000", ConfigSource.STATIC_BROKER_CONFIG)
    assert [(s.name, s.value, s.source) for s in e.synonyms] == [
        ("log.retention.hours", "1", ConfigSource.STATIC_BROKER_CONFIG),
        ("log.retention.ms", "604800000", ConfigSource.DEFAULT_CONFIG),
    ]
    minutes = Settings(log_retention_hours=1, log_retention_minutes=30)
    assert resolve_topic(minutes, NONE, {}).log_config.retention_ms == 1_800_000
    # a name set at any level beats a coarser one set at a higher level (Kafka merges each
    # name's levels, then takes .ms, else .minutes, else .hours)
    dynamic_hours = DynamicBrokerConfigs(default={"log.retention.hours": "5"})
    assert resolve_topic(minutes, dynamic_hours, {}).log_config.retention_ms == 1_800_000
    ms = Settings(log_retention_ms=1000, log_retention_minutes=30)
    assert resolve_topic(ms, NONE, {}).log_config.retention_ms == 1000
    assert resolve_topic(Settings(), dynamic_hours, {}).log_config.retention_ms == 18_000_000
    forever = resolve_topic(Settings(log_retention_hours=-1), NONE, {})
    assert forever.log_config.retention_ms == -1
    assert resolve_topic(Settings(), NONE, {"retention.ms": "5"}).log_config.retention_ms == 5
    assert validate_broker_configs({"log.retention.hours": "24"}) == {"log.retention.hours": "24"}
    assert validate_broker_configs({"log.roll.hours": "1"}) == {"log.roll.hours": "1"}
    with pytest.raises(InvalidConfigError):
        validate_broker_configs({"log.roll.hours": "0"})
    with pytest.raises(ValidationError):
        Settings(log_retention_hours=2**31)  # Kafka's INT
    described = {e.name: e for e in describe_broker(Settings(), NONE)}
    assert described["log.retention.hours"].value == "168"
    assert described["log.roll.hours"].value == "168"
    assert described["log.retention.minutes"].value is None


def test_every_log_config_field_is_fed() -> None:
    overrides = {
        "segment.bytes": "1048576",
        "segment.ms": "2000",
        "retention.ms": "3000",
        "retention.bytes": "4000",
        "index.interval.bytes": "5000",
        "segment.index.bytes": "6000",
        "max.message.bytes": "7000",
        "message.timestamp.type": "LogAppendTime",
    }
    config = resolve_topic(Settings(), NONE, validate_topic_configs(overrides))
    assert config.log_config == LogConfig(
        segment_bytes=1048576,
        segment_ms=2000,
        retention_ms=3000,
        retention_bytes=4000,
        index_interval_bytes=5000,
        segment_index_bytes=6000,
        max_message_bytes=7000,
    )
    assert config.max_message_bytes == 7000
    assert config.timestamp_type == "LogAppendTime"


@pytest.mark.parametrize(
    "configs",
    [
        {"retention.ms": "-2"},
        {"retention.ms": "abc"},
        {"retention.ms": "1.5"},
        {"segment.bytes": "13"},
        {"segment.bytes": "1048575"},
        {"segment.bytes": str(2**31)},
        {"internal.segment.bytes": "13"},
        {"segment.ms": "0"},
        {"segment.index.bytes": "3"},
        {"index.interval.bytes": "-1"},
        {"max.message.bytes": "-1"},
        {"message.timestamp.type": "createtime"},
        {"cleanup.policy": "compact"},
        {"cleanup.policy": "delete,compact"},
        {"cleanup.policy": "bogus"},
        {"no.such.config": "1"},
        {"retention.ms": None},
    ],
)
def test_invalid_topic_configs(configs: dict[str, str | None]) -> None:
    with pytest.raises(InvalidConfigError) as info:
        validate_topic_configs(configs)
    assert info.value.error_code == 40


def test_valid_topic_configs_are_canonical() -> None:
    assert validate_topic_configs({"retention.ms": " 100 ", "cleanup.policy": "delete"}) == {
        "retention.ms": "100",
        "cleanup.policy": "delete",
    }
    assert validate_topic_configs({"retention.ms": "-1", "retention.bytes": "-1"}) == {
        "retention.ms": "-1",
        "retention.bytes": "-1",
    }


@given(st.integers(min_value=-1, max_value=2**63 - 1))
def test_retention_ms_accepts_longs(value: int) -> None:
    assert validate_topic_configs({"retention.ms": str(value)}) == {"retention.ms": str(value)}


def test_broker_configs_listing() -> None:
    for name in (
        "num.partitions",
        "auto.create.topics.enable",
        "log.retention.ms",
        "message.max.bytes",
        "journal.partitions",
        "broker.id",
    ):
        assert name in BROKER_CONFIGS
    for name in DYNAMIC_BROKER_CONFIGS:
        assert BROKER_CONFIGS[name].dynamic
    assert not BROKER_CONFIGS["journal.partitions"].dynamic
    entries = {e.name: e for e in describe_broker(Settings(num_partitions=2), NONE)}
    assert entries["num.partitions"].value == "2"
    assert entries["num.partitions"].source is ConfigSource.STATIC_BROKER_CONFIG
    assert entries["auto.create.topics.enable"].value == "true"
    assert entries["auto.create.topics.enable"].type is ConfigType.BOOLEAN
    assert entries["log.retention.ms"].type is ConfigType.LONG
    assert entries["journal.partitions"].read_only
    assert not entries["log.retention.ms"].read_only


def test_broker_dynamic_validation() -> None:
    assert validate_broker_configs({"auto.create.topics.enable": "FALSE"}) == {
        "auto.create.topics.enable": "false"
    }
    with pytest.raises(InvalidConfigError):
        validate_broker_configs({"num.partitions": "0"})
    with pytest.raises(InvalidConfigError):
        validate_broker_configs({"log.message.timestamp.type": "Nope"})
    with pytest.raises(InvalidConfigError):
        validate_broker_configs({"no.such": "1"})
    with pytest.raises(InvalidRequestError):
        validate_broker_configs({"journal.partitions": "8"})


def test_broker_value_precedence() -> None:
    settings = Settings(num_partitions=2)
    own = DynamicBrokerConfigs(own={"num.partitions": "5"})
    default = DynamicBrokerConfigs(default={"num.partitions": "4"})
    both = DynamicBrokerConfigs(own={"num.partitions": "5"}, default={"num.partitions": "4"})
    assert broker_value(settings, NONE, "num.partitions") == 2
    assert broker_value(settings, own, "num.partitions") == 5
    assert broker_value(settings, default, "num.partitions") == 4
    assert broker_value(settings, both, "num.partitions") == 5
    assert broker_value(Settings(), NONE, "num.partitions") == 1
    off = DynamicBrokerConfigs(default={"auto.create.topics.enable": "false"})
    assert broker_value(settings, off, "auto.create.topics.enable") is False


def test_the_two_dynamic_broker_levels_in_describe() -> None:
    """This broker's own value over the cluster-wide default, each with its Kafka source;
    resource "" lists only the configs set as cluster-wide defaults."""
    settings = Settings(log_retention_ms=3000)
    both = DynamicBrokerConfigs(
        own={"log.retention.ms": "2000"},
        default={"log.retention.ms": "2500", "num.partitions": "6"},
    )
    entries = {e.name: e for e in describe_broker(settings, both)}
    assert [(s.value, s.source) for s in entries["log.retention.ms"].synonyms] == [
        ("2000", ConfigSource.DYNAMIC_BROKER_CONFIG),
        ("2500", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG),
        ("3000", ConfigSource.STATIC_BROKER_CONFIG),
        ("604800000", ConfigSource.DEFAULT_CONFIG),
    ]
    assert entries["num.partitions"].source is ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG
    defaults = {e.name: e for e in describe_broker_defaults(settings, both)}
    assert set(defaults) == {"log.retention.ms", "num.partitions"}
    assert (defaults["log.retention.ms"].value, defaults["log.retention.ms"].source) == (
        "2500",
        ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG,
    )
    # Kafka's ConfigHelper: only the cluster-default level as synonym there (an independent
    # audit, f7: the static and default levels were listed too)
    assert [(s.value, s.source) for s in defaults["log.retention.ms"].synonyms] == [
        ("2500", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)
    ]
    topic = resolve_topic(settings, DynamicBrokerConfigs(default={"log.retention.ms": "2500"}), {})
    assert entry(topic, "retention.ms").source is ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG
    assert topic.log_config.retention_ms == 2500


def test_incremental_set_delete() -> None:
    current = {"retention.ms": "1", "segment.ms": "5"}
    out = apply_incremental(
        current,
        [("retention.ms", ConfigOp.DELETE, None), ("segment.bytes", ConfigOp.SET, "100")],
        topic_config_type,
        lambda _: None,
    )
    assert out == {"segment.ms": "5", "segment.bytes": "100"}
    assert current == {"retention.ms": "1", "segment.ms": "5"}


def test_incremental_append_subtract_lists_only() -> None:
    out = apply_incremental(
        {}, [("cleanup.policy", ConfigOp.APPEND, "compact")], topic_config_type, lambda _: "delete"
    )
    assert out == {"cleanup.policy": "delete,compact"}
    out = apply_incremental(
        {"cleanup.policy": "delete,compact"},
        [("cleanup.policy", ConfigOp.SUBTRACT, "compact")],
        topic_config_type,
        lambda _: None,
    )
    assert out == {"cleanup.policy": "delete"}
    with pytest.raises(InvalidConfigError):
        apply_incremental(
            {}, [("retention.ms", ConfigOp.APPEND, "1")], topic_config_type, lambda _: "5"
        )


def test_incremental_rejects_duplicates_bad_ops_unknown_names() -> None:
    with pytest.raises(InvalidRequestError):
        apply_incremental(
            {},
            [("retention.ms", 0, "1"), ("retention.ms", 1, None)],
            topic_config_type,
            lambda _: None,
        )
    with pytest.raises(InvalidRequestError):
        apply_incremental({}, [("retention.ms", 9, "1")], topic_config_type, lambda _: None)
    with pytest.raises(InvalidConfigError):
        apply_incremental({}, [("nope", 0, "1")], topic_config_type, lambda _: None)


# Kafka 4.0's topic configs (TopicConfig / LogConfig: message.format.version,
# message.timestamp.difference.max.ms and message.downconversion.enable are gone in 4.0)
KAFKA_4_TOPIC_CONFIGS = {
    "cleanup.policy", "compression.type", "compression.gzip.level", "compression.lz4.level",
    "compression.zstd.level", "delete.retention.ms", "file.delete.delay.ms", "flush.messages",
    "flush.ms", "follower.replication.throttled.replicas", "index.interval.bytes",
    "leader.replication.throttled.replicas", "local.retention.bytes", "local.retention.ms",
    "max.compaction.lag.ms", "max.message.bytes", "message.timestamp.after.max.ms",
    "message.timestamp.before.max.ms", "message.timestamp.type", "min.cleanable.dirty.ratio",
    "min.compaction.lag.ms", "min.insync.replicas", "preallocate", "remote.storage.enable",
    "remote.log.copy.disable", "remote.log.delete.on.disable", "retention.bytes",
    "retention.ms", "segment.bytes", "segment.index.bytes", "segment.jitter.ms", "segment.ms",
    "unclean.leader.election.enable", "internal.segment.bytes",
}  # fmt: skip


def test_every_kafka_4_topic_config_is_known_and_documented() -> None:
    assert set(TOPIC_CONFIGS) == KAFKA_4_TOPIC_CONFIGS
    for key in TOPIC_CONFIGS.values():
        assert key.doc, key.name
        default = format_value(key.default) if key.synonym is None else None
        if default is not None:  # Kafka's default passes Kafka's validation
            assert validate_topic_configs({key.name: default}) == {key.name: default}


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("min.cleanable.dirty.ratio", "1.5"),
        ("min.cleanable.dirty.ratio", "half"),
        ("compression.gzip.level", "0"),
        ("compression.lz4.level", "18"),
        ("compression.zstd.level", "23"),
        ("leader.replication.throttled.replicas", "0:1,x"),
        ("segment.jitter.ms", "-1"),
        ("max.compaction.lag.ms", "0"),
        ("preallocate", "yes"),
    ],
)
def test_accepted_configs_are_validated_as_kafka_does(name: str, bad: str) -> None:
    with pytest.raises(InvalidConfigError, match=name):
        validate_topic_configs({name: bad})


@pytest.mark.parametrize(
    ("codec_name", "codec", "level"),
    [("producer", -1, -1), ("uncompressed", 0, -1), ("gzip", 1, 9), ("snappy", 2, -1),
     ("lz4", 3, 12), ("zstd", 4, -7)],
)  # fmt: skip
def test_compression_type_reaches_storage_with_its_level(codec_name, codec, level) -> None:
    overrides = {"compression.type": codec_name}
    if codec_name in ("gzip", "lz4", "zstd"):
        overrides[f"compression.{codec_name}.level"] = str(level)
    log_config = resolve_topic(Settings(), NONE, overrides).log_config
    assert (log_config.compression, log_config.compression_level) == (codec, level)


def test_segment_bytes_is_at_least_one_mib_as_in_kafka_4() -> None:
    """KIP-1030 (Kafka 4.0): segment.bytes and log.segment.bytes are at least 1 MiB; a smaller
    one is INVALID_CONFIG with Kafka's message. It used to be taken down to 14 bytes."""
    with pytest.raises(InvalidConfigError, match="Value must be at least 1048576"):
        validate_topic_configs({"segment.bytes": "1048575"})
    with pytest.raises(InvalidConfigError, match=r"log\.segment\.bytes: .* 1048576"):
        validate_broker_configs({"log.segment.bytes": "524288"})
    with pytest.raises(ValidationError):
        Settings(log_segment_bytes=1048575)
    assert validate_topic_configs({"segment.bytes": "1048576"}) == {"segment.bytes": "1048576"}


def test_internal_segment_bytes_sizes_segments_and_is_not_described() -> None:
    """Kafka 4's internal.segment.bytes (LogConfig.INTERNAL_SEGMENT_BYTES_CONFIG, testing
    only): when set it is the segment size, below the 1 MiB minimum; DescribeConfigs does not
    list it, and segment.bytes is still described as resolved."""
    overrides = validate_topic_configs({"internal.segment.bytes": "8192"})
    config = resolve_topic(Settings(), NONE, overrides)
    assert config.log_config.segment_bytes == 8192
    assert "internal.segment.bytes" not in config.strings()
    assert entry(config, "segment.bytes").value == str(1 << 30)
    assert resolve_topic(Settings(), NONE, {}).log_config.segment_bytes == 1 << 30


def test_every_topic_configs_broker_synonym_is_a_dynamic_broker_config() -> None:
    """Reproduced (an independent audit, f1): min.insync.replicas, log.cleanup.policy,
    unclean.leader.election.enable and log.local.retention.* were refused as not dynamic, and
    compression.type, the codec levels, log.roll.jitter.ms, log.segment.delete.delay.ms,
    log.preallocate and the log.cleaner.* defaults were unknown. Kafka's DynamicLogConfig
    lets AlterConfigs change every topic config's broker-level synonym; a topic without its
    own value takes it, with its source."""
    for key in TOPIC_CONFIGS.values():
        if key.synonym is not None:
            assert BROKER_CONFIGS[key.synonym].dynamic, key.synonym
    accepted = validate_broker_configs(
        {
            "min.insync.replicas": "2",
            "compression.type": "zstd",
            "compression.zstd.level": "7",
            "log.cleanup.policy": "delete",
            "log.cleaner.min.cleanable.ratio": "0.7",
            "unclean.leader.election.enable": "true",
        }
    )
    assert accepted["compression.type"] == "zstd"
    with pytest.raises(InvalidConfigError):
        validate_broker_configs({"compression.type": "brotli"})
    with pytest.raises(InvalidConfigError):
        validate_broker_configs({"log.cleanup.policy": "compact"})
    topic = resolve_topic(Settings(), DynamicBrokerConfigs(default=accepted), {})
    assert entry(topic, "compression.type").source is ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG
    assert topic.log_config.compression == COMPRESSION_ZSTD
    assert topic.log_config.compression_level == 7
    assert topic.values["min.insync.replicas"] == 2
    own = resolve_topic(
        Settings(), DynamicBrokerConfigs(default=accepted), {"compression.type": "lz4"}
    )
    assert own.log_config.compression == COMPRESSION_LZ4


def test_an_empty_cleanup_policy_means_no_time_or_size_retention() -> None:
    """Reproduced (an independent audit, f7): cleanup.policy="" was INVALID_CONFIG; Kafka 4's
    ValidList takes an empty list, and its UnifiedLog then deletes by time and size only
    under delete: retention.ms and retention.bytes have no effect (DeleteRecords still
    moves the log start)."""
    overrides = validate_topic_configs(
        {"cleanup.policy": "", "retention.ms": "1000", "retention.bytes": "10"}
    )
    assert overrides["cleanup.policy"] == ""
    config = resolve_topic(Settings(), NONE, overrides)
    assert (config.log_config.retention_ms, config.log_config.retention_bytes) == (-1, -1)
    assert entry(config, "retention.ms").value == "1000"  # described as set
    kept = resolve_topic(Settings(), NONE, {"retention.ms": "1000"})
    assert kept.log_config.retention_ms == 1000
