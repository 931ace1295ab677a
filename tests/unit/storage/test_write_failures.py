"""Failed writes, fsyncs and write-backs: the reproduced defects of the I/O-error issue, each
a named regression test, and the failure rules of ``stonemq/storage/health.py``.

Faults are injected into the real ``os`` calls (see ``OsFaults`` in conftest). The rule
every test checks: each batch acknowledged is in the log exactly once at its acknowledged
offset, no offset is handed out twice, and what was not stored got an error.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import gc
import itertools
import os
import threading
import time
import weakref
from pathlib import Path

import pytest
from conftest import (
    OsFaults,
    abandon,
    add_topic,
    build_batch,
    fd_path,
    new_engine,
    read_all,
    wait_split,
)
from hypothesis import given
from hypothesis import strategies as st

from stonemq.protocol.record_batch import iter_batches, parse_header
from stonemq.storage import fileio
from stonemq.storage.check import check_storage
from stonemq.storage.checkpoint import (
    JOURNAL_RECOVERY_POINT_FILE,
    QUEUE_RECOVERY_POINT_FILE,
    read_positions,
    read_queue_recovery_points,
)
from stonemq.storage.engine import LogConfig, StorageEngine, StorageError
from stonemq.storage.errors import DuplicateSequenceError
from stonemq.storage.health import (
    FATAL,
    TRANSITIONS,
    Event,
    Health,
    JournalHealth,
)
from stonemq.storage.journal import list_segments


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def stored(engine: StorageEngine, partition: int = 0) -> dict[int, bytes]:
    """offset -> the batch's bytes after its 16-byte head (base offset, length, epoch)."""
    data = read_all(engine, "t", partition)
    return {h.base_offset: bytes(data[pos + 16 : pos + h.size]) for pos, h in iter_batches(data)}


def body(batch: bytearray) -> bytes:
    return bytes(batch[16:])


def check_clean(root: Path) -> None:
    report = check_storage(str(root / "journal"), str(root / "queues"))
    assert report.ok, report.defects


# -- the failure rules ------------------------------------------------------------------------
def test_every_state_and_event_has_a_transition() -> None:
    assert {(s, e) for s in Health for e in Event} == set(TRANSITIONS)


def test_fatal_events_take_the_partition_offline_for_good() -> None:
    for start in Health:
        for event in FATAL:
            health = JournalHealth(0)
            health.state = start
            assert health.on(event, "injected") is Health.OFFLINE
            for later in Event:  # nothing brings it back before a restart
                assert health.on(later) is Health.OFFLINE
            with pytest.raises(StorageError):
                health.check_append()


def test_space_errors_heal_when_writes_succeed_again() -> None:
    health = JournalHealth(0)
    assert health.on(Event.JOURNAL_WRITE_FULL, "ENOSPC") is Health.JOURNAL_FULL
    health.check_append()  # appends are still tried: that is how it heals
    assert health.on(Event.JOURNAL_WRITE_OK) is Health.ONLINE
    assert health.on(Event.SPLIT_FULL, "ENOSPC") is Health.SPLIT_FULL
    with pytest.raises(StorageError):
        health.check_append()  # the unsplit journal must not pile up
    assert health.on(Event.JOURNAL_WRITE_OK) is Health.SPLIT_FULL
    assert health.on(Event.SPLIT_OK) is Health.ONLINE


@given(st.lists(st.sampled_from(list(Event)), max_size=30))
def test_on_full_follows_every_move_between_online_and_out_of_space(events: list[Event]) -> None:
    """``on_full`` (a cluster broker's report to its controller) is told True on each move
    from ONLINE to JOURNAL_FULL or SPLIT_FULL and False on each move back; OFFLINE goes to
    ``on_offline`` instead. So what it was told last always says whether the partition is
    out of space, until it goes offline."""
    health = JournalHealth(3)
    told: list[tuple[int, bool]] = []
    offline: list[int] = []
    health.on_full = lambda index: told.append((index, health.state is not Health.ONLINE))
    health.on_offline = offline.append
    for event in events:
        after = health.on(event, "injected")
        if after is Health.OFFLINE:
            assert offline == [3]
            break
        if told:
            assert told[-1] == (3, after is not Health.ONLINE)
        else:
            assert after is Health.ONLINE
    assert all(index == 3 for index, _ in told)
    assert all(a[1] != b[1] for a, b in itertools.pairwise(told))  # alternates


