"""``stonemq tier``: run the PySpark archive job (``tier run``) and show tiering status
(``tier status``). Both take ``--config`` / ``--data-dir`` like ``serve`` and work while the
broker runs (they read its metadata and sealed segments, and never write its files).

``tier run`` per cycle: for each partition of every topic with ``remote.storage.enable=true``,
clear what a killed run left, upload sealed segments, plan the unarchived ranges, run the
Spark job (one per topic; commit writes the manifest), then apply cold retention. One run
at a time per data dir (a lock file); Spark's own output goes to ``DATA_DIR/tier/spark.log``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from stonemq.cli.options import ConfigOpt, DataDirOpt
from stonemq.config import Settings, load_settings
from stonemq.protocol.record_batch import set_stored_limit

app = typer.Typer(
    name="tier",
    help="Tiered storage: archive sealed segments to Parquet with PySpark; show status.",
    no_args_is_help=True,
)
# piped output (cron, logs, tests) gets a wide table instead of rich's 80-column default
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False)

TASKS_PER_JOB = 64
DEFAULT_LOOP_INTERVAL_MS = 60_000


def _settings(config: Path | None, data_dir: Path | None, **flags: Any) -> Settings:
    """The broker's settings; batches read back here may decompress to as much as the
    broker accepted (``set_stored_limit``; the archive job hands it to its executors)."""
    try:
        settings = load_settings(config, data_dir=data_dir, **flags)
    except (ValidationError, ValueError, OSError) as exc:
        err.print(f"stonemq: invalid settings: {exc}")
        raise typer.Exit(2) from None
    if not Path(settings.data_dir).is_dir():  # a mistyped path showed an empty status
        err.print(f"stonemq tier: no StoneMQ data directory at {settings.data_dir}")
        raise typer.Exit(2)
    set_stored_limit(settings.batch_max_uncompressed_bytes)
    return settings


def check_spark() -> str | None:
    """Why the archive job cannot run here (no Java, no pyspark), or None."""
    java_home = os.environ.get("JAVA_HOME")
    java = shutil.which("java") or (os.path.join(java_home, "bin", "java") if java_home else None)
    if not java or not os.path.exists(java):
        return (
            "Java was not found (no `java` on PATH and no JAVA_HOME). The archive job runs on "
            "PySpark, which needs Java 17 or 21: install a JDK (e.g. apt-get install "
            "openjdk-17-jre-headless) or set JAVA_HOME."
        )
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        return (
            f"PySpark is not installed ({exc.name} is missing). Install the tier extra: "
            "pip install 'stonemq[tier]'."
        )
    return None


@contextmanager
def _run_lock(data_dir: Path) -> Iterator[None]:
    path = Path(data_dir) / "tier-run.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            err.print(f"stonemq tier run: another run holds {path}; not starting a second one")
            raise typer.Exit(1) from None
        yield


@app.command("run")
def run(
    once: Annotated[bool, typer.Option("--once", help="one cycle, then exit")] = False,
    topic: Annotated[
        list[str] | None, typer.Option("--topic", help="only this topic (repeatable)")
    ] = None,
    spark_master: Annotated[
        str | None, typer.Option(help="Spark master URL (default: tier.spark.master, local[*])")
    ] = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Archive sealed segments of tiered topics to Parquet (zstd) with a PySpark job."""
    settings = _settings(config, data_dir, tier_spark_master=spark_master)
    why = check_spark()
    if why:
        err.print(f"stonemq tier run: {why}")
        raise typer.Exit(3)
    from stonemq.tiering.cold_store import StoreSpec

    spec = StoreSpec.from_settings(settings)
    with _run_lock(settings.data_dir):
        spark = None
        interval_s = (settings.tier_interval_ms or DEFAULT_LOOP_INTERVAL_MS) / 1000
        try:
            while True:
                started = time.monotonic()
                spark = _cycle(settings, spec, topic or None, spark)
                if once:
                    break
                time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
        except KeyboardInterrupt:
            pass
        finally:
            if spark is not None:
                spark.stop()


