"""Power losses in the windows between a write, its fsync, the directory's fsync and the
checkpoint that says them durable (``storage/faults.py`` Durability: a file keeps what its
last fsync saw, a directory the names its last fsync saw). Under flush policy ``always`` an
acknowledged record is fsynced in the journal, and no checkpoint may let the journal go
before its queue log holds the record durably; under ``interval`` a journal recovery point
never passes a segment no fsync covered. audit31's p1, p3 and p4 reproducers, made tests."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import abandon, build_batch, new_engine, read_all, wait_split

from stonemq.protocol.record_batch import iter_batches
from stonemq.storage import fileio
from stonemq.storage.check import check_storage
from stonemq.storage.engine import LogConfig, StorageEngine
from stonemq.storage.faults import Durability, FaultPlan, FaultyFileOps
from stonemq.storage.journal import segment_name

TOPIC_ID = uuid.UUID("6f1c2d3e-0000-4000-8000-0000000000a1")
RECORD_OFFSET = 61  # a one-record batch's value starts here (build_batch)


class Disk:
    """Faults and the durability model, installed for one test."""

    def __init__(self, root: Path) -> None:
        self.plan = FaultPlan()
        self.durability = Durability([str(root)])
        self.ops = FaultyFileOps(self.plan, self.durability)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Disk]:
    disk = Disk(tmp_path)
    fileio.install(disk.ops)
    yield disk
    fileio.install(None)


def _open(root: Path, configs: list[LogConfig], **settings: Any) -> StorageEngine:
    engine = new_engine(
        root, queue_checkpoint_interval_ms=3_600_000, journal_partitions=1, **settings
    )
    for partition, config in enumerate(configs):
        engine.add_partition(TOPIC_ID, "t", partition, 0, config)
    engine.recover()
    engine.start(lambda *a: None)
    return engine


async def _produce(
    engine: StorageEngine,
    tag: bytes,
    n: int,
    acked: dict[tuple[int, int], bytes],
    partition: int = 0,
) -> None:
    for i in range(n):
        batch = build_batch([b"%s-%d-" % (tag, i) + b"x" * 200])
        appended = engine.append("t", partition, batch, 1)
        await appended.written
        acked[(partition, appended.base_offset)] = bytes(batch[RECORD_OFFSET:])


def _lost(engine: StorageEngine, acked: dict[tuple[int, int], bytes]) -> list[tuple[int, int]]:
    """The acknowledged records not at their offset with their value."""
    stored: dict[tuple[int, int], bytes] = {}
    for partition in {p for p, _ in acked}:
        data = read_all(engine, "t", partition, engine.log_start_offset("t", partition))
        for pos, h in iter_batches(data):
            stored[(partition, h.base_offset)] = bytes(data[pos + RECORD_OFFSET : pos + h.size])
    return sorted(key for key, value in acked.items() if stored.get(key) != value)


def test_the_name_of_a_segment_rolled_in_empty_is_made_durable(tmp_path: Path, disk: Disk) -> None:
    """DeleteRecords to the high watermark rolls in an empty segment, which the directory
    thread creates later; a flush in between fsynced the directory before the file existed
    and cleared the queue log's new-files flag, and no later flush fsynced the directory:
    a power loss took the segment's name, and with it records acknowledged (fsynced in the
    journal) and flushed into it after the journal had let them go."""
    big = LogConfig(segment_bytes=1 << 20, index_interval_bytes=4096, retention_ms=-1)

    async def main() -> list[tuple[int, int]]:
        engine = _open(tmp_path, [big], flush_policy="always", journal_segment_bytes=1024)
        acked: dict[tuple[int, int], bytes] = {}
        await _produce(engine, b"a", 5, {})
        await wait_split(engine)
        hw = engine.high_watermark("t", 0)
        hold = threading.Event()  # the directory thread is slow
        held = disk.plan.fail("open", match=f"t-0/{hw:020d}.log", hold=hold)
        deleted = engine.delete_records("t", 0, -1)
        await deleted.written
        await asyncio.wait_for(engine.split_past(deleted.journal, deleted.end), 5)
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, held.entered.wait, 5)
        await engine.flush()  # a checkpoint round before the file exists
        hold.set()
        await engine.wait_directory_work()
        await _produce(engine, b"b", 30, acked)
        await wait_split(engine)
        await engine.flush()  # the queue log flushed and checkpointed, the journal trimmed
        abandon(engine)
        disk.durability.power_loss()
        engine = _open(tmp_path, [big], flush_policy="always", journal_segment_bytes=1024)
        lost = _lost(engine, acked)
        await engine.close()
        return lost

    assert asyncio.run(main()) == []


def test_recovery_refills_segments_a_power_loss_left_empty(tmp_path: Path, disk: Disk) -> None:
    """A flush round fsyncs the queue log's files, then its directory: segments rolled in
    between got durable names and no durable contents, and a power loss left them empty
    between good ones. Recovery kept the segments after such a hole and moved the log end
    past it, and the re-split from the journal skipped the hole's offsets: acknowledged
    records lost, the log served with a gap."""
    small = LogConfig(segment_bytes=1500, index_interval_bytes=300, retention_ms=-1)

    async def main() -> list[tuple[int, int]]:
        engine = _open(tmp_path, [small], flush_policy="always", journal_segment_bytes=1 << 16)
        acked: dict[tuple[int, int], bytes] = {}
        await _produce(engine, b"a", 12, acked)
        await wait_split(engine)
        active = engine._by_name[("t", 0)].queue.segments[-1]
        hold = threading.Event()  # the flush round's first fsync takes a while
        held = disk.plan.fail("fsync", match=f"t-0/{active.base_offset:020d}.log", hold=hold)
        flushing = asyncio.ensure_future(engine.flush())
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, held.entered.wait, 5)
        await _produce(engine, b"b", 15, acked)  # the queue log rolls meanwhile
        await wait_split(engine)
        hold.set()
        await flushing  # then the directory: the new segments' names
        abandon(engine)
        disk.durability.power_loss()
        engine = _open(tmp_path, [small], flush_policy="always", journal_segment_bytes=1 << 16)
        lost = _lost(engine, acked)
        await engine.close()
        return lost

    assert asyncio.run(main()) == []


def test_a_rolled_segments_fsync_never_vouches_for_an_earlier_one(
    tmp_path: Path, disk: Disk
) -> None:
    """Flush policy ``interval``: the fsync of the second rolled journal segment finished
    before that of the first and moved the journal's durable end past the first, which no
    later fsync named; the checkpoint then called it durable. After a power loss the split
    position was inside the lost segment and the splitter never moved again: every later,
    fsynced record of the journal partition stayed unreadable, for good."""
    small = LogConfig(segment_bytes=1500, index_interval_bytes=300, retention_ms=-1)
    big = LogConfig(segment_bytes=1 << 20, index_interval_bytes=300, retention_ms=-1)
    settings = {"flush_policy": "interval", "flush_interval_ms": 3_600_000}
    settings["journal_segment_bytes"] = 1024

    async def main() -> tuple[list[tuple[int, int]], int, int]:
        engine = _open(tmp_path, [small, big], **settings)
        hold = threading.Event()
        disk.plan.fail("fsync", match=f"journal-0/{segment_name(0)}", hold=hold)
        acked: dict[tuple[int, int], bytes] = {}
        for i in range(12):  # about three journal segments: two rolls
            await _produce(engine, b"r%d" % i, 1, acked, partition=i % 2)
            await asyncio.sleep(0.01)
        await wait_split(engine)
        journal = engine._journals[0]
        for _ in range(100):  # the second roll's fsync (not held) lands
            if len(journal.segments) > 2 and journal.durable_end > journal.segments[1]:
                break
            await asyncio.sleep(0.01)
        # the checkpoint round a roll wakes: the queue logs that rolled are flushed
        await engine._flush_queues([q for q in engine._dirty if q.unflushed])
        for task in engine._tasks:  # power loss while the first segment's fsync still runs
            task.cancel()
        disk.ops.durability = None  # nothing the old engine does from here on is kept
        disk.durability.power_loss()
        hold.set()
        await asyncio.sleep(0.1)
        abandon(engine)
        engine = _open(tmp_path, [small, big], **settings)
        await asyncio.sleep(0.5)
        lost = _lost(engine, acked)
        split, written = engine.split_positions()[0], engine._journals[0].written_end
        await engine.close()
        return lost, split, written

    lost, split, written = asyncio.run(main())
    assert split == written, f"the splitter stopped at {split} of {written}"
    assert lost == []


def test_segments_a_power_loss_brings_back_below_the_log_start_are_deleted(
    tmp_path: Path, disk: Disk
) -> None:
    """DeleteRecords unlinked segments wholly below the new log start; a power loss before
    their directory's fsync brings the names back, some emptied. Recovery kept them: reads
    were right (they are below the log start) but they held disk, and `storage check`
    reported the holes between them as defects (audit31's power-loss fuzzer, seed 2058)."""
    small = LogConfig(segment_bytes=1500, index_interval_bytes=300, retention_ms=-1)
    queue_dir = tmp_path / "queues" / "t-0"

    async def main() -> tuple[list[str], list[int], int]:
        engine = _open(tmp_path, [small], flush_policy="always", journal_segment_bytes=1 << 16)
        await _produce(engine, b"a", 30, {})
        await wait_split(engine)
        bases = [seg.base_offset for seg in engine._by_name[("t", 0)].queue.segments]
        assert len(bases) >= 4
        deleted = engine.delete_records("t", 0, bases[3])
        await deleted.written
        await asyncio.wait_for(engine.split_past(deleted.journal, deleted.end), 5)
        await engine.close()
        for base in bases[:3]:  # back from the dead, emptied (or not)
            (queue_dir / f"{base:020d}.log").write_bytes(b"" if base != bases[1] else b"\0" * 7)
        engine = _open(tmp_path, [small], flush_policy="always", journal_segment_bytes=1 << 16)
        start = engine.log_start_offset("t", 0)
        await engine.close()
        report = check_storage(str(tmp_path / "journal"), str(tmp_path / "queues"))
        kept = sorted(int(p.stem) for p in queue_dir.glob("*.log"))
        return report.defects, kept, start

    defects, kept, start = asyncio.run(main())
    assert start >= min(kept) and all(base >= min(kept) for base in kept)
    assert defects == []
    assert len([base for base in kept if base < start]) <= 1  # the one holding the log start