def test_a_refused_append_keeps_nothing_of_its_caller() -> None:
    """Each refusal is a new exception: raising the stored one again chained every caller's
    frames onto its traceback, and with them every refused request (its batches are views of
    the whole request frame) until the journal came back, or for good when offline."""

    class Batch:
        pass

    def append(batch: Batch, health: JournalHealth) -> None:
        health.check_append()

    for event in (Event.SPLIT_FULL, Event.JOURNAL_WRITE_ERROR):
        health = JournalHealth(0)
        health.on(event, "injected")
        refs = []
        for _ in range(3):
            batch = Batch()
            refs.append(weakref.ref(batch))
            with pytest.raises(StorageError, match=event.value):
                append(batch, health)
            del batch
        gc.collect()
        assert [r() for r in refs] == [None, None, None]


# -- reproduced defect 1 ----------------------------------------------------------------------
def test_failed_journal_write_fails_the_entries_queued_behind_it(
    tmp_path: Path, os_faults: OsFaults
) -> None:
    """The issue's reproduction: under ``always``, batch A's write fails while B waits behind
    it; before the fix B was written at offset 1, C then got offset 0 and D offset 1 again,
    and the queue log kept only B. Now B fails with A, and C and D are stored at 0 and 1."""

    async def main() -> None:
        engine = new_engine(tmp_path, flush_policy="always")
        add_topic(engine)
        engine.start(lambda *a: None)
        os_faults.fail("pwritev", "journal-0", errno.ENOSPC)
        a = engine.append("t", 0, build_batch([b"A"]), 1)
        await asyncio.sleep(0)  # A's group is handed to the writer thread
        assert engine._journals[0].has_pending
        b = engine.append("t", 0, build_batch([b"B"]), 1)  # queued behind A's write
        with pytest.raises(StorageError):
            await a.written
        with pytest.raises(StorageError):
            await b.written
        c_batch, d_batch = build_batch([b"C"]), build_batch([b"D"])
        c = engine.append("t", 0, c_batch, 1)
        d = engine.append("t", 0, d_batch, 1)
        await asyncio.gather(c.written, d.written)
        assert (c.base_offset, d.base_offset) == (0, 1)
        await wait_split(engine)
        assert stored(engine) == {0: body(c_batch), 1: body(d_batch)}
        await engine.close()
        check_clean(tmp_path)
        engine = new_engine(tmp_path, flush_policy="always")  # and after a restart
        add_topic(engine)
        engine.recover()
        assert stored(engine) == {0: body(c_batch), 1: body(d_batch)}
        await engine.close()

    run(main())


