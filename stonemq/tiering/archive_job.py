"""The PySpark archive job: uploaded sealed segments in, committed Parquet tables out.

One Spark stage does the work, so the same job runs on ``local[*]`` or any cluster (executors
import this module from the installed package and need only the cold store):

- the driver plans :class:`ArchiveTask` s (an uploaded segment's not-yet-archived offsets)
  and spreads them, balanced by offsets, over ``defaultParallelism`` Spark partitions
  (``parallelize`` + ``mapPartitions``: its first job on a fresh session took 3.8 s here
  where ``mapInArrow`` over ``spark.range`` took 9 s);
- each executor task reads its segments from the cold store, decodes the data records
  (:func:`stonemq.tiering.rows.decode_segment`, control batches skipped) and writes each
  range as one zstd Parquet file to ``_staging/`` (:func:`stonemq.tiering.staging.stage_task`,
  a module without pyspark, so the Python workers import little); only the staged
  files' descriptions (a few hundred bytes each) travel back, never the rows;
- the driver commits (:func:`commit_partition`): moves every staged file to
  ``topics/<topic>/partition=<p>/<first>-<last>.parquet`` and then commits the partition's
  manifest (:mod:`stonemq.tiering.manifest`). A range enters the archive exactly once: a
  rerun after a kill re-plans from the manifest, and ``merge`` drops ranges already in it;
  a staged file no manifest lists (a killed run, a retried task) is removed by :func:`prepare`.

Rows never pass through the JVM: a Python data source reader feeding a ``DataSourceArrowWriter``
(the first design) converted every 1 KiB value Arrow -> JVM rows -> Arrow and started four
planning Python processes per job, about 6x the work of the stage itself.
:class:`ArchiveDataSource` remains the archive's reader for Spark (``read_archive``), which
works on an ``s3://`` store without Hadoop's S3 connector.

:func:`prepare` clears what a killed run left (staged files, Parquet files no manifest lists)
before planning; only one run at a time does so (the CLI holds a lock).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from stonemq.protocol.record_batch import stored_limit
from stonemq.tiering import manifest as mf
from stonemq.tiering.cold_store import ColdStore, StoreSpec
from stonemq.tiering.rows import ARROW_SCHEMA, SPARK_SCHEMA
from stonemq.tiering.staging import (
    DEFAULT_ZSTD_LEVEL,
    StagedFile,
    stage_partition,
    stage_task,
)

log = logging.getLogger(__name__)

COMMIT_RETRIES = 5


def _spec(options: Any) -> StoreSpec:
    return StoreSpec(**json.loads(options["store"]))


# -- reading the archive from Spark ------------------------------------------------------
class ArchiveDataSource(DataSource):
    """The committed archive as a Spark table (``options: store`` and optionally ``topic``):
    the committed rows of every partition, read through pyarrow and fsspec in the executors,
    so ``spark.read.format("stonemq_archive")`` works on an ``s3://`` store without Hadoop's
    S3 connector."""

    @classmethod
    def name(cls) -> str:
        return "stonemq_archive"

    def schema(self) -> str:
        return SPARK_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return _ArchiveReader(dict(self.options))


class _TaskPartition(InputPartition):
    def __init__(self, task: dict[str, Any]) -> None:
        super().__init__(task)
        self.task = task


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
                keys += [(f.key, current.start_offset) for f in current.files if f.key]
        return [_TaskPartition({"key": key, "start": start}) for key, start in keys]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """One file's rows at or above its partition's log start: DeleteRecords or cold
        retention may move the start inside a file, which stays whole until wholly below it,
        and the offsets below the start are deleted for every reader (Kafka never serves
        them; they were read here, audit36 p5)."""
        store = _spec(self.options).open()
        task = partition.task  # type: ignore[attr-defined]
        with store.open_read(task["key"]) as fh:
            table = pq.read_table(fh).cast(ARROW_SCHEMA)
        start = task.get("start", 0)
        if start > 0:
            table = table.filter(pc.greater_equal(table.column("offset"), start))
        yield from table.to_batches(max_chunksize=8192)


def read_archive(spark: Any, spec: StoreSpec, topic: str | None = None) -> Any:
    """The committed archive (of ``topic``, or all) as a DataFrame with the documented
    columns, on any store."""
    spark.dataSource.register(ArchiveDataSource)
    reader = spark.read.format(ArchiveDataSource.name()).option("store", json.dumps(asdict(spec)))
    if topic:
        reader = reader.option("topic", topic)
    return reader.load()


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
                s.log_bytes,
            )
            for s in staged
        ]
        merged, dropped = mf.merge(current, entries)
        dropped_ranges = {(d.first, d.last) for d in dropped}
        for s in staged:
            if s.staging_key is None:
                continue
            final = mf.parquet_key(topic, partition, s.first, s.last)
            if not store.exists(s.staging_key):
                # moved by an earlier try of this commit; anything else lost a file
                if (s.first, s.last) not in dropped_ranges and not store.exists(final):
                    raise FileNotFoundError(f"staged file {s.staging_key} is gone")
                continue
            if (s.first, s.last) in dropped_ranges:
                store.delete(s.staging_key)
            else:
                store.move(s.staging_key, final)
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


def stage_tasks(
    spark: Any, spec: StoreSpec, tasks: Sequence[mf.ArchiveTask], zstd_level: int
) -> list[StagedFile]:
    """Run one Spark job staging ``tasks`` (nothing is committed): the executors decode and
    write one staged Parquet file per task and return their descriptions."""
    if not tasks:
        return []
    sc = spark.sparkContext
    slices = max(1, min(int(sc.defaultParallelism), len(tasks)))
    groups = _balanced_groups([asdict(t) for t in tasks], slices)
    # one group per Spark partition (parallelize of n items into n slices)
    out = (
        sc.parallelize(groups, len(groups))
        .mapPartitions(stage_partition(json.dumps(asdict(spec)), zstd_level, stored_limit()))
        .collect()
    )
    return [StagedFile(**json.loads(item)) for item in out]


def run_tasks(
    spark: Any,
    spec: StoreSpec,
    tasks: Sequence[mf.ArchiveTask],
    zstd_level: int,
    topic_ids: dict[str, str] | None = None,
) -> list[StagedFile]:
    """Run one Spark job archiving ``tasks``: the executors stage, then the driver commits
    each partition's files (``topic_ids``, name -> id, tag the manifests). Returns the
    staged files."""
    staged = stage_tasks(spark, spec, tasks, zstd_level)
    commit_all(spec.open(), staged, topic_ids or {})
    return staged


def _balanced_groups(tasks: list[dict[str, Any]], slices: int) -> list[list[dict[str, Any]]]:
    """``tasks`` in ``slices`` groups of about equal bytes (largest first onto the lightest
    group), each group in task order; one Spark task per group."""
    groups: list[list[dict[str, Any]]] = [[] for _ in range(slices)]
    loads = [0] * slices
    sizes = [t["last"] - t["first"] + 1 for t in tasks]  # offsets: a proxy for bytes
    for i in sorted(range(len(tasks)), key=lambda i: -sizes[i]):
        g = loads.index(min(loads))
        groups[g].append(tasks[i])
        loads[g] += sizes[i]
    for g in groups:
        g.sort(key=lambda t: (t["topic"], t["partition"], t["first"]))
    return [g for g in groups if g]


def commit_all(
    store: ColdStore, staged: Sequence[StagedFile], topic_ids: dict[str, str] | None = None
) -> None:
    """The driver's commit: :func:`commit_partition` for each partition of ``staged``, of
    its ranges in offset order up to the first incomplete one (its rows ended before its
    range did: that one is committed up to where they ended, the later ones not at all, so
    the manifest never claims an offset no file holds). Raises :class:`ArchiveIncomplete`
    after committing, naming each partition that stopped so (the run fails; the next one
    starts there again)."""
    by_partition: dict[tuple[str, int], list[StagedFile]] = defaultdict(list)
    for f in staged:
        by_partition[(f.topic, f.partition)].append(f)
    stopped: list[str] = []
    for (topic, partition), files in sorted(by_partition.items()):
        kept: list[StagedFile] = []
        for f in sorted(files, key=lambda f: f.first):
            if f.last >= f.first:
                kept.append(f)
            if not f.complete:
                stopped.append(f"{topic}-{partition} at offset {f.last + 1}")
                break
        if kept:
            commit_partition(store, topic, partition, kept, (topic_ids or {}).get(topic))
    if stopped:
        raise ArchiveIncomplete(
            "archived only up to a batch the archive could not decode: "
            + ", ".join(stopped)
            + " (tier run's settings, batch.max.uncompressed.bytes among them, must be the "
            "broker's: pass its --config)"
        )


class ArchiveIncomplete(Exception):
    """A partition's archive stopped before the end of what was planned (see
    :func:`commit_all`)."""


def spark_session(
    master: str,
    log_path: str | None = None,
    app_name: str = "stonemq-tier",
    scheduling_only: bool = False,
) -> Any:
    """A quiet SparkSession: loopback address, log4j2 at error level, no console progress,
    UTC session time zone, workers on this interpreter. The JVM's own output (start-up
    notices, errors) goes to ``log_path`` when given, not the user's terminal.

    ``scheduling_only``: the driver JVM only schedules (the archive job: rows never pass
    through the JVM), so it compiles with C1 only (``-XX:TieredStopAtLevel=1``), which
    starts the session about 1-1.5 s sooner here (5.4-7.3 s -> 4.6-5.5 s); sessions that
    run queries keep the default JIT."""
    import sys
    import warnings

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    warnings.filterwarnings("ignore", message=".*pandas >= 3.0.0.*", category=FutureWarning)
    log4j = _log4j_config()
    java_opts = f"-Dlog4j2.configurationFile=file:{log4j}"
    if scheduling_only:
        java_opts += " -XX:TieredStopAtLevel=1"
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
    """One partition's archive cycle with the job's own staging and commit run in this
    process, without Spark (tests, tools): prepare, upload, plan, stage, commit."""
    from stonemq.tiering.uploader import upload_sealed

    store = spec.open()
    current = prepare(store, topic, partition, topic_id)
    upload_sealed(store, queue_dir, topic, partition, current.next_offset)
    tasks = plan(store, topic, partition, current)
    staged = [stage_task(store, asdict(t), DEFAULT_ZSTD_LEVEL) for t in tasks]
    if commit:
        commit_all(store, staged, {topic: topic_id} if topic_id else {})
    return staged
