"""Storage's replication paths (StorageEngine with ``replicated=True``): the leader's epoch
checkpoint and the epoch its batches carry, the follower's verbatim append, the split limit
(the journal HW) bounding what consumers see, truncation after a divergence, and the
per-partition OffsetForLeaderEpoch answered from batch epochs."""

from __future__ import annotations

import asyncio
import os
import struct
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    SMALL_LOG,
    abandon,
    add_topic,
    build_batch,
    delete_records,
    new_engine,
    started_leader,
)

from stonemq.storage.engine import LogConfig, NotLeaderError, OffsetOutOfRangeError, StorageError
from stonemq.storage.errors import UnknownTopicsError
from stonemq.storage.journal import CorruptEntryError, JournalReader


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 10))


def journal_bytes(root: Path, j: int) -> bytes:
    d = root / "journal" / f"journal-{j}"
    names = sorted(n for n in os.listdir(d) if n.endswith(".journal"))
    return b"".join((d / n).read_bytes() for n in names)


def batch_epochs(engine: Any, topic: str, partition: int) -> list[tuple[int, int]]:
    data = engine.read(topic, partition, 0, 1 << 20).data
    out, at = [], 0
    while at < len(data):
        base, length, epoch = struct.unpack_from(">qii", data, at)
        out.append((base, epoch))
        at += 12 + length
    return out


async def settle(engine: Any) -> None:
    for _ in range(50):
        await asyncio.sleep(0.01)


def test_leader_epochs_follower_append_and_the_split_limit(tmp_path: Path) -> None:
    leader_root, follower_root = tmp_path / "leader", tmp_path / "follower"

    async def scenario() -> None:
        leader = new_engine(leader_root, replicated=True)
        follower = new_engine(follower_root, replicated=True)
        for engine in (leader, follower):
            add_topic(engine, partitions=2)
            engine.recover()
            engine.start(lambda *a: None)
        try:
            await leader.become_leader(0, 3)
            assert leader.epoch_entries(0) == [(3, 0)]
            for i in range(4):
                await leader.append("t", 0, build_batch([b"a%d" % i, b"b%d" % i]), 2).written
            await leader.become_leader(0, 5)  # a later epoch starts at the journal end
            end_epoch3 = leader.journal_end(0)
            assert leader.epoch_entries(0) == [(3, 0), (5, end_epoch3)]
            await leader.append("t", 0, build_batch([b"c"]), 1).written
            end = leader.journal_written_end(0)
            # nothing is split (consumers see nothing) until the HW says so
            await settle(leader)
            assert leader.high_watermark("t", 0) == 0 and leader.log_end_offset("t", 0) == 9
            leader.set_split_limit(0, end_epoch3)
            await settle(leader)
            assert leader.high_watermark("t", 0) == 8
            leader.set_split_limit(0, end)
            await settle(leader)
            assert leader.high_watermark("t", 0) == 9
            assert batch_epochs(leader, "t", 0) == [(0, 3), (2, 3), (4, 3), (6, 3), (8, 5)]
            # the follower appends the leader's bytes as they are, in two fetches
            data = JournalReader(str(leader_root / "journal" / "journal-0")).read_raw(
                0, end, 1 << 20
            )
            assert len(data) == end
            cut = end_epoch3
            assert await follower.append_replica(0, 0, memoryview(data[:cut])) == cut
            with pytest.raises(StorageError):  # not at its journal end
                await follower.append_replica(0, 0, memoryview(data[cut:]))
            assert await follower.append_replica(0, cut, memoryview(data[cut:])) == end
            assert follower.epoch_entries(0) == [(3, 0), (5, cut)]  # from the batches' epochs
            assert follower.log_end_offset("t", 0) == 9  # next offsets follow the entries
            follower.set_split_limit(0, end)
            await settle(follower)
            assert follower.read("t", 0, 0, 1 << 20).data == leader.read("t", 0, 0, 1 << 20).data
            # OffsetForLeaderEpoch per topic partition, from the batch epochs
            assert await leader.epoch_end_offset("t", 0, 3) == (3, 8)
            assert await leader.epoch_end_offset("t", 0, 4) == (3, 8)
            assert await leader.epoch_end_offset("t", 0, 5) == (5, 9)
            assert await leader.epoch_end_offset("t", 0, 1) == (1, 0)  # below every batch
            assert await leader.epoch_end_offset("t", 1, 2) == (2, 0)  # no batch at all
            # a corrupt entry is refused whole, and nothing is written
            bad = bytearray(data[:cut])
            bad[60] ^= 0xFF
            other = new_engine(tmp_path / "other", replicated=True)
            add_topic(other, partitions=2)
            other.recover()
            other.start(lambda *a: None)
            with pytest.raises(CorruptEntryError):
                await other.append_replica(0, 0, memoryview(bytes(bad)))
            assert other.journal_end(0) == 0
            await other.close()
            assert journal_bytes(leader_root, 0) == journal_bytes(follower_root, 0)
            # from the log start (offsets audit: epochs of deleted batches were answered)
            assert await delete_records(leader, "t", 0, 7) == 7  # inside the batch at 6
            assert await leader.epoch_end_offset("t", 0, 1) == (1, 7)
            assert await leader.epoch_end_offset("t", 0, 3) == (3, 8)
            assert await delete_records(leader, "t", 0, 8) == 8
            assert await leader.epoch_end_offset("t", 0, 3) == (3, 8)
            assert await leader.epoch_end_offset("t", 0, 5) == (5, 9)
            assert await delete_records(leader, "t", 0, 9) == 9
            assert await leader.epoch_end_offset("t", 0, 3) == (3, 9)
        finally:
            await leader.close()
            await follower.close()

    run(scenario())


