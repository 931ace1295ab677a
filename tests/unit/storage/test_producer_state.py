"""Idempotent producer state: Kafka's sequence rules, the pending layer that follows journal
writes, snapshots (a round trip for any state, refusal of damaged files), and the state an
engine rebuilds after a clean stop and after a crash."""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from pathlib import Path

import pytest
from conftest import abandon, add_topic, build_batch, new_engine, wait_split
from hypothesis import given
from hypothesis import strategies as st

from stonemq.protocol.checksum import crc32c
from stonemq.protocol.record_batch import parse_header
from stonemq.storage import fileio
from stonemq.storage.engine import StorageEngine
from stonemq.storage.errors import (
    DuplicateSequenceError,
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
)
from stonemq.storage.fileio import FileOps
from stonemq.storage.producer_state import (
    SEQUENCE_MODULUS,
    BatchSeq,
    ProducerState,
    list_snapshots,
    load_snapshot,
    snapshot_path,
    write_snapshot,
)


def applied(state: ProducerState, pid: int, epoch: int, seq: int, count: int, base: int) -> None:
    last = (seq + count - 1) % SEQUENCE_MODULUS
    state.applied(pid, epoch, seq, last, base, base + count - 1, 1000 + base)


def pending(state: ProducerState, pid: int, epoch: int, seq: int, count: int, base: int) -> None:
    last = (seq + count - 1) % SEQUENCE_MODULUS
    state.appended(pid, epoch, BatchSeq(seq, last, base, base + count - 1), 1000)


# -- the rules ----------------------------------------------------------------------------------
def test_in_order_batches_are_accepted() -> None:
    state = ProducerState()
    for i, seq in enumerate((0, 3, 6)):
        state.check(1, 0, seq, seq + 2)
        pending(state, 1, 0, seq, 3, i * 3)


def test_duplicate_is_answered_with_the_original_offset() -> None:
    state = ProducerState()
    applied(state, 1, 0, 0, 3, 40)
    applied(state, 1, 0, 3, 3, 43)
    with pytest.raises(DuplicateSequenceError) as dup:
        state.check(1, 0, 0, 2)
    assert dup.value.base_offset == 40 and dup.value.written is None


def test_gap_is_out_of_order() -> None:
    state = ProducerState()
    applied(state, 1, 0, 0, 3, 0)
    with pytest.raises(OutOfOrderSequenceError):
        state.check(1, 0, 5, 5)


def test_old_epoch_is_fenced_and_a_new_epoch_starts_at_zero() -> None:
    state = ProducerState()
    applied(state, 1, 2, 0, 1, 0)
    with pytest.raises(InvalidProducerEpochError):
        state.check(1, 1, 1, 1)
    with pytest.raises(OutOfOrderSequenceError):
        state.check(1, 3, 4, 4)
    state.check(1, 3, 0, 0)


def test_an_unknown_producer_is_accepted_at_any_sequence() -> None:
    state = ProducerState()
    state.check(9, 0, 1234, 1240)


def test_sequences_wrap_around() -> None:
    state = ProducerState()
    applied(state, 1, 0, 2**31 - 2, 2, 0)  # sequences 2**31-2 and 2**31-1
    state.check(1, 0, 0, 4)


def test_pending_batches_are_checked_first_and_retired_by_the_log() -> None:
    state = ProducerState()
    applied(state, 1, 0, 0, 1, 0)
    pending(state, 1, 0, 1, 1, 1)
    pending(state, 1, 0, 2, 1, 2)
    state.check(1, 0, 3, 3)  # follows the last pending batch
    with pytest.raises(DuplicateSequenceError) as dup:
        state.check(1, 0, 1, 1)
    assert dup.value.base_offset == 1
    applied(state, 1, 0, 1, 1, 1)  # split: the pending one is retired
    assert [p.batch.base_offset for p in state.pending] == [2]
    state.failed(2)  # its write failed
    assert not state.pending
    state.check(1, 0, 2, 2)  # the retry is not a duplicate


def test_failed_drops_every_pending_batch_from_the_offset_on() -> None:
    state = ProducerState()
    pending(state, 1, 0, 0, 1, 0)
    pending(state, 2, 0, 0, 1, 1)
    pending(state, 1, 0, 1, 1, 2)
    state.failed(1)
    assert [p.batch.base_offset for p in state.pending] == [0]
    state.check(1, 0, 1, 1)
    state.check(2, 0, 0, 0)  # producer 2 is unknown again


