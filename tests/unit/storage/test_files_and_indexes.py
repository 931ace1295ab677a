"""The open-file LRU cache, the offset and time indexes, and per-partition frugality."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import build_batch, new_engine, read_all, wait_split
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stonemq.storage import fileio
from stonemq.storage.engine import LogConfig, StorageEngine
from stonemq.storage.fileio import SYNCFS_MIN_PATHS, fsync_paths
from stonemq.storage.offset_index import OffsetIndex
from stonemq.storage.open_files import OpenFiles
from stonemq.storage.time_index import TimeIndex


def test_open_files_lru_evicts_the_least_recently_used(tmp_path: Path) -> None:
    files = OpenFiles(3)
    paths = [str(tmp_path / f"f{i}") for i in range(5)]
    fds = [files.get(p) for p in paths[:3]]
    assert files.get(paths[0]) == fds[0]  # a hit refreshes f0
    files.get(paths[3])  # evicts f1, the least recently used
    assert len(files) == 3 and files.opens == 4
    files.get(paths[1])  # reopened: evicts f2
    assert files.opens == 5
    files.get(paths[0])
    assert files.opens == 5
    files.close_under([str(tmp_path)])
    assert len(files) == 0


def test_many_partitions_stay_under_the_open_file_cap(tmp_path: Path) -> None:
    cap = 16
    partitions = 300

    async def main() -> None:
        engine = new_engine(tmp_path, journal_partitions=4, max_open_files=cap)
        topic_id = uuid.uuid4()
        config = LogConfig(segment_bytes=600, index_interval_bytes=64)
        for p in range(partitions):
            engine.add_partition(topic_id, "many", p, p % 4, config)
        engine.start(lambda *a: None)
        for round_ in range(3):
            results = [
                engine.append("many", p, build_batch([b"%d" % round_ * 100] * 2), 2)
                for p in range(partitions)
            ]
            await asyncio.gather(*(r.written for r in results))
            await wait_split(engine)
            assert engine.open_files <= cap
        for p in range(0, partitions, 7):
            assert engine.high_watermark("many", p) == 6
            assert len(read_all(engine, "many", p)) > 0
            assert engine.open_files <= cap
        # at rest (executor threads that fsync, drop written pages or write producer
        # snapshots open descriptors of their own while they run, then close them)
        deadline = time.monotonic() + 10
        while True:
            targets = []
            for fd in os.listdir("/proc/self/fd"):
                with contextlib.suppress(OSError):
                    targets.append(os.readlink(f"/proc/self/fd/{fd}"))
            # only this engine's files count (a test that failed earlier in this process
            # may have left its engine's descriptors open)
            ours = [t for t in targets if t.startswith(str(tmp_path))]
            queue_files = [t for t in ours if "/queues/" in t]
            fd_count = len(ours)
            if len(queue_files) <= cap or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        await engine.close()
        assert len(queue_files) <= cap, queue_files
        assert fd_count <= cap + 16  # the journals and their directories besides

    asyncio.run(main())


def test_idle_partitions_create_no_files(tmp_path: Path) -> None:
    engine = new_engine(tmp_path)
    for p in range(1000):
        engine.add_partition(uuid.uuid4(), f"idle{p}", 0, 0, LogConfig())
    engine.recover()
    # only the broker-wide checkpoint files: no directory or file per partition
    assert all(name.endswith("checkpoint") for name in os.listdir(tmp_path / "queues"))
    assert engine.open_files == 0
    asyncio.run(engine.close())


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.integers(1, 50), min_size=0, max_size=60),
    st.integers(-5, 3000),
)
def test_offset_index_lookup_is_the_floor_entry(
    tmp_path_factory, gaps: list[int], target: int
) -> None:
    path = str(tmp_path_factory.mktemp("idx") / "00000000000000000100.index")
    files = OpenFiles(4)
    index = OffsetIndex(path, 100)
    entries = []
    offset, position = 100, 0
    for gap in gaps:
        offset += gap
        position += gap * 10
        index.append(offset, position)
        entries.append((offset, position))
    target += 100
    floor = [e for e in entries if e[0] <= target]
    # lookups see entries still gathered in memory and those written alike; a reload sees
    # them once they are written
    assert index.lookup(files, target) == (floor[-1] if floor else (100, 0))
    assert index.written == 0
    index.write_pending(files)
    assert index.written == len(entries)
    assert index.lookup(files, target) == (floor[-1] if floor else (100, 0))
    reloaded = OffsetIndex(path, 100)
    reloaded.load(files)
    assert reloaded.entries == len(entries)
    cut = position // 2
    reloaded.truncate_to_position(files, cut)
    assert reloaded.entries == len([e for e in entries if e[1] < cut])
    files.close_all()


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.tuples(st.integers(-1, 1000), st.integers(0, 5)), max_size=40), st.integers(0, 1100)
)
def test_time_index_keeps_growing_timestamps_only(
    tmp_path_factory, points: list[tuple[int, int]], target: int
) -> None:
    path = str(tmp_path_factory.mktemp("tidx") / "00000000000000000000.timeindex")
    files = OpenFiles(4)
    index = TimeIndex(path, 0)
    kept = []
    offset = 0
    for ts, step in points:
        offset += step
        before = index.entries
        index.maybe_append(ts, offset)
        if index.entries > before:
            kept.append((ts, offset))
    assert all(a[0] < b[0] and a[1] <= b[1] for a, b in itertools.pairwise(kept))
    below = [o for ts, o in kept if ts < target]
    assert index.lookup_before(files, target) == (below[-1] if below else None)
    index.write_pending(files)
    assert index.lookup_before(files, target) == (below[-1] if below else None)
    with open(path, "ab") as f:
        f.write(b"\x01\x02\x03")  # a torn entry is dropped on load
    reloaded = TimeIndex(path, 0)
    reloaded.load(files)
    assert reloaded.entries == len(kept)
    files.close_all()


async def _split_small_batches(tmp_path: Path, count: int) -> StorageEngine:
    """A started engine whose partition k-0 holds ``count`` split one-record batches of
    150 bytes, with timestamps 5000 on (``index.interval.bytes`` 100: an index entry after
    every batch but the first)."""
    engine = new_engine(tmp_path)
    engine.add_partition(uuid.uuid4(), "k", 0, 0, LogConfig(index_interval_bytes=100))
    engine.start(lambda *a: None)
    results = [
        engine.append("k", 0, build_batch([b"x" * 150], [5000 + i]), 1) for i in range(count)
    ]
    await asyncio.gather(*(r.written for r in results))
    await wait_split(engine)
    return engine


def test_index_files_follow_kafkas_layout(tmp_path: Path) -> None:
    async def main() -> None:
        engine = await _split_small_batches(tmp_path, 20)
        await engine.close()

    asyncio.run(main())
    seg = tmp_path / "queues" / "k-0"
    index = (seg / "00000000000000000000.index").read_bytes()
    timeindex = (seg / "00000000000000000000.timeindex").read_bytes()
    assert len(index) % 8 == 0 and len(index) > 8
    assert len(timeindex) % 12 == 0 and len(timeindex) > 12
    rel, pos = int.from_bytes(index[:4], "big"), int.from_bytes(index[4:8], "big")
    log = (seg / "00000000000000000000.log").read_bytes()
    assert int.from_bytes(log[pos : pos + 8], "big") == rel  # one-record batches
    ts = int.from_bytes(timeindex[:8], "big")
    assert 5000 <= ts < 5020


def test_index_entries_gather_in_memory_and_are_written_in_runs(tmp_path: Path) -> None:
    path = str(tmp_path / "00000000000000000000.index")
    files = OpenFiles(4)
    index = OffsetIndex(path, 0)
    for i in range(31):
        index.append(i * 10, i * 100)
    assert not index.write_due
    index.append(310, 3100)
    assert index.write_due  # 32 entries (256 B) gathered: the splitter's next visit writes them
    job = index.take_pending()
    assert job is not None
    for i in range(32, 40):  # entries keep coming while the write runs in a thread
        index.append(i * 10, i * 100)
    job.run(files)
    assert (index.entries, index.written) == (40, 0)  # on disk, not yet published
    assert index.entry(files, 35) == (350, 3500)  # a pending entry, read from memory
    job.done()
    assert (index.entries, index.written) == (40, 32)
    assert os.path.getsize(path) == 32 * 8
    assert index.entry(files, 5) == (50, 500)  # a written entry, read from the file
    assert index.entry(files, 35) == (350, 3500)  # still pending
    job.done()  # a second completion of the same entries changes nothing
    assert (index.entries, index.written) == (40, 32)
    index.truncate_entries(files, 36)  # within the pending run
    assert (index.entries, index.written, index.last_offset) == (36, 32, 350)
    index.truncate_entries(files, 10)  # into the written part: the file is cut
    assert (index.entries, index.written, os.path.getsize(path)) == (10, 10, 80)
    index.append(500, 5000)
    index.write_pending(files)
    reloaded = OffsetIndex(path, 0)
    reloaded.load(files)
    assert [reloaded.entry(files, i) for i in range(11)] == [
        *((i * 10, i * 100) for i in range(10)),
        (500, 5000),
    ]
    files.close_all()


def test_a_failed_index_write_drops_the_pending_entries_and_leaves_no_hole(
    tmp_path: Path,
) -> None:
    files = OpenFiles(4)
    index = TimeIndex(str(tmp_path / "gone" / "00000000000000000000.timeindex"), 0)
    index.maybe_append(1000, 1)
    index.write_pending(files)  # ENOENT: the directory is missing
    assert (index.entries, index.written) == (0, 0)
    assert index.lookup_before(files, 5000) is None
    (tmp_path / "gone").mkdir()
    index.maybe_append(2000, 2)  # later entries still increase
    index.write_pending(files)
    assert (index.entries, index.written) == (1, 1)
    assert index.entry(files, 0) == (2000, 2)
    files.close_all()


def test_a_flush_writes_the_pending_index_entries_before_it_fsyncs(tmp_path: Path) -> None:
    async def main() -> None:
        engine = await _split_small_batches(tmp_path, 10)
        seg = tmp_path / "queues" / "k-0"
        index = seg / "00000000000000000000.index"
        assert not index.exists() or index.stat().st_size == 0  # gathered in memory so far
        await engine.flush()
        # on disk before the checkpoint names the position: a crash from here on recovers
        # with the entries, without re-indexing the flushed part of the log
        assert index.stat().st_size == 9 * 8  # an entry for each batch after the first
        assert (seg / "00000000000000000000.timeindex").stat().st_size == 9 * 12
        await engine.close()

    asyncio.run(main())


@pytest.mark.parametrize("count", [3, SYNCFS_MIN_PATHS + 5])
def test_fsync_paths_takes_files_dirs_and_missing_paths(tmp_path: Path, count: int) -> None:
    """Few paths: an fsync each; many: one syncfs per filesystem. Either way every existing
    file and directory is accepted, a deleted one is skipped, and nothing is changed."""
    paths = []
    for i in range(count):
        f = tmp_path / f"f{i}"
        f.write_bytes(b"%d" % i)
        paths.append(str(f))
    paths += [str(tmp_path), str(tmp_path / "deleted-meanwhile")]
    fsync_paths(paths)
    assert [(tmp_path / f"f{i}").read_bytes() for i in range(count)] == [
        b"%d" % i for i in range(count)
    ]
    if sys.platform == "linux":
        assert fileio.HAS_SYNCFS  # the many-paths case above took syncfs


_FIT_SCRIPT = """
import resource, sys
soft, hard = (int(x) for x in sys.argv[1:3])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
from stonemq.storage.open_files import fit_to_fd_limit
fitted = fit_to_fd_limit(int(sys.argv[3]), explicit=sys.argv[4] == "set")
print(fitted, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


@pytest.mark.parametrize(
    ("soft", "hard", "requested", "how", "fitted", "soft_after"),
    [
        (2048, 4096, 1024, "set", 1024, 2048),  # fits with its reserve: nothing changes
        (1024, 4096, 1024, "set", 1024, 1280),  # soft limit raised toward the hard one
        (1024, 1024, 1024, "set", 768, 1024),  # cannot raise: the cache shrinks, room stays
        (300, 300, 1024, "set", 44, 300),  # a tiny limit still leaves 256 descriptors free
        (1024, 20000, 16384, "default", 15000, 20000),  # the default: raised, then fitted
    ],
)
def test_open_file_cache_fits_under_the_fd_limit(
    soft: int, hard: int, requested: int, how: str, fitted: int, soft_after: int
) -> None:
    """``queue.max.open.files`` near or above ``ulimit -n`` once made accept() fail with
    EMFILE (connections reset, produce timing out): the cache now fits under the limit. A
    value the user set is lowered with a warning; the default is fitted quietly."""
    out = subprocess.run(
        [sys.executable, "-c", _FIT_SCRIPT, str(soft), str(hard), str(requested), how],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == [str(fitted), str(soft_after)]
    warned = "does not fit under the open-file limit" in out.stderr
    assert warned == (fitted < requested and how == "set")


def test_a_segment_never_outgrows_its_index_positions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever ``segment_bytes`` says, a segment rolls before ``MAX_SEGMENT_BYTES`` (2^31 - 1:
    the offset index holds 4-byte positions). Past it the index append raised, the splitter
    stopped for good and recovery failed at every start. Shown with the cap lowered, so the
    test need not write 2 GiB."""
    from conftest import add_topic, produce

    from stonemq.storage import queue_log
    from stonemq.storage.engine import LogConfig

    monkeypatch.setattr(queue_log, "MAX_SEGMENT_BYTES", 4096)

    async def scenario() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine, config=LogConfig(segment_bytes=3_000_000_000, index_interval_bytes=0))
        engine.start(lambda *a: None)
        try:
            await produce(engine, "t", 0, [build_batch([b"x" * 1000]) for _ in range(20)])
            await wait_split(engine)
            sizes = [p.stat().st_size for p in (tmp_path / "queues" / "t-0").glob("*.log")]
            assert len(sizes) >= 4 and max(sizes) <= 4096, sizes
            assert len(read_all(engine, "t", 0)) == sum(sizes)
        finally:
            await engine.close()

    asyncio.run(scenario())
