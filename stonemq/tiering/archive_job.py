"""The PySpark archive job: uploaded sealed segments in, committed Parquet tables out.

Two Spark Python data sources carry it, so the same job runs on ``local[*]`` or any cluster
(executors import this module from the installed package and need only the cold store):

- ``stonemq_segments`` (reader): one input partition per :class:`ArchiveTask` (an uploaded
  segment's not-yet-archived offsets); it reads the segment from the cold store and yields
  Arrow batches of data records (control batches skipped), plus the task's range.
- ``stonemq_archive`` (a ``DataSourceArrowWriter``): each task writes its rows as one zstd
  Parquet file to ``_staging/``; the driver-side ``commit()`` moves every file to
  ``topics/<topic>/partition=<p>/<first>-<last>.parquet`` and then commits the partition's
  manifest (:mod:`stonemq.tiering.manifest`). A range enters the archive exactly once: a
  rerun after a kill re-plans from the manifest, and ``merge`` drops ranges already in it.

:func:`prepare` clears what a killed run left (staged files, Parquet files no manifest lists)
before planning; only one run at a time does so (the CLI holds a lock).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)

from stonemq.tiering import manifest as mf
from stonemq.tiering.cold_store import ColdStore, StoreSpec
from stonemq.tiering.rows import ARROW_SCHEMA, SPARK_SCHEMA, decode_segment

log = logging.getLogger(__name__)

DEFAULT_ZSTD_LEVEL = 1
ROW_GROUP_RECORDS = 16384  # cold reads skip whole row groups by their offset statistics
RANGE_COLUMNS = "_range_first long, _range_last long"
_READER_SCHEMA = pa.schema(
    [*ARROW_SCHEMA, pa.field("_range_first", pa.int64()), pa.field("_range_last", pa.int64())]
)
COMMIT_RETRIES = 5


def _spec(options: Any) -> StoreSpec:
    return StoreSpec(**json.loads(options["store"]))


# -- reader ---------------------------------------------------------------------------------
class _TaskPartition(InputPartition):
    def __init__(self, task: dict[str, Any]) -> None:
        super().__init__(task)
        self.task = task


class SegmentDataSource(DataSource):
    """Reads uploaded sealed segments (``options: store, tasks``) as archive rows."""

    @classmethod
    def name(cls) -> str:
        return "stonemq_segments"

    def schema(self) -> str:
        return f"{SPARK_SCHEMA}, {RANGE_COLUMNS}"

    def reader(self, schema: Any) -> DataSourceReader:
        return _SegmentReader(dict(self.options))


class _SegmentReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        tasks = json.loads(self.options["tasks"])
        if not tasks:
            return []
        slices = max(1, min(int(self.options.get("slices", len(tasks))), len(tasks)))
        # contiguous groups of tasks: fewer, longer Spark tasks (Python workers start once)
        per = -(-len(tasks) // slices)
        return [_TaskPartition({"tasks": tasks[i : i + per]}) for i in range(0, len(tasks), per)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        store = _spec(self.options).open()
        for task in partition.task["tasks"]:  # type: ignore[attr-defined]
            yield from _task_batches(store, task)


def _task_batches(store: ColdStore, task: dict[str, Any]) -> Iterator[pa.RecordBatch]:
    """One task's rows plus its range columns; a range with no data record (control batches
    only) yields one marker row whose offset is null."""
    data = store.get(task["segment_key"])
    table = decode_segment(data, task["topic"], task["partition"], task["first"], task["last"])
    n = table.num_rows
    if n == 0:
        table = pa.Table.from_pydict(
            {"topic": [task["topic"]], "partition": [task["partition"]]}, schema=ARROW_SCHEMA
        )
        n = 1
    table = table.append_column(
        "_range_first", pa.array([task["first"]] * n, pa.int64())
    ).append_column("_range_last", pa.array([task["last"]] * n, pa.int64()))
    yield from table.cast(_READER_SCHEMA).to_batches(max_chunksize=8192)


# -- writer ---------------------------------------------------------------------------------
@dataclass
class StagedFile(WriterCommitMessage):
    topic: str
    partition: int
    first: int
    last: int
    staging_key: str | None
    records: int
    bytes: int
    max_timestamp_ms: int


@dataclass
class StagedFiles(WriterCommitMessage):
    files: list[StagedFile]


class ArchiveDataSource(DataSource):
    """The archive as a Spark table. Writing (``options: store, zstd_level``) is the job's
    output: Parquet files committed through the manifest. Reading (``options: store`` and
    optionally ``topic``) returns the committed rows of every partition, through pyarrow and
    fsspec in the executors: ``spark.read.format("stonemq_archive")`` works on an ``s3://``
    store without Hadoop's S3 connector."""

    @classmethod
    def name(cls) -> str:
        return "stonemq_archive"

    def schema(self) -> str:
        return f"{SPARK_SCHEMA}, {RANGE_COLUMNS}"

    def writer(self, schema: Any, overwrite: bool) -> DataSourceArrowWriter:
        return _ArchiveWriter(dict(self.options))

    def reader(self, schema: Any) -> DataSourceReader:
        return _ArchiveReader(dict(self.options))


