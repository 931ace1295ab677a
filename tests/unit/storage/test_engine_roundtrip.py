"""Append, split and read through the StorageEngine: offsets, rolls, reads, timestamps."""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    PAGE,
    SMALL_LOG,
    add_topic,
    build_batch,
    cached_pages,
    new_engine,
    produce,
    read_all,
    wait_split,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stonemq.protocol.record_batch import crc_ok, iter_batches, iter_records, parse_header
from stonemq.server.metrics import METRICS
from stonemq.storage import journal as journal_module
from stonemq.storage.engine import (
    STRAYS_LOGGED,
    LogConfig,
    OffsetOutOfRangeError,
    StorageError,
    UnknownPartitionError,
)
from stonemq.storage.queue_log import read_partition_metadata
from stonemq.storage.splitter import DEEP_CATCH_UP_STEPS


def run(coro: Coroutine[Any, Any, None]) -> None:
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_offsets_are_contiguous_and_batches_come_back_intact(tmp_path: Path) -> None:
    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine, "t", 2)
        engine.recover()
        seen: dict[tuple[str, int], int] = {}
        engine.start(lambda t, p, hw: seen.__setitem__((t, p), hw))
        batches = [build_batch([b"x" * (i * 37 % 700)] * (1 + i % 4)) for i in range(200)]
        bases = await produce(engine, "t", 1, [bytearray(b) for b in batches])
        await wait_split(engine)
        counts = [parse_header(b).record_count for b in batches]
        assert bases == [sum(counts[:i]) for i in range(len(counts))]
        assert engine.log_end_offset("t", 1) == sum(counts)
        assert engine.high_watermark("t", 1) == sum(counts) == seen[("t", 1)]
        assert engine.high_watermark("t", 0) == 0
        data = read_all(engine, "t", 1)
        got = list(iter_batches(data))
        assert [h.base_offset for _, h in got] == bases
        for (pos, header), original in zip(got, batches, strict=True):
            assert crc_ok(data, pos, header)
            assert data[pos + 8 : pos + header.size] == original[8:]
        queue_dir = tmp_path / "queues" / "t-1"
        logs = sorted(p.name for p in queue_dir.iterdir() if p.suffix == ".log")
        assert len(logs) > 3  # rolled at segment_bytes
        assert all(len(name) == 24 for name in logs)
        journal = tmp_path / "journal" / "journal-1"
        assert len(list(journal.iterdir())) > 1  # journal rolled too
        await engine.close()

    run(main())


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 3000)), min_size=1, max_size=40),
    offset_seed=st.integers(0, 10**6),
    max_bytes=st.integers(1, 9000),
)
def test_read_from_any_offset_returns_the_batch_holding_it(
    tmp_path_factory: pytest.TempPathFactory,
    sizes: list[tuple[int, int]],
    offset_seed: int,
    max_bytes: int,
) -> None:
    root = tmp_path_factory.mktemp("e")

    async def main() -> None:
        engine = new_engine(root, journal_segment_bytes=8192)
        add_topic(engine)
        engine.start(lambda *a: None)
        batches = [build_batch([b"v" * size] * count) for count, size in sizes]
        bases = await produce(engine, "t", 0, batches)
        await wait_split(engine)
        hw = engine.high_watermark("t", 0)
        offset = offset_seed % hw
        result = engine.read("t", 0, offset, max_bytes)
        got = list(iter_batches(result.data))
        assert got, "at least one whole batch"
        pos_sum = sum(h.size for _, h in got)
        assert pos_sum == len(result.data)  # whole batches only
        first = got[0][1]
        assert first.base_offset <= offset <= first.last_offset
        assert len(got) == 1 or len(result.data) <= max_bytes
        assert first.base_offset in bases
        assert result.high_watermark == hw
        await engine.close()

    run(main())


