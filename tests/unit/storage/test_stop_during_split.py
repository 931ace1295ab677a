"""A clean stop (``StorageEngine.close``) while the splitter's thread is inside a step: the
stop waits for the thread's read or write, publishes what was written, and then splits the
rest itself; a failed write applies its failure rules and never holds the stop. Faults and
holds are injected at the storage's I/O boundary (``storage/faults.py``); audit31's p2 and
p5 reproducers, made tests."""

from __future__ import annotations

import asyncio
import errno
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import TOPIC_ID, build_batch, new_engine, wait_split

from stonemq.storage import fileio
from stonemq.storage.engine import LogConfig
from stonemq.storage.faults import FaultPlan, FaultyFileOps
from stonemq.storage.journal import JournalReader

ONE_BATCH_SEGMENTS = LogConfig(segment_bytes=400, index_interval_bytes=4096, retention_ms=-1)
LARGE_SEGMENTS = LogConfig(segment_bytes=1 << 20, index_interval_bytes=4096, retention_ms=-1)


@pytest.fixture
def plan() -> Any:
    plan = FaultPlan()
    fileio.install(FaultyFileOps(plan))
    yield plan
    fileio.install(None)


def test_a_stop_during_a_failing_split_write_ends(tmp_path: Path, plan: FaultPlan) -> None:
    """The write in flight at the stop fails (the read directory is full): its SplitError,
    raised while the cancel was handled, replaced the cancel; the splitter went on retrying
    and close() waited for it for good (SIGTERM never finished)."""

    async def main() -> bool:
        engine = new_engine(tmp_path, flush_policy="always", journal_partitions=1)
        engine.add_partition(TOPIC_ID, "t", 0, 0, ONE_BATCH_SEGMENTS)
        engine.recover()
        engine.start(lambda *a: None)
        for i in range(3):
            await engine.append("t", 0, build_batch([b"a%d" % i + b"x" * 300]), 1).written
        await wait_split(engine)
        name = f"t-0/{engine.high_watermark('t', 0):020d}.log"  # the next step's new segment
        hold = threading.Event()
        held = plan.fail("open", match=name, hold=hold)
        plan.fail("pwritev", match=name, error=errno.ENOSPC)
        for i in range(10):
            await engine.append("t", 0, build_batch([b"b%d" % i + b"x" * 300]), 1).written
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, held.entered.wait, 5)
        closing = asyncio.ensure_future(engine.close())
        await asyncio.sleep(0.05)
        hold.set()  # the write goes on, and fails
        done, _ = await asyncio.wait([closing], timeout=10)
        return bool(done)

    assert asyncio.run(main()), "close() still waited for the splitter after 10 s"


def test_a_stop_during_a_split_read_waits_for_it(
    tmp_path: Path, plan: FaultPlan, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop cancelled the splitter while its thread read the journal, and the final
    split then read through the same JournalReader on the loop: two threads in one reader
    (its descriptor closed twice: close() failed with EBADF, or another file's descriptor
    number read or closed)."""
    overlaps: list[str] = []
    inside: dict[int, set[int]] = {}
    lock = threading.Lock()
    pread = JournalReader._pread

    def watched(self: JournalReader, *args: Any, **kwargs: Any) -> Any:
        me = threading.get_ident()
        with lock:
            readers = inside.setdefault(id(self), set())
            if readers - {me}:
                overlaps.append(threading.current_thread().name)
            readers.add(me)
        try:
            return pread(self, *args, **kwargs)
        finally:
            with lock:
                readers.discard(me)

    monkeypatch.setattr(JournalReader, "_pread", watched)

    async def main() -> None:
        engine = new_engine(tmp_path, flush_policy="never", journal_partitions=1)
        engine.add_partition(TOPIC_ID, "t", 0, 0, LARGE_SEGMENTS)
        engine.recover()
        engine.start(lambda *a: None)
        hold = threading.Event()
        held = plan.fail("pread", match="journal-0/", hold=hold)  # a slow journal read
        await engine.append("t", 0, build_batch([b"x" * 300]), 1).written
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, held.entered.wait, 5)
        for i in range(30):  # more to split, produced while the read is slow
            await engine.append("t", 0, build_batch([b"y%d" % i + b"x" * 300]), 1).written
        closing = asyncio.ensure_future(engine.close())
        await asyncio.sleep(0.2)
        hold.set()
        await closing

    asyncio.run(main())
    assert not overlaps, f"{overlaps[0]} read a journal reader another thread was reading"
