"""The ``stonemq`` data source's pure logic: option parsing with Spark's Kafka source names and
semantics, offset JSON, and the planning of offset ranges into Spark input partitions (cold
Parquet part, Kafka part, ``minPartitions`` splits, ``maxOffsetsPerTrigger`` rate limit).

Nothing here does I/O or imports pyspark: the driver resolves offsets through the broker
(:mod:`stonemq.spark.kafka_io`) and hands the numbers to these functions.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

EARLIEST = -2  # Spark's Kafka source's offset JSON: -2 earliest, -1 latest
LATEST = -1

KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
HEADERS_FIELD = "headers array<struct<key:string,value:binary>>"

TIMESTAMP_STRATEGIES = ("error", "latest")

# options of the cold store, named as the broker's settings with a ``stonemq.`` prefix
STORE_OPTIONS = {
    "stonemq.tier.store.url": "url",
    "stonemq.tier.s3.endpoint.url": "s3_endpoint_url",
    "stonemq.tier.s3.region": "s3_region",
    "stonemq.tier.s3.access.key.id": "s3_access_key_id",
    "stonemq.tier.s3.secret.access.key": "s3_secret_access_key",
}


class OptionError(ValueError):
    """An option is missing, unknown in value or contradicts another (Spark's Kafka source
    raises IllegalArgumentException for the same cases)."""


TopicPartitionKey = tuple[str, int]


def schema(include_headers: bool) -> str:
    return KAFKA_SCHEMA + (", " + HEADERS_FIELD if include_headers else "")


# -- offsets JSON ---------------------------------------------------------------------------
def parse_offsets_json(text: str, what: str) -> dict[TopicPartitionKey, int]:
    """``{"t":{"0":23,"1":-2}}`` -> ``{("t", 0): 23, ("t", 1): -2}``."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OptionError(f"{what}: not JSON ({exc}): {text!r}") from None
    if not isinstance(body, dict):
        raise OptionError(f"{what}: expected {{topic: {{partition: offset}}}}, got {text!r}")
    out: dict[TopicPartitionKey, int] = {}
    for topic, parts in body.items():
        if not isinstance(parts, dict):
            raise OptionError(f"{what}: partitions of {topic!r} must be an object")
        for partition, offset in parts.items():
            try:
                p = int(partition)
            except ValueError:
                raise OptionError(f"{what}: partition {partition!r} is not a number") from None
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise OptionError(f"{what}: offset of {topic}-{p} must be an integer")
            out[(topic, p)] = offset
    return out


def offsets_json(offsets: Mapping[TopicPartitionKey, int]) -> dict[str, dict[str, int]]:
    """The checkpoint form: ``{"t": {"0": 23}}`` (Spark's Kafka source's offset JSON)."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def from_offsets_json(body: Mapping[str, Mapping[str, int]]) -> dict[TopicPartitionKey, int]:
    return {(t, int(p)): int(o) for t, parts in body.items() for p, o in parts.items()}


# -- options --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Bound:
    """Where a range starts or ends: ``earliest`` / ``latest``, per-partition offsets
    (``specific``, -2 / -1 allowed), one timestamp for all partitions (``timestamp``) or per
    partition (``by_timestamp``)."""

    kind: str  # earliest | latest | specific | timestamp | by_timestamp
    offsets: dict[TopicPartitionKey, int] = field(default_factory=dict)
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class SourceOptions:
    bootstrap: str
    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    assign: tuple[TopicPartitionKey, ...] = ()
    starting: Bound = Bound("earliest")
    ending: Bound = Bound("latest")
    include_headers: bool = False
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    fail_on_data_loss: bool = True
    max_offsets_per_trigger: int | None = None
    timestamp_strategy: str = "error"
    consumer_config: dict[str, str] = field(default_factory=dict)
    store: dict[str, str] = field(default_factory=dict)
    timeout_ms: int = 60_000  # kafka.default.api.timeout.ms (Kafka's default)
    poll_timeout_ms: int = 120_000  # kafkaConsumer.pollTimeoutMs (Spark's default)
    group_id_prefix: str = "stonemq-spark"  # groupIdPrefix: of the consumers' generated group.id
    # stonemq.filterPushdown: prune by pushed filters (off: PySpark reuses a DataFrame's last
    # pushed plan for its later queries that push nothing, see stonemq.spark.source)
    filter_pushdown: bool = False

    @property
    def read_committed(self) -> bool:
        return self.consumer_config.get("isolation.level", "") == "read_committed"

    def topic_matches(self, topic: str) -> bool:
        if self.subscribe:
            return topic in self.subscribe
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        return any(t == topic for t, _ in self.assign)


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    low = str(value).strip().lower()
    if low not in ("true", "false"):
        raise OptionError(f"{name} must be true or false, not {value!r}")
    return low == "true"


def _positive(options: Mapping[str, str], name: str) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        raise OptionError(f"{name} must be a positive integer, not {value!r}") from None
    if number <= 0:
        raise OptionError(f"{name} must be a positive integer, not {value!r}")
    return number


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    """Spark's data source options are case-insensitive; keys lowered, ``kafka.*`` kept."""
    return {str(k).lower(): str(v) for k, v in options.items()}