def test_read_edges(tmp_path: Path) -> None:
    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.start(lambda *a: None)
        assert engine.read("t", 0, 0, 100).data == b""
        with pytest.raises(OffsetOutOfRangeError):
            engine.read("t", 0, 1, 100)
        big = build_batch([b"z" * 5000])
        await produce(engine, "t", 0, [big, build_batch([b"a"] * 3)])
        await wait_split(engine)
        one = engine.read("t", 0, 0, 10).data  # bigger than max_bytes: still one batch
        assert parse_header(one).size == len(one) == len(big)
        assert engine.read("t", 0, 4, 100).data == b""  # offset == high watermark
        with pytest.raises(OffsetOutOfRangeError):
            engine.read("t", 0, 5, 100)
        with pytest.raises(UnknownPartitionError):
            engine.read("nope", 0, 0, 100)
        with pytest.raises(UnknownPartitionError):
            engine.append("nope", 0, build_batch([b"a"]), 1)
        await engine.close()

    run(main())


@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 5000), min_size=1, max_size=6), min_size=1, max_size=30),
    st.integers(-10, 5100),
    st.sampled_from(["none", "gzip"]),
)
def test_offset_for_timestamp_and_max_timestamp(
    tmp_path_factory: pytest.TempPathFactory,
    timestamps: list[list[int]],
    target: int,
    compression: str,
) -> None:
    root = tmp_path_factory.mktemp("ts")
    config = LogConfig(segment_bytes=400, index_interval_bytes=100)

    async def main() -> None:
        engine = new_engine(root)
        add_topic(engine, config=config)
        engine.start(lambda *a: None)
        batches = [build_batch([b"r"] * len(ts), ts, compression=compression) for ts in timestamps]
        await produce(engine, "t", 0, batches)
        await wait_split(engine)
        flat = [t for ts in timestamps for t in ts]
        expected = next(((o, t) for o, t in enumerate(flat) if t >= target), None)
        assert await engine.offset_for_timestamp("t", 0, target) == expected
        top = max(flat)
        assert await engine.max_timestamp("t", 0) == (flat.index(top), top)
        await engine.close()
        # the same answers from indexes loaded from disk
        engine = new_engine(root)
        add_topic(engine, config=config)
        engine.recover()
        assert await engine.offset_for_timestamp("t", 0, target) == expected
        assert await engine.max_timestamp("t", 0) == (flat.index(top), top)
        await engine.close()

    run(main())


def test_empty_partition_timestamps(tmp_path: Path) -> None:
    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.recover()
        assert await engine.offset_for_timestamp("t", 0, 0) is None
        assert await engine.max_timestamp("t", 0) is None
        await engine.close()

    run(main())


@pytest.mark.parametrize("policy", ["always", "interval", "never"])
def test_group_commit_resolves_after_the_write(tmp_path: Path, policy: str) -> None:
    async def main() -> None:
        engine = new_engine(tmp_path, flush_policy=policy, flush_interval_ms=10)
        add_topic(engine, partitions=2)
        engine.start(lambda *a: None)
        results = [engine.append("t", i % 2, build_batch([b"x" * 10]), 1) for i in range(50)]
        journal = engine._journals[0]
        assert journal.written_end == 0  # queued, not written yet
        assert not any(r.written.done() for r in results)
        await asyncio.gather(*(r.written for r in results))
        assert journal.written_end > 0
        if policy == "always":
            assert journal.durable_end == journal.written_end
        # a small group is written on the loop unless an fsync follows it
        assert (journal._writer is not None) == (policy == "always")
        await wait_split(engine)
        assert engine.high_watermark("t", 0) == 25
        await engine.close()

    run(main())


