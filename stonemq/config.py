"""Broker settings: each one's Kafka name, unit and default; flag > env > file > default.

A setting is named the way Kafka names it where Kafka has a name (``num.partitions``,
``socket.request.max.bytes``); the Python attribute is that name with dots turned into
underscores (``num_partitions``), and its environment variable is ``STONEMQ_`` plus the
attribute in capitals (``STONEMQ_NUM_PARTITIONS``). A TOML file given with ``--config`` may use
either spelling. Units are part of the name (``_ms``, ``_bytes``).
"""

from __future__ import annotations

import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from stonemq.config_values import (
    ALIAS_SETTINGS,
    SERVED_PROTOCOLS,
    Endpoint,
    FieldSpec,
    SettingsViews,
    kafka_name,
    parse_listeners,
    parse_protocol_map,
    split_host_port,
)

__all__ = [
    "ALIAS_SETTINGS",
    "SERVED_PROTOCOLS",
    "Endpoint",
    "Settings",
    "field_specs",
    "kafka_name",
    "load_settings",
    "parse_listeners",
    "parse_protocol_map",
    "split_host_port",
]

DEFAULT_SECURITY_PROTOCOL_MAP = (
    "SASL_SSL:SASL_SSL,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT"
)
"""Kafka's default listener.security.protocol.map."""

FlushPolicy = Literal["always", "interval", "never"]
TimestampType = Literal["CreateTime", "LogAppendTime"]
TierReadPolicy = Literal["disable", "not_in_local", "force"]

MIB = 1024 * 1024


_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1

KAFKA_INT_SETTINGS = frozenset(
    {
        "broker_id",
        "log_roll_hours",
        "log_retention_minutes",
        "log_retention_hours",
        "socket_request_max_bytes",
        "queued_max_requests",
        "max_connections",
        "max_connections_per_ip",
        "max_request_partition_size_limit",
        "num_partitions",
        "default_replication_factor",
        "min_insync_replicas",
        "leader_imbalance_check_interval_seconds",
        "leader_imbalance_per_broker_percentage",
        "message_max_bytes",
        "log_segment_bytes",
        "log_index_interval_bytes",
        "log_index_size_max_bytes",
        "replica_fetch_wait_max_ms",
        "replica_fetch_min_bytes",
        "replica_fetch_max_bytes",
        "replica_fetch_response_max_bytes",
        "replica_fetch_backoff_ms",
        "controlled_shutdown_max_retries",
        "zookeeper_session_timeout_ms",
        "zookeeper_connection_timeout_ms",
        "fetch_max_bytes",
        "offsets_topic_num_partitions",
        "offsets_topic_segment_bytes",
        "offsets_retention_minutes",
        "group_initial_rebalance_delay_ms",
        "group_min_session_timeout_ms",
        "group_max_session_timeout_ms",
        "producer_id_expiration_ms",
        "producer_id_expiration_check_interval_ms",
        "quota_window_num",
        "quota_window_size_seconds",
        # ours, positions in files addressed with 4 bytes as a queue log's are
        "journal_segment_bytes",
    }
)
"""The settings Kafka types INT (32 bits); every other whole-number setting is a LONG."""


