"""The registry of configs: topic-level configs the broker honours, broker configs it exposes.

Names, types, defaults and validation follow Kafka. A topic config's value comes from, in order:
the topic's own override (DYNAMIC_TOPIC_CONFIG), the dynamic broker config of its synonym set
through AlterConfigs, this broker's own (resource ``<broker id>``, DYNAMIC_BROKER_CONFIG) over
the cluster-wide default (resource ``""``, DYNAMIC_DEFAULT_BROKER_CONFIG), the broker setting
given by flag, environment or file (STATIC_BROKER_CONFIG), and the built-in default
(DEFAULT_CONFIG). :func:`resolve_topic`
applies that order and gives both the DescribeConfigs view (value, source, synonyms) and the
:class:`~stonemq.storage.engine.LogConfig` storage needs.

Errors raised here and by the topic manager carry the Kafka error code they map to.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from re import compile as re_compile
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from stonemq.config_values import ALIAS_SETTINGS, FieldSpec, check_value, fields
from stonemq.protocol.record_batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
)
from stonemq.storage.engine import PRODUCER_COMPRESSION, LogConfig

if TYPE_CHECKING:
    from stonemq.config import Settings


class ConfigType(enum.IntEnum):
    """DescribeConfigs' ``config_type``."""

    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


class ConfigSource(enum.IntEnum):
    """DescribeConfigs' ``config_source`` (and a synonym's ``source``)."""

    UNKNOWN = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5
    DYNAMIC_BROKER_LOGGER_CONFIG = 6


class ConfigOp(enum.IntEnum):
    """IncrementalAlterConfigs' ``config_operation``."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


class AdminError(Exception):
    """A request that cannot be carried out; ``error_code`` is the Kafka error to answer."""

    error_code: ErrorCode = ErrorCode.unknown_server_error

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidConfigError(AdminError):
    error_code = ErrorCode.invalid_config


class InvalidRequestError(AdminError):
    error_code = ErrorCode.invalid_request


# -- values -------------------------------------------------------------------------------------
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_SHORT_MIN, _SHORT_MAX = -(2**15), 2**15 - 1


def parse_value(name: str, type_: ConfigType, raw: str) -> Any:
    """Parse a config value given as a string, the way Kafka's ConfigDef does."""
    text = raw.strip()
    if type_ in (ConfigType.INT, ConfigType.LONG, ConfigType.SHORT):
        low, high = {
            ConfigType.INT: (_INT_MIN, _INT_MAX),
            ConfigType.LONG: (_LONG_MIN, _LONG_MAX),
            ConfigType.SHORT: (_SHORT_MIN, _SHORT_MAX),
        }[type_]
        try:
            if not text.lstrip("+-").isdigit() or not text.isascii():
                raise ValueError
            value = int(text)
        except ValueError:
            raise _invalid(name, raw, f"Not a number of type {type_.name}") from None
        if not low <= value <= high:
            raise _invalid(name, raw, f"Not a number of type {type_.name}")
        return value
    if type_ is ConfigType.BOOLEAN:
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise _invalid(name, raw, "Expected value to be either true or false")
    if type_ is ConfigType.LIST:
        return [item.strip() for item in text.split(",")] if text else []
    if type_ is ConfigType.DOUBLE:
        try:
            value = float(text)
        except ValueError:
            raise _invalid(name, raw, "Not a number of type DOUBLE") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise _invalid(name, raw, "Not a number of type DOUBLE")
        return value
    return text


def format_value(value: Any) -> str | None:
    """A config value as DescribeConfigs reports it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _invalid(name: str, raw: str | None, why: str) -> InvalidConfigError:
    return InvalidConfigError(f"Invalid value {raw} for configuration {name}: {why}")


def _at_least(low: int) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if value < low:
            raise _invalid(name, format_value(value), f"Value must be at least {low}")

    return check


def _between(low: float, high: float, *also: int) -> Callable[[str, Any], None]:
    """Kafka's ``Range.between`` (and the codec level validators: ``also`` the extra values
    allowed, gzip's -1 default)."""

    def check(name: str, value: Any) -> None:
        if value in also:
            return
        if not low <= value <= high:
            raise _invalid(name, format_value(value), f"Value must be between {low} and {high}")

    return check


_THROTTLED_REPLICA = re_compile(r"[0-9]+:[0-9]+")


def _throttled_replicas(name: str, value: Any) -> None:
    """Kafka's ThrottledReplicaListValidator: ``*`` or ``partition:broker`` entries."""
    if value == ["*"] or all(_THROTTLED_REPLICA.fullmatch(item) for item in value):
        return
    raise _invalid(
        name,
        format_value(value),
        "must be the literal '*' or a list of replicas in the following format: "
        "[partitionId]:[brokerId],[partitionId]:[brokerId],...",
    )


def _one_of(*allowed: str) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if value not in allowed:
            raise _invalid(name, value, f"String must be one of: {', '.join(allowed)}")

    return check