def _bound(opts: Mapping[str, str], prefix: str, default: str, streaming: bool) -> Bound:
    """startingOffsets / endingOffsets with their timestamp variants; the timestamp option
    wins over ``...OffsetsByTimestamp``, which wins over ``...Offsets`` (as in Spark)."""
    ts = opts.get(f"{prefix}timestamp")
    if ts is not None:
        try:
            value = int(ts.strip())
        except ValueError:
            raise OptionError(f"{prefix}Timestamp must be milliseconds, not {ts!r}") from None
        if value < 0:
            raise OptionError(f"{prefix}Timestamp must not be negative, not {ts!r}")
        return Bound("timestamp", timestamp_ms=value)
    by_ts = opts.get(f"{prefix}offsetsbytimestamp")
    if by_ts is not None:
        return Bound("by_timestamp", parse_offsets_json(by_ts, f"{prefix}OffsetsByTimestamp"))
    text = opts.get(f"{prefix}offsets", default).strip()
    if text.lower() in ("earliest", "latest"):
        return Bound(text.lower())
    return Bound("specific", parse_offsets_json(text, f"{prefix}Offsets"))


def parse(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """The reader's options, checked as Spark's Kafka source checks them."""
    opts = _lower(options)
    bootstrap = opts.get("kafka.bootstrap.servers")
    if not bootstrap:
        raise OptionError("option 'kafka.bootstrap.servers' must be specified")
    chosen = [k for k in ("subscribe", "subscribepattern", "assign") if k in opts]
    if len(chosen) != 1:
        raise OptionError(
            "exactly one of the options 'assign', 'subscribe', 'subscribePattern' must be "
            f"specified (got {len(chosen)})"
        )
    subscribe: tuple[str, ...] = ()
    pattern = None
    assign: tuple[TopicPartitionKey, ...] = ()
    if "subscribe" in opts:
        subscribe = tuple(t.strip() for t in opts["subscribe"].split(",") if t.strip())
        if not subscribe:
            raise OptionError(f"no topics to subscribe to in {opts['subscribe']!r}")
    elif "subscribepattern" in opts:
        pattern = opts["subscribepattern"].strip()
        if not pattern:
            raise OptionError("pattern to subscribe is empty")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"subscribePattern {pattern!r}: {exc}") from None
    else:
        try:
            body = json.loads(opts["assign"])
        except json.JSONDecodeError as exc:
            raise OptionError(f"assign: not JSON ({exc})") from None
        if not isinstance(body, dict) or not all(isinstance(v, list) for v in body.values()):
            raise OptionError('assign must look like {"topicA":[0,1],"topicB":[2,4]}')
        assign = tuple(sorted((t, int(p)) for t, ps in body.items() for p in ps))
        if not assign:
            raise OptionError("assign lists no partitions")

    starting = _bound(opts, "starting", "latest" if streaming else "earliest", streaming)
    ending = _bound(opts, "ending", "latest", streaming)
    if streaming:
        if any(k.startswith("ending") for k in opts):
            raise OptionError("ending offset options are not valid in streaming queries")
    else:
        if starting.kind == "latest":
            raise OptionError("starting offset can't be latest for batch queries on Kafka")
        if starting.kind == "specific" and LATEST in starting.offsets.values():
            raise OptionError("starting offset for a partition can't be latest (-1) in batch")
        if ending.kind == "earliest":
            raise OptionError("ending offset can't be earliest for batch queries on Kafka")
        if ending.kind == "specific" and EARLIEST in ending.offsets.values():
            raise OptionError("ending offset for a partition can't be earliest (-2) in batch")
    strategy = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in TIMESTAMP_STRATEGIES:
        raise OptionError(f"startingOffsetsByTimestampStrategy must be error or latest: {strategy}")
    # Spark's KafkaSourceProvider refuses these (and takes kafka.group.id with a warning: the
    # source never joins a group, so that id only names its consumers, as here)
    for banned, why in (
        ("kafka.auto.offset.reset", "set startingOffsets to earliest or latest instead"),
        ("kafka.enable.auto.commit", "the source tracks offsets itself"),
        ("kafka.key.deserializer", "keys are read as bytes; deserialize them in the DataFrame"),
        ("kafka.value.deserializer", "values are read as bytes; deserialize them in the DataFrame"),
        ("kafka.interceptor.classes", "interceptors could change what is read"),
    ):
        if banned in opts:
            raise OptionError(f"option '{banned}' is not supported: {why}")
    if streaming:  # Spark's trigger options this source does not have: refused, not ignored
        for unsupported in ("minOffsetsPerTrigger", "maxTriggerDelay"):
            if unsupported.lower() in opts:
                raise OptionError(
                    f"option '{unsupported}' is not supported by the stonemq source (a "
                    "micro-batch takes what is there, up to maxOffsetsPerTrigger)"
                )
    consumer_config = {
        k[len("kafka.") :]: v
        for k, v in _kafka_options(options).items()
        if k.lower() not in ("kafka.bootstrap.servers", "kafka.default.api.timeout.ms")
    }
    timeout_ms = _positive(opts, "kafka.default.api.timeout.ms") or 60_000
    poll_timeout_ms = _positive(opts, "kafkaconsumer.polltimeoutms") or 120_000
    store = {STORE_OPTIONS[k]: v for k, v in opts.items() if k in STORE_OPTIONS}
    # secrets and URLs keep their case
    for name, attr in STORE_OPTIONS.items():
        for k, v in options.items():
            if str(k).lower() == name:
                store[attr] = str(v)
    return SourceOptions(
        bootstrap=bootstrap,
        subscribe=subscribe,
        pattern=pattern,
        assign=assign,
        starting=starting,
        ending=ending,
        include_headers=_bool(opts, "includeheaders", False),
        min_partitions=_positive(opts, "minpartitions"),
        max_records_per_partition=_positive(opts, "maxrecordsperpartition"),
        fail_on_data_loss=_bool(opts, "failondataloss", True),
        max_offsets_per_trigger=_positive(opts, "maxoffsetspertrigger"),
        timestamp_strategy=strategy,
        consumer_config=consumer_config,
        store=store,
        timeout_ms=timeout_ms,
        poll_timeout_ms=poll_timeout_ms,
        group_id_prefix=str(opts.get("groupidprefix") or "stonemq-spark"),
        filter_pushdown=_bool(opts, "stonemq.filterpushdown", False),
    )


