"""The ``stonemq`` data source for Spark 4's Python Data Source API: batch and streaming
reads with Spark's Kafka source's options and schema, batch and streaming writes with its
sink's columns.

The driver plans (partitions, offsets, the manifest's archived ranges) and each task reads
one offset range: archived offsets from Parquet in the cold store, the rest over Kafka
(:mod:`stonemq.spark.kafka_io`). Writes produce through one idempotent confluent-kafka
producer per task and fail the task on any undelivered record: at least once.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from stonemq.spark import options as so
from stonemq.spark.kafka_io import (
    Broker,
    DataLossError,
    ReadContext,
    SourceError,
)
from stonemq.spark.options import OffsetRange, SourceOptions, TopicPartitionKey

NAME = "stonemq"


class StoneMQDataSource(DataSource):
    """``format("stonemq")``: Spark's Kafka source and sink, without a jar, reading archived
    offsets straight from the cold store's Parquet files."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return so.schema(so._bool(dict(self.options), "includeheaders", False))

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = so.parse(dict(self.options), streaming=False)
        return FilteringBatchReader(opts) if _pushdown_enabled() else BatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(so.parse(dict(self.options), streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> BatchWriter:
        return BatchWriter(so.parse_sink(dict(self.options)), _check_sink_schema(schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> StreamWriter:
        return StreamWriter(so.parse_sink(dict(self.options)), _check_sink_schema(schema))


class RangePartition(InputPartition):
    def __init__(self, r: OffsetRange) -> None:
        super().__init__(r)
        self.range = r


# -- planning shared by batch and streaming -------------------------------------------------
def _plan(
    broker: Broker,
    opts: SourceOptions,
    starts: dict[TopicPartitionKey, int],
    ends: dict[TopicPartitionKey, int],
    marks: dict[TopicPartitionKey, tuple[int, int]],
) -> list[OffsetRange]:
    """Offset ranges for ``[starts, ends)``: a start below the log start is data loss
    (error, or the log start with failOnDataLoss=false); archived offsets go to cold
    ranges."""
    tps = sorted(ends)
    cold = broker.cold_parts(tps)
    ranges: list[OffsetRange] = []
    for tp in tps:
        low, high = marks[tp]
        start, end = starts[tp], ends[tp]
        if start < low:
            if opts.fail_on_data_loss:
                raise DataLossError(
                    f"{tp[0]}-{tp[1]}: offsets {start}..{low - 1} are gone (the log now "
                    f"starts at {low}: retention removed them). Some data may have been "
                    "lost; set failOnDataLoss=false to go on from the log start."
                )
            start = low
        if end > high:
            if opts.fail_on_data_loss:
                raise DataLossError(
                    f"{tp[0]}-{tp[1]}: ending offset {end} is past the log end {high} "
                    "(the topic was deleted and re-created, or truncated). Set "
                    "failOnDataLoss=false to read what is there."
                )
            end = high
        if end < start:
            if opts.fail_on_data_loss:
                raise DataLossError(
                    f"{tp[0]}-{tp[1]}: ending offset {end} is before starting offset {start}"
                )
            continue
        ranges += so.split_at_seam(tp[0], tp[1], start, end, cold.get(tp))
    return so.split_ranges(ranges, opts.min_partitions, opts.max_records_per_partition)


@dataclass(slots=True)
class Pushed:
    """What the pushed filters allow: partitions, an offset range, a timestamp floor."""

    partitions: set[int] | None = None
    offset_min: int = 0
    offset_max: int | None = None  # exclusive
    timestamp_min_ms: int | None = None

    def apply(self, r: OffsetRange) -> OffsetRange | None:
        if self.partitions is not None and r.partition not in self.partitions:
            return None
        start = max(r.start, self.offset_min)
        end = r.end if self.offset_max is None else min(r.end, self.offset_max)
        if end <= start:
            return None
        files = r.files
        if r.cold:
            files = tuple(f for f in files if f[1] >= start and f[0] < end)
        return replace(r, start=start, end=end, files=files)


def _millis(value: Any) -> int | None:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            return None  # a wall-clock time of unknown zone: not used for pruning
        return int(value.timestamp() * 1000)
    return None


# -- batch ----------------------------------------------------------------------------------
def _pushdown_enabled() -> bool:
    """Whether Spark will push filters (``spark.sql.python.filterPushdown.enabled``, off by
    default; :func:`stonemq.spark.register` turns it on). PySpark refuses a reader that
    has ``pushFilters`` when it is off and hands the setting to no one, so it is read from
    the planning worker's frame; not found (another PySpark) means a reader without it."""
    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            break
        if "enable_pushdown" in frame.f_locals:
            return bool(frame.f_locals["enable_pushdown"])
        if frame.f_code.co_filename.endswith("data_source_pushdown_filters.py"):
            return True  # the worker Spark runs only when pushdown is on
        frame = frame.f_back
    return False


class BatchReader(DataSourceReader):
    """``spark.read.format("stonemq")``: one input partition per offset range."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.pushed = Pushed()

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        with Broker(opts) as broker:
            tps = broker.partitions()
            marks = broker.watermarks(tps)
            starts = broker.resolve(opts.starting, tps, marks, starting=True)
            ends = broker.resolve(opts.ending, tps, marks, starting=False)
            if self.pushed.partitions is not None:  # pruned after the options' checks
                ends = {tp: o for tp, o in ends.items() if tp[1] in self.pushed.partitions}
            ranges = _plan(broker, opts, starts, ends, marks)
        out = []
        for r in ranges:
            pruned = self.pushed.apply(r)
            if pruned is None:
                continue
            if pruned.cold and self.pushed.timestamp_min_ms is not None:
                pruned = _prune_cold_by_time(pruned, self.pushed.timestamp_min_ms, broker)
            if pruned is not None:
                out.append(RangePartition(pruned))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if partition.value is not None:  # None: Spark's stand-in when nothing is planned
            yield from ReadContext(self.opts).read(partition.value)


class FilteringBatchReader(BatchReader):
    """The batch reader with filter pushdown on partition, offset and timestamp."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Partition and offset comparisons are applied exactly by the plan (not
        evaluated again); timestamp floors only drop archived files whose newest record
        is older, so Spark still evaluates them."""
        p = self.pushed
        for f in filters:
            column = f.attribute[0] if len(f.attribute) == 1 else None  # type: ignore[attr-defined]
            value = getattr(f, "value", None)
            if column == "partition" and isinstance(f, EqualTo) and isinstance(value, int):
                p.partitions = {value} & p.partitions if p.partitions is not None else {value}
                continue
            if column == "partition" and isinstance(f, In):
                values = {v for v in value if isinstance(v, int)}  # type: ignore[union-attr]
                p.partitions = values & p.partitions if p.partitions is not None else values
                continue
            if column == "offset" and isinstance(value, int):
                if isinstance(f, EqualTo):
                    p.offset_min = max(p.offset_min, value)
                    p.offset_max = _min(p.offset_max, value + 1)
                    continue
                if isinstance(f, GreaterThan | GreaterThanOrEqual):
                    p.offset_min = max(p.offset_min, value + (isinstance(f, GreaterThan)))
                    continue
                if isinstance(f, LessThan | LessThanOrEqual):
                    p.offset_max = _min(p.offset_max, value + (isinstance(f, LessThanOrEqual)))
                    continue
            if column == "timestamp" and isinstance(f, GreaterThan | GreaterThanOrEqual):
                ms = _millis(value)
                if ms is not None:
                    # > T and >= T both mean no row older than T is wanted
                    p.timestamp_min_ms = max(p.timestamp_min_ms or ms, ms)
            yield f


def _prune_cold_by_time(r: OffsetRange, floor_ms: int, broker: Broker) -> OffsetRange | None:
    """Drop archived files whose newest record is older than ``floor_ms`` (the manifest
    keeps each file's largest timestamp)."""
    from stonemq.spark.kafka_io import _store
    from stonemq.tiering import manifest as mf

    current = mf.load(_store(broker.opts.store), r.topic, r.partition)
    newest = {f.key: f.max_timestamp_ms for f in current.files}
    files = tuple(f for f in r.files if f[2] is None or newest.get(f[2], floor_ms) >= floor_ms)
    if not any(f[2] for f in files):
        return None
    return replace(r, files=files)


def _min(a: int | None, b: int) -> int:
    return b if a is None else min(a, b)


# -- streaming ------------------------------------------------------------------------------
class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("stonemq")``: offsets ``{"topic": {"partition": offset}}``
    in the checkpoint; each micro-batch reads ``[previous end, new end)``."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.target: dict[TopicPartitionKey, int] | None = None  # Trigger.AvailableNow

    def initialOffset(self) -> dict:
        with Broker(self.opts) as broker:
            tps = broker.partitions()
            marks = broker.watermarks(tps)
            return so.offsets_json(broker.resolve(self.opts.starting, tps, marks, starting=True))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        with Broker(self.opts) as broker:
            tps = broker.partitions()
            self.target = {tp: high for tp, (_, high) in broker.watermarks(tps).items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = so.from_offsets_json(start)
        with Broker(self.opts) as broker:
            tps = broker.partitions()
            if self.target is not None:
                tps = [tp for tp in tps if tp in self.target]
            marks = broker.watermarks(tps)
        latest = {tp: marks[tp][1] for tp in tps}
        if self.target is not None:
            latest = {tp: min(v, self.target[tp]) for tp, v in latest.items()}
        # a new partition starts at its earliest offset; a partition that went away keeps
        # its offset in the checkpoint
        full_start = {tp: begin.get(tp, marks[tp][0]) for tp in tps}
        for tp in tps:
            if tp in begin and latest[tp] < begin[tp] and self.opts.fail_on_data_loss:
                raise DataLossError(
                    f"{tp[0]}-{tp[1]}: the log now ends at {latest[tp]}, before the query's "
                    f"offset {begin[tp]} (the topic was deleted and re-created, or truncated). "
                    "Some data may have been lost; set failOnDataLoss=false to go on."
                )
        if isinstance(limit, ReadMaxRows):
            latest = so.rate_limit(full_start, latest, limit.max_rows)
        out = dict(begin)
        out.update(latest)
        return so.offsets_json(out)

    def reportLatestOffset(self) -> dict | None:
        return None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin = so.from_offsets_json(start)
        finish = so.from_offsets_json(end)
        with Broker(self.opts) as broker:
            tps = sorted(tp for tp in finish if finish[tp] != begin.get(tp))
            known = set(broker.partitions())
            lost = [tp for tp in tps if tp not in known]
            if lost and self.opts.fail_on_data_loss:
                raise DataLossError(
                    f"partitions {lost} are gone (topic deleted?). Some data may have been "
                    "lost; set failOnDataLoss=false to go on without them."
                )
            tps = [tp for tp in tps if tp in known]
            marks = broker.watermarks(tps)
            starts = {tp: begin.get(tp, marks[tp][0]) for tp in tps}
            ends = {tp: finish[tp] for tp in tps}
            ranges = _plan(broker, self.opts, starts, ends, marks)
        return [RangePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if partition.value is not None:  # None: Spark's stand-in when nothing is planned
            yield from ReadContext(self.opts).read(partition.value)

    def commit(self, end: dict) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint, not in a consumer group."""

    def stop(self) -> None:
        """Nothing to release: every call opens and closes its own client."""


# -- writes ---------------------------------------------------------------------------------
SINK_TYPES = {
    "value": ("string", "binary"),
    "key": ("string", "binary"),
    "topic": ("string",),
    "partition": ("int",),
    "headers": ("array<struct<key:string,value:binary>>",),
}


def _check_sink_schema(schema: StructType) -> StructType:
    """Spark's Kafka sink's column rules: ``value`` required, string or binary; ``key``
    string or binary; ``topic`` string; ``partition`` int; ``headers``
    array<struct<key:string,value:binary>>. Other columns are ignored."""
    names = {f.name.lower(): f for f in schema.fields}
    if "value" not in names:
        raise so.OptionError("required attribute 'value' not found in the DataFrame")
    for name, allowed in SINK_TYPES.items():
        f = names.get(name)
        if f is not None and f.dataType.simpleString() not in allowed:
            raise so.OptionError(
                f"{name} attribute type must be {' or '.join(allowed)}, "
                f"not {f.dataType.simpleString()}"
            )
    return schema


@dataclass(slots=True)
class Delivered(WriterCommitMessage):
    records: int


def _bytes(v: Any) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    return str(v).encode() if not isinstance(v, bytearray | memoryview) else bytes(v)


def produce_batches(sink: so.SinkOptions, batches: Iterator[pa.RecordBatch]) -> Delivered:
    """Produce every row through one idempotent producer (acks=all), flush, and raise on
    any record not delivered: the task fails and Spark retries it (at least once)."""
    from confluent_kafka import KafkaException, Producer

    conf: dict[str, Any] = {
        "bootstrap.servers": sink.bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
    }
    conf.update(sink.producer_config)
    producer = Producer(conf)
    errors: list[str] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None and len(errors) < 5:
            errors.append(f"{msg.topic()}-{msg.partition()}: {err.str()}")

    sent = 0
    for batch in batches:
        cols = {name.lower(): batch.column(i) for i, name in enumerate(batch.schema.names)}
        n = batch.num_rows
        values = cols["value"].to_pylist()
        keys = cols["key"].to_pylist() if "key" in cols else [None] * n
        topics = (
            [sink.topic] * n
            if sink.topic
            else (cols["topic"].to_pylist() if "topic" in cols else [None] * n)
        )
        parts = cols["partition"].to_pylist() if "partition" in cols else [None] * n
        headers = cols["headers"].to_pylist() if "headers" in cols else [None] * n
        for i in range(n):
            topic = topics[i]
            if not topic:
                raise so.OptionError(
                    "topic option required when no 'topic' attribute is present, and a "
                    "row's topic must not be null"
                )
            kwargs: dict[str, Any] = {"key": _bytes(keys[i]), "on_delivery": report}
            if parts[i] is not None:
                kwargs["partition"] = parts[i]
            if headers[i]:
                kwargs["headers"] = [(h["key"], h["value"]) for h in headers[i]]
            while True:
                try:
                    producer.produce(topic, _bytes(values[i]), **kwargs)
                    break
                except BufferError:
                    producer.poll(0.05)
                except KafkaException as exc:
                    raise SourceError(f"producing to {topic}: {exc}") from None
            sent += 1
            if errors:
                break
        producer.poll(0)
        if errors:
            break
    left = producer.flush(120)
    if errors:
        raise SourceError(f"records not delivered: {'; '.join(errors)}")
    if left:
        raise SourceError(f"{left} records not delivered within 120 s")
    return Delivered(sent)


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, sink: so.SinkOptions, schema: StructType) -> None:
        self.sink = sink

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return produce_batches(self.sink, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every task flushed its records before reporting: nothing left to do."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Records delivered by tasks that finished stay (Kafka has no rollback)."""


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, sink: so.SinkOptions, schema: StructType) -> None:
        self.sink = sink

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return produce_batches(self.sink, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The micro-batch's records are all delivered once every task returned."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Delivered records stay; the batch is replayed on restart (at least once)."""