class Settings(SettingsViews, BaseSettings):
    """The broker's settings. Construct with :func:`load_settings`."""

    model_config = SettingsConfigDict(env_prefix="STONEMQ_", extra="forbid", frozen=True)

    # -- network -------------------------------------------------------------------------------
    listeners: str = Field(
        "PLAINTEXT://127.0.0.1:9092",
        description="Kafka's listeners: NAME://HOST:PORT[,NAME://HOST:PORT...], the addresses "
        "the broker listens on (an empty HOST: every interface)",
    )
    advertised_listeners: str | None = Field(
        None,
        description="Kafka's advertised.listeners: the address given to clients for each "
        "listener name (default: listeners)",
    )
    listener_security_protocol_map: str = Field(
        DEFAULT_SECURITY_PROTOCOL_MAP,
        description="Kafka's listener.security.protocol.map: each listener name's protocol "
        "(StoneMQ serves PLAINTEXT)",
    )
    # aliases, read from flag, env and file and turned into listeners / advertised.listeners
    # before validation (see _ListenerAliases): always None on a built Settings
    listen: str | None = Field(None, description="alias: listeners=PLAINTEXT://HOST:PORT")
    advertise: str | None = Field(
        None, description="alias: advertised.listeners=PLAINTEXT://HOST:PORT"
    )
    socket_request_max_bytes: int = Field(100 * MIB, gt=0, description="largest request frame")
    connections_max_idle_ms: int = Field(600_000, gt=0, description="idle connections are closed")
    max_connections: int = Field(
        2_147_483_647,
        gt=0,
        description="connections accepted at once over all listeners (fewer if the open-file "
        "limit leaves room for fewer beside the broker's own files)",
    )
    max_connections_per_ip: int = Field(
        2_147_483_647,
        ge=0,
        description="connections accepted at once from one client address (0: only from "
        "the addresses max.connections.per.ip.overrides names)",
    )
    max_connections_per_ip_overrides: str = Field(
        "",
        description="per-address exceptions to max.connections.per.ip: host:count entries "
        "separated by commas (a host name stands for the addresses it resolves to at start)",
    )
    queued_max_requests: int = Field(500, gt=0, description="requests in flight per connection")
    queued_max_request_bytes: int = Field(
        4 * MIB,
        ge=-1,
        description="bytes of requests in flight over all connections before reading pauses "
        "(-1: no limit, Kafka's default; one request is always let in)",
    )

    # -- identity --------------------------------------------------------------------------------
    broker_id: int = Field(1, ge=0, description="this broker's id (Kafka's broker.id / node.id)")
    cluster_id: str | None = Field(None, description="cluster id; generated once and kept")

    # -- cluster ---------------------------------------------------------------------------------
    zookeeper_connect: str | None = Field(
        None,
        description="Kafka's zookeeper.connect, host:port[,host:port...][/chroot]: the metadata "
        "goes to ZooKeeper and the broker registers there; unset: a single node on SQLite",
    )
    zookeeper_session_timeout_ms: int = Field(18_000, gt=0, description="Kafka's default")
    zookeeper_connection_timeout_ms: int = Field(
        30_000, gt=0, description="how long a start waits for ZooKeeper before it gives up"
    )
    broker_rack: str | None = Field(None, description="Kafka's broker.rack")

    # -- directories -----------------------------------------------------------------------------
    data_dir: Path = Field(Path("./data"), description="root of all broker state")
    journal_dir: Path | None = Field(None, description="write directory (default DATA/journal)")
    queue_dir: Path | None = Field(None, description="read directory (default DATA/queues)")

    # -- topics ----------------------------------------------------------------------------------
    auto_create_topics_enable: bool = True
    num_partitions: int = Field(1, gt=0)
    max_partitions: int = Field(
        200_000, gt=0, description="partitions this broker holds at most, over all topics"
    )
    max_partitions_per_request: int = Field(
        100_000, gt=0, description="partitions one CreateTopics or CreatePartitions may add"
    )
    default_replication_factor: int = Field(1, gt=0)
    unclean_leader_election_enable: bool = Field(
        False,
        description="Kafka's unclean.leader.election.enable: a replica outside the ISR may lead "
        "a journal partition whose ISR is gone (acknowledged records may be lost)",
    )
    min_insync_replicas: int = Field(
        1, gt=0, description="Kafka's: replicas that must hold a batch before acks=all is answered"
    )
    auto_leader_rebalance_enable: bool = Field(
        True,
        description="Kafka's: the controller gives journal partitions back to their home "
        "broker (a preferred election) once its share led elsewhere is above "
        "leader.imbalance.per.broker.percentage",
    )
    leader_imbalance_check_interval_seconds: int = Field(
        300, ge=1, description="how often the controller checks the leader imbalance"
    )
    leader_imbalance_per_broker_percentage: int = Field(
        10, ge=0, le=100, description="the share of a broker's journal partitions led elsewhere"
    )
    replica_lag_time_max_ms: int = Field(
        30_000, gt=0, description="a follower not caught up for this long leaves the ISR"
    )
    replica_fetch_wait_max_ms: int = Field(500, ge=0, description="a replica fetch's long poll")
    replica_fetch_min_bytes: int = Field(1, ge=0)
    replica_fetch_max_bytes: int = Field(
        1_048_576, gt=0, description="journal bytes per journal partition per replica fetch"
    )
    replica_fetch_response_max_bytes: int = Field(10_485_760, gt=0)
    replica_fetch_tail_max_bytes: int = Field(
        2_097_152,
        ge=0,
        description="newest journal bytes a leader keeps in memory per led journal partition "
        "to answer replica fetches without a file read (0: none)",
    )
    replica_fetch_backoff_ms: int = Field(1000, ge=0, description="after a failed replica fetch")
    controlled_shutdown_enable: bool = Field(
        True, description="a stopping leader has the controller move its leaderships first"
    )
    controlled_shutdown_max_retries: int = Field(3, ge=0)
    controlled_shutdown_retry_backoff_ms: int = Field(5000, ge=0)
    message_max_bytes: int = Field(1_048_588, ge=0, description="default max.message.bytes")
    log_message_timestamp_type: TimestampType = "CreateTime"
    log_message_timestamp_before_max_ms: int = Field(2**63 - 1, ge=0)
    log_message_timestamp_after_max_ms: int = Field(3_600_000, ge=0, description="Kafka 4's")
    batch_max_uncompressed_bytes: int = Field(
        64 * MIB,
        gt=0,
        description="the most a produced compressed batch may decompress to (the broker "
        "decompresses it to validate its records, as Kafka does): MESSAGE_TOO_LARGE beyond",
    )
    log_segment_bytes: int = Field(1024 * MIB, ge=MIB, description="at least 1 MiB (KIP-1030)")
    log_roll_ms: int = Field(7 * 24 * 3600 * 1000, gt=0)
    log_roll_hours: int = Field(
        168, ge=1, description="the default segment.ms in hours, when log.roll.ms is not set"
    )
    log_retention_ms: int = Field(7 * 24 * 3600 * 1000, ge=-1)
    log_retention_minutes: int | None = Field(
        None,
        description="the default retention.ms in minutes, when log.retention.ms is not set "
        "(negative: no time limit)",
    )
    log_retention_hours: int = Field(
        168,
        description="the default retention.ms in hours, when neither log.retention.ms nor "
        "log.retention.minutes is set (negative: no time limit)",
    )
    log_retention_bytes: int = Field(-1, ge=-1)
    log_retention_check_interval_ms: int = Field(300_000, gt=0)
    log_index_interval_bytes: int = Field(4096, ge=0)
    log_index_size_max_bytes: int = Field(10 * MIB, ge=4)
    fetch_max_bytes: int = Field(55 * MIB, gt=0, description="cap on one fetch response")
    fetch_zero_copy: bool = Field(
        True,
        description="send fetched records of 16 KiB or more from the segment files with "
        "sendfile (false: read them into memory and write them, as before)",
    )
    max_request_partition_size_limit: int = Field(
        2000, gt=0, description="most partitions one DescribeTopicPartitions response carries"
    )
    quota_window_num: int = Field(
        11, ge=2, description="samples a client quota's rate is kept over (Kafka's default)"
    )
    quota_window_size_seconds: int = Field(
        1, gt=0, description="length of one client-quota sample (Kafka's default)"
    )

    # -- journal and splitter (StoneMQ's own) -------------------------------------------------
    journal_partitions: int = Field(4, gt=0, le=1024)
    journal_segment_bytes: int = Field(128 * MIB, ge=1024)
    journal_flush_policy: FlushPolicy = "interval"
    journal_flush_interval_ms: int = Field(1000, gt=0)
    log_flush_interval_messages: int = Field(
        2**63 - 1,
        ge=1,
        description="default flush.messages: records of a partition after which its journal "
        "is fsynced before the ack (Kafka's default, Long.MAX_VALUE: the flush policy decides)",
    )
    log_flush_interval_ms: int = Field(
        2**63 - 1,
        ge=0,
        description="default flush.ms: the longest a topic's append waits for a journal fsync "
        "(0: before the ack; Kafka's default, Long.MAX_VALUE: the flush policy decides)",
    )
    queue_checkpoint_interval_ms: int = Field(60_000, gt=0)
    queue_max_open_files: int = Field(16384, ge=8)
    # 1 MiB: the read stays under the malloc mmap threshold (stonemq/server/malloc.py) and the
    # loop is held for shorter; against 4 MiB it split faster at 1 partition (~290 vs ~240
    # MB/s, 1 KiB records) and lowered the peak PSS at 1,000 partitions by ~1.5 MB
    splitter_batch_bytes: int = Field(MIB, gt=0, description="journal bytes split per pass")
    queue_cache_retain_bytes: int = Field(
        1024 * MIB,
        ge=-1,
        description="queue-log bytes, the most recently written, left in the OS page cache; "
        "older written pages are written back and dropped, so the cache stays bounded and new "
        "writes reuse the pages freed (-1: no bound, the OS decides as with Kafka)",
    )
    splitter_max_lag_bytes: int = Field(
        64 * MIB,
        ge=-1,
        description="journal bytes written but not yet split before the broker stops reading "
        "requests until the splitter catches up (-1: no limit); bounds how far consumers "
        "trail acknowledged data under a producer faster than the splitter",
    )

    producer_id_expiration_ms: int = Field(
        86_400_000,
        ge=1,
        description="an idempotent producer's state is dropped after this long without a batch",
    )
    producer_id_expiration_check_interval_ms: int = Field(600_000, gt=0)

    # -- consumer groups and committed offsets -----------------------------------------------
    group_initial_rebalance_delay_ms: int = Field(
        3000, ge=0, description="wait for more members before an empty group's first rebalance"
    )
    group_min_session_timeout_ms: int = Field(6000, ge=0)
    group_max_session_timeout_ms: int = Field(1_800_000, gt=0)
    offsets_topic_num_partitions: int = Field(50, gt=0, description="__consumer_offsets size")
    offsets_topic_segment_bytes: int = Field(100 * MIB, ge=1024)
    offsets_retention_minutes: int = Field(10080, gt=0, description="empty groups' offsets kept")
    offsets_retention_check_interval_ms: int = Field(600_000, gt=0)
    offsets_snapshot_min_records: int = Field(
        10_000, gt=0, description="records since the last snapshot before a partition snapshots"
    )

    # -- tiered storage (KIP-405 names; see stonemq/tiering) ----------------------------------
    log_local_retention_ms: int = Field(
        -2, ge=-2, description="default local.retention.ms; -2 means use retention.ms"
    )
    log_local_retention_bytes: int = Field(
        -2, ge=-2, description="default local.retention.bytes; -2 means use retention.bytes"
    )
    tier_store_url: str | None = Field(
        None, description="cold store: file:///path or s3://bucket/prefix (default DATA/tier)"
    )
    tier_s3_endpoint_url: str | None = Field(None, description="S3 endpoint (S3-compatible)")
    tier_s3_region: str | None = Field(None, description="S3 region")
    tier_s3_access_key_id: str | None = Field(None, description="S3 access key id")
    tier_s3_secret_access_key: str | None = Field(None, description="S3 secret access key")
    tier_interval_ms: int = Field(
        0, ge=0, description="run the archive job every N ms as a separate process; 0 = off"
    )
    tier_spark_master: str = Field("local[*]", description="Spark master of the archive job")
    tier_parquet_zstd_level: int = Field(1, ge=1, le=22, description="Parquet zstd level")
    tier_read_policy: TierReadPolicy = Field(
        "not_in_local", description="cold reads: disable | not_in_local | force"
    )
    tier_read_ahead_max_bytes: int = Field(
        16 * MIB, gt=0, description="largest read-ahead window of one cold reader"
    )
    tier_read_cache_expire_ms: int = Field(
        30_000, gt=0, description="read-ahead data unused this long expires (window halves)"
    )

    # -- logging and metrics ---------------------------------------------------------------------
    log_level: str = "INFO"
    metrics_listen: str | None = Field(
        None,
        description="HOST:PORT of a Prometheus text endpoint (/metrics) with the broker's "
        "counters (stonemq/server/metrics.py); unset: none",
    )

    @model_validator(mode="after")
    def _check_kafka_types(self) -> Settings:
        """Every whole-number setting fits Kafka's type for it: INT (32 bits) for those
        Kafka types INT, LONG (64 bits) for the rest. Kafka's ConfigDef refuses a value
        outside ("Not a number of type INT"); taken as given, ``log.segment.bytes`` past
        2^31 - 1 let a segment grow past what its offset index can address (4-byte
        positions): the splitter stopped for good and recovery failed at every start after
        (an independent config check)."""
        for name, value in self:
            if isinstance(value, bool) or not isinstance(value, int):
                continue
            low, high = (
                (_INT_MIN, _INT_MAX) if name in KAFKA_INT_SETTINGS else (_LONG_MIN, _LONG_MAX)
            )
            if not low <= value <= high:
                kind = "INT" if name in KAFKA_INT_SETTINGS else "LONG"
                raise ValueError(
                    f"{name.replace('_', '.')}: {value} is not a number of type {kind} "
                    f"({low} to {high})"
                )
        return self

    @model_validator(mode="after")
    def _check_connection_limits(self) -> Settings:
        """Kafka's rules: the overrides parse, and a per-address limit of 0 needs them."""
        from stonemq.server.connection_limits import parse_overrides

        overrides = parse_overrides(self.max_connections_per_ip_overrides)
        if self.max_connections_per_ip == 0 and not overrides:
            raise ValueError(
                "max.connections.per.ip can be set to zero only if "
                "max.connections.per.ip.overrides is set"
            )
        return self

    @model_validator(mode="after")
    def _check_listeners(self) -> Settings:
        if self.listen is not None or self.advertise is not None:
            raise ValueError("listen / advertise are aliases resolved before validation")
        self.listener_endpoints()
        self.advertised_endpoints()
        if self.metrics_listen is not None:
            from stonemq.server.metrics import parse_listen

            parse_listen(self.metrics_listen)
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # init kwargs carry the command-line flags; the TOML file is passed the same way but
        # under a private key, so it sits below the environment. Each source's listen /
        # advertise aliases become listeners / advertised.listeners within that source, so
        # the precedence between sources holds across the two spellings.
        return tuple(
            _ListenerAliases(settings_cls, source)
            for source in (init_settings, env_settings, _TomlSource(settings_cls))
        )