class _ArchiveReader(DataSourceReader):
    """One input partition per committed Parquet file."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        store = _spec(self.options).open()
        wanted = self.options.get("topic")
        keys = []
        for topic in store.list_dirs("manifests"):
            if wanted and topic != wanted:
                continue
            for partition in store.list_dirs(f"manifests/{topic}"):
                current = mf.load(store, topic, int(partition))
                keys += [f.key for f in current.files if f.key]
        return [_TaskPartition({"key": key}) for key in keys]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        store = _spec(self.options).open()
        with store.open_read(partition.task["key"]) as fh:  # type: ignore[attr-defined]
            table = pq.read_table(fh).cast(ARROW_SCHEMA)
        n = table.num_rows
        table = table.append_column("_range_first", pa.nulls(n, pa.int64())).append_column(
            "_range_last", pa.nulls(n, pa.int64())
        )
        yield from table.to_batches(max_chunksize=8192)


def read_archive(spark: Any, spec: StoreSpec, topic: str | None = None) -> Any:
    """The committed archive (of ``topic``, or all) as a DataFrame with the documented
    columns, on any store."""
    spark.dataSource.register(ArchiveDataSource)
    reader = spark.read.format(ArchiveDataSource.name()).option("store", json.dumps(asdict(spec)))
    if topic:
        reader = reader.option("topic", topic)
    return reader.load().drop("_range_first", "_range_last")


class _ArchiveWriter(DataSourceArrowWriter):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFiles:
        """Write each range of the input (rows arrive range by range) as one staged file."""
        store = _spec(self.options).open()
        level = int(self.options.get("zstd_level", DEFAULT_ZSTD_LEVEL))
        staged: list[StagedFile] = []
        pending: list[pa.RecordBatch] = []
        current: tuple[int, int] | None = None
        for batch in iterator:
            firsts = batch.column(batch.schema.get_field_index("_range_first")).to_pylist()
            lasts = batch.column(batch.schema.get_field_index("_range_last")).to_pylist()
            start = 0
            for i in range(batch.num_rows + 1):
                rng = (firsts[i], lasts[i]) if i < batch.num_rows else None
                if i < batch.num_rows and rng == current:
                    continue
                if i > start:  # rows start..i-1 belong to ``current``
                    pending.append(batch.slice(start, i - start))
                start = i
                if rng is None:
                    break
                if pending:  # a new range begins: the previous one is complete
                    staged.append(_stage(store, pending, level))
                pending, current = [], rng
        if pending:
            staged.append(_stage(store, pending, level))
        return StagedFiles(staged)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        store = _spec(self.options).open()
        by_partition: dict[tuple[str, int], list[StagedFile]] = defaultdict(list)
        for m in messages:
            for f in m.files if isinstance(m, StagedFiles) else ():
                by_partition[(f.topic, f.partition)].append(f)
        topic_ids = json.loads(self.options.get("topic_ids", "{}"))
        for (topic, partition), staged in sorted(by_partition.items()):
            commit_partition(store, topic, partition, staged, topic_ids.get(topic))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        store = _spec(self.options).open()
        for m in messages:
            for f in m.files if isinstance(m, StagedFiles) else ():
                if f.staging_key:
                    store.delete(f.staging_key)


def _stage(store: ColdStore, batches: list[pa.RecordBatch], zstd_level: int) -> StagedFile:
    """One range's rows as a staged Parquet file (none when it has no data record)."""
    table = pa.Table.from_batches(batches)
    topic = table.column("topic")[0].as_py()
    partition = table.column("partition")[0].as_py()
    first = table.column("_range_first")[0].as_py()
    last = table.column("_range_last")[0].as_py()
    table = table.drop_columns(["_range_first", "_range_last"])
    table = table.filter(pc.is_valid(table.column("offset"))).cast(ARROW_SCHEMA)
    if table.num_rows == 0:
        return StagedFile(topic, partition, first, last, None, 0, 0, -1)
    name = f"{first:020d}-{last:020d}.{uuid.uuid4().hex}.parquet"
    key = f"{mf.staging_dir(topic, partition)}/{name}"
    size = write_parquet(store, key, table, zstd_level)
    max_ts = pc.max(table.column("timestamp").cast(pa.int64())).as_py() // 1000
    return StagedFile(topic, partition, first, last, key, table.num_rows, size, max_ts)


