"""The ``stonemq`` data source for Spark 4's Python Data Source API: batch and streaming
reads with Spark's Kafka source's options and schema, batch and streaming writes with its
sink's columns.

The driver plans (partitions, offsets, the manifest's archived ranges) and each task reads
one offset range: archived offsets from Parquet in the cold store, the rest over Kafka
(:mod:`stonemq.spark.kafka_io`). Writes produce through one idempotent producer per task
that builds record batches from the Arrow columns (:mod:`stonemq.spark.produce_write`;
confluent-kafka's for options only it has) and fail the task on any undelivered record: at
least once.
"""

from __future__ import annotations

import contextlib
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
from stonemq.spark import produce_write
from stonemq.spark.kafka_io import (
    Broker,
    DataLossError,
    ReadContext,
    SourceError,
)
from stonemq.spark.options import OffsetRange, SourceOptions, TopicPartitionKey
from stonemq.spark.pool import ClientPool, config_key

NAME = "stonemq"


class StoneMQDataSource(DataSource):
    """``format("stonemq")``: Spark's Kafka source and sink, without a jar, reading archived
    offsets straight from the cold store's Parquet files."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        """Spark's Kafka columns. Spark asks for them at ``load()``, so the reader options
        are checked here too: an option wrong for a batch and for a streaming read alike
        fails at ``load()``, as Spark's Kafka source fails it (one wrong for only one of
        them fails when that read plans, as this cannot tell which it is)."""
        options = dict(self.options)
        try:
            so.parse(options, streaming=False)
        except so.OptionError as batch_error:
            try:
                so.parse(options, streaming=True)  # valid for a stream: checked again there
            except so.OptionError:
                # wrong for both: the batch read's reason (a batch user got the streaming
                # one, "ending offset options are not valid in streaming queries", for
                # endingOffsets=earliest: an independent Spark check)
                raise batch_error from None
        return so.schema(so._bool(options, "includeheaders", False))

    def reader(self, schema: StructType) -> DataSourceReader:
        """The batch reader; the one that prunes by pushed filters only when the read asks
        for it (``stonemq.filterPushdown=true``) and Spark pushes filters at all: see
        :class:`FilteringBatchReader` for why it is not the default."""
        opts = so.parse(dict(self.options), streaming=False)
        if opts.filter_pushdown and _pushdown_enabled():
            return FilteringBatchReader(opts)
        return BatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        try:
            return StreamReader(so.parse(dict(self.options), streaming=True))
        except so.OptionError as exc:
            # PySpark 4's stream runner calls the reader's stop() in a finally even when
            # streamReader raised, so the user saw "UnboundLocalError: ... 'reader'" instead
            # of this: a reader that raises it from its first call reaches them as it is
            return _RefusedStreamReader(exc)

    def writer(self, schema: StructType, overwrite: bool) -> BatchWriter:
        if overwrite:  # Spark's Kafka sink refuses it too: records are only ever appended
            raise so.OptionError(
                "save mode Overwrite is not allowed for stonemq (nor for Spark's Kafka "
                'sink): a topic is only appended to; use mode("append")'
            )
        sink = so.parse_sink(dict(self.options))
        return BatchWriter(sink, _check_sink_schema(schema, sink))

    def streamWriter(self, schema: StructType, overwrite: bool) -> StreamWriter:
        sink = so.parse_sink(dict(self.options))
        return StreamWriter(sink, _check_sink_schema(schema, sink))


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
    batch: bool = False,
    late: Iterable[TopicPartitionKey] = (),
    early: Iterable[TopicPartitionKey] = (),
) -> list[OffsetRange]:
    """Offset ranges for ``[starts, ends)``: a start below the log start is data loss
    (error, or the log start with failOnDataLoss=false); archived offsets go to cold
    ranges. A start past the end fails a batch read whatever failOnDataLoss says (Spark's
    KafkaSourceRDD asserts it), and is data loss in a micro-batch (Spark drops the range
    with failOnDataLoss=false).

    The partitions in ``late`` end at the log end when their task runs: each gets a last
    Kafka range marked ``to_latest`` (empty if nothing is there yet), and no range is
    split (Spark splits only with offsets resolved at planning). The partitions in ``early``
    start at the log start when their task runs, unless their first range is archived (the
    archive does not move under a query): their first range is marked ``from_earliest``."""
    late, early = set(late), set(early)
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
        if end < start and batch:
            raise SourceError(
                f"{tp[0]}-{tp[1]}: starting offset {start} is after the ending offset {end} "
                "(an invalid starting offset, or the topic was deleted and re-created or "
                "truncated); Spark's Kafka source fails such a read too, whatever "
                "failOnDataLoss says"
            )
        if end < start:
            if opts.fail_on_data_loss:
                raise DataLossError(
                    f"{tp[0]}-{tp[1]}: ending offset {end} is before starting offset {start}"
                )
            continue
        parts = so.split_at_seam(tp[0], tp[1], start, end, cold.get(tp))
        if tp in late:
            if parts and not parts[-1].cold:
                parts[-1] = replace(parts[-1], to_latest=True)
            else:  # nothing yet, or the archive ends the range: the log end's part comes
                at = parts[-1].end if parts else start
                parts.append(OffsetRange(tp[0], tp[1], at, at, to_latest=True))
        if tp in early and parts and not parts[0].cold:
            parts[0] = replace(parts[0], from_earliest=True)
        ranges += parts
    if late or early:
        return ranges
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
        if end <= start and not r.to_latest:  # late-bound: may hold records at its run
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
            # every partition planned and checked (data loss, start after end) as Spark's
            # source does, which has no pushdown; a partition filter prunes only after
            ranges = _plan(
                broker,
                opts,
                starts,
                ends,
                marks,
                batch=True,
                late=self._late_bound(ends, opts.ending, so.LATEST),
                early=self._late_bound(ends, opts.starting, so.EARLIEST),
            )
            floor = self.pushed.timestamp_min_ms
            # ListOffsets by time: every record before the offset it names is older than
            # the floor (-1: every record is), so a Kafka range can start there
            by_time = {}
            if floor is not None:
                wanted = self.pushed.partitions
                by_time = broker.offsets_for_times(
                    {tp: floor for tp in ends if wanted is None or tp[1] in wanted}
                )
        out = []
        for r in ranges:
            pruned = self.pushed.apply(r)
            if pruned is None:
                continue
            if pruned.cold and floor is not None:
                pruned = _prune_cold_by_time(pruned, floor, broker)
            elif not pruned.cold and floor is not None:
                pruned = _narrow_by_time(pruned, by_time.get((r.topic, r.partition)))
            if pruned is not None:
                out.append(RangePartition(pruned))
        if self._reads_later_partitions(ends):
            out.append(InputPartition(so.LaterPartitions(frozenset(ends))))
        return out

    def _reads_later_partitions(self, ends: dict[TopicPartitionKey, int]) -> bool:
        """Whether the plan gets a task for partitions added after it: a subscription (not
        ``assign``, whose partitions are fixed) read from ``earliest`` to ``latest``, both
        late-bound (no split, no pruning), as Spark's Kafka source reads them at its next
        query's plan."""
        opts = self.opts
        return (
            not opts.assign
            and opts.starting.kind == "earliest"
            and opts.ending.kind == "latest"
            and len(self._late_bound(ends, opts.ending, so.LATEST)) == len(ends)
        )

    def _late_bound(
        self, ends: dict[TopicPartitionKey, int], spec: Any, sentinel: int
    ) -> list[TopicPartitionKey]:
        """The partitions whose ``spec`` (endingOffsets, or startingOffsets) is ``latest``
        (``earliest``; ``sentinel`` in JSON), resolved by each task when it runs: PySpark
        plans a DataFrame's read once and reuses the plan for its every query, so a
        resolved offset froze the DataFrame at its first plan (records produced since not
        read; offsets retention removed since read as data loss), where Spark's Kafka
        source plans each query and resolves both in the task (KafkaSourceRDD). Not when
        minPartitions (above the partition count) or maxRecordsPerPartition split the
        ranges (Spark resolves the offsets at planning to split them), nor with pruning."""
        opts = self.opts
        split = opts.max_records_per_partition is not None or (
            opts.min_partitions is not None and opts.min_partitions > len(ends)
        )
        if split or self.pushed != Pushed():
            return []
        if spec.kind == ("latest" if sentinel == so.LATEST else "earliest"):
            return list(ends)
        if spec.kind == "specific":
            return [tp for tp in ends if spec.offsets.get(tp) == sentinel]
        return []

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if partition.value is not None:  # None: Spark's stand-in when nothing is planned
            yield from ReadContext(self.opts).read(partition.value)


