"""Fetch reads as segment ranges (``storage/file_range.py``): the range a read in a disk-read
thread hands back covers exactly the whole batches the copying read returns, found through the
offset index without reading the batches in between; it stays readable after its segment is
deleted; ranges are bounded in number and always closed."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import random
from pathlib import Path

import pytest
from conftest import add_topic, build_batch, new_engine, wait_split
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stonemq.server.metrics import METRICS
from stonemq.storage import file_range
from stonemq.storage.engine import LogConfig
from stonemq.storage.file_range import FileRange


async def _fill(engine, sizes: list[tuple[int, int]], compression: str = "none") -> int:
    """Batches of (records, record size) with random bytes; returns the next offset."""
    offset = 0
    for records, size in sizes:
        batch = build_batch([os.urandom(size) for _ in range(records)], compression=compression)
        await engine.append("t", 0, batch, records).written
        offset += records
    await wait_split(engine)
    return offset


def _data(read) -> bytes:
    if isinstance(read, FileRange):
        try:
            return read.read_all()
        finally:
            read.close()
    return bytes(read)


BIG_SEGMENTS = LogConfig(segment_bytes=64 << 20, index_interval_bytes=4096)

batch_sizes = st.lists(
    st.tuples(st.integers(1, 30), st.sampled_from([10, 200, 1000, 5000, 40_000])),
    min_size=1,
    max_size=40,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sizes=batch_sizes, seed=st.integers(0, 2**32 - 1))
def test_a_range_covers_exactly_the_batches_a_copying_read_returns(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[tuple[int, int]], seed: int
) -> None:
    """For random batches (index entries every 4 KiB, segments of 256 KiB) and random fetch
    offsets and sizes, the zero-copy read (index jump, or every header read) returns the same
    bytes as the copying read, and every range it opened is closed again."""
    tmp_path = tmp_path_factory.mktemp("ranges")
    rng = random.Random(seed)

    async def main() -> None:
        engine = new_engine(tmp_path, queue_cache_retain_bytes=-1)
        add_topic(engine, config=LogConfig(segment_bytes=256 * 1024, index_interval_bytes=4096))
        engine.start(lambda *a: None)
        end = await _fill(engine, sizes)
        opened = METRICS.file_ranges_opened - METRICS.file_ranges_closed
        for _ in range(12):
            offset = rng.randrange(end)
            max_bytes = rng.choice([1, 100, 70_000, 300_000, 1 << 20])
            copied = bytes((await engine.read_async("t", 0, offset, max_bytes)).data)
            for every_batch in (False, True):
                read = await engine.read_async(
                    "t", 0, offset, max_bytes, file_range=True, every_batch=every_batch
                )
                assert _data(read.data) == copied, (offset, max_bytes, every_batch)
        assert METRICS.file_ranges_opened - METRICS.file_ranges_closed == opened
        await engine.close()

    asyncio.run(main())


def test_large_reads_come_back_as_ranges_that_know_their_codecs(tmp_path: Path) -> None:
    """A read of 1 MiB past the loop's limit is a FileRange (no bytes in memory); read with
    ``every_batch`` it says whether a zstd batch is in it; a small one is bytes."""

    async def main() -> None:
        engine = new_engine(tmp_path, queue_cache_retain_bytes=-1)
        add_topic(engine, config=BIG_SEGMENTS)
        engine.start(lambda *a: None)
        await _fill(engine, [(20, 3000)] * 10 + [(20, 3000)], compression="none")
        start_zstd = 220
        batch = build_batch([b"z" * 3000] * 20, compression="zstd")
        await engine.append("t", 0, batch, 20).written
        await _fill(engine, [(20, 3000)] * 3)
        plain = await engine.read_async("t", 0, 0, 200_000, file_range=True, every_batch=True)
        assert isinstance(plain.data, FileRange) and not plain.data.has_zstd
        plain.data.close()
        mixed = await engine.read_async("t", 0, 0, 1 << 20, file_range=True, every_batch=True)
        assert isinstance(mixed.data, FileRange) and mixed.data.has_zstd
        mixed.data.close()
        tail = await engine.read_async("t", 0, start_zstd + 1, 1 << 20, file_range=True)
        assert isinstance(tail.data, FileRange)
        tail.data.close()
        small = await engine.read_async("t", 0, 0, 1, file_range=True)
        assert isinstance(small.data, bytes | memoryview)  # one batch of 60 KB: on the loop
        await engine.close()

    asyncio.run(main())


def test_a_range_outlives_its_deleted_segment_and_the_count_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A range's bytes are read through its own descriptor after the segment file is
    unlinked; past ``MAX_OPEN_RANGES`` open ranges a read is bytes again."""

    async def main() -> None:
        engine = new_engine(tmp_path, queue_cache_retain_bytes=-1)
        add_topic(engine, config=BIG_SEGMENTS)
        engine.start(lambda *a: None)
        await _fill(engine, [(20, 3000)] * 30)
        expected = bytes((await engine.read_async("t", 0, 0, 1 << 20)).data)
        read = await engine.read_async("t", 0, 0, 1 << 20, file_range=True)
        assert isinstance(read.data, FileRange)
        monkeypatch.setattr(file_range, "MAX_OPEN_RANGES", file_range.open_ranges())
        capped = await engine.read_async("t", 0, 0, 1 << 20, file_range=True)
        assert not isinstance(capped.data, FileRange)
        assert bytes(capped.data) == expected
        os.unlink(read.data.path)
        assert not os.path.exists(read.data.path)
        assert _data(read.data) == expected
        await engine.close()

    asyncio.run(main())


