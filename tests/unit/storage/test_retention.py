"""Retention and DeleteRecords: the log start offset advances over whole segments, survives
restarts and crashes, and never lets a re-split bring deleted offsets back."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    abandon,
    add_topic,
    build_batch,
    delete_records,
    new_engine,
    read_all,
    wait_split,
)
from engines import ENGINE_DEFAULTS  # tests/ (on sys.path: root conftest)

from stonemq.protocol.record_batch import iter_batches
from stonemq.storage.engine import LogConfig, OffsetOutOfRangeError, StorageEngine

SMALL = LogConfig(segment_bytes=2048, index_interval_bytes=256)


async def fill(engine: StorageEngine, batches: int, timestamp: int = 1000) -> None:
    results = []
    for i in range(batches):
        batch = build_batch([b"v%04d" % i * 20, b"w" * 50], [timestamp, timestamp])
        results.append(engine.append("t", 0, batch, 2))
    await asyncio.gather(*(r.written for r in results))
    await wait_split(engine)


def offsets(engine: StorageEngine) -> list[int]:
    start = engine.log_start_offset("t", 0)
    data = read_all(engine, "t", 0, start) if start < engine.high_watermark("t", 0) else b""
    return [h.base_offset for _, h in iter_batches(data)]


def reopened(root: Path) -> StorageEngine:
    """The engine over ``root`` again, recovered (as a restart does)."""
    engine = new_engine(root)
    add_topic(engine, config=SMALL)
    engine.recover()
    return engine


def segment_files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "queues" / "t-0").glob("*.log"))


def test_delete_records_advances_log_start_and_survives_restart(tmp_path: Path) -> None:
    async def run() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine, config=SMALL)
        engine.start(lambda *a: None)
        assert await delete_records(engine, "t", 0, -1) == 0  # empty log
        with pytest.raises(OffsetOutOfRangeError):
            await delete_records(engine, "t", 0, 1)
        await fill(engine, 60)
        hw = engine.high_watermark("t", 0)
        assert hw == 120
        before = len(segment_files(tmp_path))
        assert before > 3
        assert await delete_records(engine, "t", 0, 51) == 51
        assert engine.log_start_offset("t", 0) == 51
        await engine.wait_directory_work()  # files are unlinked off the event loop
        assert len(segment_files(tmp_path)) < before  # whole segments below 51 are gone
        assert await delete_records(engine, "t", 0, 10) == 51  # lower: no change
        with pytest.raises(OffsetOutOfRangeError):
            await delete_records(engine, "t", 0, hw + 1)
        with pytest.raises(OffsetOutOfRangeError):
            engine.read("t", 0, 50, 1000)
        first = parse_first(engine.read("t", 0, 51, 1000).data)
        assert first <= 51  # the batch holding offset 51
        await engine.close()

        engine = reopened(tmp_path)
        assert engine.log_start_offset("t", 0) == 51
        assert engine.high_watermark("t", 0) == 120
        engine.start(lambda *a: None)
        assert await delete_records(engine, "t", 0, -1) == 120  # everything, the active segment too
        assert engine.high_watermark("t", 0) == 120
        await fill(engine, 1)  # appends continue at the log end
        assert offsets(engine) == [120]
        assert engine.log_start_offset("t", 0) == 120
        await engine.flush()
        abandon(engine)  # crash after the checkpoint: the journal still holds 0..119

        engine = reopened(tmp_path)
        assert engine.log_start_offset("t", 0) == 120
        assert offsets(engine) == [120]  # re-split brought nothing below the log start back
        await engine.close()

    asyncio.run(run())


def parse_first(data: bytes) -> int:
    return next(iter_batches(data))[1].base_offset


def test_delete_records_then_crash_before_checkpoint_keeps_offsets(tmp_path: Path) -> None:
    async def run() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine, config=SMALL)
        engine.start(lambda *a: None)
        await fill(engine, 30)
        await delete_records(engine, "t", 0, -1)
        abandon(engine)  # no checkpoint: the journal is re-split from the start

        engine = reopened(tmp_path)
        # the log end never goes back, whatever start recovery settles on
        assert engine.high_watermark("t", 0) == 60
        assert engine.log_end_offset("t", 0) == 60
        engine.start(lambda *a: None)
        await fill(engine, 1)
        assert offsets(engine)[-1] == 60
        await engine.close()

    asyncio.run(run())


def test_retention_bytes_and_ms(tmp_path: Path) -> None:
    async def run() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine, config=LogConfig(segment_bytes=2048, retention_bytes=4096))
        engine.start(lambda *a: None)
        await fill(engine, 60)
        total = sum(p.stat().st_size for p in (tmp_path / "queues" / "t-0").glob("*.log"))
        assert total > 8192
        assert engine.apply_retention(now_ms=2000) == 1
        await engine.wait_directory_work()  # files are unlinked off the event loop
        kept = sum(p.stat().st_size for p in (tmp_path / "queues" / "t-0").glob("*.log"))
        assert 4096 - 2048 <= kept <= 4096 + 2048
        start = engine.log_start_offset("t", 0)
        assert start > 0 and offsets(engine)[0] == start
        assert engine.apply_retention(now_ms=2000) == 0  # nothing more to do

        # retention.ms: every segment's largest timestamp (1000) is older than 500 ms at 2000
        engine.update_config("t", LogConfig(segment_bytes=2048, retention_ms=500))
        assert engine.apply_retention(now_ms=1400) == 0
        assert engine.apply_retention(now_ms=2000) == 1
        assert engine.log_start_offset("t", 0) == engine.high_watermark("t", 0) == 120
        await engine.wait_directory_work()
        assert len(segment_files(tmp_path)) == 1  # an empty active segment at the log end
        await fill(engine, 2, timestamp=5000)
        assert offsets(engine) == [120, 122]
        await engine.close()

        engine = reopened(tmp_path)
        assert engine.log_start_offset("t", 0) == 120
        assert offsets(engine) == [120, 122]
        await engine.close()

    asyncio.run(run())


def test_records_without_timestamps_age_by_their_files_last_change(tmp_path: Path) -> None:
    """A record produced without a timestamp (-1, which CreateTime accepts) counts as old
    as its segment file's last change, as Kafka's LogSegment.largestTimestamp: the segment's
    largest timestamp of -1 made every such segment, the active one too, expire at the
    next retention check whatever retention.ms was (an independent audit: two records
    sent with kafka-python's timestamp_ms=-1 gone a second later)."""
    import os

    async def run() -> None:
        engine = new_engine(tmp_path)
        week = 7 * 24 * 3600 * 1000
        add_topic(engine, config=LogConfig(segment_bytes=2048, retention_ms=week))
        engine.start(lambda *a: None)
        await fill(engine, 40, timestamp=-1)  # several segments, none with a timestamp
        now = int(time.time() * 1000)
        assert engine.apply_retention(now_ms=now) == 0
        assert engine.log_start_offset("t", 0) == 0 and offsets(engine)[0] == 0
        # the sealed segments' files last changed eight days ago: those expire, only those
        files = sorted((tmp_path / "queues" / "t-0").glob("*.log"))
        assert len(files) > 2
        old = (now - week - 24 * 3600 * 1000) / 1000
        for path in files[:-1]:
            os.utime(path, (old, old))
        assert engine.apply_retention(now_ms=now) == 1
        start = engine.log_start_offset("t", 0)
        assert 0 < start < engine.high_watermark("t", 0) == 80
        assert offsets(engine)[0] == start
        await engine.close()

    asyncio.run(run())


class SlowCheckpointEngine(StorageEngine):
    """Checkpoint files written slowly, with a flag once a write has begun: a close can then
    be made to land in the middle of a checkpoint round, every time."""

    writing = threading.Event()

    def _write_checkpoints(self, *args: Any) -> None:
        self.writing.set()
        time.sleep(0.2)
        super()._write_checkpoints(*args)


def test_a_clean_close_during_a_checkpoint_round_keeps_the_new_log_start(tmp_path: Path) -> None:
    """DeleteRecords wakes a checkpoint round; a clean close that lands while the round is
    writing must not cancel it halfway and come back with the old log start (it did: the
    round had cleared its 'log starts changed' flag and the close then wrote none)."""

    async def run() -> None:
        engine = SlowCheckpointEngine(
            str(tmp_path / "journal"), str(tmp_path / "queues"), **ENGINE_DEFAULTS
        )
        add_topic(engine, config=SMALL)
        engine.recover()
        engine.start(lambda *a: None)
        await fill(engine, 30)
        await engine.flush()
        engine.writing.clear()
        assert await delete_records(engine, "t", 0, 40) == 40
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, engine.writing.wait, 5)
        await engine.close()
        engine = reopened(tmp_path)
        assert engine.log_start_offset("t", 0) == 40
        assert engine.high_watermark("t", 0) == 60

    asyncio.run(asyncio.wait_for(run(), 20))