class FilteringBatchReader(BatchReader):
    """The batch reader with filter pushdown on partition, offset and timestamp: opt-in
    (``stonemq.filterPushdown=true`` on the read and Spark's
    ``spark.sql.python.filterPushdown.enabled``), because PySpark (4.3) cannot keep a pruned
    plan to the query it was planned for.

    PySpark plans a pushdown query in a worker that calls ``pushFilters`` then
    ``partitions()`` and stores the result (the partitions and this pickled reader) on the
    DataFrame's relation (``PythonDataSourceV2.setReadInfo``); a later query of the same
    DataFrame that pushes no filter (none at all, or only ones PySpark cannot send, such as
    an ``OR``) runs no Python on the driver and reuses that stored plan as it is. No code of
    this reader runs for that query, and its tasks cannot tell which query they serve, so
    a plan pruned for ``where offset = 3`` would answer a later ``count()`` with 1 row per
    partition. Pruning is therefore only for reads that opt in, knowing that a DataFrame
    filtered once must be loaded again for a query without filters.

    Every filter is returned as not handled, so Spark evaluates each of them on what is
    read: a pushed filter changes only what is read, never the result of its own query."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        p = self.pushed
        for f in filters:
            # Not, And and Or have no attribute of their own: Spark evaluates them
            attribute = getattr(f, "attribute", None)
            column = attribute[0] if attribute is not None and len(attribute) == 1 else None
            value = getattr(f, "value", None)
            if column == "partition" and isinstance(f, EqualTo) and isinstance(value, int):
                p.partitions = {value} & p.partitions if p.partitions is not None else {value}
            elif column == "partition" and isinstance(f, In):
                values = {v for v in value if isinstance(v, int)}  # type: ignore[union-attr]
                p.partitions = values & p.partitions if p.partitions is not None else values
            elif column == "offset" and isinstance(value, int):
                if isinstance(f, EqualTo):
                    p.offset_min = max(p.offset_min, value)
                    p.offset_max = _min(p.offset_max, value + 1)
                elif isinstance(f, GreaterThan | GreaterThanOrEqual):
                    p.offset_min = max(p.offset_min, value + (isinstance(f, GreaterThan)))
                elif isinstance(f, LessThan | LessThanOrEqual):
                    p.offset_max = _min(p.offset_max, value + (isinstance(f, LessThanOrEqual)))
            elif column == "timestamp" and isinstance(f, GreaterThan | GreaterThanOrEqual):
                ms = _millis(value)
                # a floor below 0 keeps every record, and ListOffsets would read -1..-6 as
                # special targets (latest, earliest, the max timestamp, ...), not as times
                if ms is not None and ms >= 0:
                    # > T and >= T both mean no row older than T is wanted
                    p.timestamp_min_ms = max(p.timestamp_min_ms or ms, ms)
            yield f  # Spark evaluates every filter again: pruning never decides a row


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


def _narrow_by_time(r: OffsetRange, first: int | None) -> OffsetRange | None:
    """A Kafka range started at ``first``, the first offset whose timestamp is at or past
    the pushed floor (-1: no such offset, nothing to read); ``None``: not asked."""
    if first is None:
        return r
    if first < 0 or first >= r.end:
        return None
    return replace(r, start=max(r.start, first))


def _min(a: int | None, b: int) -> int:
    return b if a is None else min(a, b)


# -- streaming ------------------------------------------------------------------------------
class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("stonemq")``: offsets ``{"topic": {"partition": offset}}``
    in the checkpoint; each micro-batch reads ``[previous end, new end)``."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.available_now = False  # Trigger.AvailableNow
        self.target: dict[TopicPartitionKey, int] | None = None  # its end, once known
        self._initial: dict | None = None
        self._latest: dict | None = None  # the log ends the last latestOffset saw
        self._broker: Broker | None = None

    def __getstate__(self) -> dict[str, Any]:
        # the client stays here
        return {"opts": self.opts, "available_now": self.available_now, "target": self.target}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.opts = state["opts"]
        self.available_now = state.get("available_now", False)
        self.target = state["target"]
        self._initial = None
        self._latest = None
        self._broker = None

    @contextlib.contextmanager
    def _client(self) -> Iterator[Broker]:
        """The driver's client, kept open across micro-batches (Spark keeps this reader
        in one process for the query's life); closed and made again after an error."""
        if self._broker is None:
            self._broker = Broker(self.opts)
        try:
            yield self._broker
        except BaseException:
            self._close_client()
            raise

    def _close_client(self) -> None:
        if self._broker is not None:
            broker, self._broker = self._broker, None
            broker.close()

    def initialOffset(self) -> dict:
        """Resolved once per run: Spark asks again when it plans the first micro-batch
        (its start when nothing is committed), and a second ``latest`` on a topic being
        written was past the end the first one led to (Spark's Kafka source keeps its
        initial offsets in the checkpoint)."""
        if self._initial is None:
            with self._client() as broker:
                tps = broker.partitions()
                marks = broker.watermarks(tps)
                starts = broker.resolve(self.opts.starting, tps, marks, starting=True)
            self._initial = so.offsets_json(starts)
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Only notes the trigger: Spark calls this when the query starts, before
        ``initialOffset()``, so log ends read here could be behind the start offsets read
        after them (``startingOffsets=latest`` on a topic being written), and clamping to
        them looked like a truncated log. As Spark's KafkaMicroBatchStream, the target is
        the log ends at the first ``latestOffset`` call, which knows the start."""
        self.available_now = True

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = so.from_offsets_json(start)
        with self._client() as broker:
            tps = broker.partitions()
            if self.available_now and self.target is None:
                marks = broker.watermarks(tps)
                # never below the query's start: a log end behind it is data loss, found
                # below from the log ends themselves
                self.target = {tp: max(marks[tp][1], begin.get(tp, 0)) for tp in tps}
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
        seen = dict(begin)
        seen.update(latest)
        self._latest = so.offsets_json(seen)
        if isinstance(limit, ReadMaxRows):
            latest = so.rate_limit(full_start, latest, limit.max_rows)
        out = dict(begin)
        out.update(latest)
        return so.offsets_json(out)

    def reportLatestOffset(self) -> dict | None:
        """The log ends the last :meth:`latestOffset` saw (AvailableNow: its target), before
        ``maxOffsetsPerTrigger``: the query progress's ``latestOffset``, which shows how far
        behind the query is, as Spark's Kafka source reports it."""
        return self._latest

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin = so.from_offsets_json(start)
        finish = so.from_offsets_json(end)
        with self._client() as broker:
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
        self._close_client()


