"""The running splitter reads the journal into one reused buffer (``Splitter._read_reused``):
a step's batches are views of it, so a view used after the next read would write or serve
another step's bytes. Every journal read of the splitter here first overwrites the whole
buffer with garbage, and the queue logs must still hold every journal batch byte for byte."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

from conftest import add_topic, build_batch, fd_path, new_engine, read_all, wait_split

from stonemq.protocol.record_batch import iter_batches, parse_header
from stonemq.storage import fileio
from stonemq.storage.fileio import FileOps
from stonemq.storage.journal import JournalReader
from stonemq.storage.splitter import CATCH_UP_STEPS, DEEP_CATCH_UP_STEPS

BATCH_BYTES = 4096  # the splitter's buffer: CATCH_UP_STEPS times this
PARTITIONS = 4  # on journal partitions 0 and 1
GARBAGE = 0xEE


class ScribblingReads(FileOps):
    """Real operations; a read into a buffer (the splitter's journal reads) first fills the
    whole buffer it is a view of with ``GARBAGE``, as the next step's read would."""

    def __init__(self) -> None:
        self.reads = 0
        self.buffers: set[int] = set()

    def pread_into(self, fd: int, buf: Any, pos: int) -> int:
        if "/journal/" in fd_path(fd):
            whole = memoryview(buf.obj)
            whole[:] = bytes([GARBAGE]) * len(whole)
            self.reads += 1
            self.buffers.add(len(buf.obj))
        return super().pread_into(fd, buf, pos)


def _journal_batches(root: Path) -> dict[int, list[bytes]]:
    """Each partition's batches as the journal holds them (new bytes, no shared buffer)."""
    out: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for j in range(2):
        reader = JournalReader(str(root / "journal" / f"journal-{j}"))
        pos = reader.first_position()
        while True:
            entries, end = reader.read(pos, 1 << 62, 1 << 20)
            if not entries:
                break
            for entry in entries:
                out[entry.partition].append(bytes(entry.batch))
            pos = end
        reader.close()
    return out


def test_queue_logs_match_the_journal_when_each_read_overwrites_the_buffer(
    tmp_path: Path,
) -> None:
    disk = ScribblingReads()
    rng = random.Random(22)

    async def main() -> tuple[dict[int, bytes], dict[int, list[bytes]]]:
        # one journal segment each: none is deleted before the check reads them
        engine = new_engine(
            tmp_path, splitter_batch_bytes=BATCH_BYTES, journal_segment_bytes=64 << 20
        )
        add_topic(engine, partitions=PARTITIONS)
        previous = fileio.install(disk)
        try:
            engine.start(lambda *a: None)
            for round_ in range(40):  # rounds of produce the splitter runs between
                appends = []
                for i in range(rng.randint(1, 12)):
                    # mostly small batches, some of several steps, some larger than the
                    # buffer (read into new bytes instead)
                    size = rng.choice((40, 300, 1500, 5000, 9000, 20_000))
                    fill = bytes([65 + (round_ * 13 + i) % 26])
                    batch = build_batch([fill * size] * rng.randint(1, 3))
                    p = rng.randrange(PARTITIONS)
                    appends.append(engine.append("t", p, batch, parse_header(batch).record_count))
                await asyncio.gather(*(a.written for a in appends))
                if round_ % 3 == 0:
                    await wait_split(engine, timeout_s=30)
            await wait_split(engine, timeout_s=30)
        finally:
            fileio.install(previous)
        journal = _journal_batches(tmp_path)
        stored = {p: read_all(engine, "t", p) for p in range(PARTITIONS)}
        await engine.close()
        return stored, journal

    stored, journal = asyncio.run(main())
    assert disk.reads >= 40, disk.reads  # the splitter did read into its buffer
    # one buffer, of the deep catch-up's size (a normal step reads into its first part)
    assert disk.buffers == {BATCH_BYTES * DEEP_CATCH_UP_STEPS}
    for p in range(PARTITIONS):
        assert journal[p], p
        queue_batches = [bytes(stored[p][pos : pos + h.size]) for pos, h in iter_batches(stored[p])]
        assert len(queue_batches) == len(journal[p]), p
        for i, (got, want) in enumerate(zip(queue_batches, journal[p], strict=True)):
            assert got == want, f"partition {p} batch {i} differs from the journal"
        assert bytes([GARBAGE]) * 64 not in stored[p]
    assert CATCH_UP_STEPS * BATCH_BYTES < 20_000 + 200  # some batches did not fit the buffer