def test_the_log_start_checkpoint_follows_a_deletion_a_crash_left_unwritten(
    tmp_path: Path,
) -> None:
    """DeleteRecords to a segment's base deletes the segments below it at once; a crash
    before the next checkpoint left the old log start in the checkpoint file, and recovery's
    re-split of the log-start entry changed nothing (the first segment already starts
    there), so the file stayed stale through every later stop (an independent cluster
    check). Recovery's checkpoint now writes the log start it found."""
    from stonemq.storage.checkpoint import LOG_START_OFFSET_FILE, read_offsets, write_offsets

    async def run() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine, config=SMALL)
        engine.start(lambda *a: None)
        await fill(engine, 60)
        await engine.flush()
        bases = [int(name.split(".")[0]) for name in segment_files(tmp_path)]
        boundary = bases[len(bases) // 2]
        assert await delete_records(engine, "t", 0, boundary) == boundary
        await engine.wait_directory_work()
        assert min(int(n.split(".")[0]) for n in segment_files(tmp_path)) == boundary
        abandon(engine)
        # the crash's window: the segments went, the checkpoint round had not run yet
        checkpoint = tmp_path / "queues" / LOG_START_OFFSET_FILE
        write_offsets(str(checkpoint), {("t", 0): 0})
        engine = reopened(tmp_path)
        assert engine.log_start_offset("t", 0) == boundary
        assert read_offsets(str(checkpoint))[("t", 0)] == boundary
        await engine.close()

    asyncio.run(run())