def test_truncation_cuts_only_the_unsplit_tail(tmp_path: Path) -> None:
    async def scenario() -> None:
        engine = await started_leader(tmp_path)
        try:
            for i in range(3):
                await engine.append("t", 0, build_batch([b"x%d" % i]), 1).written
            split_to = engine.journal_written_end(0)
            engine.set_split_limit(0, split_to)
            await settle(engine)
            await engine.become_leader(0, 2)
            for i in range(2):
                await engine.append("t", 0, build_batch([b"y%d" % i]), 1).written
            assert engine.log_end_offset("t", 0) == 5 and engine.high_watermark("t", 0) == 3
            with pytest.raises(StorageError, match="below the split position"):
                await engine.truncate_replica(0, 0)
            assert engine.log_end_offset("t", 0) == 5
            cut = await engine.truncate_replica(0, split_to)
            assert cut > 0 and engine.journal_end(0) == split_to
            assert engine.log_end_offset("t", 0) == 3  # offsets 3 and 4 are free again
            assert engine.epoch_entries(0) == [(1, 0)]  # epoch 2 started at the cut
            await engine.become_leader(0, 3)
            appended = engine.append("t", 0, build_batch([b"z"]), 1)
            await appended.written
            assert appended.base_offset == 3
        finally:
            await engine.close()
        assert len(journal_bytes(tmp_path, 0)) > split_to

    run(scenario())


def test_a_truncation_at_the_end_still_drops_an_epoch_begun_there(tmp_path: Path) -> None:
    """A copy that began an epoch at its end and appended nothing in it (it led a moment, or
    followed such a leader) is told by its leader that its previous epoch ends right there:
    nothing is cut, but that empty epoch goes, as Kafka's truncateTo always truncates the
    epoch cache. Kept, every fetch diverged again at the same point and the copy never
    caught up (an audit: a preferred election after a restart stalled acks=all)."""

    async def scenario() -> None:
        engine = await started_leader(tmp_path)
        try:
            for i in range(3):
                await engine.append("t", 0, build_batch([b"x%d" % i]), 1).written
            end = engine.journal_end(0)
            await engine.become_leader(0, 2)  # epoch 2 begins at the end, no batch in it
            assert engine.epoch_entries(0) == [(1, 0), (2, end)]
            assert await engine.truncate_replica(0, end) == 0  # nothing to cut
            assert engine.epoch_entries(0) == [(1, 0)]
            assert engine.journal_end(0) == end and engine.log_end_offset("t", 0) == 3
        finally:
            await engine.close()
        reopened = new_engine(tmp_path, replicated=True)  # the checkpoint file says so too
        add_topic(reopened)
        reopened.recover()
        try:
            assert reopened.epoch_entries(0) == [(1, 0)]
        finally:
            abandon(reopened)

    run(scenario())


