"""Helpers for the storage tests: valid RecordBatch v2 bytes and engines on tmp_path."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import mmap
import os
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from engines import new_engine  # tests/ (on sys.path: root conftest)
from kafka.record.default_records import DefaultRecordBatchBuilder

from stonemq.storage.engine import LogConfig, StorageEngine

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def build_batch(
    values: Sequence[bytes],
    timestamps: Sequence[int] | None = None,
    *,
    base_offset: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    compression: str = "none",
) -> bytearray:
    """One valid RecordBatch v2 holding ``values`` (timestamps default to 1000 + i)."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=CODECS[compression],
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 30,
    )
    for i, value in enumerate(values):
        ts = 1000 + i if timestamps is None else timestamps[i]
        builder.append(i, timestamp=ts, key=None, value=value, headers=[])
    data = bytearray(builder.build())
    data[0:8] = base_offset.to_bytes(8, "big", signed=True)
    return data


SMALL_LOG = LogConfig(segment_bytes=16 * 1024, index_interval_bytes=512)
TOPIC_ID = uuid.UUID("6f1c2d3e-0000-4000-8000-000000000001")


def add_topic(
    engine: StorageEngine,
    topic: str = "t",
    partitions: int = 1,
    config: LogConfig = SMALL_LOG,
    topic_id: uuid.UUID = TOPIC_ID,
) -> None:
    for p in range(partitions):
        engine.add_partition(topic_id, topic, p, p % 2, config)


def read_all(engine: StorageEngine, topic: str, partition: int, start: int = 0) -> bytes:
    """Every batch from ``start`` to the high watermark, read in small fetches."""
    out = bytearray()
    offset = start
    hw = engine.high_watermark(topic, partition)
    from stonemq.protocol.record_batch import iter_batches

    while offset < hw:
        data = engine.read(topic, partition, offset, 1000).data
        assert data, f"no data at {offset} below hw {hw}"
        last = None
        for _, header in iter_batches(data):
            last = header
        assert last is not None
        out += data
        offset = last.next_offset
    return bytes(out)


@pytest.fixture
def engine_factory(tmp_path: Path) -> Callable[..., StorageEngine]:
    def make(**overrides: Any) -> StorageEngine:
        return new_engine(tmp_path, **overrides)

    return make


async def produce(
    engine: StorageEngine, topic: str, partition: int, batches: Sequence[bytearray]
) -> list[int]:
    """Append ``batches`` to one partition and wait until each is in its journal file; their
    base offsets."""
    import asyncio

    from stonemq.protocol.record_batch import parse_header

    appends = [
        engine.append(topic, partition, batch, parse_header(batch).record_count)
        for batch in batches
    ]
    await asyncio.gather(*(a.written for a in appends))
    return [a.base_offset for a in appends]


async def wait_split(engine: StorageEngine, timeout_s: float = 5.0) -> None:
    """Wait until the splitter has split everything the journals made visible (an offline
    journal partition is not split any more)."""
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        positions = engine.split_positions()
        ends = [
            j.visible_end if j.health.splits else positions[i]
            for i, j in enumerate(engine._journals)
        ]
        if positions == ends and not any(j.has_pending for j in engine._journals):
            return
        assert loop.time() < deadline, "splitter did not catch up"
        await asyncio.sleep(0.001)


async def delete_records(
    engine: StorageEngine, topic: str, partition: int, offset: int, timeout_s: float = 5.0
) -> int:
    """DeleteRecords as the handler does it: the engine queues a log-start entry; wait until
    it is written and split (a replicated engine's HW is moved past it here, as its ISR
    would); the new log start offset. TimeoutError when the split does not get there."""
    import asyncio

    queued = engine.delete_records(topic, partition, offset)
    if queued is not None:
        await queued.written
        if engine._split_limits is not None:  # no followers here: the test is the ISR
            engine.set_split_limit(queued.journal, queued.end)
        await asyncio.wait_for(engine.split_past(queued.journal, queued.end), timeout_s)
    return engine.log_start_offset(topic, partition)


async def started_leader(root: Path) -> StorageEngine:
    """A started replicated engine leading journal partition 0 at epoch 1, with topic ``t``
    of two partitions (t-0 on journal partition 0)."""
    engine = new_engine(root, replicated=True)
    add_topic(engine, partitions=2)
    engine.recover()
    engine.start(lambda *a: None)
    try:
        await engine.become_leader(0, 1)
    except BaseException:
        await engine.close()
        raise
    return engine


