"""The splitter never waits for the disk on the event loop: a queue-log write or a journal read
that stalls (a disk busy with a catch-up read, dirty-page throttling) stalls the split, not
the clients. Stalls are injected at the storage's I/O boundary (``fileio.install``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import add_topic, build_batch, fd_path, new_engine, read_all, wait_split

from stonemq.storage import fileio
from stonemq.storage.checkpoint import QUEUE_RECOVERY_POINT_FILE, read_queue_recovery_points
from stonemq.storage.fileio import FileOps

STALL_S = 0.8


class StalledDisk(FileOps):
    """Real operations, but ``op`` on a file whose path contains ``match`` first sleeps
    ``STALL_S`` (as a write or read waiting for the disk does: the GIL is released)."""

    def __init__(self, op: str, match: str) -> None:
        self.op = op
        self.match = match
        self.stalls = 0

    def _maybe_stall(self, op: str, fd: int) -> None:
        if op == self.op and self.match in fd_path(fd):
            self.stalls += 1
            time.sleep(STALL_S)

    def pwritev(self, fd: int, buffers: Any, pos: int) -> int:
        self._maybe_stall("pwritev", fd)
        return super().pwritev(fd, buffers, pos)

    def pread(self, fd: int, n: int, pos: int) -> bytes:
        self._maybe_stall("pread", fd)
        return super().pread(fd, n, pos)

    def pread_into(self, fd: int, buf: Any, pos: int) -> int:  # the splitter's journal reads
        self._maybe_stall("pread", fd)
        return super().pread_into(fd, buf, pos)


async def _loop_lag(stop: asyncio.Event) -> float:
    """The longest the event loop went without running this task (10 ms naps)."""
    loop = asyncio.get_running_loop()
    worst = 0.0
    while not stop.is_set():
        before = loop.time()
        await asyncio.sleep(0.01)
        worst = max(worst, loop.time() - before - 0.01)
    return worst


@pytest.mark.slow  # several seconds: the whole suite runs it, the fast set not
@pytest.mark.parametrize(("op", "match"), [("pwritev", "/queues/"), ("pread", "/journal/")])
def test_a_stalled_split_never_stalls_the_event_loop(tmp_path: Path, op: str, match: str) -> None:
    """Before, the splitter wrote queue logs and read the journal on the event loop: every
    stalled call froze the broker for its whole length."""
    disk = StalledDisk(op, match)

    async def main() -> tuple[float, float]:
        engine = new_engine(tmp_path, splitter_batch_bytes=4096)
        add_topic(engine, partitions=2)
        engine.start(lambda *a: None)
        batches = [build_batch([b"%d" % i * 1000]) for i in range(6)]
        previous = fileio.install(disk)
        stop = asyncio.Event()
        lag = asyncio.ensure_future(_loop_lag(stop))
        started = time.monotonic()
        try:
            for i, batch in enumerate(batches):
                await engine.append("t", i % 2, batch, 1).written
            await wait_split(engine, timeout_s=30)
        finally:
            fileio.install(previous)
            stop.set()
        took = time.monotonic() - started
        worst = await lag
        for p in (0, 1):
            data = read_all(engine, "t", p)
            assert bytes(data).count(b"0" * 1000 if p == 0 else b"1" * 1000) == 1
        await engine.close()
        return took, worst

    took, worst = asyncio.run(main())
    assert disk.stalls >= 2 and took >= 2 * STALL_S  # the split did wait for the disk
    # a stall on the loop lags it by STALL_S or more; half of it leaves room for the
    # scheduler on a loaded machine (STALL_S / 4 failed twice at load average 15 on 2 cores)
    assert worst < STALL_S / 2, f"the event loop stalled {worst:.3f} s"


def test_a_stop_during_a_split_write_flushes_and_checkpoints_what_it_wrote(tmp_path: Path) -> None:
    """A clean stop cancelled the splitter while its thread wrote a step's batches: the
    writes were published, but the queue log was never marked dirty, so the final flush
    neither fsynced it nor wrote its recovery point, while the split-position checkpoint
    counted the journal bytes split (the journal could be trimmed under unsynced data; the
    next start re-validated every segment from the first). Found by
    test_damaged_segments.py, whose 1,000 records were split in one step 4 ms before its
    stop."""
    disk = StalledDisk("pwritev", "/queues/")

    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.start(lambda *a: None)
        previous = fileio.install(disk)
        try:
            await engine.append("t", 0, build_batch([b"x" * 100] * 5), 5).written
            while not disk.stalls:  # the step's write is under way in the splitter's thread
                await asyncio.sleep(0.005)
            await engine.close()
        finally:
            fileio.install(previous)

    asyncio.run(main())
    points = read_queue_recovery_points(str(tmp_path / "queues" / QUEUE_RECOVERY_POINT_FILE))
    assert points[("t", 0)].offset == 5