def _only(allowed: Any, why: str) -> Callable[[str, Any], None]:
    """For a Kafka config whose only value StoneMQ can honour is ``allowed``."""

    def check(name: str, value: Any) -> None:
        if value != allowed:
            raise _invalid(name, format_value(value), why)

    return check


def _cleanup_policy(name: str, value: Any) -> None:
    for item in value:
        if item not in ("delete", "compact"):
            raise _invalid(
                name, format_value(value), f"Invalid value {item}; must be one of [compact, delete]"
            )
    if "compact" in value:
        raise _invalid(
            name, format_value(value), "StoneMQ does not support log compaction yet; use delete"
        )
    # an empty list passes, as Kafka's ValidList: neither delete nor compact, so no time or
    # size retention, and DeleteRecords is POLICY_VIOLATION (handlers/delete_records.py)


# -- topic configs ------------------------------------------------------------------------------
MIN_SEGMENT_BYTES = 1024 * 1024
"""segment.bytes' and log.segment.bytes' minimum since Kafka 4.0 (KIP-1030)."""
INTERNAL_SEGMENT_BYTES = "internal.segment.bytes"
"""Kafka 4's internal topic config (``LogConfig.INTERNAL_SEGMENT_BYTES_CONFIG``): when set, the
segment size in place of segment.bytes, with no 1 MiB minimum; not returned by
DescribeConfigs. Tests (Kafka's and ours) use it for small segments."""
COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
"""Kafka's compression.type values (BrokerCompressionType)."""
_CODECS = {
    "uncompressed": COMPRESSION_NONE,
    "gzip": COMPRESSION_GZIP,
    "snappy": COMPRESSION_SNAPPY,
    "lz4": COMPRESSION_LZ4,
    "zstd": COMPRESSION_ZSTD,
    "producer": PRODUCER_COMPRESSION,
}


@dataclass(frozen=True, slots=True)
class TopicConfigKey:
    """One topic-level config: its Kafka name, type, validation and default's broker synonym."""

    name: str
    type: ConfigType
    doc: str
    synonym: str | None  # the broker config that supplies the default (Kafka name)
    default: Any = None  # used when no broker setting exists for the synonym
    validator: Callable[[str, Any], None] | None = None
    log_field: str | None = None  # the LogConfig attribute it feeds
    internal: bool = False  # Kafka's defineInternal: settable, never described
    # broker synonyms in coarser units after ``synonym``, with their factor to it (Kafka's
    # log.retention.minutes and .hours for retention.ms): the first of ``synonym`` and these
    # that is set at any level gives the default, as KafkaConfig.logRetentionTimeMillis
    coarser: tuple[tuple[str, int], ...] = ()

    def parse(self, raw: str | None) -> Any:
        """Parse and validate a value given by a client; raises :class:`InvalidConfigError`."""
        if raw is None:
            raise InvalidConfigError(f"Null value not supported for topic config {self.name}")
        value = parse_value(self.name, self.type, raw)
        if self.validator is not None:
            self.validator(self.name, value)
        return value