def test_expiry_keeps_producers_with_pending_batches() -> None:
    state = ProducerState()
    applied(state, 1, 0, 0, 1, 0)  # last timestamp 1000
    applied(state, 2, 0, 0, 1, 1)
    pending(state, 2, 0, 1, 1, 2)
    assert state.expire(now_ms=10_000, expiration_ms=5_000) == 1
    assert set(state.producers) == {2}


# -- snapshots ----------------------------------------------------------------------------------
producers = st.dictionaries(
    st.integers(0, 2**63 - 1),
    st.tuples(
        st.integers(0, 2**15 - 1),
        st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(1, 100)), max_size=7),
    ),
    max_size=8,
)


@given(producers)
def test_a_snapshot_round_trips_any_state(
    spec: dict[int, tuple[int, list[tuple[int, int]]]],
) -> None:
    state = ProducerState()
    base = 0
    for pid, (epoch, batches) in spec.items():
        for seq, count in batches:
            applied(state, pid, epoch, seq, count, base)
            base += count
    decoded = ProducerState.decode(state.encode())
    assert decoded.producers.keys() == state.producers.keys()
    for pid, entry in state.producers.items():
        other = decoded.producers[pid]
        assert (other.epoch, other.last_timestamp) == (entry.epoch, entry.last_timestamp)
        # every batch keeps its timestamp, what a duplicate of it is answered with: version 1
        # kept the last one's only, and a retry of an older batch after a clean restart was
        # answered -1 (LogAppendTime topics: the client reported its CreateTime instead)
        assert [
            (b.first_sequence, b.last_sequence, b.base_offset, b.last_offset, b.timestamp)
            for b in other.batches
        ] == [
            (b.first_sequence, b.last_sequence, b.base_offset, b.last_offset, b.timestamp)
            for b in entry.batches
        ]


def test_a_version_1_snapshot_is_still_read() -> None:
    """Version 1 (no per-batch timestamp): the last batch answers with the producer's last
    timestamp, the others with -1."""
    body = struct.pack(">i", 1) + struct.pack(">qhqB", 7, 2, 5000, 2)
    body += struct.pack(">iiqq", 0, 4, 10, 14) + struct.pack(">iiqq", 5, 9, 20, 24)
    data = struct.pack(">HI", 1, crc32c(body)) + body
    (entry,) = ProducerState.decode(data).producers.values()
    assert entry.epoch == 2 and entry.last_timestamp == 5000
    assert [(b.base_offset, b.last_sequence, b.timestamp) for b in entry.batches] == [
        (10, 4, -1),
        (20, 9, 5000),
    ]


@given(st.integers(0, 10_000), st.integers(1, 255), st.binary(min_size=1, max_size=20))
def test_a_damaged_snapshot_is_refused(at: int, flip: int, extra: bytes) -> None:
    state = ProducerState()
    applied(state, 5, 1, 0, 3, 0)
    applied(state, 6, 0, 7, 2, 3)
    good = state.encode()
    flipped = bytearray(good)
    flipped[at % len(good)] ^= flip
    for damaged in (bytes(flipped), good[: at % len(good)], good + extra):
        with pytest.raises(ValueError):
            ProducerState.decode(damaged)


