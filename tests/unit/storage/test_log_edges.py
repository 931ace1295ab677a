"""Kafka's semantics at the log's edges, on the engine: a fetch between the high watermark
(what is split) and the log end (what is acknowledged) is empty, not out of range
(reproduced defect 4 of the I/O-error issue), and offsets by timestamp start at the log
start (defect 5)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from conftest import add_topic, build_batch, delete_records, new_engine, wait_split

from stonemq.storage import fileio
from stonemq.storage.engine import LogConfig, OffsetOutOfRangeError
from stonemq.storage.fileio import FileOps
from stonemq.storage.open_files import LOOP_READ_MAX_BYTES


def test_a_fetch_between_high_watermark_and_log_end_is_empty(tmp_path: Path) -> None:
    """Reproduced: with up to splitter.max.lag.bytes between ack and split, a consumer that
    seeked to a just-acknowledged offset got OFFSET_OUT_OF_RANGE and was reset by
    auto.offset.reset. Kafka answers an offset up to the log end with no records."""

    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.start(lambda *a: None)
        for i in range(2):
            await engine.append("t", 0, build_batch([b"split%d" % i]), 1).written
        await wait_split(engine)
        await engine.close()
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.recover()  # no start(): nothing more is split, the journal still takes writes
        results = [engine.append("t", 0, build_batch([b"v%d" % i]), 1) for i in range(3)]
        await asyncio.gather(*(r.written for r in results))
        assert engine.high_watermark("t", 0) == 2 and engine.log_end_offset("t", 0) == 5
        assert engine.read("t", 0, 1, 1000).data  # split: served
        for offset in (2, 3, 5):
            read = engine.read("t", 0, offset, 1000)
            assert read.data == b"" and read.high_watermark == 2
        with pytest.raises(OffsetOutOfRangeError):
            engine.read("t", 0, 6, 1000)
        with pytest.raises(OffsetOutOfRangeError):
            engine.read("t", 0, -1, 1000)
        await engine.close()

    asyncio.run(main())


def test_offsets_by_timestamp_start_at_the_log_start(tmp_path: Path) -> None:
    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.start(lambda *a: None)
        for i in range(4):  # offsets 3i..3i+2, timestamps 100i + 1000 + j
            batch = build_batch([b"x"] * 3, [100 * i + 1000 + j for j in range(3)])
            await engine.append("t", 0, batch, 3).written
        await wait_split(engine)
        await delete_records(engine, "t", 0, 4)  # inside the second batch
        assert await engine.offset_for_timestamp("t", 0, 0) == (4, 1101)
        assert await engine.offset_for_timestamp("t", 0, 1101) == (4, 1101)
        assert await engine.offset_for_timestamp("t", 0, 1102) == (5, 1102)
        assert await engine.offset_for_timestamp("t", 0, 1301) == (10, 1301)
        assert await engine.offset_for_timestamp("t", 0, 1303) is None
        assert await engine.max_timestamp("t", 0) == (11, 1302)
        await delete_records(engine, "t", 0, 12)
        assert await engine.offset_for_timestamp("t", 0, 0) is None
        assert await engine.max_timestamp("t", 0) is None
        await engine.close()

    asyncio.run(main())


def test_max_timestamp_past_a_log_start_inside_a_batch_is_a_live_records_pair(
    tmp_path: Path,
) -> None:
    """Reproduced (offsets audit): DeleteRecords inside a batch whose largest timestamp was a
    deleted record's made MAX_TIMESTAMP answer the batch's last offset with that timestamp,
    a pair no record holds. The cut batch counts only its live records."""

    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.start(lambda *a: None)
        await engine.append("t", 0, build_batch([b"a"] * 3, [1050, 1100, 1020]), 3).written
        await engine.append("t", 0, build_batch([b"b"] * 2, [1100, 1030]), 2).written
        await wait_split(engine)
        await delete_records(engine, "t", 0, 2)  # offsets 0-1 gone: 1100 lives at 3
        assert await engine.max_timestamp("t", 0) == (3, 1100)
        await delete_records(engine, "t", 0, 4)
        assert await engine.max_timestamp("t", 0) == (4, 1030)
        await engine.close()
        engine = new_engine(tmp_path / "second")  # a cut batch alone in the log
        add_topic(engine, "u")
        engine.start(lambda *a: None)
        await engine.append("u", 0, build_batch([b"c"] * 3, [1200, 1010, 1005]), 3).written
        await wait_split(engine)
        await delete_records(engine, "u", 0, 1)
        assert await engine.max_timestamp("u", 0) == (1, 1010)
        await engine.close()

    asyncio.run(main())


class StalledDiskReads(FileOps):
    """Real operations; the first ``open`` of a queue-log file by a disk-read thread (a
    fetch or a search by timestamp reading in a thread) waits until ``go`` is set, as a
    read waiting for a busy disk does, while the event loop goes on (retention, DeleteRecords).
    Counts the opens that found their file gone."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.held = threading.Event()
        self.gone = 0

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        if "/queues/" in path and threading.current_thread().name.startswith("stonemq-disk-read"):
            if not self.held.is_set():
                self.held.set()
                self.go.wait(10)
            try:
                return super().open(path, flags, mode)
            except FileNotFoundError:
                self.gone += 1
                raise
        return super().open(path, flags, mode)