def test_a_new_leader_knows_the_idempotent_batches_it_has_not_split(tmp_path: Path) -> None:
    """A follower appends a producer's batches but has not split them (no HW yet) when it
    becomes leader: a retry of one of them is a duplicate (its original offset), the next
    sequence is taken, and a gap is refused, as if the batches were in its queue log."""
    from stonemq.protocol.record_batch import parse_header
    from stonemq.storage.errors import DuplicateSequenceError, OutOfOrderSequenceError

    async def scenario() -> None:
        leader = new_engine(tmp_path / "a", replicated=True)
        follower = new_engine(tmp_path / "b", replicated=True)
        for engine in (leader, follower):
            add_topic(engine, partitions=2)
            engine.recover()
            engine.start(lambda *a: None)
        try:
            await leader.become_leader(0, 1)
            batches = [
                build_batch(
                    [b"p%d" % i, b"q%d" % i], producer_id=7, producer_epoch=0, base_sequence=2 * i
                )
                for i in range(3)
            ]
            for batch in batches:
                appended = leader.append("t", 0, bytearray(batch), 2, producer=parse_header(batch))
                await appended.written
            end = leader.journal_written_end(0)
            data = JournalReader(str(tmp_path / "a" / "journal" / "journal-0")).read_raw(
                0, end, 1 << 20
            )
            await follower.append_replica(0, 0, memoryview(data))
            assert follower.high_watermark("t", 0) == 0  # nothing split: no HW known
            await follower.become_leader(0, 2)
            retry = batches[1]
            with pytest.raises(DuplicateSequenceError) as dup:
                follower.append("t", 0, bytearray(retry), 2, producer=parse_header(retry))
            assert dup.value.base_offset == 2
            gap = build_batch([b"g"], producer_id=7, producer_epoch=0, base_sequence=9)
            with pytest.raises(OutOfOrderSequenceError):
                follower.append("t", 0, gap, 1, producer=parse_header(gap))
            nxt = build_batch([b"n"], producer_id=7, producer_epoch=0, base_sequence=6)
            appended = follower.append("t", 0, nxt, 1, producer=parse_header(nxt))
            await appended.written
            assert appended.base_offset == 6
            follower.set_split_limit(0, follower.journal_written_end(0))
            await settle(follower)
            assert follower.high_watermark("t", 0) == 7
        finally:
            await leader.close()
            await follower.close()

    run(scenario())


def test_journal_deletion_moves_the_epoch_history_start(tmp_path: Path) -> None:
    """When the checkpoint round deletes journal segments, the epoch checkpoint's history
    starts at the new journal start (Kafka's truncateFromStart), its latest epoch kept."""

    async def scenario() -> None:
        engine = new_engine(tmp_path, replicated=True, journal_segment_bytes=4096)
        add_topic(engine, partitions=2)
        engine.recover()
        engine.start(lambda *a: None)
        try:
            await engine.become_leader(0, 1)
            for i in range(40):
                await engine.append("t", 0, build_batch([b"%04d" % i * 50]), 1).written
            await engine.become_leader(0, 2)
            for i in range(40):
                await engine.append("t", 0, build_batch([b"%04d" % i * 50]), 1).written
            engine.set_split_limit(0, engine.journal_written_end(0))
            await settle(engine)
            assert engine.high_watermark("t", 0) == 80
            await engine.flush()
            start = engine.journal_start(0)
            assert start > 0
            entries = engine.epoch_entries(0)
            assert entries[0][1] == start and entries[-1][0] == 2
        finally:
            await engine.close()

    run(scenario())


