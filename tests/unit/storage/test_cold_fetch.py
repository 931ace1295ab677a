"""Fetch reads never wait for the disk on the event loop: what the page cache holds is read
at once; bytes it does not hold raise NotCachedError there and are read in a disk-read
thread on descriptors of its own (the disk-I/O part of the hostile-input issue)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from conftest import PAGE, add_topic, build_batch, cached_pages, new_engine, read_all, wait_split

from stonemq.storage import fileio
from stonemq.storage.engine import StorageEngine
from stonemq.storage.open_files import LOOP_READ_MAX_BYTES, CachedReads, NotCachedError
from stonemq.storage.page_cache import drop_pages


def drop_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        drop_pages(fd, 0, path.stat().st_size)
    finally:
        os.close(fd)


class StrictNowaitReads(fileio.FileOps):
    """Real operations, but a ``pread_cached`` of a range the page cache does not wholly hold
    (mincore(2), which reads nothing) is refused without reading. The kernel's RWF_NOWAIT is
    a best effort: here (6.18, ext4) about 1 run in 12 had such a read served anyway, several
    times in a row, and each miss starts the readahead that makes the next read a hit. The
    engine's choice between the loop and a thread is what this test is about, so the page
    cache's answer is made exact; the kernel's part is tested alone below."""

    def pread_cached(self, fd: int, n: int, pos: int) -> bytes | None:
        end = min(pos + n, os.fstat(fd).st_size)
        if end > pos:
            pages = cached_pages(Path(os.readlink(f"/proc/self/fd/{fd}")))
            if not all(pages[pos // PAGE : (end - 1) // PAGE + 1]):
                return None
        return super().pread_cached(fd, n, pos)


@pytest.mark.skipif(not hasattr(os, "RWF_NOWAIT"), reason="needs preadv2(RWF_NOWAIT)")
def test_a_cached_read_is_served_from_the_page_cache_and_refused_past_it(tmp_path: Path) -> None:
    """``fileio.pread_cached`` on the real kernel: cached bytes are served, and a read of
    dropped pages is refused (None) rather than read; skipped where the kernel serves such
    reads anyway every time (a filesystem ignoring RWF_NOWAIT)."""
    data = os.urandom(1 << 20)
    path = tmp_path / "file"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert fileio.pread_cached(fd, 4096, 8192) == data[8192 : 8192 + 4096]
        assert fileio.pread_cached(fd, 4096, len(data) - 100) == data[-100:]  # the file's end
        for _ in range(5):  # the kernel's best effort: see StrictNowaitReads
            drop_file(path)
            assert not any(cached_pages(path)), "pages still cached"
            if fileio.pread_cached(fd, 4096, 1 << 19) is None:
                return
        pytest.skip(f"{tmp_path}'s filesystem reads uncached pages despite RWF_NOWAIT")
    finally:
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "RWF_NOWAIT"), reason="needs preadv2(RWF_NOWAIT)")
def test_a_fetch_of_uncached_bytes_reads_them_in_a_thread(tmp_path: Path) -> None:
    async def main() -> None:
        engine = new_engine(tmp_path, queue_cache_retain_bytes=-1)
        add_topic(engine)
        engine.start(lambda *a: None)
        batches = [build_batch([os.urandom(3000)] * 20) for _ in range(20)]  # ~1.2 MB
        for batch in batches:
            await engine.append("t", 0, batch, 20).written
        await wait_split(engine)
        expected = read_all(engine, "t", 0)
        previous = fileio.install(StrictNowaitReads())
        try:
            await uncached_reads_go_to_a_thread(engine, expected)
        finally:
            fileio.install(previous)
        await engine.close()

    async def uncached_reads_go_to_a_thread(engine: StorageEngine, expected: bytes) -> None:
        for log in (tmp_path / "queues" / "t-0").glob("*.log"):
            drop_file(log)
            assert not any(cached_pages(log)[:-1]), "pages still cached"
        with pytest.raises(NotCachedError):  # the event loop's read would have waited
            engine.read("t", 0, 0, 1 << 20, CachedReads(engine._files))
        got = bytearray()
        offset = 0
        while offset < engine.high_watermark("t", 0):
            data = bytes((await engine.read_async("t", 0, offset, 1 << 20)).data)
            got += data
            offset = last_offset_after(data)
        assert bytes(got) == expected
        assert engine._disk_readers is not None  # the reads went to the disk-read thread

    asyncio.run(main())


def last_offset_after(data: bytes) -> int:
    """The offset after the last whole batch of ``data``."""
    pos = 0
    nxt = 0
    while pos + 61 <= len(data):
        base = int.from_bytes(data[pos : pos + 8], "big")
        length = int.from_bytes(data[pos + 8 : pos + 12], "big")
        delta = int.from_bytes(data[pos + 23 : pos + 27], "big")
        nxt = base + delta + 1
        pos += 12 + length
    return nxt


def test_a_fetch_of_many_cached_bytes_copies_them_in_a_thread(tmp_path: Path) -> None:
    """A consumer catching up reads a MiB per partition: even when the page cache holds it,
    the copy runs in a disk-read thread (in parallel with the event loop), not on the loop;
    a read within ``LOOP_READ_MAX_BYTES`` (a consumer at the tail) stays on the loop."""

    async def main() -> None:
        engine = new_engine(tmp_path, queue_cache_retain_bytes=-1)
        add_topic(engine)
        engine.start(lambda *a: None)
        small = build_batch([b"x" * 100])
        await engine.append("t", 0, small, 1).written
        for _ in range(10):  # 1.2 MB more in batches of 120 KB, in the page cache
            await engine.append("t", 0, build_batch([os.urandom(3000)] * 40), 40).written
        await wait_split(engine)
        on_loop = CachedReads(engine._files)
        assert bytes(engine.read("t", 0, 0, 200, on_loop).data) == small  # small: on the loop
        with pytest.raises(NotCachedError):
            engine.read("t", 0, 1, 1 << 20, on_loop)
        assert bytes((await engine.read_async("t", 0, 0, 200)).data) == small
        assert engine._disk_readers is None  # no thread for the small read
        whole = bytes((await engine.read_async("t", 0, 1, 1 << 20)).data)
        assert engine._disk_readers is not None  # the large one went to a disk-read thread
        assert whole == bytes(engine.read("t", 0, 1, 1 << 20).data)
        assert len(whole) > LOOP_READ_MAX_BYTES
        await engine.close()

    asyncio.run(main())