TOPIC_CONFIGS: dict[str, TopicConfigKey] = {
    key.name: key
    for key in (
        TopicConfigKey(
            "cleanup.policy",
            ConfigType.LIST,
            "The retention policy for old log segments: 'delete' discards old segments when "
            "their retention time or size limit is reached; an empty list keeps them all "
            "(DeleteRecords refused too). StoneMQ has no log compaction yet.",
            synonym="log.cleanup.policy",
            default=["delete"],
            validator=_cleanup_policy,
        ),
        TopicConfigKey(
            "retention.ms",
            ConfigType.LONG,
            "The longest time a log segment is kept before it is discarded to free space; "
            "-1 means no time limit.",
            synonym="log.retention.ms",
            validator=_at_least(-1),
            log_field="retention_ms",
            coarser=(("log.retention.minutes", 60_000), ("log.retention.hours", 3_600_000)),
        ),
        TopicConfigKey(
            "retention.bytes",
            ConfigType.LONG,
            "The largest a partition can grow before old segments are discarded; -1 means no "
            "size limit.",
            synonym="log.retention.bytes",
            log_field="retention_bytes",
        ),
        TopicConfigKey(
            "segment.bytes",
            ConfigType.INT,
            "The segment file size of the partition's queue log.",
            synonym="log.segment.bytes",
            validator=_at_least(MIN_SEGMENT_BYTES),
        ),
        TopicConfigKey(
            INTERNAL_SEGMENT_BYTES,
            ConfigType.INT,
            "The segment file size of the partition's queue log, below segment.bytes' minimum; "
            "for testing only.",
            synonym=None,
            validator=_at_least(14),
            internal=True,
        ),
        TopicConfigKey(
            "segment.ms",
            ConfigType.LONG,
            "The time after which a queue-log segment is rolled even if it is not full, so "
            "retention can delete or compact old data.",
            synonym="log.roll.ms",
            validator=_at_least(1),
            log_field="segment_ms",
            coarser=(("log.roll.hours", 3_600_000),),
        ),
        TopicConfigKey(
            "segment.index.bytes",
            ConfigType.INT,
            "The size of the index that maps offsets to file positions.",
            synonym="log.index.size.max.bytes",
            validator=_at_least(4),
            log_field="segment_index_bytes",
        ),
        TopicConfigKey(
            "index.interval.bytes",
            ConfigType.INT,
            "How often an entry is added to the offset index (bytes of log between entries).",
            synonym="log.index.interval.bytes",
            validator=_at_least(0),
            log_field="index_interval_bytes",
        ),
        TopicConfigKey(
            "max.message.bytes",
            ConfigType.INT,
            "The largest record batch size allowed for this topic.",
            synonym="message.max.bytes",
            validator=_at_least(0),
            log_field="max_message_bytes",
        ),
        TopicConfigKey(
            "compression.type",
            ConfigType.STRING,
            "The codec of stored batches: 'producer' keeps each batch as the producer "
            "compressed it (written as received, no copy); 'uncompressed', 'gzip', 'snappy', "
            "'lz4' or 'zstd' has every batch in another codec recompressed by the broker as "
            "it moves from the journal to the partition's log (in the splitter's thread, off "
            "the event loop), so consumers read the topic's codec.",
            synonym="compression.type",
            default="producer",
            validator=_one_of(*COMPRESSION_TYPES),
        ),
        TopicConfigKey(
            "flush.messages",
            ConfigType.LONG,
            "Records of a partition after which the journal holding them is fsynced; the "
            "produce that reaches the count is acknowledged once the fsync is done (1: every "
            "batch is durable before its ack). The default leaves it to journal.flush.policy.",
            synonym="log.flush.interval.messages",
            validator=_at_least(1),
            log_field="flush_messages",
        ),
        TopicConfigKey(
            "flush.ms",
            ConfigType.LONG,
            "The longest a record of this topic stays written but not fsynced: the journal "
            "holding it is fsynced at most this long after the append (0: before the ack, "
            "which waits for it). The default leaves it to journal.flush.policy.",
            synonym="log.flush.interval.ms",
            validator=_at_least(0),
            log_field="flush_ms",
        ),
        TopicConfigKey(
            "min.insync.replicas",
            ConfigType.INT,
            "The in-sync replicas that must hold a batch before acks=all is answered: with a "
            "smaller ISR an acks=all produce gets NOT_ENOUGH_REPLICAS (a single node is an "
            "ISR of one).",
            synonym="min.insync.replicas",
            validator=_at_least(1),
        ),
        TopicConfigKey(
            "remote.storage.enable",
            ConfigType.BOOLEAN,
            "Archive this topic's sealed segments to the cold store as Parquet (tiered "
            "storage); consumers keep reading archived offsets through the Kafka protocol.",
            synonym=None,
            default=False,
        ),
        TopicConfigKey(
            "local.retention.ms",
            ConfigType.LONG,
            "How long a tiered topic keeps a segment on local disk once it is archived; -2 "
            "means retention.ms. Local segments are deleted only once wholly archived.",
            synonym="log.local.retention.ms",
            validator=_at_least(-2),
        ),
        TopicConfigKey(
            "local.retention.bytes",
            ConfigType.LONG,
            "The most a tiered topic keeps on local disk per partition; -2 means "
            "retention.bytes. Local segments are deleted only once wholly archived.",
            synonym="log.local.retention.bytes",
            validator=_at_least(-2),
        ),
        TopicConfigKey(
            "message.timestamp.before.max.ms",
            ConfigType.LONG,
            "How far before the broker's time a record's CreateTime may be; an older one is "
            "refused with INVALID_TIMESTAMP.",
            synonym="log.message.timestamp.before.max.ms",
            validator=_at_least(0),
        ),
        TopicConfigKey(
            "message.timestamp.after.max.ms",
            ConfigType.LONG,
            "How far after the broker's time a record's CreateTime may be; a later one is "
            "refused with INVALID_TIMESTAMP.",
            synonym="log.message.timestamp.after.max.ms",
            validator=_at_least(0),
        ),
        # -- accepted, with no effect on one broker without compaction (the reason each) ---
        TopicConfigKey(
            "segment.jitter.ms",
            ConfigType.LONG,
            "Accepted, no effect: Kafka subtracts a random jitter from segment.ms so that many "
            "partitions do not roll at once on the append path; StoneMQ rolls queue-log "
            "segments in the splitter, off the produce path, so rolls never stall produces.",
            synonym="log.roll.jitter.ms",
            default=0,
            validator=_at_least(0),
        ),
        TopicConfigKey(
            "delete.retention.ms",
            ConfigType.LONG,
            "Accepted, no effect: how long compaction keeps delete tombstones; StoneMQ has no "
            "log compaction (cleanup.policy=compact is refused).",
            synonym="log.cleaner.delete.retention.ms",
            default=86_400_000,
            validator=_at_least(0),
        ),
        TopicConfigKey(
            "min.compaction.lag.ms",
            ConfigType.LONG,
            "Accepted, no effect: StoneMQ has no log compaction.",
            synonym="log.cleaner.min.compaction.lag.ms",
            default=0,
            validator=_at_least(0),
        ),
        TopicConfigKey(
            "max.compaction.lag.ms",
            ConfigType.LONG,
            "Accepted, no effect: StoneMQ has no log compaction.",
            synonym="log.cleaner.max.compaction.lag.ms",
            default=2**63 - 1,
            validator=_at_least(1),
        ),
        TopicConfigKey(
            "min.cleanable.dirty.ratio",
            ConfigType.DOUBLE,
            "Accepted, no effect: StoneMQ has no log compaction.",
            synonym="log.cleaner.min.cleanable.ratio",
            default=0.5,
            validator=_between(0, 1),
        ),
        TopicConfigKey(
            "file.delete.delay.ms",
            ConfigType.LONG,
            "Accepted, no effect: Kafka renames a deleted segment and unlinks it later so "
            "that readers holding it finish; StoneMQ unlinks at once, as a reader's open file "
            "descriptor keeps the data readable until it closes it.",
            synonym="log.segment.delete.delay.ms",
            default=60_000,
            validator=_at_least(0),
        ),
        TopicConfigKey(
            "preallocate",
            ConfigType.BOOLEAN,
            "Accepted, no effect: segments grow as they are written, so recovery never has to "
            "tell preallocated zeroes from a torn tail.",
            synonym="log.preallocate",
            default=False,
        ),
        TopicConfigKey(
            "unclean.leader.election.enable",
            ConfigType.BOOLEAN,
            "Accepted, no effect on one broker: a partition's only replica is always in sync. "
            "With ZooKeeper, leader elections are per journal partition and follow the broker "
            "config (static, or dynamic through AlterConfigs).",
            synonym="unclean.leader.election.enable",
        ),
        TopicConfigKey(
            "leader.replication.throttled.replicas",
            ConfigType.LIST,
            "Accepted, no effect: replication is per journal partition, not per topic "
            "partition, and is not throttled.",
            synonym=None,
            default=[],
            validator=_throttled_replicas,
        ),
        TopicConfigKey(
            "follower.replication.throttled.replicas",
            ConfigType.LIST,
            "Accepted, no effect: replication is per journal partition, not per topic "
            "partition, and is not throttled.",
            synonym=None,
            default=[],
            validator=_throttled_replicas,
        ),
        TopicConfigKey(
            "compression.gzip.level",
            ConfigType.INT,
            "The gzip level of batches the broker compresses (compression.type=gzip); -1 is "
            "zlib's default, 6.",
            synonym="compression.gzip.level",
            default=-1,
            validator=_between(1, 9, -1),
        ),
        TopicConfigKey(
            "compression.lz4.level",
            ConfigType.INT,
            "The lz4 level of batches the broker compresses (compression.type=lz4).",
            synonym="compression.lz4.level",
            default=9,
            validator=_between(1, 17),
        ),
        TopicConfigKey(
            "compression.zstd.level",
            ConfigType.INT,
            "The zstd level of batches the broker compresses (compression.type=zstd).",
            synonym="compression.zstd.level",
            default=3,
            validator=_between(-131072, 22),
        ),
        TopicConfigKey(
            "remote.log.copy.disable",
            ConfigType.BOOLEAN,
            "Accepted, no effect: whether a tiered topic stops copying segments to remote "
            "storage; StoneMQ's archive job archives every topic with remote.storage.enable.",
            synonym=None,
            default=False,
        ),
        TopicConfigKey(
            "remote.log.delete.on.disable",
            ConfigType.BOOLEAN,
            "Accepted, no effect: whether turning remote.storage.enable off deletes the "
            "archive; StoneMQ keeps the archive until the topic is deleted.",
            synonym=None,
            default=False,
        ),
        TopicConfigKey(
            "message.timestamp.type",
            ConfigType.STRING,
            "Whether the timestamp in a message is the producer's CreateTime or the broker's "
            "LogAppendTime.",
            synonym="log.message.timestamp.type",
            validator=_one_of("CreateTime", "LogAppendTime"),
        ),
    )
}