class _RefusedStreamReader(StreamReader):
    """The stream reader of options that are not valid: every call raises their error."""

    def __init__(self, error: so.OptionError) -> None:
        super().__init__(None)  # type: ignore[arg-type]
        self.error = error

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": None, "available_now": False, "target": None, "error": self.error}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.error = state["error"]

    def initialOffset(self) -> dict:
        raise self.error

    def getDefaultReadLimit(self) -> ReadLimit:
        raise self.error

    def prepareForTriggerAvailableNow(self) -> None:
        raise self.error

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        raise self.error

    def reportLatestOffset(self) -> dict | None:
        raise self.error

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        raise self.error

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        raise self.error

    def commit(self, end: dict) -> None:
        raise self.error


# -- writes ---------------------------------------------------------------------------------
SINK_TYPES = {
    "value": ("string", "binary"),
    "key": ("string", "binary"),
    "topic": ("string",),
    "partition": ("int",),
    "headers": ("array<struct<key:string,value:binary>>",),
}


def _check_sink_schema(schema: StructType, sink: so.SinkOptions) -> StructType:
    """Spark's Kafka sink's column rules (KafkaWriter.validateQuery, before anything is
    written, batch or streaming): a ``topic`` option or a ``topic`` column; ``value``
    required, string or binary; ``key`` string or binary; ``topic`` string; ``partition``
    int; ``headers`` array<struct<key:string,value:binary>>. Other columns are ignored."""
    names = {f.name.lower(): f for f in schema.fields}
    if sink.topic is None and "topic" not in names:
        raise so.OptionError(
            "topic option required when no 'topic' attribute is present. Use the topic "
            "option for setting a topic."
        )
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