def alias_listener(address: str) -> str:
    """The ``listeners`` value of the ``listen`` / ``advertise`` alias ``HOST:PORT``."""
    host, port = split_host_port(address)
    host = f"[{host}]" if ":" in host else host
    return f"PLAINTEXT://{host}:{port}"


class _ListenerAliases(PydanticBaseSettingsSource):
    """One source with its ``listen`` / ``advertise`` values turned into ``listeners`` /
    ``advertised_listeners`` (the same source giving both spellings is an error)."""

    def __init__(self, settings_cls: type[BaseSettings], inner: PydanticBaseSettingsSource):
        super().__init__(settings_cls)
        self._inner = inner

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        values = dict(self._inner())
        for alias, target in (("listen", "listeners"), ("advertise", "advertised_listeners")):
            address = values.pop(alias, None)
            if address is None:
                continue
            if values.get(target) is not None:
                raise ValueError(f"{alias} is an alias of {kafka_name(target)}: give one of them")
            values[target] = alias_listener(str(address))
        return values


_CONFIG_FILE: Path | None = None


class _TomlSource(PydanticBaseSettingsSource):
    """Settings from the TOML file named by ``--config``; keys may be dotted Kafka names."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        if _CONFIG_FILE is None:
            return {}
        with _CONFIG_FILE.open("rb") as fh:
            raw = tomllib.load(fh)
        flat: dict[str, Any] = {}
        _flatten(raw, "", flat)
        known = self.settings_cls.model_fields
        out: dict[str, Any] = {}
        for key, value in flat.items():
            attribute = key.replace(".", "_").replace("-", "_")
            if attribute not in known:
                raise ValueError(f"{_CONFIG_FILE}: unknown setting {key!r}")
            out[attribute] = value
        return out


def _flatten(table: dict[str, Any], prefix: str, out: dict[str, Any]) -> None:
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            _flatten(value, name + ".", out)
        else:
            out[name] = value


def load_settings(config_file: Path | None = None, **flags: Any) -> Settings:
    """Build settings with precedence flag > env (``STONEMQ_*``) > file > default.

    ``flags`` holds only the flags the user actually gave (``None`` values are dropped).
    """
    global _CONFIG_FILE
    _CONFIG_FILE = config_file
    try:
        return Settings(**{k: v for k, v in flags.items() if v is not None})
    finally:
        _CONFIG_FILE = None


def field_specs() -> list[FieldSpec]:
    """Each field's :class:`FieldSpec` (type, bounds, default, description) read off the
    model, in declaration order: what the serving process checks dynamic broker configs with,
    without pydantic (:mod:`stonemq.config_values`)."""
    out = []
    for name, info in Settings.model_fields.items():
        annotation: Any = info.annotation
        nullable = False
        if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            nullable = len(args) < len(typing.get_args(annotation))
            if len(args) != 1:
                raise TypeError(f"setting {name}: a union of {args} has no FieldSpec kind")
            annotation = args[0]
        choices: tuple[str, ...] = ()
        if typing.get_origin(annotation) is Literal:
            kind = "choice"
            choices = tuple(typing.get_args(annotation))
        else:
            kinds = {bool: "bool", int: "int", float: "float", str: "str", Path: "path"}
            if annotation not in kinds:
                raise TypeError(f"setting {name}: type {annotation!r} has no FieldSpec kind")
            kind = kinds[annotation]
        bounds: dict[str, Any] = {}
        for meta in info.metadata:
            key = type(meta).__name__.lower()  # annotated_types' Gt, Ge, Lt, Le (Field's bounds)
            if key not in ("gt", "ge", "lt", "le"):
                raise TypeError(f"setting {name}: constraint {meta!r} has no FieldSpec bound")
            bounds[key] = getattr(meta, key)
        default = info.default
        out.append(
            FieldSpec(
                name=name,
                kind=kind,
                nullable=nullable,
                choices=choices,
                default=str(default) if isinstance(default, Path) else default,
                description=info.description,
                **bounds,
            )
        )
    return out