def test_only_a_leader_takes_its_own_appends(tmp_path: Path) -> None:
    """A replicated engine refuses this broker's own appends (a produce, a group
    coordinator's record) to a journal partition it does not lead: before it leads and after
    it stops leading (NotLeaderError, NOT_LEADER_OR_FOLLOWER), with no offset assigned and
    nothing queued, while the leader's bytes still come in through the follower's append. A
    follower whose group coordinator wrote to its own journal diverged from its leader (the
    fault suite found one split into __consumer_offsets with offsets the leader never had)."""

    async def scenario() -> None:
        leader = new_engine(tmp_path / "leader", replicated=True)
        follower = new_engine(tmp_path / "follower", replicated=True)
        for engine in (leader, follower):
            add_topic(engine, partitions=1)
            engine.recover()
            engine.start(lambda *a: None)
        try:
            with pytest.raises(NotLeaderError):  # a replicated broker starts leading nothing
                leader.append("t", 0, build_batch([b"early"]), 1)
            assert leader.journal_end(0) == 0 and leader.log_end_offset("t", 0) == 0
            await leader.become_leader(0, 1)
            await leader.append("t", 0, build_batch([b"a"]), 1).written
            end = leader.journal_written_end(0)
            data = JournalReader(str(tmp_path / "leader" / "journal" / "journal-0")).read_raw(
                0, end, 1 << 20
            )
            with pytest.raises(NotLeaderError):
                follower.append("t", 0, build_batch([b"mine"]), 1)
            assert await follower.append_replica(0, 0, memoryview(data)) == end
            assert follower.log_end_offset("t", 0) == 1
            leader.stop_leading(0)
            with pytest.raises(NotLeaderError):
                leader.append("t", 0, build_batch([b"late"]), 1)
            assert leader.journal_end(0) == end and leader.log_end_offset("t", 0) == 1
            await leader.become_leader(0, 2)  # leads again, in a later epoch
            assert leader.append("t", 0, build_batch([b"b"]), 1).base_offset == 1
        finally:
            await leader.close()
            await follower.close()
        assert (
            journal_bytes(tmp_path / "follower", 0)
            == journal_bytes(tmp_path / "leader", 0)[: len(data)]
        )

    run(scenario())


def test_a_crash_after_a_truncation_recovers_the_leaders_entries_appended_since(
    tmp_path: Path,
) -> None:
    """A follower truncates its diverged tail, appends its leader's entries over those
    positions and crashes before the next checkpoint round. Its journal's checkpointed
    recovery point must not still name the old end: inside the leader's entries now, it made
    recovery scan from mid-entry and cut everything after it as a torn tail, leaving a
    partial entry the follower could never fetch past (the fault suite, seed 598538733)."""
    leader_root, follower_root = tmp_path / "leader", tmp_path / "follower"

    async def scenario() -> None:
        leader = new_engine(leader_root, replicated=True)
        follower = new_engine(follower_root, replicated=True)
        for engine in (leader, follower):
            add_topic(engine, partitions=1)
            engine.recover()
            engine.start(lambda *a: None)
        reader = JournalReader(str(leader_root / "journal" / "journal-0"))
        try:
            await leader.become_leader(0, 1)
            for i in range(3):
                await leader.append("t", 0, build_batch([b"x%d" % i]), 1).written
            agreed = leader.journal_written_end(0)
            await follower.append_replica(0, 0, memoryview(reader.read_raw(0, agreed, 1 << 20)))
            # the follower led epoch 1 for a moment: a short tail its leader never had
            await follower.become_leader(0, 1)
            await follower.append("t", 0, build_batch([b"y"]), 1).written
            follower.stop_leading(0)
            await follower.flush()  # checkpointed: its recovery point is past that tail
            await leader.become_leader(0, 2)
            for i in range(3):
                await leader.append("t", 0, build_batch([b"z%d" % i * 100]), 1).written
            end = leader.journal_written_end(0)
            assert await follower.truncate_replica(0, agreed) > 0
            tail = reader.read_raw(agreed, end, 1 << 20)
            assert await follower.append_replica(0, agreed, memoryview(tail)) == end
        finally:
            reader.close()
            await leader.close()
        abandon(follower)  # a crash before the next checkpoint round
        again = new_engine(follower_root, replicated=True)
        add_topic(again, partitions=1)
        again.recover()
        try:
            assert again.journal_written_end(0) == end
        finally:
            again.start(lambda *a: None)
            await again.close()
        assert journal_bytes(follower_root, 0) == journal_bytes(leader_root, 0)

    run(scenario())