def topic_config_key(name: str) -> TopicConfigKey:
    key = TOPIC_CONFIGS.get(name)
    if key is None:
        raise InvalidConfigError(f"Unknown topic config name: {name}")
    return key


def validate_topic_configs(configs: Mapping[str, str | None]) -> dict[str, str]:
    """Check a set of topic overrides; return them with canonical string values."""
    out: dict[str, str] = {}
    for name, raw in configs.items():
        value = topic_config_key(name).parse(raw)
        out[name] = format_value(value) or ""
    return out


def validate_topic_values(
    values: Mapping[str, Any], before: Mapping[str, Any] | None = None
) -> None:
    """The rules between a topic's effective configs (Kafka's ``LogConfig.validateValues``
    and ``validateTopicLogConfigValues``), ``before``: the topic's effective configs until
    now (None for a new topic). Raises :class:`InvalidConfigError` with Kafka's message."""
    low, high = int(values["min.compaction.lag.ms"]), int(values["max.compaction.lag.ms"])
    if low > high:
        raise InvalidConfigError(
            f"conflict topic config setting min.compaction.lag.ms ({low}) > "
            f"max.compaction.lag.ms ({high})"
        )
    if values.get("remote.storage.enable"):
        validate_tiered_retention(values)
        if values.get("remote.log.copy.disable"):
            for local_name, whole_name in (
                ("local.retention.bytes", "retention.bytes"),
                ("local.retention.ms", "retention.ms"),
            ):
                local = int(values[local_name])
                if local != -2 and local != int(values[whole_name]):
                    raise InvalidConfigError(
                        f"When `remote.log.copy.disable` is set to true, the `{local_name}` "
                        f"and `{whole_name}` must be set to the identical value because there "
                        "will be no more logs copied to the remote storage."
                    )
    elif (
        before is not None
        and before.get("remote.storage.enable")
        and not values.get("remote.log.delete.on.disable")
    ):
        raise InvalidConfigError(
            "It is invalid to disable remote storage without deleting remote data. If you want "
            "to keep the remote data and turn to read only, please set "
            "`remote.storage.enable=true,remote.log.copy.disable=true`. If you want to disable "
            "remote storage and delete all remote data, please set "
            "`remote.storage.enable=false,remote.log.delete.on.disable=true`."
        )