def _kafka_options(options: Mapping[str, str]) -> dict[str, str]:
    """``kafka.*`` options with the prefix's case normalised and the rest kept as given
    (librdkafka property names are lower case, as Kafka's)."""
    return {
        "kafka." + str(k)[len("kafka.") :]: str(v)
        for k, v in options.items()
        if str(k).lower().startswith("kafka.")
    }


@dataclass(frozen=True, slots=True)
class SinkOptions:
    bootstrap: str
    topic: str | None
    producer_config: dict[str, str]


def parse_sink(options: Mapping[str, str]) -> SinkOptions:
    opts = _lower(options)
    bootstrap = opts.get("kafka.bootstrap.servers")
    if not bootstrap:
        raise OptionError("option 'kafka.bootstrap.servers' must be specified")
    config = {
        k[len("kafka.") :]: v
        for k, v in _kafka_options(options).items()
        if k.lower() != "kafka.bootstrap.servers"
    }
    for name in ("key.serializer", "value.serializer"):
        if name in config:
            raise OptionError(f"kafka option '{name}' is not supported: keys and values are bytes")
    if config.get("enable.idempotence", "true").lower() == "false":
        raise OptionError("the sink's producers are idempotent: kafka.enable.idempotence=false")
    topic = opts.get("topic")
    return SinkOptions(bootstrap, topic.strip() if topic else None, config)


# -- planning -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ColdPart:
    """Archived offsets a task reads from Parquet: the manifest's committed files."""

    start_offset: int  # the cold log start (rows below it are gone)
    next_offset: int  # the first offset the manifest does not cover
    files: tuple[tuple[int, int, str | None], ...] = ()  # (first, last, key)


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """One Spark input partition: offsets ``[start, end)`` of one topic partition, read
    from the cold store (``cold``) or over Kafka."""

    topic: str
    partition: int
    start: int
    end: int
    cold: bool = False
    files: tuple[tuple[int, int, str | None], ...] = ()
    # a batch read's endingOffsets latest, late-bound: the task reads to the log end at its
    # run (``end`` is the log end at planning), as Spark's KafkaSourceRDD resolves it
    to_latest: bool = False
    # a batch read's startingOffsets earliest, late-bound the same way: the task reads from
    # the log start at its run (``start`` is the log start at planning)
    from_earliest: bool = False

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class LaterPartitions:
    """One more Spark input partition of a batch read from ``earliest`` to ``latest`` by
    subscription: the partitions its task finds that the plan did not know (``known``),
    each read from its log start to its log end when the task runs. PySpark reuses a
    DataFrame's plan for every query, where Spark's Kafka source plans each query and so
    reads partitions (and subscribed topics) added since."""

    known: frozenset[tuple[str, int]]