# -- reproduced defect 2 ----------------------------------------------------------------------
def idempotent(seq: int, value: bytes, pid: int = 7, epoch: int = 0) -> bytearray:
    return build_batch([value], producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def append(engine: StorageEngine, batch: bytearray):  # type: ignore[no-untyped-def]
    header = parse_header(batch)
    return engine.append("t", 0, batch, header.record_count, producer=header)


def test_failed_pipelined_batches_of_one_producer_are_all_forgotten(
    tmp_path: Path, os_faults: OsFaults
) -> None:
    """Two pipelined batches of one idempotent producer fail in the same write. Before the
    fix only the newer was forgotten, and the producer's retry of the first sequence was
    answered as a duplicate pointing at an offset that held nothing."""

    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.start(lambda *a: None)
        os_faults.fail("pwritev", "journal-0", errno.ENOSPC)
        first, second = append(engine, idempotent(0, b"s0")), append(engine, idempotent(1, b"s1"))
        for result in (first, second):
            with pytest.raises(StorageError):
                await result.written
        retry0, retry1 = idempotent(0, b"s0"), idempotent(1, b"s1")
        again = [append(engine, retry0), append(engine, retry1)]  # not duplicates
        await asyncio.gather(*(r.written for r in again))
        assert [r.base_offset for r in again] == [0, 1]
        await wait_split(engine)
        assert stored(engine) == {0: body(retry0), 1: body(retry1)}
        await engine.close()

    run(main())


def test_a_duplicate_of_a_pending_batch_waits_for_its_write(
    tmp_path: Path, os_faults: OsFaults
) -> None:
    """A retry that arrives while the original is still being written is a duplicate whose
    answer is the original's outcome: success once stored, the error when it failed."""

    async def main() -> None:
        engine = new_engine(tmp_path, flush_policy="always")
        add_topic(engine)
        engine.start(lambda *a: None)
        os_faults.fail("pwritev", "journal-0", errno.ENOSPC)
        original = append(engine, idempotent(0, b"x"))
        with pytest.raises(DuplicateSequenceError) as dup:
            append(engine, idempotent(0, b"x"))
        assert dup.value.base_offset == original.base_offset
        assert dup.value.written is original.written
        with pytest.raises(StorageError):
            await dup.value.written  # the original failed: so does the duplicate's answer
        stored_batch = idempotent(0, b"x")
        ok = append(engine, stored_batch)
        await ok.written
        with pytest.raises(DuplicateSequenceError) as dup:
            append(engine, idempotent(0, b"x"))
        assert dup.value.base_offset == ok.base_offset == 0
        await dup.value.written  # stored: the duplicate is answered with success
        await engine.close()

    run(main())


# -- reproduced defect 3 ----------------------------------------------------------------------
def test_an_fsync_error_on_a_rolled_journal_segment_takes_it_offline(
    tmp_path: Path, os_faults: OsFaults
) -> None:
    """Under ``interval`` a full journal segment is fsynced after its roll; that fsync's
    error was only logged, and the partition went on as if the bytes were durable."""

    async def main() -> None:
        engine = new_engine(
            tmp_path, flush_policy="interval", flush_interval_ms=60_000, journal_segment_bytes=4096
        )
        add_topic(engine)
        engine.start(lambda *a: None)
        os_faults.fail("fsync", "journal-0/00000000000000000000.journal", errno.EIO)
        acked = []
        for i in range(12):  # rolls the journal segment once or twice
            batch = build_batch([b"%d" % i * 300])
            try:  # the failed fsync may take the partition offline before the last ones
                result = engine.append("t", 0, batch, 1)
                await result.written
            except StorageError:
                break
            acked.append((result.base_offset, body(batch)))
        assert len(acked) >= 4  # past the first roll (4 KiB segments, about 1 KiB a batch)
        deadline = asyncio.get_running_loop().time() + 5
        while engine.journal_health()[0] != "offline":
            assert asyncio.get_running_loop().time() < deadline, "fsync error ignored"
            await asyncio.sleep(0.01)
        assert os_faults.seen
        journal = engine._journals[0]
        assert journal.durable_end == 0  # nothing after the failed fsync counts as durable
        with pytest.raises(StorageError):
            engine.append("t", 0, build_batch([b"refused"]), 1)
        await engine.flush()  # an offline partition's checkpoints do not move
        points = read_positions(str(tmp_path / "journal" / JOURNAL_RECOVERY_POINT_FILE))
        assert points.get(0, 0) == 0
        assert list_segments(journal.directory)[0] == 0  # no journal segment deleted
        abandon(engine)
        engine = new_engine(tmp_path)  # a restart replays the journal: nothing acked lost
        add_topic(engine)
        engine.recover()
        assert stored(engine) == dict(acked)
        await engine.close()

    run(main())


def test_an_fsync_overlapping_a_failed_one_marks_nothing_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two fsyncs of one journal in flight together (the interval flush and a checkpoint
    round, say): the first fails, the second succeeds after it. The second's success proves
    nothing (the pages whose writeback failed may be gone), so the journal is not marked
    durable. Before, it was: the test above failed that way when a loaded machine let its
    interval fsync and a checkpoint round overlap."""
    second_started, first_failed = threading.Event(), threading.Event()
    calls: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        if "journal-0" not in fd_path(fd):
            return real(fd)
        calls.append(fd_path(fd))
        if len(calls) == 1:  # the first: fails once the second is under way
            assert second_started.wait(10)
            first_failed.set()
            raise OSError(errno.EIO, "injected fsync: EIO")
        second_started.set()
        assert first_failed.wait(10)
        time.sleep(0.2)  # its success reaches the loop after the first's failure
        return real(fd)

    async def main() -> None:
        engine = new_engine(tmp_path, flush_policy="never")  # no interval fsync of its own
        add_topic(engine)
        engine.start(lambda *a: None)
        await engine.append("t", 0, build_batch([b"x" * 300]), 1).written
        journal = engine._journals[0]
        assert journal.durable_end == 0
        monkeypatch.setattr(os, "fsync", fsync)
        end = journal.written_end
        both = await asyncio.gather(
            engine._fsync_journal(journal, end), engine._fsync_journal(journal, end)
        )
        assert len(calls) == 2
        assert both == [False, False]
        assert engine.journal_health()[0] == "offline"
        assert journal.durable_end == 0
        await engine.close()

    run(main())


def test_a_flush_does_not_trust_a_journal_partition_that_failed(
    tmp_path: Path, os_faults: OsFaults
) -> None:
    """After the interval fsync failed, a checkpoint round fsynced the journal again (which
    may succeed after the kernel dropped the failed pages), marked it durable and let its
    segments be deleted."""

    async def main() -> None:
        engine = new_engine(
            tmp_path, flush_policy="interval", flush_interval_ms=20, journal_segment_bytes=4096
        )
        add_topic(engine)
        engine.start(lambda *a: None)
        os_faults.fail("fsync", "journal-0/", errno.EIO)
        batches = [build_batch([b"%d" % i * 300]) for i in range(12)]
        results = [engine.append("t", 0, b, 1) for b in batches]
        await asyncio.gather(*(r.written for r in results))
        deadline = asyncio.get_running_loop().time() + 5
        while engine.journal_health()[0] != "offline":
            assert asyncio.get_running_loop().time() < deadline, "fsync error ignored"
            await asyncio.sleep(0.01)
        journal = engine._journals[0]
        before = journal.durable_end
        segments = list_segments(journal.directory)
        await wait_split(engine)
        await engine.flush()
        assert journal.durable_end == before
        assert list_segments(journal.directory) == segments
        assert (
            read_queue_recovery_points(str(tmp_path / "queues" / QUEUE_RECOVERY_POINT_FILE)).get(
                ("t", 0)
            )
            is None
            or before > 0
        )
        abandon(engine)
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.recover()
        assert stored(engine) == {
            r.base_offset: body(b) for r, b in zip(results, batches, strict=True)
        }
        await engine.close()
        check_clean(tmp_path)

    run(main())


def test_a_write_back_error_is_not_swallowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page-cache window waits for queue-log write-back with ``sync_file_range``, which
    reports a write-back error once, to that call. It was ignored, a later fsync through
    another descriptor succeeded, and the checkpoint let journal segments go although the
    queue log's bytes were lost. Now the queue log fails, its journal partition goes
    offline, its recovery point stays and no journal segment is deleted."""
    real = fileio._sync_file_range
    assert real is not None
    failed_paths: list[str] = []

    def failing(fd: int, offset: int, length: int, flags: int) -> int:
        if flags & fileio.SYNC_FILE_RANGE_WAIT_AFTER and "/t-0/" in fd_path(fd):
            failed_paths.append(fd_path(fd))
            real(fd, offset, length, flags)
            ctypes.set_errno(errno.EIO)
            return -1
        return real(fd, offset, length, flags)

    monkeypatch.setattr(fileio, "_sync_file_range", failing)

    async def main() -> None:
        config = LogConfig(segment_bytes=64 * 1024, index_interval_bytes=512)
        engine = new_engine(
            tmp_path, queue_cache_retain_bytes=32 * 1024, journal_segment_bytes=16 * 1024
        )
        add_topic(engine, config=config)
        engine.start(lambda *a: None)
        acked: dict[int, bytes] = {}
        for i in range(120):  # until the write-back error takes the partition offline
            batch = build_batch([bytes([i % 250]) * 2000])
            try:
                result = engine.append("t", 0, batch, 1)
            except StorageError:
                break
            await result.written
            acked[result.base_offset] = body(batch)
            await wait_split(engine)
        assert failed_paths, "the window never waited for a write-back"
        assert engine.journal_health()[0] == "offline"
        with pytest.raises(StorageError):
            engine.read("t", 0, 0, 1000)  # its bytes are no longer known good
        segments = list_segments(engine._journals[0].directory)
        await engine.flush()
        point = read_queue_recovery_points(str(tmp_path / "queues" / QUEUE_RECOVERY_POINT_FILE))
        assert ("t", 0) not in point  # never checkpointed past the lost bytes
        assert list_segments(engine._journals[0].directory) == segments
        assert segments[0] == 0  # the journal still holds every acknowledged batch
        abandon(engine)
        monkeypatch.setattr(fileio, "_sync_file_range", real)
        engine = new_engine(tmp_path)  # recovery re-splits it all from the journal
        add_topic(engine, config=config)
        engine.recover()
        assert stored(engine) == acked
        await engine.close()
        check_clean(tmp_path)

    run(main())


def test_enospc_in_the_journal_heals_when_space_returns(
    tmp_path: Path, os_faults: OsFaults
) -> None:
    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.start(lambda *a: None)
        os_faults.fail("pwritev", "journal-0", errno.ENOSPC, times=3)
        acked: dict[int, bytes] = {}
        failures = 0
        for i in range(10):
            batch = build_batch([b"v%d" % i])
            result = engine.append("t", 0, batch, 1)
            try:
                await result.written
            except StorageError:
                failures += 1
                continue
            assert result.base_offset not in acked, "an offset was handed out twice"
            acked[result.base_offset] = body(batch)
        assert failures == 3
        assert engine.journal_health()[0] == "online"
        assert sorted(acked) == list(range(7))
        await wait_split(engine)
        assert stored(engine) == acked
        await engine.close()
        check_clean(tmp_path)

    run(main())


def test_a_failed_journal_read_takes_only_that_journal_partition_offline(
    tmp_path: Path, os_faults: OsFaults
) -> None:
    """A journal read of the splitter that fails (EIO) used to end the splitter's task: no
    journal partition was split any more, silently. Now that journal partition goes
    offline (fail-stop), the others go on, and a restart replays what it could not read."""

    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine, partitions=2)  # partition p on journal partition p
        engine.start(lambda *a: None)
        os_faults.fail("pread", "journal-0/", errno.EIO, times=-1)
        os_faults.fail("preadv", "journal-0/", errno.EIO, times=-1)  # the splitter's reads
        acked: dict[int, dict[int, bytes]] = {0: {}, 1: {}}
        for i in range(6):
            for p in (0, 1):
                batch = build_batch([b"%d-%d" % (p, i) * 50])
                try:
                    result = engine.append("t", p, batch, 1)
                    await result.written
                except StorageError:
                    continue  # journal-0 went offline meanwhile: not acknowledged
                acked[p][result.base_offset] = body(batch)
        deadline = asyncio.get_running_loop().time() + 5
        while engine.journal_health()[0] != "offline":
            assert asyncio.get_running_loop().time() < deadline, "journal read error ignored"
            await asyncio.sleep(0.01)
        assert engine.journal_health()[1] == "online"
        await wait_split(engine)  # journal-1 is still split
        assert stored(engine, 1) == acked[1]
        batch = build_batch([b"after"])
        result = engine.append("t", 1, batch, 1)
        await result.written
        acked[1][result.base_offset] = body(batch)
        await wait_split(engine)
        assert stored(engine, 1) == acked[1]
        await engine.close()
        os_faults.rules.clear()
        engine = new_engine(tmp_path)
        add_topic(engine, partitions=2)
        engine.recover()
        assert stored(engine, 0) == acked[0]
        assert stored(engine, 1) == acked[1]
        await engine.close()

    run(main())