def validate_tiered_retention(values: Mapping[str, Any]) -> None:
    """KIP-405's rule for a tiered topic's effective configs (Kafka's LogConfig checks):
    ``local.retention.ms`` may not exceed ``retention.ms`` and ``local.retention.bytes`` may
    not exceed ``retention.bytes``, unless the whole-log limit is -1 (none); -2 means "the
    same as retention.*"; -1 locally is refused under a finite whole-log limit. Raises
    :class:`InvalidConfigError` with Kafka's message."""
    if not values.get("remote.storage.enable"):
        return
    for local_name, whole_name in (
        ("local.retention.ms", "retention.ms"),
        ("local.retention.bytes", "retention.bytes"),
    ):
        local, whole = int(values[local_name]), int(values[whole_name])
        if whole == -1 or local == -2:
            continue
        if local == -1:
            raise _invalid(
                local_name,
                str(local),
                f"Value must not be -1 as {whole_name} value is set as {whole}.",
            )
        if local > whole:
            raise _invalid(
                local_name,
                str(local),
                f"Value must not be more than {whole_name} property value: {whole}",
            )


# -- broker configs -----------------------------------------------------------------------------
DYNAMIC_BROKER_CONFIGS: frozenset[str] = frozenset(
    {
        "log.retention.ms",
        "log.retention.bytes",
        "log.segment.bytes",
        "log.roll.ms",
        "log.roll.hours",
        "log.retention.minutes",
        "log.retention.hours",
        "log.index.interval.bytes",
        "log.index.size.max.bytes",
        "message.max.bytes",
        "log.message.timestamp.type",
        "log.message.timestamp.before.max.ms",
        "log.message.timestamp.after.max.ms",
        "num.partitions",
        "auto.create.topics.enable",
        "log.flush.interval.messages",
        "log.flush.interval.ms",
        "min.insync.replicas",
        "unclean.leader.election.enable",
        "log.local.retention.ms",
        "log.local.retention.bytes",
        "producer.id.expiration.ms",  # Kafka's DynamicProducerStateManagerConfig (KIP-854)
    }
)
"""Dynamic broker configs with a setting of their own; every other topic config's broker-level
synonym is dynamic too (Kafka's DynamicLogConfig.ReconfigurableConfigs: all of them)."""

_BROKER_DOCS: dict[str, str] = {
    "auto.create.topics.enable": "Create a topic when a client asks for metadata of a topic "
    "that does not exist.",
    "num.partitions": "The default number of partitions of a new topic.",
    "log.cleanup.policy": "The default cleanup policy for topics; StoneMQ supports only delete.",
    "default.replication.factor": "The default replication factor of a new topic.",
    "min.insync.replicas": "The default min.insync.replicas of a topic.",
    "replica.lag.time.max.ms": "A follower that has not caught up for this long leaves the ISR.",
    "log.message.timestamp.type": "The default message.timestamp.type of a topic.",
    "log.segment.bytes": "The default segment.bytes of a topic.",
    "log.roll.ms": "The default segment.ms of a topic.",
    "log.retention.ms": "The default retention.ms of a topic; -1 keeps data forever.",
    "log.retention.bytes": "The default retention.bytes of a topic; -1 means no size limit.",
    "log.retention.check.interval.ms": "How often retention deletes old segments.",
    "log.index.interval.bytes": "The default index.interval.bytes of a topic.",
    "log.index.size.max.bytes": "The default segment.index.bytes of a topic.",
    "message.max.bytes": "The default max.message.bytes of a topic.",
    "journal.partitions": "How many journal partitions all topic partitions are written "
    "through (fixed once topics exist).",
    "journal.segment.bytes": "The segment size of a journal partition.",
    "journal.flush.policy": "When the journal is fsynced: always (before the ack), interval, "
    "or never (left to the OS).",
    "journal.flush.interval.ms": "How often the journal is fsynced under the interval policy.",
    "queue.checkpoint.interval.ms": "How often queue logs write their recovery checkpoints.",
    "queue.max.open.files": "The bound on queue-log files kept open.",
    "log.level": "The broker's log level.",
    "listeners": "The listeners, NAME://HOST:PORT comma-separated (--listen HOST:PORT is "
    "listeners=PLAINTEXT://HOST:PORT).",
    "advertised.listeners": "The address given to clients for each listener name "
    "(--advertise HOST:PORT is advertised.listeners=PLAINTEXT://HOST:PORT); default listeners.",
    "listener.security.protocol.map": "Each listener name's security protocol; StoneMQ "
    "serves PLAINTEXT.",
}