def split_at_seam(
    topic: str, partition: int, start: int, end: int, cold: ColdPart | None
) -> list[OffsetRange]:
    """``[start, end)`` as a cold range (what the manifest covers) and a Kafka range (the
    rest): the two meet at the manifest's next offset, so no offset is read twice or
    skipped. Empty ranges are left out."""
    if end <= start:
        return []
    if cold is None or cold.next_offset <= start or cold.next_offset <= cold.start_offset:
        return [OffsetRange(topic, partition, start, end)]
    seam = min(cold.next_offset, end)
    cold_start = max(start, cold.start_offset)
    out = []
    if cold_start > start:  # below the cold log start: only Kafka can say it is gone
        out.append(OffsetRange(topic, partition, start, min(cold_start, end)))
    if seam > cold_start:
        files = tuple(f for f in cold.files if f[1] >= cold_start and f[0] < seam)
        out.append(OffsetRange(topic, partition, cold_start, seam, cold=True, files=files))
    if end > seam:
        out.append(OffsetRange(topic, partition, seam, end))
    return out


def split_ranges(
    ranges: Iterable[OffsetRange],
    min_partitions: int | None = None,
    max_records: int | None = None,
) -> list[OffsetRange]:
    """Split ranges so there are at least ``min_partitions`` of them when there are that
    many offsets (each range into parts in proportion to its size, as Spark's
    KafkaOffsetRangeCalculator does) and none holds more than ``max_records`` offsets.
    Parts cover their range exactly, in order.

    The parts are shared out by largest remainder, so ranges of about equal size get equal
    numbers of parts and the total is ``min_partitions`` exactly unless a range smaller
    than its share needs a part of its own (rounding every share up gave two halves of a
    read 3 + 2 tasks for minPartitions=4: a third wave of tasks on two cores)."""
    out = [r for r in ranges if r.size > 0]
    if max_records:
        out = [p for r in out for p in _split_even(r, -(-r.size // max_records))]
    total = sum(r.size for r in out)
    if min_partitions and total and len(out) < min_partitions:
        parts = _shares([r.size for r in out], min_partitions)
        out = [p for r, n in zip(out, parts, strict=True) for p in _split_even(r, n)]
    return out


def _shares(sizes: list[int], wanted: int) -> list[int]:
    """Parts per range: at least one each, ``wanted`` in all shared in proportion to the
    sizes by largest remainder, never more parts than a range has offsets."""
    total = sum(sizes)
    parts = [max(1, size * wanted // total) for size in sizes]
    # the ranges with the largest remainders first (earlier ranges win ties)
    order = sorted(range(len(sizes)), key=lambda i: (-(sizes[i] * wanted % total), i))
    left = wanted - sum(parts)
    while left > 0:
        grew = False
        for i in order:
            if left and parts[i] < sizes[i]:
                parts[i] += 1
                left -= 1
                grew = True
        if not grew:
            break
    return parts


def _split_even(r: OffsetRange, parts: int) -> list[OffsetRange]:
    if parts <= 1:
        return [r]
    out = []
    for i in range(parts):
        s = r.start + r.size * i // parts
        e = r.start + r.size * (i + 1) // parts
        if e > s:
            files = tuple(f for f in r.files if f[1] >= s and f[0] < e) if r.cold else ()
            out.append(replace(r, start=s, end=e, files=files))
    return out


def rate_limit(
    start: Mapping[TopicPartitionKey, int],
    latest: Mapping[TopicPartitionKey, int],
    max_offsets: int,
) -> dict[TopicPartitionKey, int]:
    """The end offsets of a micro-batch under ``maxOffsetsPerTrigger``, by Spark's Kafka
    source's rule: each partition takes ``max_offsets`` times its share of what waits in
    all, rounded down, but a share under one offset is rounded up so that a partition with
    little waiting beside a large backlog is never starved; never past ``latest``. So a
    micro-batch may take up to one offset per such partition more than ``max_offsets``, or a
    few less, as Spark's does. ``start`` holds every partition of ``latest`` (new ones at
    their earliest offset)."""
    waiting = {tp: max(0, latest[tp] - start.get(tp, latest[tp])) for tp in latest}
    total = sum(waiting.values())
    if total <= max_offsets:
        return dict(latest)
    out = {}
    for tp, end in latest.items():
        n = waiting[tp]
        if n == 0:
            out[tp] = end
            continue
        share = max_offsets * n / total
        take = math.ceil(share) if share < 1 else math.floor(share)
        out[tp] = min(end, start.get(tp, end) + take)
    return out