def test_a_journal_partition_added_while_serving_takes_appends_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    """``add_journal_partition`` (a cluster broker hosting a journal partition placed after
    its start) opens an empty journal under the next local index that leads, splits below its
    limit and checkpoints like the others; a restart with one more journal partition finds
    its bytes, queue log and epochs. A directory already holding journal bytes is refused."""
    other = uuid.UUID("6f1c2d3e-0000-4000-8000-000000000002")

    async def serve() -> None:
        engine = new_engine(tmp_path, replicated=True)
        add_topic(engine, partitions=2)
        engine.recover()
        engine.start(lambda *a: None)
        try:
            assert engine.add_journal_partition() == 2
            engine.add_partition(other, "n", 0, 2, SMALL_LOG)
            await engine.become_leader(2, 4)
            for i in range(5):
                await engine.append("n", 0, build_batch([b"n%d" % i]), 1).written
            assert engine.high_watermark("n", 0) == 0  # below the limit only
            engine.set_split_limit(2, engine.journal_written_end(2))
            await settle(engine)
            assert engine.high_watermark("n", 0) == 5
            assert batch_epochs(engine, "n", 0) == [(i, 4) for i in range(5)]
            assert engine.split_positions()[2] == engine.journal_written_end(2)
        finally:
            await engine.close()

    async def restart() -> None:
        engine = new_engine(tmp_path, replicated=True, journal_partitions=3)
        add_topic(engine, partitions=2)
        engine.add_partition(other, "n", 0, 2, SMALL_LOG)
        engine.recover()
        engine.start(lambda *a: None)
        try:
            assert engine.epoch_entries(2) == [(4, 0)]
            assert engine.high_watermark("n", 0) == 5
            assert batch_epochs(engine, "n", 0) == [(i, 4) for i in range(5)]
        finally:
            await engine.close()

    async def refused() -> None:
        engine = new_engine(tmp_path, replicated=True)  # journal-2 holds bytes: not new
        add_topic(engine, partitions=2)
        engine.recover()
        engine.start(lambda *a: None)
        try:
            with pytest.raises(StorageError, match="already holds"):
                engine.add_journal_partition()
            assert len(engine.split_positions()) == 2
        finally:
            await engine.close()

    run(serve())
    run(restart())
    run(refused())


def test_becoming_leader_waits_for_a_replica_append_in_flight(tmp_path: Path) -> None:
    """A follower becomes leader while the last fetched entries are still being written (a
    leadership moved by the controller while the follower fetches): become_leader waits for
    that write, so their offsets are not assigned again to the next produce, and refuses any
    further replica append until the partition is followed again."""
    leader_root, follower_root = tmp_path / "leader", tmp_path / "follower"

    async def scenario() -> None:
        leader = new_engine(leader_root, replicated=True)
        follower = new_engine(follower_root, replicated=True)
        for engine in (leader, follower):
            add_topic(engine, partitions=2)
            engine.recover()
            engine.start(lambda *a: None)
        try:
            await leader.become_leader(0, 1)
            for i in range(3):
                await leader.append("t", 0, build_batch([b"a%d" % i, b"b%d" % i]), 2).written
            end = leader.journal_written_end(0)
            data = JournalReader(str(leader_root / "journal" / "journal-0")).read_raw(
                0, end, 1 << 20
            )
            await follower.become_leader(0, 0)  # it led once; the journal was empty then
            follower.stop_leading(0)
            appending = asyncio.ensure_future(follower.append_replica(0, 0, memoryview(data)))
            await asyncio.sleep(0)  # the write is queued, not done
            await follower.become_leader(0, 2)
            assert appending.done() and appending.result() == end
            with pytest.raises(StorageError, match="led here"):
                await follower.append_replica(0, end, memoryview(data))
            assert follower.log_end_offset("t", 0) == 6
            appended = follower.append("t", 0, build_batch([b"c"]), 1)
            await appended.written
            follower.set_split_limit(0, follower.journal_written_end(0))
            await settle(follower)
            assert [base for base, _ in batch_epochs(follower, "t", 0)] == [0, 2, 4, 6]
            follower.stop_leading(0)  # followed again: replica appends are taken
            assert await follower.append_replica(0, follower.journal_end(0), memoryview(b"")) >= 0
        finally:
            await leader.close()
            await follower.close()

    run(scenario())


