"""Journal segments deleted by retention: unlisted at once (the journal start moves before the
files go, so no reader is sent to a file being deleted), unlinked off the event loop, and a
segment that cannot be unlinked is listed again with every younger one taken with it, so the
journal's segments stay contiguous and the deletion is tried again."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from pathlib import Path

from conftest import add_topic, build_batch, new_engine, produce, wait_split

from stonemq.storage import fileio
from stonemq.storage.faults import FaultPlan, FaultyFileOps
from stonemq.storage.health import Event
from stonemq.storage.journal import JournalLog, segment_name, unlink_segments

BASES = [0, 100, 200, 300, 400]


def _journal(tmp_path: Path) -> JournalLog:
    for base in BASES:
        (tmp_path / segment_name(base)).write_bytes(b"x" * 100)
    return JournalLog(str(tmp_path), 0, segment_bytes=100, flush_policy="interval")


def _files(tmp_path: Path) -> list[str]:
    return sorted(n for n in os.listdir(tmp_path) if n.endswith(".journal"))


def test_segments_ending_at_or_before_the_position_go(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    taken = journal.take_segments_before(250)  # 0 and 100 end by 200; 200 ends at 300
    assert [os.path.basename(p) for p in taken] == [segment_name(0), segment_name(100)]
    assert journal.segments == [200, 300, 400]  # unlisted before any file goes
    assert _files(tmp_path) == [segment_name(b) for b in BASES]
    assert unlink_segments(taken, 0) == []
    assert _files(tmp_path) == [segment_name(b) for b in (200, 300, 400)]
    assert journal.take_segments_before(10**9) == [
        str(tmp_path / segment_name(b)) for b in (200, 300)
    ]  # never the active (last) segment


def test_a_segment_that_cannot_be_unlinked_is_listed_again_with_the_younger_ones(
    tmp_path: Path,
) -> None:
    journal = _journal(tmp_path)
    plan = FaultPlan()
    plan.fail("unlink", match=segment_name(100), error=errno.EIO, times=1)
    previous = fileio.install(FaultyFileOps(plan))
    try:
        taken = journal.take_segments_before(400)
        kept = unlink_segments(taken, 0)
    finally:
        fileio.install(previous)
    assert [os.path.basename(p) for p in kept] == [segment_name(b) for b in (100, 200, 300)]
    journal.give_back_segments(kept)
    assert journal.segments == [100, 200, 300, 400]  # contiguous: 200 and 300 not tried
    assert _files(tmp_path) == [segment_name(b) for b in (100, 200, 300, 400)]
    assert unlink_segments(journal.take_segments_before(400), 0) == []  # tried again
    assert journal.segments == [400]
    assert _files(tmp_path) == [segment_name(400)]


def test_an_offline_journal_keeps_its_segments(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    journal.health.on(Event.JOURNAL_FSYNC_FAILED, "injected")
    assert journal.take_segments_before(10**9) == []
    assert journal.segments == BASES


class _RecordingOps(fileio.FileOps):
    """The real operations, noting the thread of every journal segment unlink."""

    def __init__(self) -> None:
        self.unlinks: list[tuple[str, str]] = []

    def unlink(self, path: str) -> None:
        if path.endswith(".journal"):
            self.unlinks.append((os.path.basename(path), threading.current_thread().name))
        super().unlink(path)


def test_the_engine_deletes_split_journal_segments_off_the_event_loop(tmp_path: Path) -> None:
    ops = _RecordingOps()

    async def main() -> None:
        engine = new_engine(tmp_path, journal_partitions=1, journal_segment_bytes=8192)
        add_topic(engine)
        engine.start(lambda *a: None)
        await produce(engine, "t", 0, [build_batch([b"v" * 1000] * 3) for _ in range(30)])
        await wait_split(engine)
        await engine.flush()  # queue logs flushed past the journal: its old segments go
        loop_thread = threading.current_thread().name
        assert ops.unlinks, "no journal segment deleted"
        assert all(thread != loop_thread for _, thread in ops.unlinks), ops.unlinks
        remaining = sorted(n for n in os.listdir(tmp_path / "journal" / "journal-0"))
        assert not {n for n, _ in ops.unlinks} & set(remaining)
        await engine.close()

    previous = fileio.install(ops)
    try:
        asyncio.run(main())
    finally:
        fileio.install(previous)