def test_a_group_larger_than_the_inline_bound_goes_to_the_writer_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_module, "INLINE_WRITE_BYTES", 1000)

    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.start(lambda *a: None)
        journal = engine._journals[0]
        await produce(engine, "t", 0, [build_batch([b"s" * 100])])
        assert journal._writer is None
        pending = [engine.append("t", 0, build_batch([b"l" * 600]), 1) for _ in range(2)]
        await asyncio.sleep(0)  # the flush runs: 2 x 600+ bytes, handed to the thread
        assert journal._io_in_flight is not None and journal._writer is not None
        await asyncio.gather(*(r.written for r in pending))
        await wait_split(engine)
        data = engine.read("t", 0, 0, 10_000).data
        assert [h.base_offset for _, h in iter_batches(data)] == [0, 1, 2]
        await engine.close()

    run(main())


@pytest.mark.parametrize("inline_bytes", [1 << 20, 0], ids=["on-the-loop", "writer-thread"])
def test_a_writer_bug_fails_the_group_instead_of_hanging_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inline_bytes: int
) -> None:
    monkeypatch.setattr(journal_module, "INLINE_WRITE_BYTES", inline_bytes)

    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.start(lambda *a: None)
        await produce(engine, "t", 0, [build_batch([b"a"])])
        real = journal_module._write_entries

        def broken(*args: Any) -> Any:
            raise RuntimeError("writer bug")

        monkeypatch.setattr(journal_module, "_write_entries", broken)
        failing = engine.append("t", 0, build_batch([b"b"]), 1)
        with pytest.raises(StorageError):
            await asyncio.wait_for(failing.written, 5)
        monkeypatch.setattr(journal_module, "_write_entries", real)
        # nothing is known of what the writer left in the file: fail-stop (health.py)
        assert engine.journal_health()[0] == "offline"
        with pytest.raises(StorageError):
            engine.append("t", 0, build_batch([b"c"]), 1)
        await engine.close()
        engine = new_engine(tmp_path)  # a restart brings the partition back
        add_topic(engine)
        engine.start(lambda *a: None)
        (base,) = await produce(engine, "t", 0, [build_batch([b"c"])])
        assert base == 1  # the failed entry never became an offset: no gap
        await engine.close()

    run(main())