def test_an_unreadable_snapshot_is_deleted_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A snapshot of garbage was dropped without a word; the older readable one is used."""
    state = ProducerState()
    applied(state, 1, 0, 0, 1, 10)
    write_snapshot(str(tmp_path), 10, state.encode())
    write_snapshot(str(tmp_path), 20, b"garbage" * 10)
    with caplog.at_level(logging.WARNING, logger="stonemq.storage.producer_state"):
        loaded, offset = load_snapshot(str(tmp_path), 30)
    assert offset == 10 and set(loaded.producers) == {1}
    assert list_snapshots(str(tmp_path)) == [10]
    (record,) = caplog.records
    assert "00000000000000000020.snapshot cannot be read" in record.getMessage()


def test_load_takes_the_newest_snapshot_within_the_log_and_deletes_the_rest(
    tmp_path: Path,
) -> None:
    state = ProducerState()
    for offset in (10, 20, 30):
        applied(state, 1, 0, offset, 1, offset)
        write_snapshot(str(tmp_path), offset, state.encode())
    assert list_snapshots(str(tmp_path)) == [20, 30]  # the newest two are kept
    Path(snapshot_path(str(tmp_path), 40)).write_bytes(b"garbage")
    loaded, offset = load_snapshot(str(tmp_path), log_end=25)  # a crash took 30 back
    assert offset == 20 and loaded.producers[1].last_sequence == 20
    assert list_snapshots(str(tmp_path)) == [20]


def test_load_does_not_take_a_snapshot_below_the_log_start(tmp_path: Path) -> None:
    """A snapshot below the log start describes batches the log no longer holds (a
    follower's queue log emptied to start at its leader's log start): not used, as Kafka's
    truncateAndReload drops it; one at the log start is."""
    state = ProducerState()
    for offset in (10, 20):
        applied(state, 1, 0, offset, 1, offset)
        write_snapshot(str(tmp_path), offset, state.encode())
    loaded, offset = load_snapshot(str(tmp_path), log_end=40, log_start=21)
    assert offset == -1 and not loaded.producers
    loaded, offset = load_snapshot(str(tmp_path), log_end=40, log_start=20)
    assert offset == 20 and loaded.producers[1].last_sequence == 20


# -- an engine's producer state across restarts --------------------------------------------------
def idem(seq: int, count: int = 1, pid: int = 42, epoch: int = 3) -> bytearray:
    return build_batch(
        [b"p%d-%d-" % (seq, i) * 60 for i in range(count)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


async def append(engine: StorageEngine, batch: bytearray) -> int:
    header = parse_header(batch)
    result = engine.append("t", 0, batch, header.record_count, producer=header)
    await result.written
    return result.base_offset


@pytest.mark.parametrize("stop", ["clean", "crash"])
def test_a_restart_continues_the_same_producer_id_and_sequence(tmp_path: Path, stop: str) -> None:
    """After a clean stop the state comes from the snapshot written at the stop; after a
    crash from the snapshot of the last roll plus a replay of the headers after it. Either
    way the producer continues its sequence, a retry of its last batch is a duplicate, and
    a gap is out of order."""

    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.start(lambda *a: None)
        offsets = [await append(engine, idem(seq * 2, 2)) for seq in range(40)]  # rolls
        await wait_split(engine)
        directory = engine._by_name[("t", 0)].queue.directory  # type: ignore[union-attr]
        deadline = asyncio.get_running_loop().time() + 5
        while not list_snapshots(directory):  # written off the loop after a roll
            assert asyncio.get_running_loop().time() < deadline, "no snapshot at the rolls"
            await asyncio.sleep(0.01)
        if stop == "clean":
            await engine.close()
        else:
            abandon(engine)
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.start(lambda *a: None)
        queue = engine._by_name[("t", 0)].queue
        assert queue is not None and queue.producers is not None
        snapshots = list_snapshots(queue.directory)
        assert (snapshots[-1] == queue.next_offset) == (stop == "clean")  # else a replay
        with pytest.raises(DuplicateSequenceError) as dup:
            await append(engine, idem(78, 2))
        assert dup.value.base_offset == offsets[-1]
        with pytest.raises(OutOfOrderSequenceError):
            await append(engine, idem(81))
        assert await append(engine, idem(80)) == offsets[-1] + 2
        await engine.close()

    asyncio.run(main())


def test_snapshots_go_with_the_topic(tmp_path: Path) -> None:
    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.start(lambda *a: None)
        for seq in range(60):
            await append(engine, idem(seq))
        await wait_split(engine)
        directory = engine._by_name[("t", 0)].queue.directory  # type: ignore[union-attr]
        deadline = asyncio.get_running_loop().time() + 5
        while not list_snapshots(directory):  # written off the loop after a roll
            assert asyncio.get_running_loop().time() < deadline, "no snapshot at the rolls"
            await asyncio.sleep(0.01)
        await engine.remove_topic("t")
        assert not Path(directory).exists()
        await engine.close()

    asyncio.run(main())


class SlowSnapshots(FileOps):
    """Real operations; opening a producer snapshot's temporary file first sleeps 0.2 s, and
    the moments snapshot files are opened or renamed and directories deleted are recorded."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        if path.endswith(".snapshot.tmp"):
            time.sleep(0.2)
            self.events.append(("snapshot", path))
        return super().open(path, flags, mode)

    def replace(self, src: str, dst: str) -> None:
        if dst.endswith(".snapshot"):
            self.events.append(("snapshot", dst))
        super().replace(src, dst)

    def rmtree(self, path: str) -> None:
        self.events.append(("rmtree", path))
        super().rmtree(path)