@pytest.mark.parametrize("query", ["timestamp", "max_timestamp", "fetch"])
def test_a_read_in_a_thread_never_answers_below_a_log_start_moved_under_it(
    tmp_path: Path, query: str
) -> None:
    """Reads in disk-read threads work on views taken on the loop; when DeleteRecords moves the
    log start and deletes the segments they were reading, they are taken again: an answer
    from the new log start (or OFFSET_OUT_OF_RANGE for a fetch), never an offset below it,
    a traceback, or a read of a file that went."""

    async def main() -> None:
        engine = new_engine(tmp_path, queue_cache_retain_bytes=-1)
        add_topic(engine, config=LogConfig(segment_bytes=300, index_interval_bytes=64))
        engine.start(lambda *a: None)
        for i in range(12):  # one batch per segment: offsets 3i..3i+2, the largest time at 8
            base_ms = 9000 if i == 2 else 100 * i + 1000
            # the first batch is larger than a read on the event loop may be, so a fetch of it
            # reads in a disk-read thread whatever the page cache holds. Dropping its pages
            # was not enough: the loop's RWF_NOWAIT read that misses starts the kernel's
            # readahead, and when the loop's thread is descheduled before it looks, it finds
            # the page read and answers on the loop (no thread: the test waited forever)
            value = b"x" * (LOOP_READ_MAX_BYTES // 2 if i == 0 else 100)
            batch = build_batch([value] * 3, [base_ms + j for j in range(3)])
            await engine.append("t", 0, batch, 3).written
        await wait_split(engine)
        disk = StalledDiskReads()
        previous = fileio.install(disk)
        try:
            if query == "timestamp":
                task = asyncio.create_task(engine.offset_for_timestamp("t", 0, 0))
            elif query == "max_timestamp":
                task = asyncio.create_task(engine.max_timestamp("t", 0))
            else:  # the first batch, in a thread (it is larger than LOOP_READ_MAX_BYTES)
                task = asyncio.create_task(engine.read_async("t", 0, 0, 1 << 20))
            while not disk.held.is_set():  # the thread waits at its first open
                assert not task.done(), "answered without a read in a disk-read thread"
                await asyncio.sleep(0.01)
            assert await delete_records(engine, "t", 0, 31) == 31  # inside the batch at 30
            assert await engine.wait_directory_work()  # the segments below it are gone
            disk.go.set()
            if query == "fetch":
                with pytest.raises(OffsetOutOfRangeError):
                    await task
            else:
                found = await task
                expected = (31, 1001 + 1000) if query == "timestamp" else (35, 2102)
                assert found == expected
        finally:
            disk.go.set()
            fileio.install(previous)
        assert disk.gone >= 1  # the first views were of deleted files
        await engine.close()

    asyncio.run(main())


def test_a_search_by_time_is_taken_again_when_the_log_start_moves_within_a_segment(
    tmp_path: Path,
) -> None:
    """DeleteRecords inside the first segment deletes no file; a search by timestamp that
    was reading from the old log start answers from the new one."""

    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.start(lambda *a: None)
        await engine.append("t", 0, build_batch([b"x"] * 3, [1000, 1001, 1002]), 3).written
        await wait_split(engine)
        disk = StalledDiskReads()
        previous = fileio.install(disk)
        try:
            task = asyncio.create_task(engine.offset_for_timestamp("t", 0, 0))
            while not disk.held.is_set():
                await asyncio.sleep(0.01)
            assert await delete_records(engine, "t", 0, 2) == 2
            disk.go.set()
            assert await task == (2, 1002)
        finally:
            disk.go.set()
            fileio.install(previous)
        assert disk.gone == 0
        await engine.close()

    asyncio.run(main())