@pytest.mark.slow  # several seconds: the whole suite runs it, the fast set not
@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise")
def test_journal_pages_are_released_once_split_and_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_module, "PAGE_RELEASE_MIN_BYTES", 64 * 1024)

    async def main() -> None:
        engine = new_engine(
            tmp_path, flush_policy="interval", flush_interval_ms=20, journal_segment_bytes=1 << 23
        )
        add_topic(engine)
        engine.start(lambda *a: None)
        journal = engine._journals[0]
        batches = [build_batch([os.urandom(1000)] * 50) for _ in range(20)]  # ~1 MB
        await produce(engine, "t", 0, batches)
        await wait_split(engine)
        split = engine._splitter.positions[0]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while journal.released_end < split and loop.time() < deadline:
            await asyncio.sleep(0.02)  # the next fsync round makes it durable, then releases
        # up to the page boundary below: the partly written last page stays for the next
        # write, which would otherwise read it back from disk first (what that costs is
        # tested on queue logs in test_page_cache.py)
        assert split == journal.written_end and split % PAGE
        assert journal.released_end == split - split % PAGE
        path = Path(journal.path(0))
        deadline = loop.time() + 5
        while any(cached_pages(path)[: split // PAGE]):  # its whole pages below split
            assert loop.time() < deadline, "split and durable pages not dropped"
            await asyncio.sleep(0.02)  # the release runs in an executor thread
        # the queue log keeps its pages (consumers read it), and every byte reads back
        assert read_all(engine, "t", 0) == b"".join(batches)  # patched in place when queued
        await engine.close()

    run(main())


def test_write_failure_fails_futures_and_leaves_no_gap(tmp_path: Path) -> None:
    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.start(lambda *a: None)
        await produce(engine, "t", 0, [build_batch([b"a"] * 2)])
        journal = engine._journals[0]
        # a file size limit makes the next write short and then fail (EFBIG), like ENOSPC
        old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (journal.active_size + 100, hard))
        try:
            failing = [engine.append("t", 0, build_batch([b"b" * 50] * 3), 3) for _ in range(3)]
            assert engine.log_end_offset("t", 0) == 11
            for r in failing:
                with pytest.raises(StorageError):
                    await r.written
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            signal.signal(signal.SIGXFSZ, old_handler)
        assert engine.log_end_offset("t", 0) == 2  # rolled back to the first failed offset
        assert os.path.getsize(journal.path(0)) == journal.written_end  # short write undone
        (base,) = await produce(engine, "t", 0, [build_batch([b"c"])])
        assert base == 2
        await wait_split(engine)
        data = engine.read("t", 0, 0, 10_000).data
        assert [h.base_offset for _, h in iter_batches(data)] == [0, 2]
        await engine.close()

    run(main())


def test_remove_topic_drops_pending_entries_and_directories(tmp_path: Path) -> None:
    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine, "gone", 2)
        add_topic(engine, "kept", 1, topic_id=uuid.uuid4())
        engine.start(lambda *a: None)
        await produce(engine, "gone", 0, [build_batch([b"a"])])
        await wait_split(engine)
        assert (tmp_path / "queues" / "gone-0").is_dir()
        r = engine.append("gone", 1, build_batch([b"b"]), 1)
        await r.written
        await engine.remove_topic("gone")
        await produce(engine, "kept", 0, [build_batch([b"k"])])
        await wait_split(engine)
        assert not (tmp_path / "queues" / "gone-0").exists()
        assert not (tmp_path / "queues" / "gone-1").exists()
        with pytest.raises(UnknownPartitionError):
            engine.high_watermark("gone", 0)
        assert engine.high_watermark("kept", 0) == 1
        # recreated under the same name: a new topic id, fresh offsets
        engine.add_partition(uuid.uuid4(), "gone", 0, 0, SMALL_LOG)
        (base,) = await produce(engine, "gone", 0, [build_batch([b"new"])])
        assert base == 0
        await wait_split(engine)
        assert engine.high_watermark("gone", 0) == 1
        await engine.close()

    run(main())


def test_records_survive_compression(tmp_path: Path) -> None:
    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.start(lambda *a: None)
        values = [b"value-%d" % i for i in range(20)]
        await produce(engine, "t", 0, [build_batch(values[:10], compression="zstd")])
        await produce(engine, "t", 0, [build_batch(values[10:], compression="lz4")])
        await wait_split(engine)
        data = engine.read("t", 0, 0, 100_000).data
        records = [
            r for pos, h in iter_batches(data) for r in iter_records(data[pos : pos + h.size])
        ]
        assert [r.value for r in records] == values
        assert [r.offset for r in records] == list(range(20))
        await engine.close()

    run(main())


def test_new_partitions_are_created_ahead_of_their_first_batch(tmp_path: Path) -> None:
    """Partitions added after start get their directory and empty first segment from the
    creator thread; one deleted before it gets there leaves nothing; a restart loads the
    empty segment as an empty log, and the first batch lands in it at offset 0."""

    async def main() -> None:
        engine = new_engine(tmp_path)
        engine.start(lambda *a: None)
        add_topic(engine, "early", 3)
        add_topic(engine, "dropped", 2, topic_id=uuid.uuid4())
        await engine.remove_topic("dropped")
        assert await engine.wait_precreated(10)
        for p in range(3):
            log_file = tmp_path / "queues" / f"early-{p}" / f"{0:020d}.log"
            assert log_file.is_file() and log_file.stat().st_size == 0
        assert not (tmp_path / "queues" / "dropped-0").exists()
        assert not (tmp_path / "queues" / "dropped-1").exists()
        await engine.close()

        engine = new_engine(tmp_path)
        add_topic(engine, "early", 3)
        engine.start(lambda *a: None)
        assert engine.high_watermark("early", 1) == 0
        (base,) = await produce(engine, "early", 1, [build_batch([b"x", b"y"])])
        assert base == 0
        await wait_split(engine)
        assert engine.high_watermark("early", 1) == 2
        data = read_all(engine, "early", 1)
        assert [r.value for r in iter_records(data)] == [b"x", b"y"]
        await engine.close()

    run(main())