def test_a_snapshot_queued_before_a_deletion_is_written_before_the_directory_goes(
    tmp_path: Path,
) -> None:
    """Snapshot writes and directory deletions run in one thread, in the order asked: a
    snapshot in flight when its topic is deleted can neither leave a file that keeps the
    directory alive nor land in a new topic of the same name."""

    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.start(lambda *a: None)
        disk = SlowSnapshots()
        previous = fileio.install(disk)
        try:
            for seq in range(60):  # rolls, each queueing a snapshot
                await append(engine, idem(seq))
            await wait_split(engine)
            directory = engine._by_name[("t", 0)].queue.directory  # type: ignore[union-attr]
            await engine.remove_topic("t")
            assert not Path(directory).exists()
            await engine.wait_directory_work()
        finally:
            fileio.install(previous)
        await engine.close()
        kinds = [kind for kind, path in disk.events if path.startswith(directory)]
        assert "snapshot" in kinds and kinds[-1] == "rmtree", kinds
        assert not Path(directory).exists()

    asyncio.run(main())


class SlowIndexOpen(FileOps):
    """Real operations; opening an index file first sleeps 0.3 s (once); index opens and
    directory deletions are recorded in order."""

    def __init__(self) -> None:
        self.stalled = False
        self.events: list[tuple[str, str]] = []

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        if path.endswith(".index"):
            if not self.stalled:
                self.stalled = True
                time.sleep(0.3)
            self.events.append(("index", path))
        return super().open(path, flags, mode)

    def rmtree(self, path: str) -> None:
        self.events.append(("rmtree", path))
        super().rmtree(path)


def test_a_deletion_waits_for_the_flush_in_flight(tmp_path: Path) -> None:
    """A flush round writing a queue log's index entries while its topic is deleted: the
    deletion waits for it, so neither can the flush fail on a directory gone under it nor
    put an index file back into a directory being deleted (which kept it alive)."""

    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.start(lambda *a: None)
        for seq in range(30):
            await append(engine, idem(seq))
        await wait_split(engine)
        directory = engine._by_name[("t", 0)].queue.directory  # type: ignore[union-attr]
        disk = SlowIndexOpen()
        previous = fileio.install(disk)
        try:
            flushing = asyncio.ensure_future(engine.flush())
            await asyncio.sleep(0.05)  # the flush thread waits at the index's open
            await engine.remove_topic("t")
            await flushing  # did not fail
        finally:
            fileio.install(previous)
        assert disk.stalled
        assert not Path(directory).exists()
        kinds = [kind for kind, path in disk.events if path.startswith(directory)]
        assert "index" in kinds and kinds[-1] == "rmtree", kinds  # nothing after the delete
        await engine.close()

    asyncio.run(main())


# -- what DescribeProducers reports -------------------------------------------------------------
batches = st.lists(
    st.tuples(st.integers(1, 4), st.integers(0, 3), st.integers(1, 5), st.integers(0, 10**6)),
    max_size=40,
)


@given(batches, st.integers(0, 40))
def test_active_counts_pending_batches_as_the_log_will_hold_them(
    appended: list[tuple[int, int, int, int]], split: int
) -> None:
    """Producers reported while batches are pending are those reported once they are split:
    the newest batch of a producer's newest epoch, its epoch's newest timestamp."""
    state = ProducerState()
    offset, next_seq = 0, {}
    plan = []
    for pid, epoch, count, timestamp in appended:
        seq = next_seq.get((pid, epoch), 0)
        next_seq[(pid, epoch)] = seq + count
        batch = BatchSeq(seq, seq + count - 1, offset, offset + count - 1)
        plan.append((pid, epoch, batch, timestamp))
        offset += count
    for pid, epoch, batch, timestamp in plan[:split]:  # already in the log
        state.applied(
            pid,
            epoch,
            batch.first_sequence,
            batch.last_sequence,
            batch.base_offset,
            batch.last_offset,
            timestamp,
        )
    for pid, epoch, batch, timestamp in plan[split:]:  # acknowledged, not split yet
        state.appended(pid, epoch, batch, timestamp)
    reported = sorted(state.active())
    for pid, epoch, batch, timestamp in plan[split:]:
        state.applied(
            pid,
            epoch,
            batch.first_sequence,
            batch.last_sequence,
            batch.base_offset,
            batch.last_offset,
            timestamp,
        )
    assert not state.pending
    assert reported == sorted(state.active())
    for pid, epoch, last_sequence, _ in reported:
        newest = max(e for p, e, _, _ in plan if p == pid)
        assert epoch == newest
        assert last_sequence == next_seq[(pid, newest)] - 1
