"""A splitter that fell behind catches up in fewer, larger steps. Each step of the running
splitter costs the same event-loop hops whatever its size (its journal read and its writes run
in the splitter's thread, and the loop stages and publishes in between); while the loop serves
a catch-up and pipelined requests every hop waits for the loop's current iteration, so a
splitter stepping one ``splitter.batch.bytes`` at a time fell behind a producer and held it
for split lag (issue 17's interference benchmark). Counted by the broker's own accounting
(``splitter_steps``), not by wall time."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from conftest import (
    PAGE,
    add_topic,
    build_batch,
    fd_path,
    new_engine,
    produce,
    read_all,
    resident_pages,
    wait_split,
)

from stonemq.server.metrics import METRICS
from stonemq.storage import fileio
from stonemq.storage.fileio import FileOps
from stonemq.storage.splitter import CATCH_UP_STEPS, DEEP_CATCH_UP_STEPS, DEEP_LAG_STEPS

BATCH_BYTES = 64 * 1024
RECORD = 60 * 1024  # one record per batch: about one splitter.batch.bytes each
BATCHES = 64  # 4 MiB of journal


class HeldJournalRead(FileOps):
    """Real operations, but the first journal read waits until ``go`` is set (in the
    splitter's thread), so the journal fills up behind a splitter that is reading."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.held = threading.Event()

    def _hold(self, fd: int) -> None:
        if not self.go.is_set() and "/journal/" in fd_path(fd):
            self.held.set()
            assert self.go.wait(30)

    def pread(self, fd: int, n: int, pos: int) -> bytes:
        self._hold(fd)
        return super().pread(fd, n, pos)

    def pread_into(self, fd: int, buf: Any, pos: int) -> int:  # the splitter's reads
        self._hold(fd)
        return super().pread_into(fd, buf, pos)


def _behind(tmp_path: Path, batches: int) -> tuple[int, list[bytes], bool]:
    """``batches`` one-record batches produced while the splitter is held on its first read:
    the splitter's steps to split them, the records not split exactly once, and whether the
    deep catch-up buffer was still there at the end."""
    disk = HeldJournalRead()

    async def main() -> tuple[int, list[bytes], bool]:
        engine = new_engine(
            tmp_path, splitter_batch_bytes=BATCH_BYTES, journal_segment_bytes=64 << 20
        )
        add_topic(engine)
        engine.start(lambda *a: None)
        previous = fileio.install(disk)
        try:
            records = [b"%06d" % i + bytes([65 + i % 26]) * RECORD for i in range(batches)]
            await produce(engine, "t", 0, [build_batch([records[0]])])
            while not disk.held.is_set():  # the splitter reads the first batch: held there
                await asyncio.sleep(0.001)
            steps = METRICS.splitter_steps
            await produce(engine, "t", 0, [build_batch([r]) for r in records[1:]])
            disk.go.set()
            await wait_split(engine, timeout_s=30)
            steps = METRICS.splitter_steps - steps
        finally:
            disk.go.set()
            fileio.install(previous)
        data = read_all(engine, "t", 0)
        assert engine._splitter is not None
        splitter = engine._splitter
        # the deep part of the read buffer given back: no page past a normal step's is mapped
        assert splitter._buffer is not None
        normal = BATCH_BYTES * CATCH_UP_STEPS
        deep_left = splitter._deep_pages or any(resident_pages(splitter._buffer)[normal // PAGE :])
        await engine.close()
        return steps, [r for r in records if data.count(r) != 1], deep_left

    return asyncio.run(main())


def test_a_splitter_behind_catches_up_in_steps_of_several_batches(tmp_path: Path) -> None:
    steps, missing, _ = _behind(tmp_path, BATCHES)
    assert not missing  # every batch split once
    # the first step read one batch; the 63 behind it came in steps of CATCH_UP_STEPS
    # batches (8): 1 + 8 steps, and a couple more where a step's end fell short of a batch.
    # One batch per step took 64.
    assert steps <= 1 + BATCHES // CATCH_UP_STEPS + 3, steps


def test_a_splitter_far_behind_catches_up_in_deeper_steps(tmp_path: Path) -> None:
    """Behind by ``DEEP_LAG_STEPS`` batches or more, a step reads ``DEEP_CATCH_UP_STEPS``
    of them (where a busy loop made each step cost ~10 ms whatever its size, 2-batch steps
    held producers for split lag 67 s of 98); the deep part of the read buffer is given back
    once caught up."""
    batches = 8 * DEEP_LAG_STEPS
    steps, missing, deep_left = _behind(tmp_path, batches)
    assert not missing and not deep_left
    # about (batches - DEEP_LAG_STEPS) / DEEP_CATCH_UP_STEPS deep steps, then the last
    # DEEP_LAG_STEPS batches by CATCH_UP_STEPS; CATCH_UP_STEPS alone took batches / 2
    deep = (batches - DEEP_LAG_STEPS) // DEEP_CATCH_UP_STEPS + DEEP_LAG_STEPS // CATCH_UP_STEPS
    assert steps <= deep + 6 < batches // CATCH_UP_STEPS, steps