def test_split_lag_counts_written_unsplit_bytes_and_watchers_see_every_step(
    tmp_path: Path,
) -> None:
    """``split_lag_bytes`` is what the journals hold beyond the split positions; the split
    watchers (the request budget's re-check) run after each splitter step, down to zero lag."""

    async def main() -> None:
        engine = new_engine(tmp_path, splitter_batch_bytes=4096)
        add_topic(engine, "t", 1)
        engine.recover()
        lags: list[int] = []
        engine.split_watchers.append(lambda: lags.append(engine.split_lag_bytes()))
        assert engine.split_lag_bytes() == 0
        engine.start(lambda *a: None)
        results = [engine.append("t", 0, build_batch([b"x" * 900] * 4), 4) for _ in range(40)]
        await asyncio.gather(*(r.written for r in results))
        written = sum(engine.journal_ends())
        lag = engine.split_lag_bytes()
        assert 0 < lag <= written
        seen = len(lags)  # from here on nothing is written: the lag only shrinks
        steps = METRICS.splitter_steps
        await wait_split(engine)
        assert engine.split_lag_bytes() == 0
        after = lags[seen:]
        assert len(after) == METRICS.splitter_steps - steps  # once after every step
        # steps of 4 KiB, or up to DEEP_CATCH_UP_STEPS times that while the splitter is behind
        assert len(after) >= lag // (4096 * DEEP_CATCH_UP_STEPS) - 1
        assert after[-1] == 0 and after == sorted(after, reverse=True)
        await engine.close()

    run(main())


def test_a_deletion_is_not_held_behind_a_creation_backlog(tmp_path: Path) -> None:
    """The directory thread creates new partitions' directories a chunk at a time: a topic
    deletion (or a producer snapshot, a retention unlink) asked while 20,000 directories
    wait to be made is done long before they all are, and a stop drops the backlog."""

    async def main() -> None:
        engine = new_engine(tmp_path)
        engine.start(lambda *a: None)
        add_topic(engine, "small", 1)
        assert await engine.wait_precreated(10)
        add_topic(engine, "big", 20_000, topic_id=uuid.uuid4())
        await engine.remove_topic("small")
        assert not (tmp_path / "queues" / "small-0").exists()
        assert len(engine._create_pending) > 10_000  # most of the backlog still to make
        await engine.close()
        made = sum(1 for p in (tmp_path / "queues").iterdir() if p.name.startswith("big-"))
        assert made < 20_000  # the stop did not wait for the rest

    run(main())