@pytest.mark.parametrize("max_bytes", [0, 1, 3, 4, 5])
def test_a_replica_read_smaller_than_an_entry_still_returns_the_first_whole_entry(
    tmp_path: Path, max_bytes: int
) -> None:
    """As Kafka returns at least one batch whatever replica.fetch.max.bytes says: a read of
    fewer bytes than an entry's 4-byte length field returned nothing, so a follower with a
    replica.fetch.max.bytes below 4 never moved (found by the catch-up tests)."""

    async def scenario() -> None:
        engine = new_engine(tmp_path, replicated=True)
        add_topic(engine, partitions=1)
        engine.recover()
        engine.start(lambda *a: None)
        try:
            await engine.become_leader(0, 1)
            for i in range(2):
                await engine.append("t", 0, build_batch([b"v%d" % i]), 1).written
            end = engine.journal_written_end(0)
            whole = journal_bytes(tmp_path, 0)
            reader = JournalReader(str(tmp_path / "journal" / "journal-0"))
            try:
                first = reader.read_raw(0, end, max_bytes)
                assert 0 < len(first) < end and whole.startswith(first)
                second = reader.read_raw(len(first), end, max_bytes)
                assert first + second == whole
            finally:
                reader.close()
        finally:
            await engine.close()

    run(scenario())


def test_a_log_start_entry_moves_the_log_start_on_every_replica(tmp_path: Path) -> None:
    """DeleteRecords is a log-start entry in the journal partition: the leader applies it
    only once its HW passes it; a follower appending the leader's bytes applies it when it
    splits them, also after it became the leader itself with the entry not split yet; and
    the log start stays after a restart of either. Before, DeleteRecords moved only the
    leader's queue log: a new leader served the deleted records again."""
    leader_root, follower_root = tmp_path / "leader", tmp_path / "follower"
    small = LogConfig(segment_bytes=1024, index_interval_bytes=256)

    async def scenario() -> None:
        leader = new_engine(leader_root, replicated=True)
        follower = new_engine(follower_root, replicated=True)
        for engine in (leader, follower):
            add_topic(engine, partitions=2, config=small)
            engine.recover()
            engine.start(lambda *a: None)
        try:
            await leader.become_leader(0, 1)
            for i in range(20):
                await leader.append("t", 0, build_batch([b"v%02d" % i * 30]), 1).written
            leader.set_split_limit(0, leader.journal_written_end(0))
            await settle(leader)
            assert leader.high_watermark("t", 0) == 20
            queued = leader.delete_records("t", 0, 12)
            assert queued is not None
            await queued.written
            await settle(leader)
            assert leader.log_start_offset("t", 0) == 0  # not below the HW yet
            leader.set_split_limit(0, queued.end)
            await asyncio.wait_for(leader.split_past(0, queued.end), 5)
            assert leader.log_start_offset("t", 0) == 12
            assert leader.delete_records("t", 0, 5) is None  # below it: nothing to write
            after = leader.append("t", 0, build_batch([b"after"]), 1)
            await after.written
            assert after.base_offset == 20
            end = leader.journal_written_end(0)
            data = JournalReader(str(leader_root / "journal" / "journal-0")).read_raw(
                0, end, 1 << 20
            )
            assert await follower.append_replica(0, 0, memoryview(data)) == end
            assert follower.log_end_offset("t", 0) == 21  # the entry carries no offsets
            # failover: the follower leads with the entry not split yet
            await follower.become_leader(0, 2)
            assert follower.log_start_offset("t", 0) == 0
            follower.set_split_limit(0, end)
            await asyncio.wait_for(follower.split_past(0, end), 5)
            assert follower.log_start_offset("t", 0) == 12
            with pytest.raises(OffsetOutOfRangeError):
                follower.read("t", 0, 11, 1 << 20)
            await follower.wait_directory_work()
            first = min(
                int(n[:-4])
                for n in os.listdir(follower_root / "queues" / "t-0")
                if n.endswith(".log")
            )
            assert 0 < first <= 12  # the segments wholly below went
            appended = follower.append("t", 0, build_batch([b"new"]), 1)
            await appended.written
            assert appended.base_offset == 21
        finally:
            await leader.close()
            await follower.close()
        for root in (leader_root, follower_root):
            again = new_engine(root, replicated=True)
            add_topic(again, partitions=2, config=small)
            again.recover()
            assert again.log_start_offset("t", 0) == 12
            await again.close()

    run(scenario())