def test_a_split_step_that_fails_unexpectedly_takes_the_journal_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A split step that raised anything but an I/O error (a defect: an index append past its
    4-byte positions, seen in an independent config check) ended the splitter's task unseen:
    nothing logged, acknowledged records never served, every later produce waiting for good.
    Now the journal partition goes offline (fail-stop, with the traceback logged), so
    appends are refused at once and a restart replays it."""
    from stonemq.storage import queue_log

    real_stage = queue_log.QueueLog.stage
    calls = {"n": 0}

    def stage(self, write, batch, journal_position):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected defect")
        return real_stage(self, write, batch, journal_position)

    async def scenario() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.start(lambda *a: None)
        try:
            monkeypatch.setattr(queue_log.QueueLog, "stage", stage)
            appends = [engine.append("t", 0, build_batch([b"v%d" % i]), 1) for i in range(5)]
            await asyncio.gather(*(a.written for a in appends))  # acknowledged, then split
            deadline = time.monotonic() + 5
            while "offline" not in engine.journal_health()[0]:
                assert time.monotonic() < deadline, engine.journal_health()
                await asyncio.sleep(0.01)
            with pytest.raises(StorageError):
                await engine.append("t", 0, build_batch([b"late"]), 1).written
            monkeypatch.setattr(queue_log.QueueLog, "stage", real_stage)
        finally:
            await engine.close()
        again = new_engine(tmp_path)
        add_topic(again)
        again.start(lambda *a: None)
        try:
            await wait_split(again)
            assert again.high_watermark("t", 0) == 5  # replayed from the journal
        finally:
            await again.close()

    run(scenario())