_LONG_SETTINGS = frozenset(
    {
        "batch_max_uncompressed_bytes",
        "log_retention_bytes",
        "journal_segment_bytes",
        "splitter_batch_bytes",
        "splitter_max_lag_bytes",
        "queue_cache_retain_bytes",
        "log_local_retention_bytes",
        "log_flush_interval_messages",
    }
)


@dataclass(frozen=True, slots=True)
class BrokerConfigKey:
    """One broker-level config: a Settings field under its Kafka name (or a fixed value)."""

    name: str
    type: ConfigType
    doc: str
    attribute: str | None  # the Settings field; None for a fixed StoneMQ value
    default: Any
    dynamic: bool
    sensitive: bool = False

    def parse(self, raw: str | None) -> Any:
        """Parse and validate a dynamic value; raises :class:`InvalidConfigError`."""
        if raw is None:
            raise InvalidConfigError(f"Null value not supported for broker config {self.name}")
        value = parse_value(self.name, self.type, raw)
        if self.attribute is not None:
            try:
                check_value(fields()[self.attribute], value)
            except ValueError as e:
                raise _invalid(self.name, raw, str(e)) from None
        topic_key = _TOPIC_BY_SYNONYM.get(self.name)
        if topic_key is not None and topic_key.validator is not None:
            topic_key.validator(self.name, value)
        return value


def _broker_name(attribute: str) -> str:
    return attribute.replace("_", ".")


def _setting_type(spec: FieldSpec) -> ConfigType:
    if spec.kind == "bool":
        return ConfigType.BOOLEAN
    if spec.kind == "int":
        return (
            ConfigType.LONG
            if spec.name.endswith("_ms") or spec.name in _LONG_SETTINGS
            else ConfigType.INT
        )
    return ConfigType.STRING


def _build_broker_configs() -> dict[str, BrokerConfigKey]:
    out: dict[str, BrokerConfigKey] = {}
    for attribute, spec in fields().items():
        if attribute in ALIAS_SETTINGS:
            continue  # listen / advertise are reported as listeners / advertised.listeners
        name = _broker_name(attribute)
        out[name] = BrokerConfigKey(
            name=name,
            type=_setting_type(spec),
            doc=_BROKER_DOCS.get(name) or spec.description or f"The {name} setting.",
            attribute=attribute,
            default=spec.default,
            dynamic=name in DYNAMIC_BROKER_CONFIGS,
            sensitive=attribute.endswith(("_secret_access_key", "_password")),
        )
    for key in TOPIC_CONFIGS.values():
        # a topic config's broker-level default with no setting of its own (Kafka's
        # ServerTopicConfigSynonyms): its built-in default, changed through AlterConfigs
        if key.synonym is not None and key.synonym not in out:
            out[key.synonym] = BrokerConfigKey(
                name=key.synonym,
                type=key.type,
                doc=_BROKER_DOCS.get(key.synonym) or f"The default {key.name} of a topic.",
                attribute=None,
                default=key.default,
                dynamic=True,
            )
    return dict(sorted(out.items()))


BROKER_CONFIGS: dict[str, BrokerConfigKey] = _build_broker_configs()
_TOPIC_BY_SYNONYM: dict[str, TopicConfigKey] = {
    k.synonym: k for k in TOPIC_CONFIGS.values() if k.synonym
}


def validate_broker_configs(configs: Mapping[str, str | None]) -> dict[str, str]:
    """Check a set of dynamic broker configs; return them with canonical string values.

    Unknown names are INVALID_CONFIG; known but not dynamically alterable ones INVALID_REQUEST
    (as Kafka answers "Cannot update these configs dynamically").
    """
    out: dict[str, str] = {}
    fixed: list[str] = []
    for name, raw in configs.items():
        key = BROKER_CONFIGS.get(name)
        if key is None:
            raise InvalidConfigError(f"Unknown broker config name: {name}")
        if not key.dynamic:
            fixed.append(name)
            continue
        out[name] = format_value(key.parse(raw)) or ""
    if fixed:
        raise InvalidRequestError(
            f"Cannot update these configs dynamically: {', '.join(sorted(fixed))}"
        )
    return out