class _Producer:
    """An idempotent acks=all producer and the delivery failures of the task using it:
    delivery reports come back for failed records only (``delivery.report.only.error``),
    so a delivered record costs no Python callback."""

    def __init__(self, conf: dict[str, Any]) -> None:
        from confluent_kafka import Producer

        self.errors: list[str] = []
        self.failed = 0
        self.producer = Producer(
            {**conf, "delivery.report.only.error": True, "on_delivery": self._report}
        )

    def _report(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed += 1
            if len(self.errors) < 5:
                self.errors.append(f"{msg.topic()}-{msg.partition()}: {err.str()}")


PRODUCERS = ClientPool(lambda p: p.producer.close())  # see stonemq.spark.pool


def _producer_conf(sink: so.SinkOptions) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": sink.bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        # keyed records where Kafka's Java producer (Spark's sink) puts them: murmur2 of
        # the key (librdkafka's default hashes with CRC32); null keys spread at random
        "partitioner": "murmur2_random",
    }
    conf.update(sink.producer_config)
    return conf


def _column(cols: dict[str, pa.Array], name: str, n: int) -> list[Any]:
    return cols[name].to_pylist() if name in cols else [None] * n


def produce_batches(sink: so.SinkOptions, batches: Iterator[pa.RecordBatch]) -> Delivered:
    """Produce every row through one idempotent producer (acks=all), wait for every
    acknowledgement, and raise on any record not delivered: the task fails and Spark
    retries it (at least once). The producer builds batches from the Arrow columns
    (:mod:`stonemq.spark.produce_write`) unless the sink's options ask for what only
    confluent-kafka does."""
    if produce_write.usable(sink):
        return _produce_arrow(sink, batches)
    return _produce_librdkafka(sink, batches)


