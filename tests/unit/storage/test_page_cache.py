"""Recovery keeps no page cache of what it read once: the journal it scanned and re-split and the
queue-log tails it validated; and it still recovers every batch. Residency comes from
``cached_pages`` (conftest.py: mincore, which reads nothing)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from conftest import (
    PAGE,
    abandon,
    add_topic,
    build_batch,
    cached_pages,
    new_engine,
    read_all,
    wait_split,
)

from stonemq.storage.page_cache import drop_pages


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
        add_topic(engine, partitions=2)
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
    add_topic(engine, partitions=2)
    report = engine.recover()

    assert report.journal_bytes_replayed > 0
    for path in files:
        assert not any(cached_pages(path)), f"{path.relative_to(root)} left in the page cache"
    for partition in (0, 1):
        data = read_all(engine, "t", partition)
        got = [bytes(data).count(v) for v in values[partition]]
        assert got == [1] * len(values[partition])
        assert engine.high_watermark("t", partition) == len(values[partition])