def _tiered_topics(settings: Settings, names: list[str] | None) -> Any:
    """The tiered topics, or exit 1 with one line when the topic store cannot be read."""
    from stonemq.metadata.sqlite import MetadataStoreError
    from stonemq.tiering import status

    try:
        return status.tiered_topics(settings, names)
    except MetadataStoreError as exc:
        err.print(f"stonemq tier: {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


def _cycle(settings: Settings, spec: Any, names: list[str] | None, spark: Any) -> Any:
    from stonemq.tiering import archive_job, status, uploader
    from stonemq.tiering import manifest as mf

    store = spec.open()
    topics = _tiered_topics(settings, names)
    if names:
        missing = sorted(set(names) - {t.name for t in topics})
        if missing:
            err.print(f"not tiered (no remote.storage.enable=true) or unknown: {missing}")
    if not topics:
        console.print("No topic has remote.storage.enable=true; nothing to archive.")
        return spark
    queue_dir = str(settings.queue_path)
    started = time.time()
    summary: dict[str, Any] = {"topics": {}, "store": spec.url}
    plans: dict[str, list[mf.ArchiveTask]] = {}
    for name, topic_id in status.pending_deletes(store).items():
        # a deleted topic's cold data (the broker was stopped while removing it): while the
        # tombstone is there a topic of that name does not tier, so all of it is the old one's
        status.delete_topic_data(store, name, topic_id)
        topics = [t for t in topics if t.name != name]
    for t in topics:
        tasks: list[mf.ArchiveTask] = []
        for p in range(t.partitions):
            current = archive_job.prepare(store, t.name, p, t.topic_id or None)
            uploader.upload_sealed(store, queue_dir, t.name, p, current.next_offset)
            tasks += archive_job.plan(store, t.name, p, current)
        plans[t.name] = tasks
    before = {t.name: _archived(store, t.name, t.partitions) for t in topics}
    failed = False
    committer = ThreadPoolExecutor(1, thread_name_prefix="tier-commit")
    commits: list[Future[bool]] = []
    commit_failed: set[str] = set()
    jobs_started: float | None = None
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("segments"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        bars = {t.name: progress.add_task(t.name, total=max(len(plans[t.name]), 1)) for t in topics}
        for t in topics:
            tasks = plans[t.name]
            if not tasks:
                progress.update(bars[t.name], completed=1, description=f"{t.name} (up to date)")
                continue
            if spark is None:
                progress.update(bars[t.name], description=f"{t.name} (starting Spark)")
                spark_started = time.monotonic()
                spark = archive_job.spark_session(
                    settings.tier_spark_master,
                    str(Path(settings.data_dir) / "tier" / "spark.log"),
                    scheduling_only=True,
                )
                summary["spark_start_s"] = round(time.monotonic() - spark_started, 3)
            progress.update(bars[t.name], description=t.name)
            if jobs_started is None:
                jobs_started = time.monotonic()
            for i in range(0, len(tasks), TASKS_PER_JOB):
                chunk = tasks[i : i + TASKS_PER_JOB]
                if t.name in commit_failed:
                    break
                job_started = time.monotonic()
                try:
                    staged = archive_job.stage_tasks(
                        spark, spec, chunk, settings.tier_parquet_zstd_level
                    )
                except Exception as exc:  # a Spark/Py4J error: say it short, keep the log
                    failed = True
                    err.print(
                        f"[red]archive job failed for {t.name}[/red]: {_first_line(exc)}\n"
                        f"  (Spark's log: {Path(settings.data_dir) / 'tier' / 'spark.log'})"
                    )
                    break
                if "first_job_s" not in summary:
                    # the first job also starts Spark's Python workers: a fixed cost per run
                    summary["first_job_s"] = round(time.monotonic() - job_started, 3)
                    summary["first_job_bytes"] = sum(s.bytes_in for s in staged)
                summary["staged_bytes"] = summary.get("staged_bytes", 0) + sum(
                    s.bytes_in for s in staged
                )
                # the driver commits while the executors stage the next chunk; one commit
                # thread keeps a topic's commits in offset order
                commits.append(
                    committer.submit(
                        _commit,
                        store,
                        t.name,
                        staged,
                        t.topic_id,
                        commit_failed,
                        progress,
                        bars[t.name],
                        len(chunk),
                    )
                )
        for done in commits:
            if not done.result():
                failed = True
    committer.shutdown()
    if jobs_started is not None:
        summary["jobs_s"] = round(time.monotonic() - jobs_started, 3)
    now_ms = int(time.time() * 1000)
    table = Table(title="stonemq tier run")
    for col in (
        "topic",
        "partitions",
        "segments",
        "archived ranges",
        "records",
        "parquet bytes",
        "cold files deleted",
    ):
        table.add_column(col, justify="right" if col != "topic" else "left")
    for t in topics:
        deleted = 0
        for p in range(t.partitions):
            current = mf.load(store, t.name, p, t.topic_id or None)
            local = uploader.waiting_bytes(queue_dir, t.name, p, current.next_offset)
            segs = uploader.local_segments(queue_dir, t.name, p)
            deleted += status.apply_cold_retention(
                store, t, p, local, now_ms, local_start=segs[0].base if segs else None
            ).files_deleted
        after = _archived(store, t.name, t.partitions)
        added_files = after[0] - before[t.name][0]
        added_records = after[1] - before[t.name][1]
        added_bytes = after[2] - before[t.name][2]
        summary["topics"][t.name] = {
            "segments": len(plans[t.name]),
            "files": added_files,
            "records": added_records,
            "bytes": added_bytes,
            "cold_files_deleted": deleted,
        }
        table.add_row(
            t.name,
            str(t.partitions),
            str(len(plans[t.name])),
            str(added_files),
            str(added_records),
            str(added_bytes),
            str(deleted),
        )
    summary["duration_s"] = round(time.time() - started, 3)
    summary["ok"] = not failed
    status.record_run(store, summary)
    console.print(table)
    console.print(
        f"done in {summary['duration_s']:.1f} s" + ("" if not failed else " (with errors)")
    )
    if failed:
        raise typer.Exit(1)
    return spark


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else repr(exc)


def _commit(
    store: Any,
    topic: str,
    staged: list[Any],
    topic_id: str,
    failed: set[str],
    progress: Progress,
    bar: Any,
    tasks: int,
) -> bool:
    """Commit one job's staged files (the commit thread). After a failed commit the
    topic's later chunks are not committed, so no range is committed past a gap; the
    next run plans them again."""
    from stonemq.tiering import archive_job

    if topic in failed:
        return False
    try:
        archive_job.commit_all(store, staged, {topic: topic_id})
    except Exception as exc:
        failed.add(topic)
        err.print(f"[red]archive commit failed for {topic}[/red]: {_first_line(exc)}")
        return False
    progress.advance(bar, tasks)
    return True


def _archived(store: Any, topic: str, partitions: int) -> tuple[int, int, int]:
    from stonemq.tiering import manifest as mf

    files = records = size = 0
    for p in range(partitions):
        current = mf.load(store, topic, p)
        files += sum(1 for f in current.files if f.key)
        records += sum(f.records for f in current.files)
        size += current.bytes
    return files, records, size


@app.command("status")
def show_status(
    topic: Annotated[list[str] | None, typer.Option("--topic", help="only this topic")] = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Per tiered partition: local range, archived range, bytes waiting, and the last run."""
    settings = _settings(config, data_dir)
    from stonemq.tiering import status
    from stonemq.tiering.cold_store import StoreSpec

    spec = StoreSpec.from_settings(settings)
    store = spec.open()
    topics = _tiered_topics(settings, topic or None)
    table = Table(title=f"tiered storage ({spec.url})")
    for col in (
        "topic",
        "partition",
        "local offsets",
        "archived offsets",
        "files",
        "archived bytes",
        "bytes waiting",
    ):
        table.add_column(col, justify="left" if col == "topic" else "right")
    for t in topics:
        for p in range(t.partitions):
            s = status.partition_status(store, str(settings.queue_path), t.name, p)
            table.add_row(
                t.name,
                str(p),
                _range(s.local),
                _range(s.archived),
                str(s.archived_files),
                str(s.archived_bytes),
                str(s.waiting_bytes),
            )
    console.print(table)
    last = status.last_run(store)
    if last is None:
        console.print("last run: never")
    else:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last["finished_ms"] / 1000))
        state = "ok" if last.get("ok") else "failed"
        console.print(f"last run: {when} ({state}, {last.get('duration_s', 0):.1f} s)")


def _range(r: tuple[int, int] | None) -> str:
    if r is None or r[1] <= r[0]:
        return "-"
    return f"{r[0]}..{r[1] - 1}"