def write_parquet(store: ColdStore, key: str, table: pa.Table, zstd_level: int) -> int:
    """Write ``table`` as one zstd Parquet object at ``key``; returns its size."""
    with tempfile.NamedTemporaryFile(suffix=".parquet") as tmp:
        pq.write_table(
            table,
            tmp.name,
            compression="zstd",
            compression_level=zstd_level,
            row_group_size=ROW_GROUP_RECORDS,
        )
        with open(tmp.name, "rb") as fh:
            return store.put_atomic(key, iter(lambda: fh.read(8 * 1024 * 1024), b""))


def commit_partition(
    store: ColdStore,
    topic: str,
    partition: int,
    staged: Sequence[StagedFile],
    topic_id: str | None = None,
) -> mf.Manifest:
    """Make ``staged`` files part of the archive: final keys first, then the manifest.

    A file lands at its final key before any manifest lists it; a file whose range the
    manifest already covers is discarded (exactly once). With ``topic_id`` the manifest is
    that topic's (another topic of the same name's version counts as empty)."""
    for _ in range(COMMIT_RETRIES):
        current = mf.load(store, topic, partition, topic_id)
        entries = [
            mf.ArchivedFile(
                s.first,
                s.last,
                mf.parquet_key(topic, partition, s.first, s.last) if s.staging_key else None,
                s.records,
                s.bytes,
                s.max_timestamp_ms,
            )
            for s in staged
        ]
        merged, dropped = mf.merge(current, entries)
        dropped_ranges = {(d.first, d.last) for d in dropped}
        for s in staged:
            if s.staging_key is None or not store.exists(s.staging_key):
                continue
            if (s.first, s.last) in dropped_ranges:
                store.delete(s.staging_key)
            else:
                store.move(s.staging_key, mf.parquet_key(topic, partition, s.first, s.last))
        try:
            committed = mf.commit(store, merged)
        except mf.ConcurrentCommitError:
            continue
        from stonemq.tiering.uploader import delete_archived

        delete_archived(store, topic, partition, committed.next_offset)
        return committed
    raise mf.ConcurrentCommitError(f"{topic}-{partition}: gave up after {COMMIT_RETRIES} tries")


# -- driver ---------------------------------------------------------------------------------
def prepare(
    store: ColdStore, topic: str, partition: int, topic_id: str | None = None
) -> mf.Manifest:
    """Clear what a killed run left for this partition; returns its manifest."""
    for key in store.list(mf.staging_dir(topic, partition)):
        store.delete(key)
    current = mf.load(store, topic, partition, topic_id)
    listed = {f.key for f in current.files if f.key}
    for key in store.list(mf.partition_dir(topic, partition)):
        if key.endswith(".parquet") and key not in listed:
            log.info("removing %s: written by a run that did not commit it", key)
            store.delete(key)
    return current