ARROW_PRODUCERS = ClientPool(lambda p: p.close())  # see stonemq.spark.pool


def _produce_arrow(sink: so.SinkOptions, batches: Iterator[pa.RecordBatch]) -> Delivered:
    key = (sink.bootstrap, config_key(sink.producer_config))
    producer = ARROW_PRODUCERS.take(key)
    ok = False
    try:
        if producer is None:
            producer = produce_write.ArrowProducer(produce_write.Settings.of(sink))
        sent = producer.write(sink, batches)
        ok = True
        return Delivered(sent)
    except produce_write.ProduceFailed as exc:
        raise SourceError(f"records not delivered: {exc}") from None
    finally:
        if producer is not None:
            if ok:
                ARROW_PRODUCERS.give(key, producer)
            else:  # what was sent may or may not be appended: the task is retried anyway
                producer.close()


def _produce_librdkafka(sink: so.SinkOptions, batches: Iterator[pa.RecordBatch]) -> Delivered:
    conf = _producer_conf(sink)
    key = config_key(conf)
    cached = PRODUCERS.take(key) or _Producer(conf)
    ok = False
    try:
        sent = _produce_all(sink, cached, batches)
        left = cached.producer.flush(120)
        if cached.errors:
            raise SourceError(f"records not delivered: {'; '.join(cached.errors)}")
        if left:
            raise SourceError(f"{left} records not delivered within 120 s")
        ok = True
        return Delivered(sent)
    finally:
        if ok:
            PRODUCERS.give(key, cached)
        else:  # what is still queued may or may not go out: the task is retried anyway
            cached.producer.purge()
            cached.producer.close()


def _produce_all(sink: so.SinkOptions, cached: _Producer, batches: Iterator[pa.RecordBatch]) -> int:
    from confluent_kafka import KafkaException

    produce = cached.producer.produce
    poll = cached.producer.poll
    sent = 0
    for batch in batches:
        cols = {name.lower(): batch.column(i) for i, name in enumerate(batch.schema.names)}
        n = batch.num_rows
        values = cols["value"].to_pylist()
        keys = _column(cols, "key", n)
        topics = [sink.topic] * n if sink.topic else _column(cols, "topic", n)
        if not all(topics):
            raise so.OptionError(
                "topic option required when no 'topic' attribute is present, and a "
                "row's topic must not be null"
            )
        parts = _column(cols, "partition", n)
        headers = _column(cols, "headers", n)
        simple = "partition" not in cols and "headers" not in cols
        i = 0
        while i < n:
            begin = i  # 0, or the row a full queue (BufferError) refused
            try:
                if simple:  # the usual case: one call with positional arguments a row
                    for i in range(begin, n):
                        produce(topics[i], values[i], keys[i])
                    i = n
                else:
                    for i in range(begin, n):
                        kwargs: dict[str, Any] = {}
                        if parts[i] is not None:
                            kwargs["partition"] = parts[i]
                        if headers[i]:
                            kwargs["headers"] = [(h["key"], h["value"]) for h in headers[i]]
                        produce(topics[i], values[i], keys[i], **kwargs)
                    i = n
            except BufferError:  # the queue is full: let librdkafka send, go on at row i
                poll(0.05)
            except KafkaException as exc:
                raise SourceError(f"producing to {topics[i]}: {exc}") from None
            if cached.errors:
                break
        sent += n
        poll(0)
        if cached.errors:
            break
    return sent


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