def test_sendfile_moves_file_bytes_and_a_full_socket_raises_blocking(tmp_path: Path) -> None:
    """``fileio.sendfile`` (libc's, holding the GIL) sends a file's bytes from an offset to a
    non-blocking socket, reports a full socket as BlockingIOError and a closed peer as an
    OSError, like ``os.sendfile``."""
    import socket

    from stonemq.storage import fileio

    payload = os.urandom(3 << 20)
    path = tmp_path / "segment.log"
    path.write_bytes(b"skip" + payload)
    fd = os.open(path, os.O_RDONLY)
    a, b = socket.socketpair()
    try:
        a.setblocking(False)
        got = bytearray()
        sent = 0
        blocked = 0
        while sent < len(payload):
            try:
                sent += fileio.sendfile(a.fileno(), fd, 4 + sent, len(payload) - sent)
            except BlockingIOError:
                blocked += 1
                got += b.recv(1 << 20)
        b.setblocking(False)
        while len(got) < len(payload):
            got += b.recv(1 << 20)
        assert bytes(got) == payload
        assert blocked > 0  # 3 MiB never fit in a socket pair's buffers at once
        b.close()
        with pytest.raises(OSError) as failure:
            for _ in range(100):
                fileio.sendfile(a.fileno(), fd, 4, 1 << 16)
        assert failure.value.errno in (errno.EPIPE, errno.ECONNRESET)
    finally:
        a.close()
        b.close()
        os.close(fd)


def test_a_send_stops_at_its_share_and_goes_on_where_it_stopped(tmp_path: Path) -> None:
    """``FileRange.send(fd, max_bytes)`` sends at most ``max_bytes`` a call (the connection
    then lets the loop serve others before the next call) and the calls together send the
    range's bytes exactly once, in order."""
    import socket

    payload = os.urandom(700_000)
    path = tmp_path / "segment.log"
    path.write_bytes(b"head" + payload + b"tail")
    r = file_range.open_range(str(path), 4, len(payload), False)
    assert r is not None
    a, b = socket.socketpair()
    try:
        a.setblocking(False)
        b.setblocking(False)
        got = bytearray()
        calls = 0
        done = False
        while not done:
            before = r.sent
            try:
                done = r.send(a.fileno(), 100_000)
                calls += 1
                assert r.sent - before <= 100_000
                assert done or r.sent - before == 100_000  # a call short of its share is full
            except BlockingIOError:
                pass
            with contextlib.suppress(BlockingIOError):
                while True:
                    got += b.recv(1 << 20)
        with contextlib.suppress(BlockingIOError):
            while len(got) < len(payload):
                got += b.recv(1 << 20)
        assert bytes(got) == payload
        assert calls >= 7  # 700,000 bytes in shares of 100,000
        assert r.send(a.fileno(), 100_000) and r.sent == len(payload)  # nothing left: done
    finally:
        r.close()
        a.close()
        b.close()


def test_out_of_descriptors_a_range_is_not_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening a range's descriptor fails with EMFILE (the process's limit, injected at the
    I/O boundary): ``open_range`` answers None, as past ``MAX_OPEN_RANGES`` (the read is then
    copied, as the test above shows), and counts nothing; another error is raised."""
    from stonemq.storage import fileio

    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"x" * 100)
    opened, now_open = METRICS.file_ranges_opened, file_range.open_ranges()

    def failing(error: int):
        def open_failing(path: str, flags: int, mode: int = 0o644) -> int:
            raise OSError(error, os.strerror(error), path)

        return open_failing

    monkeypatch.setattr(fileio, "open", failing(errno.EMFILE))
    assert file_range.open_range(str(path), 0, 100, False) is None
    monkeypatch.setattr(fileio, "open", failing(errno.ENOENT))
    with pytest.raises(FileNotFoundError):
        file_range.open_range(str(path), 0, 100, False)
    assert METRICS.file_ranges_opened == opened
    assert file_range.open_ranges() == now_open