def plan(
    store: ColdStore, topic: str, partition: int, current: mf.Manifest
) -> list[mf.ArchiveTask]:
    return mf.plan_ranges(
        topic, partition, current.next_offset, mf.list_segments(store, topic, partition)
    )


def run_tasks(
    spark: Any,
    spec: StoreSpec,
    tasks: Sequence[mf.ArchiveTask],
    zstd_level: int,
    topic_ids: dict[str, str] | None = None,
) -> None:
    """Run one Spark job archiving ``tasks`` (commit included); ``topic_ids`` (name -> id)
    tag the manifests it commits."""
    if not tasks:
        return
    spark.dataSource.register(SegmentDataSource)
    spark.dataSource.register(ArchiveDataSource)
    store_json = json.dumps(asdict(spec))
    df = (
        spark.read.format(SegmentDataSource.name())
        .option("store", store_json)
        .option("tasks", json.dumps([asdict(t) for t in tasks]))
        .option("slices", str(max(1, spark.sparkContext.defaultParallelism)))
        .load()
    )
    (
        df.write.format(ArchiveDataSource.name())
        .option("store", store_json)
        .option("zstd_level", str(zstd_level))
        .option("topic_ids", json.dumps(topic_ids or {}))
        .mode("append")
        .save()
    )


def spark_session(master: str, log_path: str | None = None, app_name: str = "stonemq-tier") -> Any:
    """A quiet SparkSession: loopback address, log4j2 at error level, no console progress,
    UTC session time zone, workers on this interpreter. The JVM's own output (start-up
    notices, errors) goes to ``log_path`` when given, not the user's terminal."""
    import sys
    import warnings

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    warnings.filterwarnings("ignore", message=".*pandas >= 3.0.0.*", category=FutureWarning)
    log4j = _log4j_config()
    java_opts = f"-Dlog4j2.configurationFile=file:{log4j}"
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):  # under spark-submit its --master wins
        builder = builder.master(master)
    builder = (
        builder.appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", os.environ["SPARK_LOCAL_IP"])
        .config("spark.driver.bindAddress", os.environ["SPARK_LOCAL_IP"])
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.executor.extraJavaOptions", java_opts)
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.python.worker.reuse", "true")
    )
    if log_path is None:
        return builder.getOrCreate()
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(2), os.dup(1)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:  # the JVM inherits these descriptors for its whole life
        os.dup2(fd, 2)
        os.dup2(fd, 1)
        return builder.getOrCreate()
    finally:
        os.dup2(saved[0], 2)
        os.dup2(saved[1], 1)
        for f in (fd, *saved):
            os.close(f)


_LOG4J2 = """\
status = error
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def _log4j_config() -> str:
    path = os.path.join(tempfile.gettempdir(), "stonemq-log4j2.properties")
    try:
        with open(path) as fh:
            current = fh.read()
    except OSError:
        current = ""
    if current != _LOG4J2:
        with open(path + ".tmp", "w") as fh:
            fh.write(_LOG4J2)
        os.replace(path + ".tmp", path)
    return path


def archive_in_process(
    spec: StoreSpec,
    queue_dir: str,
    topic: str,
    partition: int,
    *,
    commit: bool = True,
    topic_id: str | None = None,
) -> list[StagedFile]:
    """One partition's archive cycle with the job's own reader, writer and commit run in
    this process, without Spark (tests, tools): prepare, upload, plan, write, commit."""
    from stonemq.tiering.uploader import upload_sealed

    store = spec.open()
    current = prepare(store, topic, partition, topic_id)
    upload_sealed(store, queue_dir, topic, partition, current.next_offset)
    tasks = plan(store, topic, partition, current)
    options = {
        "store": json.dumps(asdict(spec)),
        "zstd_level": str(DEFAULT_ZSTD_LEVEL),
        "tasks": json.dumps([asdict(t) for t in tasks]),
        "slices": "2",
        "topic_ids": json.dumps({topic: topic_id} if topic_id else {}),
    }
    reader = SegmentDataSource(options).reader(None)
    writer = ArchiveDataSource(options).writer(None, False)
    messages = [writer.write(iter(reader.read(p))) for p in reader.partitions()]
    if commit:
        writer.commit(list(messages))
    return [f for m in messages for f in m.files]