async def wait_hw(engine: StorageEngine, hw: int, poll_s: float = 0.001) -> float:
    """Seconds until partition t-0's high watermark is ``hw`` (the split done), polled every
    ``poll_s``; fails after 5 s."""
    import time

    started = time.monotonic()
    while engine.high_watermark("t", 0) != hw:
        assert time.monotonic() - started < 5, engine.high_watermark("t", 0)
        await asyncio.sleep(poll_s)
    return time.monotonic() - started


def abandon(engine: StorageEngine) -> None:
    """Drop an engine as a crash would: no final split, flush or checkpoint.

    A crash also ends the writes the engine runs in executor threads; cancelling its tasks
    does not, so wait for them here: a checkpoint write of the abandoned engine still running
    in the loop's default executor raced the next engine's recovery on the same ``.tmp`` file
    (the rename of one found no file; seen once in the fast set under load)."""
    for task in engine._tasks:
        task.cancel()
    engine._tasks = []
    engine._closed = True
    for pool in (engine._creator, engine._disk_readers):
        if pool is not None:
            pool.shutdown(wait=True)
    with contextlib.suppress(RuntimeError):  # called outside a running loop: nothing runs
        loop = asyncio.get_running_loop()
        # asyncio has no public getter for the default executor: replace it, then wait for
        # the old one's work to end
        old = getattr(loop, "_default_executor", None)
        loop.set_default_executor(ThreadPoolExecutor(thread_name_prefix="asyncio"))
        if old is not None:
            old.shutdown(wait=True)
    for journal in engine._journals:
        journal.close()
    if engine._splitter is not None:
        engine._splitter.close()
    engine._files.close_all()


PAGE = mmap.PAGESIZE

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
_MAP_FAILED = ctypes.c_void_p(-1).value


def cached_pages(path: Path) -> list[bool]:
    """For each page of ``path``: is it in the page cache? mincore(2) on a mapping of the
    file, which reads nothing (a probing read would start the readahead it observes)."""
    size = path.stat().st_size
    if size == 0:
        return []
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, _MAP_FAILED), os.strerror(ctypes.get_errno())
        try:
            vec = ctypes.create_string_buffer((size + PAGE - 1) // PAGE)
            assert _libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            return [bool(b & 1) for b in vec.raw]
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def resident_pages(mapping: mmap.mmap) -> list[bool]:
    """For each page of an anonymous ``mapping`` of this process: is it mapped (resident)?
    mincore(2) on its own address; a page never written, or given back with MADV_DONTNEED,
    is not."""
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
    size = len(mapping)
    vec = ctypes.create_string_buffer((size + PAGE - 1) // PAGE)
    assert _libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
    return [bool(b & 1) for b in vec.raw]


def read_from_disk_bytes() -> int:
    """Bytes this process (all its threads) caused to be read from the disk: /proc/self/io."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise AssertionError("no read_bytes in /proc/self/io")


def fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"fd:{fd}"


class OsFaults:
    """Real ``os`` calls that fail: ``fail("pwritev", "journal-0", errno.ENOSPC)`` makes the
    next call of ``os.pwritev`` on a file whose path contains ``journal-0`` raise. Patching
    ``os`` itself (not the storage's own wrappers) keeps these tests valid for any version
    of the storage code."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.rules: list[list[Any]] = []  # [name, match, errno, times left]
        self.seen: list[tuple[str, str]] = []
        self._patched: set[str] = set()

    def fail(self, name: str, match: str, error: int, times: int = 1) -> None:
        self.rules.append([name, match, error, times])
        if name in self._patched:
            return
        self._patched.add(name)
        real = getattr(os, name)

        def faulty(*args: Any, **kwargs: Any) -> Any:
            target = args[0]
            path = fd_path(target) if isinstance(target, int) else str(target)
            for rule in self.rules:
                if rule[0] == name and rule[1] in path and rule[3] != 0:
                    rule[3] -= 1
                    self.seen.append((name, path))
                    raise OSError(rule[2], f"injected {name}: {os.strerror(rule[2])}", path)
            return real(*args, **kwargs)

        self.monkeypatch.setattr(os, name, faulty)


@pytest.fixture
def os_faults(monkeypatch: pytest.MonkeyPatch) -> OsFaults:
    return OsFaults(monkeypatch)