def test_a_queue_log_of_a_name_taken_by_a_new_topic_is_set_aside(tmp_path: Path) -> None:
    """A broker down while a topic was deleted and created again under the same name finds,
    at its next start, the name registered with the new topic's id and a directory of that
    name holding the old topic's batches. It opened them as the new topic's: its queue log
    served the deleted topic's records and numbered the new ones after them, apart from the
    other replicas (found by an independent cluster check). Each directory now names its
    topic id (``partition.metadata``, as in Kafka); recovery sets aside one that names
    another, and the new topic starts empty. A directory without the file (made before it
    existed) is kept as it is."""

    async def main() -> None:
        old_id, new_id = uuid.uuid4(), uuid.uuid4()
        engine = new_engine(tmp_path)
        add_topic(engine, "x", 2, topic_id=old_id)
        engine.start(lambda *a: None)
        for p in (0, 1):
            await produce(engine, "x", p, [build_batch([b"old"] * 3)])
        await wait_split(engine)
        await engine.close()
        meta = (tmp_path / "queues" / "x-0" / "partition.metadata").read_text()
        assert meta.splitlines()[0] == "version: 0" and meta.splitlines()[1].startswith("topic_id:")
        (tmp_path / "queues" / "x-1" / "partition.metadata").unlink()  # as an older broker made it

        engine = new_engine(tmp_path)
        add_topic(engine, "x", 2, topic_id=new_id)  # the name's topic now
        engine.recover()
        engine.start(lambda *a: None)
        stray = [p.name for p in (tmp_path / "queues").iterdir() if p.name.endswith(".stray")]
        assert len(stray) == 1 and stray[0].startswith("x-0-")
        assert engine.high_watermark("x", 0) == 0
        assert engine.high_watermark("x", 1) == 3  # no file: kept
        (base,) = await produce(engine, "x", 0, [build_batch([b"new"])])
        assert base == 0
        await wait_split(engine)
        assert [r.value for r in iter_records(read_all(engine, "x", 0))] == [b"new"]
        await engine.close()

        engine = new_engine(tmp_path)  # and the new directory names the new topic
        add_topic(engine, "x", 2, topic_id=new_id)
        engine.recover()
        assert engine.high_watermark("x", 0) == 1
        assert len([p for p in (tmp_path / "queues").iterdir() if p.name.endswith(".stray")]) == 1
        await engine.close()

    run(main())


def test_a_queue_log_left_by_a_cut_short_deletion_is_set_aside(tmp_path: Path) -> None:
    """A crash between a topic's deletion and the removal of its directories leaves them
    behind; recovery sets them aside (``<name>-<ms>.stray``, as Kafka does with stray logs),
    so a topic created later under the same name starts empty instead of finding them."""

    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine, "gone", 1)
        engine.start(lambda *a: None)
        await produce(engine, "gone", 0, [build_batch([b"old"] * 3)])
        await wait_split(engine)
        await engine.close()

        engine = new_engine(tmp_path)  # "gone" was deleted from the metadata: not registered
        engine.recover()
        engine.start(lambda *a: None)
        stray = [p.name for p in (tmp_path / "queues").iterdir() if p.name.endswith(".stray")]
        assert len(stray) == 1 and stray[0].startswith("gone-0-")
        again = uuid.uuid4()
        add_topic(engine, "gone", 1, topic_id=again)  # created again
        assert await engine.wait_precreated(10)  # made ahead of its first batch, id and all
        assert read_partition_metadata(str(tmp_path / "queues" / "gone-0")) == again.bytes
        assert engine.high_watermark("gone", 0) == 0
        (base,) = await produce(engine, "gone", 0, [build_batch([b"new"])])
        assert base == 0
        await wait_split(engine)
        assert [r.value for r in iter_records(read_all(engine, "gone", 0))] == [b"new"]
        await engine.close()

    run(main())


def test_the_queue_logs_of_a_cut_short_deletion_are_logged_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A deletion of a 100,000-partition topic cut short left 87,000 queue logs, and the next
    start logged a line for each (its start took over 20 s): they are set aside each, and
    logged in one line naming the first ``STRAYS_LOGGED`` and how many more."""
    partitions = STRAYS_LOGGED + 30

    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine, "gone", partitions)
        engine.start(lambda *a: None)
        for p in range(partitions):
            await produce(engine, "gone", p, [build_batch([b"old"])])
        await wait_split(engine)
        await engine.close()

        engine = new_engine(tmp_path)  # "gone" was deleted from the metadata: not registered
        with caplog.at_level(logging.WARNING, logger="stonemq"):
            engine.recover()
        stray = [p.name for p in (tmp_path / "queues").iterdir() if p.name.endswith(".stray")]
        assert sorted(n.rsplit("-", 1)[0] for n in stray) == sorted(
            f"gone-{p}" for p in range(partitions)
        )
        lines = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"{partitions} queue log(s) in "), lines[0]
        assert lines[0].endswith(" and 30 more"), lines[0]
        await engine.close()

    run(main())