def test_a_truncated_log_start_entry_is_never_applied(tmp_path: Path) -> None:
    """A follower's journal suffix holding a log-start entry it has not split (its leader
    died before the HW passed it) is cut like any other: its log start stays."""

    async def scenario() -> None:
        engine = await started_leader(tmp_path)
        try:
            for i in range(3):
                await engine.append("t", 0, build_batch([b"x%d" % i]), 1).written
            split_to = engine.journal_written_end(0)
            engine.set_split_limit(0, split_to)
            await settle(engine)
            queued = engine.delete_records("t", 0, 2)
            assert queued is not None
            await queued.written
            await engine.become_leader(0, 2)  # deposed and back: the entry is not split
            assert await engine.truncate_replica(0, split_to) > 0
            engine.set_split_limit(0, engine.journal_end(0) + 1000)
            await settle(engine)
            assert engine.log_start_offset("t", 0) == 0
            assert engine.log_end_offset("t", 0) == 3
        finally:
            await engine.close()

    run(scenario())


def test_a_follower_appends_no_entry_of_a_topic_it_does_not_know_yet(tmp_path: Path) -> None:
    """audit33 p1: a follower whose metadata lagged split the entries of a topic created
    meanwhile as a deleted topic's, skipping them for good, while its append counted them
    acknowledged. Such a run is refused whole until the topic is registered; entries of a
    topic known to be deleted (removed here, or ``topics_gone``) are appended and skipped."""
    leader_root, follower_root = tmp_path / "leader", tmp_path / "follower"
    new_id = uuid.UUID(int=99)

    async def scenario() -> None:
        leader = await started_leader(leader_root)
        follower = new_engine(follower_root, replicated=True)
        add_topic(follower, partitions=2)
        follower.recover()
        follower.start(lambda *a: None)
        try:
            add_topic(leader, "new", partitions=1, topic_id=new_id)
            await leader.append("t", 0, build_batch([b"a"]), 1).written
            await leader.append("new", 0, build_batch([b"n1", b"n2"]), 2).written
            end = leader.journal_written_end(0)
            data = JournalReader(str(leader_root / "journal" / "journal-0")).read_raw(
                0, end, 1 << 20
            )
            with pytest.raises(UnknownTopicsError) as refused:
                await follower.append_replica(0, 0, memoryview(data))
            assert refused.value.topic_ids == {new_id.bytes}
            assert follower.journal_end(0) == 0  # nothing of the run written
            add_topic(follower, "new", partitions=1, topic_id=new_id)  # the metadata caught up
            assert await follower.append_replica(0, 0, memoryview(data)) == end
            for engine in (leader, follower):
                engine.set_split_limit(0, end)
                await settle(engine)
            assert follower.high_watermark("new", 0) == 2
            assert (
                follower.read("new", 0, 0, 1 << 20).data == leader.read("new", 0, 0, 1 << 20).data
            )
            # a deleted topic's entries: removed on the follower, then on the leader after
            # two more records; the follower appends them and its splitter skips them
            await follower.remove_topic("new")
            await leader.append("new", 0, build_batch([b"n3"]), 1).written
            await leader.append("t", 0, build_batch([b"b"]), 1).written
            end2 = leader.journal_written_end(0)
            more = JournalReader(str(leader_root / "journal" / "journal-0")).read_raw(
                end, end2, 1 << 20
            )
            assert await follower.append_replica(0, end, memoryview(more)) == end2
            # and one the follower never knew, found in no topic of the metadata
            other_id = uuid.UUID(int=100)
            add_topic(leader, "gone", partitions=1, topic_id=other_id)
            await leader.append("gone", 0, build_batch([b"g"]), 1).written
            end3 = leader.journal_written_end(0)
            last = JournalReader(str(leader_root / "journal" / "journal-0")).read_raw(
                end2, end3, 1 << 20
            )
            with pytest.raises(UnknownTopicsError):
                await follower.append_replica(0, end2, memoryview(last))
            follower.topics_gone({other_id.bytes})
            assert await follower.append_replica(0, end2, memoryview(last)) == end3
            follower.set_split_limit(0, end3)
            await settle(follower)
            assert follower.high_watermark("t", 0) == 2
        finally:
            await leader.close()
            await follower.close()

    run(scenario())
