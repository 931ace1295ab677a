"""Recovery: torn and garbage tails in the journal and the queue logs, re-split idempotence,
checkpoint files that are missing, half-written or damaged."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from conftest import abandon, add_topic, build_batch, new_engine, read_all, wait_split
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stonemq.protocol.record_batch import crc_ok, iter_batches, parse_header
from stonemq.storage.engine import StorageEngine
from stonemq.storage.queue_log import QueueLog
from stonemq.storage.splitter import Splitter

PARTITIONS = 3


def newest(directory: Path, suffix: str) -> Path:
    return sorted(p for p in directory.iterdir() if p.suffix == suffix)[-1]


async def produce(engine: StorageEngine, count: int, seed: int = 0) -> None:
    results = []
    for i in range(count):
        n = 1 + (i + seed) % 3
        batch = build_batch([b"%d-%d" % (seed, i) * (1 + i % 40)] * n)
        results.append(engine.append("t", i % PARTITIONS, batch, n))
    await asyncio.gather(*(r.written for r in results))


def check_partition(engine: StorageEngine, partition: int) -> bytes:
    """Offsets contiguous from 0, every batch CRC-valid, log end == high watermark."""
    data = read_all(engine, "t", partition)
    expected = 0
    for pos, header in iter_batches(data):
        assert header.base_offset == expected
        assert crc_ok(data, pos, header)
        expected = header.next_offset
    assert expected == engine.high_watermark("t", partition)
    assert engine.log_end_offset("t", partition) == expected
    return data


def reopen(root: Path) -> tuple[StorageEngine, object]:
    engine = new_engine(root)
    add_topic(engine, partitions=PARTITIONS)
    return engine, engine.recover()


def test_garbage_after_crash_is_cut_and_nothing_acknowledged_is_lost(tmp_path: Path) -> None:
    async def before_crash() -> list[bytes]:
        engine = new_engine(tmp_path)
        add_topic(engine, partitions=PARTITIONS)
        engine.start(lambda *a: None)
        await produce(engine, 120)
        await wait_split(engine)
        data = [check_partition(engine, p) for p in range(PARTITIONS)]
        abandon(engine)
        return data

    before = asyncio.run(before_crash())
    with open(newest(tmp_path / "journal" / "journal-0", ".journal"), "ab") as f:
        f.write(os.urandom(333))
    with open(newest(tmp_path / "queues" / "t-0", ".log"), "ab") as f:
        f.write(b"\x00" * 7 + os.urandom(200))
    seg = newest(tmp_path / "queues" / "t-1", ".log")
    os.truncate(seg, seg.stat().st_size - 5)  # a torn batch: the journal still has it

    engine, report = reopen(tmp_path)
    assert report.journal_bytes_truncated == 333
    assert report.queue_bytes_truncated >= 207
    for p in range(PARTITIONS):
        assert check_partition(engine, p) == before[p]

    async def after() -> None:  # appends continue from the recovered ends
        engine.start(lambda *a: None)
        await produce(engine, 6, seed=1)
        await wait_split(engine)
        for p in range(PARTITIONS):
            assert check_partition(engine, p).startswith(before[p])
        await engine.close()

    asyncio.run(after())


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cut_seed=st.integers(0, 10**9), split=st.booleans(), garbage=st.binary(max_size=64))
def test_torn_journal_tail_keeps_every_entry_before_the_cut(
    tmp_path_factory, cut_seed: int, split: bool, garbage: bytes
) -> None:
    root = tmp_path_factory.mktemp("torn")

    async def before_crash() -> list[list[tuple[int, bytes]]]:
        engine = new_engine(root, journal_partitions=1)
        engine.add_partition(TOPIC_ID, "t", 0, 0, SMALL_LOG)
        engine.add_partition(TOPIC_ID, "t", 1, 0, SMALL_LOG)
        engine.add_partition(TOPIC_ID, "t", 2, 0, SMALL_LOG)
        if split:
            engine.start(lambda *a: None)
        else:
            engine.recover()  # no splitter: everything is only in the journal
        await produce(engine, 30)
        if split:
            await wait_split(engine)
        abandon(engine)
        return []

    asyncio.run(before_crash())
    journal_dir = root / "journal" / "journal-0"
    segments = sorted(journal_dir.iterdir())
    total = sum(p.stat().st_size for p in segments)
    cut = cut_seed % total
    # entries that end at or before the cut must survive
    from stonemq.storage.journal import JournalReader

    reader = JournalReader(str(journal_dir))
    entries, _ = reader.read(0, total, 1 << 30, verify=True)
    survivors: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    for entry in entries:
        if entry.end <= cut or split:
            survivors[entry.partition].append(entry.base_offset)
    reader.close()
    # cut the journal at ``cut`` (dropping later segments' bytes) and add garbage
    for seg in segments:
        base = int(seg.stem)
        size = seg.stat().st_size
        if base >= cut and base > 0:
            seg.unlink()
        elif base + size > cut:
            os.truncate(seg, cut - base)
            with open(seg, "ab") as f:
                f.write(garbage)

    engine = new_engine(root, journal_partitions=1)
    for p in range(PARTITIONS):
        engine.add_partition(TOPIC_ID, "t", p, 0, SMALL_LOG)
    engine.recover()
    for p in range(PARTITIONS):
        data = check_partition(engine, p)
        bases = [h.base_offset for _, h in iter_batches(data)]
        assert bases == survivors[p]
    asyncio.run(engine.close())


def test_resplit_from_the_start_changes_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine, partitions=PARTITIONS)
        engine.start(lambda *a: None)
        await produce(engine, 90)
        await wait_split(engine)
        sizes = {p: len(read_all(engine, "t", p)) for p in range(PARTITIONS)}
        files = sorted((tmp_path / "queues").rglob("*"))
        stat = {p: p.stat().st_size for p in files if p.is_file()}
        splitter = Splitter(
            [j.directory for j in engine._journals],
            [0] * len(engine._journals),
            engine._resolve,
            4096,
        )
        advanced: set[QueueLog] = set()
        for j, journal in enumerate(engine._journals):
            assert splitter.split_to(j, journal.written_end, advanced) == journal.written_end
        splitter.close()
        assert advanced == set()
        assert {p: len(read_all(engine, "t", p)) for p in range(PARTITIONS)} == sizes
        assert {p: p.stat().st_size for p in files if p.is_file()} == stat
        await engine.close()

    asyncio.run(main())


def test_clean_restart_uses_the_checkpoints(tmp_path: Path) -> None:
    async def main() -> list[bytes]:
        engine = new_engine(tmp_path)
        add_topic(engine, partitions=PARTITIONS)
        engine.start(lambda *a: None)
        await produce(engine, 60)
        await engine.close()
        return []

    asyncio.run(main())
    for name in ("journal-recovery-point-checkpoint", "split-position-checkpoint"):
        assert (tmp_path / "journal" / name).read_text().startswith("0\n2\n")
    rp = (tmp_path / "queues" / "recovery-point-offset-checkpoint").read_text().splitlines()
    assert rp[:2] == ["0", "3"] and rp[2].startswith("t 0 ")
    engine, report = reopen(tmp_path)
    assert report.journal_bytes_truncated == report.queue_bytes_truncated == 0
    total = sum(engine.journal_ends())
    assert report.journal_bytes_replayed < total / 10  # only the last entry per queue log
    for p in range(PARTITIONS):
        check_partition(engine, p)
    asyncio.run(engine.close())


def test_leftover_temp_and_damaged_checkpoints_are_ignored(tmp_path: Path) -> None:
    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine, partitions=PARTITIONS)
        engine.start(lambda *a: None)
        await produce(engine, 45)
        await engine.close()

    asyncio.run(main())
    queue_rp = tmp_path / "queues" / "recovery-point-offset-checkpoint"
    good = queue_rp.read_text()
    # a crash mid-write leaves a temp file: readers never look at it
    (tmp_path / "queues" / "recovery-point-offset-checkpoint.tmp").write_text("0\n9\nt 0 99")
    engine, report = reopen(tmp_path)
    assert report.queue_bytes_truncated == 0
    before = [check_partition(engine, p) for p in range(PARTITIONS)]
    asyncio.run(engine.close())
    assert queue_rp.read_text() == good  # the temp file was replaced, not read
    assert not (tmp_path / "queues" / "recovery-point-offset-checkpoint.tmp").exists()
    # damaged checkpoints fall back to a full validation and a full re-split
    queue_rp.write_text("0\n3\nt 0 garbage")
    (tmp_path / "journal" / "split-position-checkpoint").write_text("7\n")
    engine, report = reopen(tmp_path)
    assert report.journal_bytes_replayed == sum(engine.journal_ends())
    assert [check_partition(engine, p) for p in range(PARTITIONS)] == before
    asyncio.run(engine.close())


def test_journal_segments_are_deleted_once_every_queue_log_flushed_past_them(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        engine = new_engine(tmp_path, journal_segment_bytes=2048)
        add_topic(engine, partitions=PARTITIONS)
        engine.start(lambda *a: None)
        await produce(engine, 120)
        await wait_split(engine)
        journal_dir = tmp_path / "journal" / "journal-0"
        assert len(list(journal_dir.iterdir())) > 3
        await engine.flush()
        assert len(list(journal_dir.iterdir())) == 1  # only the active segment is left
        data = [check_partition(engine, p) for p in range(PARTITIONS)]
        abandon(engine)
        engine2, _ = reopen(tmp_path)
        assert [check_partition(engine2, p) for p in range(PARTITIONS)] == data
        await engine2.close()

    asyncio.run(main())


from conftest import SMALL_LOG, TOPIC_ID  # noqa: E402

del parse_header