# -- resolution ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Synonym:
    name: str
    value: str | None
    source: ConfigSource


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One config as DescribeConfigs (and CreateTopics v5+) reports it."""

    name: str
    value: str | None
    source: ConfigSource
    type: ConfigType
    read_only: bool
    is_sensitive: bool
    documentation: str
    synonyms: tuple[Synonym, ...]


def _parse_quietly(key: TopicConfigKey | BrokerConfigKey, raw: str) -> tuple[bool, Any]:
    try:
        return True, key.parse(raw)
    except AdminError:
        return False, None


@dataclass(frozen=True, slots=True)
class DynamicBrokerConfigs:
    """The dynamic broker configs a broker resolves with (Kafka's two levels): its own, set
    through AlterConfigs on resource ``<broker id>``, over the cluster-wide default, set on
    resource ``""`` and in force on every broker without its own value."""

    own: Mapping[str, str] = field(default_factory=dict)
    default: Mapping[str, str] = field(default_factory=dict)

    def levels(self) -> tuple[tuple[ConfigSource, Mapping[str, str]], ...]:
        return (
            (ConfigSource.DYNAMIC_BROKER_CONFIG, self.own),
            (ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG, self.default),
        )


NO_DYNAMIC_BROKER_CONFIGS = DynamicBrokerConfigs()


def _broker_levels(
    settings: Settings, dynamic: DynamicBrokerConfigs, name: str
) -> list[tuple[Synonym, Any]]:
    """The levels that give broker config ``name`` a value, highest precedence first."""
    key = BROKER_CONFIGS.get(name)
    if key is None:
        return []
    levels: list[tuple[Synonym, Any]] = []
    for source, configs in dynamic.levels() if key.dynamic else ():
        if name in configs:
            ok, value = _parse_quietly(key, configs[name])
            if ok:
                levels.append((Synonym(name, format_value(value), source), value))
    if key.attribute is not None and key.attribute in settings.model_fields_set:
        value = getattr(settings, key.attribute)
        levels.append(
            (Synonym(name, format_value(value), ConfigSource.STATIC_BROKER_CONFIG), value)
        )
    levels.append(
        (Synonym(name, format_value(key.default), ConfigSource.DEFAULT_CONFIG), key.default)
    )
    return levels


def broker_value(settings: Settings, dynamic: DynamicBrokerConfigs, name: str) -> Any:
    """The effective value of broker config ``name`` (this broker's dynamic value > the
    cluster-wide dynamic default > static setting > default)."""
    levels = _broker_levels(settings, dynamic, name)
    if not levels:
        raise KeyError(name)
    return levels[0][1]


def describe_broker(settings: Settings, dynamic: DynamicBrokerConfigs) -> list[ConfigEntry]:
    """Every broker config with its effective value, source and synonyms."""
    entries: list[ConfigEntry] = []
    for name, key in BROKER_CONFIGS.items():
        levels = _broker_levels(settings, dynamic, name)
        entries.append(_broker_entry(key, levels))
    return entries


def describe_broker_defaults(
    settings: Settings, dynamic: DynamicBrokerConfigs
) -> list[ConfigEntry]:
    """The cluster-wide dynamic defaults only (DescribeConfigs of broker resource ``""``, as
    Kafka answers it: the configs set at that level, with that level alone as synonym; Kafka's
    ConfigHelper keeps only DYNAMIC_DEFAULT_BROKER_CONFIG synonyms there)."""
    defaults_only = DynamicBrokerConfigs(default=dynamic.default)
    return [
        _broker_entry(
            key,
            [
                level
                for level in _broker_levels(settings, defaults_only, name)
                if level[0].source is ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG
            ],
        )
        for name, key in BROKER_CONFIGS.items()
        if key.dynamic and name in dynamic.default
    ]


def _broker_entry(key: BrokerConfigKey, levels: list[tuple[Synonym, Any]]) -> ConfigEntry:
    top = levels[0][0]
    return ConfigEntry(
        name=top.name,
        value=None if key.sensitive else top.value,
        source=top.source,
        type=key.type,
        read_only=not key.dynamic,
        is_sensitive=key.sensitive,
        documentation=key.doc,
        synonyms=tuple(s for s, _ in levels),
    )


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """A topic's effective configuration."""

    values: dict[str, Any]  # typed values by Kafka name
    entries: tuple[ConfigEntry, ...] = field(repr=False)
    log_config: LogConfig = field(default_factory=LogConfig)

    @property
    def max_message_bytes(self) -> int:
        return int(self.values["max.message.bytes"])

    @property
    def timestamp_type(self) -> str:
        return str(self.values["message.timestamp.type"])

    def strings(self) -> dict[str, str | None]:
        return {e.name: e.value for e in self.entries}


def whole_retention(values: Mapping[str, Any]) -> tuple[int, int]:
    """A topic's retention.ms and retention.bytes in force, from its typed config values:
    (-1, -1) when its cleanup.policy lacks delete (the empty list: Kafka's UnifiedLog
    deletes by time and size only under delete)."""
    if "delete" not in values["cleanup.policy"]:
        return -1, -1
    return int(values["retention.ms"]), int(values["retention.bytes"])


def segment_bytes(values: Mapping[str, Any]) -> int:
    """A topic's segment size from its typed config values: internal.segment.bytes when set,
    else segment.bytes (Kafka's LogConfig.segmentSize)."""
    internal = values.get(INTERNAL_SEGMENT_BYTES)
    return int(values["segment.bytes"] if internal is None else internal)


def _synonym_levels(
    settings: Settings, dynamic: DynamicBrokerConfigs, key: TopicConfigKey
) -> list[tuple[Synonym, Any]]:
    """The broker levels of a topic config's default, highest precedence first: every level
    that sets ``key.synonym``, then those of each coarser synonym in turn (values converted
    to the topic config's unit; a negative one is -1), then the synonym's default. So the
    first synonym set at any level wins, as Kafka merges each name's levels first and then
    takes log.retention.ms, else .minutes, else .hours."""
    assert key.synonym is not None
    levels = _broker_levels(settings, dynamic, key.synonym)
    if not key.coarser:
        return levels
    default = levels.pop()
    for name, factor in key.coarser:
        for synonym, value in _broker_levels(settings, dynamic, name):
            if synonym.source is not ConfigSource.DEFAULT_CONFIG and value is not None:
                levels.append((synonym, -1 if value < 0 else value * factor))
    levels.append(default)
    return levels


def resolve_topic(
    settings: Settings, dynamic: DynamicBrokerConfigs, overrides: Mapping[str, str]
) -> TopicConfig:
    """Resolve every topic config: override > dynamic broker config > setting > default."""
    values: dict[str, Any] = {}
    entries: list[ConfigEntry] = []
    for name, key in TOPIC_CONFIGS.items():
        levels: list[tuple[Synonym, Any]] = []
        if name in overrides:
            ok, value = _parse_quietly(key, overrides[name])
            if ok:
                levels.append(
                    (Synonym(name, format_value(value), ConfigSource.DYNAMIC_TOPIC_CONFIG), value)
                )
        if key.synonym is not None:
            levels.extend(_synonym_levels(settings, dynamic, key))
        if not levels or levels[-1][0].source is not ConfigSource.DEFAULT_CONFIG:
            levels.append(
                (
                    Synonym(
                        key.synonym or name, format_value(key.default), ConfigSource.DEFAULT_CONFIG
                    ),
                    key.default,
                )
            )
        top, value = levels[0]
        values[name] = value
        if key.internal:
            continue
        entries.append(
            ConfigEntry(
                name=name,
                value=format_value(value),  # a coarser synonym's value is in its own unit
                source=top.source,
                type=key.type,
                read_only=False,
                is_sensitive=False,
                documentation=key.doc,
                synonyms=tuple(s for s, _ in levels),
            )
        )
    compression = str(values["compression.type"])
    fields = {
        key.log_field: int(values[name])
        for name, key in TOPIC_CONFIGS.items()
        if key.log_field is not None
    }
    fields["retention_ms"], fields["retention_bytes"] = whole_retention(values)
    log_config = LogConfig(
        **fields,
        segment_bytes=segment_bytes(values),
        compression=_CODECS[compression],
        compression_level=int(values.get(f"compression.{compression}.level", -1)),
    )
    return TopicConfig(values=values, entries=tuple(entries), log_config=log_config)


# -- incremental alteration ---------------------------------------------------------------------
def apply_incremental(
    current: Mapping[str, str],
    ops: Sequence[tuple[str, int, str | None]],
    type_of: Callable[[str], ConfigType],
    effective: Callable[[str], str | None],
) -> dict[str, str | None]:
    """Apply IncrementalAlterConfigs operations ``(name, op, value)`` to an override set.

    ``type_of(name)`` gives a config's type (raising :class:`InvalidConfigError` for unknown
    names); ``effective(name)`` its current effective value, the base APPEND and SUBTRACT
    start from when there is no override. Values are not validated here.
    """
    names = [name for name, _, _ in ops]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidRequestError(f"Error due to duplicate config keys: {', '.join(duplicates)}")
    out: dict[str, str | None] = dict(current)
    for name, op_code, value in ops:
        try:
            op = ConfigOp(op_code)
        except ValueError:
            raise InvalidRequestError(f"Unknown alter configs operation {op_code}") from None
        type_ = type_of(name)
        if op is ConfigOp.SET:
            out[name] = value
        elif op is ConfigOp.DELETE:
            out.pop(name, None)
        else:
            if type_ is not ConfigType.LIST:
                verb = "append" if op is ConfigOp.APPEND else "subtract"
                raise InvalidConfigError(
                    f"Config value {verb} is not allowed for config key: {name}"
                )
            base = out.get(name) if name in out else effective(name)
            items = [i.strip() for i in (base or "").split(",") if i.strip()]
            given = [i.strip() for i in (value or "").split(",") if i.strip()]
            if op is ConfigOp.APPEND:
                items += [i for i in given if i not in items]
            else:
                items = [i for i in items if i not in given]
            out[name] = ",".join(items)
    return out


def topic_config_type(name: str) -> ConfigType:
    return topic_config_key(name).type


def broker_config_type(name: str) -> ConfigType:
    key = BROKER_CONFIGS.get(name)
    if key is None:
        raise InvalidConfigError(f"Unknown broker config name: {name}")
    return key.type
