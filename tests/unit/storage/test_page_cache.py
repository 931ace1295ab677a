"""Recovery keeps no page cache of what it read once: the journal it scanned and re-split and the
queue-log tails it validated; and it still recovers every batch. Queue-log pages a window
(``queue.cache.retain.bytes``) old leave the cache, the newest stay. Residency comes from
``cached_pages`` (conftest.py: mincore, which reads nothing)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from conftest import (
    PAGE,
    TOPIC_ID,
    abandon,
    add_topic,
    build_batch,
    cached_pages,
    new_engine,
    produce,
    read_all,
    read_from_disk_bytes,
    wait_split,
)

from stonemq.storage.engine import LogConfig
from stonemq.storage.page_cache import FOLIO_MAX_BYTES, drop_pages


def load(path: Path) -> None:
    path.read_bytes()


@pytest.fixture
def droppable(tmp_path: Path) -> Path:
    """``tmp_path``, if its file system drops clean pages on POSIX_FADV_DONTNEED (tmpfs does
    not: its pages are the files)."""
    probe = tmp_path / "probe"
    probe.write_bytes(os.urandom(4 * PAGE))
    fd = os.open(probe, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if any(cached_pages(probe)):
        pytest.skip("this file system keeps pages through POSIX_FADV_DONTNEED")
    probe.unlink()
    return tmp_path


def test_drop_pages_drops_the_range_it_is_given_and_no_more(droppable: Path) -> None:
    # whole 2 MiB-aligned folios: the cache may hold a file in folios of up to 2 MiB, and a
    # folio only partly inside the range stays (so can a page or two around a real range)
    mib = 1 << 20
    path = droppable / "f"
    path.write_bytes(os.urandom(16 * mib))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        load(path)
        assert all(cached_pages(path))
        drop_pages(fd, 4 * mib, 8 * mib)
    finally:
        os.close(fd)
    pages = cached_pages(path)
    per_mib = mib // PAGE
    assert not any(pages[4 * per_mib : 12 * per_mib])
    assert all(pages[: 4 * per_mib]) and all(pages[12 * per_mib :])


def test_recovery_reads_through_no_page_cache_and_recovers_every_batch(droppable: Path) -> None:
    root = droppable / "broker"
    values: dict[int, list[bytes]] = {0: [], 1: []}

    async def before_crash() -> None:
        engine = new_engine(root)
        # one segment per partition: a roll would wake a flush, whose recovery points would
        # spare recovery the reads this test watches
        add_topic(engine, partitions=2, config=LogConfig(segment_bytes=1 << 20))
        engine.start(lambda *a: None)
        appends = []
        for i in range(300):
            value = b"%05d" % i * 200
            values[i % 2].append(value)
            appends.append(engine.append("t", i % 2, build_batch([value]), 1))
        await asyncio.gather(*(a.written for a in appends))
        await wait_split(engine)
        abandon(engine)  # no checkpoint: recovery scans and re-splits all of it

    asyncio.run(before_crash())
    os.sync()  # clean pages, as after a crash that lost none (only clean pages can go)
    files = sorted(root.rglob("*.journal")) + sorted(root.rglob("*.log"))
    assert len(files) > 4
    for path in files:
        load(path)
        assert all(cached_pages(path))

    engine = new_engine(root)
    add_topic(engine, partitions=2, config=LogConfig(segment_bytes=1 << 20))
    report = engine.recover()

    assert report.journal_bytes_replayed > 0
    for path in files:
        assert not any(cached_pages(path)), f"{path.relative_to(root)} left in the page cache"
    for partition in (0, 1):
        data = read_all(engine, "t", partition)
        got = [bytes(data).count(v) for v in values[partition]]
        assert got == [1] * len(values[partition])
        assert engine.high_watermark("t", partition) == len(values[partition])


def test_queue_log_pages_past_the_window_leave_the_page_cache(droppable: Path) -> None:
    window = 1 << 20
    big_segments = LogConfig(segment_bytes=1 << 30, index_interval_bytes=4096)

    async def main() -> None:
        engine = new_engine(
            droppable / "broker", queue_cache_retain_bytes=window, journal_segment_bytes=1 << 24
        )
        add_topic(engine, config=big_segments)
        engine.start(lambda *a: None)
        old = [build_batch([os.urandom(1000)] * 100) for _ in range(50)]  # ~5 MB
        await produce(engine, "t", 0, old)
        await wait_split(engine)
        await engine.flush()  # written back: clean, so a drop can take it
        new = [build_batch([os.urandom(1000)] * 100) for _ in range(30)]
        await produce(engine, "t", 0, new)
        await wait_split(engine)
        (segment,) = sorted((droppable / "broker" / "queues").rglob("*.log"))
        old_bytes = sum(map(len, old))
        # but for a folio (up to 2 MiB) that also holds new, dirty bytes
        kept = (old_bytes - FOLIO_MAX_BYTES) // PAGE
        deadline = asyncio.get_running_loop().time() + 5
        while any(cached_pages(segment)[:kept]):  # the drop runs in an executor thread
            if asyncio.get_running_loop().time() > deadline:
                left = [i for i, cached in enumerate(cached_pages(segment)[:kept]) if cached]
                raise AssertionError(f"pages a window old are still cached: {left[:20]}...")
            await asyncio.sleep(0.05)
        pages = cached_pages(segment)
        size = segment.stat().st_size
        newest = pages[-((window // 2) // PAGE) :]
        # all of them but for what this VM pages out on its own (DAMON), now and then a page
        assert sum(newest) >= 0.9 * len(newest), "the newest half window was dropped"
        data = read_all(engine, "t", 0)  # and everything reads back, from disk or cache
        assert [bytes(data).count(bytes(b[61:])) for b in old + new] == [1] * 80
        assert size == len(data)
        await engine.close()

    asyncio.run(asyncio.wait_for(main(), 20))


def test_appends_after_a_drop_read_nothing_back_from_disk(droppable: Path) -> None:
    # A drop reaching the end of a file takes its partly written last page too, and the next
    # append into that page reads it back from disk first, on the event loop. Drops end at
    # the page boundary below the range instead: the last page stays. (The journal's release
    # is tested in test_engine_roundtrip.py.)
    window = 256 << 10
    big_segments = LogConfig(segment_bytes=1 << 30, index_interval_bytes=4096)
    root = droppable / "broker"
    quiet = range(8)  # partitions appended to, left alone past a window, appended to again

    async def main() -> None:
        engine = new_engine(
            root,
            queue_cache_retain_bytes=window,
            journal_partitions=1,
            journal_segment_bytes=1 << 30,
        )
        for p in range(len(quiet) + 1):  # all in the one journal partition
            engine.add_partition(TOPIC_ID, "t", p, 0, big_segments)
        engine.start(lambda *a: None)

        async def append_to_quiet() -> None:
            for p in quiet:  # ~5 KB each: every file ends inside a page
                await produce(engine, "t", p, [build_batch([os.urandom(1000)] * 5)])
            await wait_split(engine)

        await append_to_quiet()
        # a busy partition writes many windows after them
        busy = [build_batch([os.urandom(1000)] * 100) for _ in range(100)]  # ~10 MB
        await produce(engine, "t", len(quiet), busy)
        await wait_split(engine)
        segments = [next((root / "queues" / f"t-{p}").glob("*.log")) for p in quiet]
        deadline = asyncio.get_running_loop().time() + 5
        while any(cached_pages(path)[0] for path in segments):
            # the drops run in an executor thread
            assert asyncio.get_running_loop().time() < deadline, "older pages not dropped"
            await asyncio.sleep(0.05)
        # This VM also pages out memory it sees unused (DAMON), now and then a page of
        # ours: a drop that took the last pages takes all 8, that leaves at most one or two.
        assert all(path.stat().st_size % PAGE for path in segments), "a page boundary"
        dropped = [path.parent.name for path in segments if not cached_pages(path)[-1]]
        assert len(dropped) <= 2, f"partly written last pages dropped: {dropped}"

        before = read_from_disk_bytes()
        await append_to_quiet()
        read_pages = (read_from_disk_bytes() - before) // PAGE
        assert read_pages <= 2, f"{read_pages} pages read back from disk to append to 8 files"
        await engine.close()

    asyncio.run(asyncio.wait_for(main(), 30))
