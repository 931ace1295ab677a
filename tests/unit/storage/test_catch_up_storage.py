"""A follower's catch-up from its leader's state at one point (StorageEngine.catch_up_*,
driven by stonemq/replication/catchup.py): the leader's answer for the point, the verbatim
copy of its queue-log batches, the install (queue logs durable, then a marker, an empty
journal at the point, the epoch history and checkpoints at it), and crashes and I/O failures
on either side of the marker: the old state, or a state the next start finishes."""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from conftest import CODECS, abandon, add_topic, build_batch, delete_records, new_engine, read_all
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from stonemq.protocol.record_batch import iter_batches, parse_header, recompress, set_base_offset
from stonemq.storage import fileio
from stonemq.storage.check import check_storage
from stonemq.storage.engine import CATCH_UP_FILE, StorageError, catch_up_epochs
from stonemq.storage.faults import Durability, FaultPlan, FaultyFileOps
from stonemq.storage.journal import JournalReader
from stonemq.storage.leader_epoch import LeaderEpochCache


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 20))


async def settle(engine: Any, j: int = 0) -> None:
    for _ in range(200):
        limit = min(engine.journal_written_end(j), engine.split_limit(j))
        if engine.split_positions()[j] >= limit:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the splitter did not settle")


def journal_files(root: Path, j: int = 0) -> list[str]:
    return sorted(
        n for n in os.listdir(root / "journal" / f"journal-{j}") if n.endswith(".journal")
    )


def start(root: Path) -> Any:
    engine = new_engine(root, replicated=True, journal_segment_bytes=4096)
    add_topic(engine, partitions=2)  # t-0 on journal partition 0, t-1 on 1
    engine.recover()
    engine.start(lambda *a: None)
    return engine


async def behind(tmp_path: Path, records: int = 1) -> tuple[Any, Any, int]:
    """A leader of journal partition 0 (epochs 1 then 2) that deleted journal segments, and
    a follower holding the first 5 of its entries (of ``records`` records each), split.
    Returns (leader, follower, the leader's journal end when the follower stopped)."""
    leader, follower = start(tmp_path / "leader"), start(tmp_path / "follower")
    await leader.become_leader(0, 1)
    for i in range(5):
        values = [b"a%03d%d" % (i, r) * 40 for r in range(records)]
        await leader.append("t", 0, build_batch(values), records).written
    early = leader.journal_written_end(0)
    reader = JournalReader(str(tmp_path / "leader" / "journal" / "journal-0"))
    try:
        data = reader.read_raw(0, early, 1 << 20)
    finally:
        reader.close()
    assert await follower.append_replica(0, 0, memoryview(data)) == early
    follower.set_split_limit(0, early)
    await settle(follower)
    assert follower.high_watermark("t", 0) == 5 * records
    await leader.become_leader(0, 2)
    for i in range(60):
        await leader.append("t", 0, build_batch([b"b%03d" % i * 40, b"c"]), 2).written
    leader.set_split_limit(0, leader.journal_written_end(0))
    await settle(leader)
    await leader.flush()
    assert leader.journal_start(0) > early  # the follower cannot fetch from its end
    return leader, follower, early


async def copy(leader: Any, follower: Any, point: int, parts: list[Any]) -> None:
    await follower.catch_up_prepare(0)
    for topic, partition, log_start, end in parts:
        assert follower.catch_up_queue(0, topic, partition) is not None
        offset = await follower.catch_up_offset(topic, partition, log_start)
        while offset < end:
            data = leader.read(topic, partition, offset, 700).data
            offset = await follower.catch_up_append(topic, partition, data, end, point)


def test_the_leaders_point_the_copy_and_the_install(tmp_path: Path) -> None:
    async def scenario() -> None:
        leader, follower, _ = await behind(tmp_path)
        try:
            point, epochs, parts = leader.catch_up_point(0)
            assert point == leader.split_positions()[0] >= leader.journal_start(0)
            assert parts == [("t", 0, 0, 125)]  # only what journal partition 0 routes
            assert epochs == [(e, s) for e, s in leader.epoch_entries(0) if s <= point]
            await copy(leader, follower, point, parts)
            assert read_all(follower, "t", 0) == read_all(leader, "t", 0)
            await follower.catch_up_install(0, point, epochs, [("t", 0)])
            assert follower.journal_start(0) == follower.journal_end(0) == point
            assert follower.split_positions()[0] == point == follower.split_limit(0)
            assert follower.epoch_entries(0) == [(2, point)]
            assert follower.last_epoch(0) == 2
            assert follower.log_end_offset("t", 0) == 125
            assert journal_files(tmp_path / "follower") == [f"{point:020d}.journal"]
            # the journal goes on from the point with the leader's bytes
            for i in range(5):
                await leader.append("t", 0, build_batch([b"d%d" % i]), 1).written
            end = leader.journal_written_end(0)
            reader = JournalReader(str(tmp_path / "leader" / "journal" / "journal-0"))
            try:
                data = reader.read_raw(point, end, 1 << 20)
            finally:
                reader.close()
            assert await follower.append_replica(0, point, memoryview(data)) == end
            leader.set_split_limit(0, end)
            follower.set_split_limit(0, end)
            await settle(leader)
            await settle(follower)
            assert read_all(follower, "t", 0) == read_all(leader, "t", 0)
            assert follower.high_watermark("t", 0) == 130
            # producer state came with the batches as with split ones (none idempotent here)
            assert follower.active_producers("t", 0) == leader.active_producers("t", 0)
        finally:
            await leader.close()
            await follower.close()
        again = start(tmp_path / "follower")  # a clean restart keeps all of it
        try:
            assert again.journal_start(0) == point and again.journal_written_end(0) == end
            assert again.high_watermark("t", 0) == 130
            assert again.epoch_entries(0) == [(2, point)]
        finally:
            await again.close()

    run(scenario())


def test_a_copy_refuses_corrupt_batches_and_batches_past_the_point(tmp_path: Path) -> None:
    async def scenario() -> None:
        leader, follower, _ = await behind(tmp_path)
        try:
            point, _, parts = leader.catch_up_point(0)
            (_, _, _, end) = parts[0]
            await follower.catch_up_prepare(0)
            bad = bytearray(leader.read("t", 0, 5, 700).data)
            bad[70] ^= 0xFF  # inside the first batch's records
            with pytest.raises(StorageError, match="CRC"):
                await follower.catch_up_append("t", 0, bytes(bad), end, point)
            with pytest.raises(StorageError, match="past"):  # a batch across the end given
                await follower.catch_up_append("t", 0, leader.read("t", 0, 5, 700).data, 6, point)
            assert follower.high_watermark("t", 0) == 5  # nothing taken
            # from its last batch (offset 4): the same bytes as the leader's, or a divergence
            assert await follower.catch_up_last_batch("t", 0) == 4
            other = build_batch([b"not the leader's"])
            set_base_offset(other, 0, 4)
            assert parse_header(other).partition_leader_epoch != 1  # the leader's batch: 1
            rest = leader.read("t", 0, 5, 700).data
            with pytest.raises(StorageError, match="differs"):
                await follower.catch_up_append("t", 0, bytes(other) + bytes(rest), end, point)
            assert follower.high_watermark("t", 0) == 5
            # what the log holds is skipped, as a re-split skips it
            first = leader.read("t", 0, 0, 1 << 20).data
            assert await follower.catch_up_append("t", 0, first, end, point) == end
            assert read_all(follower, "t", 0) == read_all(leader, "t", 0)
        finally:
            await leader.close()
            await follower.close()

    run(scenario())


@pytest.mark.parametrize("deleted", [40, 3])
def test_a_caught_up_queue_log_takes_the_leaders_log_start(tmp_path: Path, deleted: int) -> None:
    """The leader deleted records up to ``deleted``: 40 is past this replica's end (5), so
    its queue log starts again there; 3 is below it, and the log start moved up to it (the
    deletion's log-start entry lies below the catch-up point, never fetched here: the copy
    kept log start 0 and the caught-up replica served the deleted records, also as a later
    leader and after a restart, an independent review)."""

    async def scenario() -> None:
        leader, follower, _ = await behind(tmp_path)
        try:
            assert follower.high_watermark("t", 0) == 5
            assert await delete_records(leader, "t", 0, deleted) == deleted
            point, epochs, parts = leader.catch_up_point(0)
            assert parts == [("t", 0, deleted, 125)]
            await copy(leader, follower, point, parts)
            assert follower.log_start_offset("t", 0) == deleted
            assert follower.high_watermark("t", 0) == 125
            await follower.catch_up_install(0, point, epochs, [("t", 0)])
            expected = read_all(leader, "t", 0, deleted)
        finally:
            await leader.close()
            await follower.close()
        again = start(tmp_path / "follower")
        try:
            assert again.log_start_offset("t", 0) == deleted
            assert again.high_watermark("t", 0) == 125
            header = parse_header(again.read("t", 0, deleted, 1 << 20).data)
            assert header.base_offset <= deleted < header.next_offset
            assert read_all(again, "t", 0, deleted) == expected
        finally:
            await again.close()

    run(scenario())


def test_a_leader_log_start_inside_the_replicas_last_batch(tmp_path: Path) -> None:
    """The leader deleted records up to 9, inside this replica's last batch (offsets 8 and
    9): the copy fetches from 9, gets that whole batch back and finds it held here already.
    It was refused as overlapping the log end, at every attempt, so the replica never
    caught up (an independent review)."""

    async def scenario() -> None:
        leader, follower, _ = await behind(tmp_path, records=2)
        try:
            assert follower.high_watermark("t", 0) == 10
            assert await delete_records(leader, "t", 0, 9) == 9
            point, epochs, parts = leader.catch_up_point(0)
            assert parts == [("t", 0, 9, 130)]
            await copy(leader, follower, point, parts)
            assert follower.log_start_offset("t", 0) == 9
            assert follower.high_watermark("t", 0) == 130
            await follower.catch_up_install(0, point, epochs, [("t", 0)])
            assert read_all(follower, "t", 0, 9) == read_all(leader, "t", 0, 9)
        finally:
            await leader.close()
            await follower.close()

    run(scenario())


@pytest.mark.parametrize(
    "where", ["queue checkpoint", "marker", "journal unlink", "split checkpoint"]
)
def test_a_crash_or_failure_on_either_side_of_the_marker(tmp_path: Path, where: str) -> None:
    """The install fails at one I/O call (the queue logs' checkpoint or the marker's rename:
    before the commit point; a journal segment's unlink or the split checkpoint's rename:
    after it) and the broker
    crashes: the next start holds the old journal (the copy resumes from the queue logs,
    which hold a prefix of the leader's, nothing twice) or finishes the install."""

    async def install() -> tuple[int, int, bytes]:
        leader, follower, early = await behind(tmp_path)
        point, epochs, parts = leader.catch_up_point(0)
        await copy(leader, follower, point, parts)
        expected = read_all(leader, "t", 0)
        await leader.close()
        plan = FaultPlan()
        if where == "queue checkpoint":
            plan.fail("replace", match="recovery-point-offset-checkpoint")
        elif where == "marker":
            plan.fail("replace", match=CATCH_UP_FILE)
        elif where == "journal unlink":
            plan.fail("unlink", match=f"{0:020d}.journal")
        else:
            # the install's queue flush writes it first: its second write is the finish's
            plan.fail("replace", match="split-position-checkpoint", after=1)
        previous = fileio.install(FaultyFileOps(plan))
        try:
            with pytest.raises(StorageError):
                await follower.catch_up_install(0, point, epochs, [("t", 0)])
        finally:
            fileio.install(previous)
        before = where in ("queue checkpoint", "marker")
        marker = tmp_path / "follower" / "journal" / "journal-0" / CATCH_UP_FILE
        assert marker.exists() == (not before)  # the commit point
        if not before:
            assert follower.journal_health()[0] == "offline"
        abandon(follower)  # and the broker crashes
        # review F12: ``storage check`` reports an install the next start finishes as
        # pending, not as damage (the old segments and the one at P are not a hole)
        root = tmp_path / "follower"
        report = check_storage(str(root / "journal"), str(root / "queues"))
        assert report.ok, report.defects
        pending = f"journal-0: catch-up install to journal position {point} pending"
        assert [n for n in report.notes if n.startswith(pending)] == (
            [] if before else [f"{pending}: a start finishes it"]
        )
        return early, point, expected

    early, point, expected = run(install())

    async def restart() -> None:
        again = start(tmp_path / "follower")
        try:
            root = tmp_path / "follower" / "journal" / "journal-0"
            assert not (root / CATCH_UP_FILE).exists()
            assert read_all(again, "t", 0) == expected  # every batch once, the leader's
            assert again.log_end_offset("t", 0) == 125
            if where in (
                "queue checkpoint",
                "marker",
            ):  # the old state: the copy starts again from the logs' ends
                assert again.journal_start(0) == 0 and again.journal_written_end(0) == early
                assert again.catch_up_queue(0, "t", 0) == (125, 0)
            else:  # finished by the start
                assert again.journal_start(0) == again.journal_written_end(0) == point
                assert again.split_positions()[0] == point
                # written at (2, point), then dropped by recovery's truncation from the end
                # of an empty journal, as Kafka's truncateFromEnd(log end) drops it: the
                # first fetched batch brings its epoch back
                assert (root / "leader-epoch-checkpoint").exists()
                assert again.epoch_entries(0) == [] and again.last_epoch(0) == -1
        finally:
            await again.close()

    run(restart())


# every assign and truncation writes the checkpoint file with fsyncs: an example took 1.4 s on
# a loaded disk (3 ms when hypothesis ran it again), past the default 200 ms deadline
@settings(deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 5000)), max_size=8),
    st.integers(0, 6000),
)
def test_the_epoch_history_at_the_point_is_kafkas_truncation_from_the_start(
    tmp_path_factory: Any, entries: list[tuple[int, int]], point: int
) -> None:
    """``catch_up_epochs`` = the leader's history cut at the point (entries after it go)
    then truncated from the start at it, as LeaderEpochCache does."""
    directory = tmp_path_factory.mktemp("epochs")
    cache = LeaderEpochCache(str(directory))
    for epoch, start_ in entries:
        cache.assign(epoch, start_)
    history = [(e.epoch, e.start) for e in cache.entries]
    cache.truncate_from_end(point + 1)
    cache.truncate_from_start(point)
    assert catch_up_epochs(history, point) == [(e.epoch, e.start) for e in cache.entries]


@pytest.mark.parametrize("where", [None, "queue checkpoint", "marker", "journal unlink"])
def test_a_power_loss_after_the_install_or_its_failure(tmp_path: Path, where: str | None) -> None:
    """The follower's files go through the power-loss model (only what fsyncs made durable
    survives) from before the copy: after an install that returned, the next start holds the
    whole copy and the journal at the point (the queue logs were durable before the marker,
    the marker before the journal was emptied); after an install that failed at one call, it
    holds the old journal and a prefix of the leader's queue log, or the finished install."""
    follower_root = tmp_path / "follower"

    async def install() -> tuple[int, int, bytes]:
        leader, follower, early = await behind(tmp_path)
        point, epochs, parts = leader.catch_up_point(0)
        expected = read_all(leader, "t", 0)
        await follower.flush()  # the model starts from what the follower made durable
        model = Durability([str(follower_root)])
        plan = FaultPlan()
        if where == "queue checkpoint":
            plan.fail("replace", match="recovery-point-offset-checkpoint")
        elif where == "marker":
            plan.fail("replace", match=CATCH_UP_FILE)
        elif where == "journal unlink":
            plan.fail("unlink", match=f"{0:020d}.journal")
        previous = fileio.install(FaultyFileOps(plan, model))
        try:
            await copy(leader, follower, point, parts)
            await leader.close()
            if where is None:
                await follower.catch_up_install(0, point, epochs, [("t", 0)])
            else:
                with pytest.raises(StorageError):
                    await follower.catch_up_install(0, point, epochs, [("t", 0)])
            abandon(follower)
        finally:
            fileio.install(previous)
        model.power_loss()
        return early, point, expected

    early, point, expected = run(install())

    async def restart() -> None:
        again = start(follower_root)
        try:
            held = read_all(again, "t", 0)
            if where in ("queue checkpoint", "marker"):
                assert expected.startswith(held) and len(held) > 0
                assert again.journal_start(0) == 0 and again.journal_written_end(0) == early
            else:
                assert held == expected
                assert again.journal_start(0) == again.journal_written_end(0) == point
                assert again.split_positions()[0] == point
        finally:
            await again.close()

    run(restart())


def test_a_cancel_during_a_copy_write_publishes_once_the_thread_wrote(tmp_path: Path) -> None:
    """Review F1: the attempt is cancelled (a leader change, a shutdown) while a copy write
    is in its thread (held there by the fault layer): the cancel waits for that write and
    publishes it before it goes on, so no other writer starts at a stale size; the queue log
    then holds the leader's batches once each, in the running broker, in ``storage check``
    and after a restart's recovery."""
    follower_root = tmp_path / "follower"

    async def scenario() -> bytes:
        plan = FaultPlan()  # from the start: it knows every descriptor's file
        previous = fileio.install(FaultyFileOps(plan))
        hold = threading.Event()
        leader, follower, _ = await behind(tmp_path)
        try:
            point, _, parts = leader.catch_up_point(0)
            (_, _, _, end) = parts[0]
            await follower.catch_up_prepare(0)
            data = leader.read("t", 0, 5, 700).data
            queue_dir = str(follower_root / "queues" / "t-0")
            rule = plan.fail("pwritev", match=queue_dir, hold=hold)
            try:
                task = asyncio.ensure_future(follower.catch_up_append("t", 0, data, end, point))
                assert await asyncio.to_thread(rule.entered.wait, 10)
                task.cancel()
                await asyncio.sleep(0.1)
                assert not task.done()  # the thread still writes: not published, not over
                assert follower.log_end_offset("t", 0) == 5
                with pytest.raises(StorageError, match="in flight"):  # no second writer
                    await follower.catch_up_append("t", 0, data, end, point)
                hold.set()
                with pytest.raises(asyncio.CancelledError):
                    await task
            finally:
                hold.set()
            offset = follower.log_end_offset("t", 0)
            assert offset > 5  # what the thread wrote is published
            while offset < end:  # the copy goes on from there: nothing overlaps
                offset = await follower.catch_up_append(
                    "t", 0, leader.read("t", 0, offset, 700).data, end, point
                )
            expected = read_all(leader, "t", 0)
            assert read_all(follower, "t", 0) == expected
            follower.catch_up_end(0)
            return expected
        finally:
            await leader.close()
            await follower.close()
            fileio.install(previous)

    expected = run(scenario())
    report = check_storage(str(follower_root / "journal"), str(follower_root / "queues"))
    assert report.ok, report.defects
    (summary,) = [q for q in report.queue_logs if q.name == "t-0"]
    assert summary.next_offset == 125

    async def restart() -> None:
        again = start(follower_root)
        try:
            assert read_all(again, "t", 0) == expected
            assert again.log_end_offset("t", 0) == 125
        finally:
            await again.close()

    run(restart())


def test_an_attempt_is_the_only_writer_of_its_queue_logs(tmp_path: Path) -> None:
    """Review F2: from catch_up_prepare to the attempt's end the storage refuses a second
    attempt, replica appends, truncations and split-limit moves for the journal partition
    (another fetcher's, or the old fetcher's after a leader change); a copy without a
    prepared attempt is refused; after catch_up_end the journal is fetched again."""

    async def scenario() -> None:
        leader, follower, early = await behind(tmp_path)
        try:
            point, _, parts = leader.catch_up_point(0)
            (_, _, _, end) = parts[0]
            data = leader.read("t", 0, 5, 700).data
            with pytest.raises(StorageError, match="no catch-up"):
                await follower.catch_up_append("t", 0, data, end, point)
            with pytest.raises(StorageError, match="no catch-up"):
                await follower.catch_up_restart_queue("t", 0, 40)
            await follower.catch_up_prepare(0)
            assert follower.catch_up_active(0) and not follower.catch_up_active(1)
            with pytest.raises(StorageError, match="under way"):
                await follower.catch_up_prepare(0)
            with pytest.raises(StorageError, match="under way"):  # refused before reading
                await follower.append_replica(0, early, memoryview(b""))
            with pytest.raises(StorageError, match="under way"):
                await follower.truncate_replica(0, early)
            limit = follower.split_limit(0)
            follower.set_split_limit(0, limit + 1000)
            assert follower.split_limit(0) == limit  # not moved
            assert follower.journal_written_end(0) == early
            await follower.catch_up_append("t", 0, data, end, point)
            follower.catch_up_end(0)
            assert not follower.catch_up_active(0)
            await follower.catch_up_prepare(0)  # a new attempt may start
            follower.catch_up_end(0)
            # taken again: an (empty) replica append, a truncation, a split-limit move
            assert await follower.append_replica(0, early, memoryview(b"")) == early
            assert await follower.truncate_replica(0, early) == 0
            follower.set_split_limit(0, limit + 1)
            assert follower.split_limit(0) == limit + 1
        finally:
            await leader.close()
            await follower.close()

    run(scenario())


def test_the_last_batch_recompressed_another_way_is_the_same_batch(tmp_path: Path) -> None:
    """Review F3: replicas recompress to the topic's codec themselves, so the follower's
    last batch and the leader's may hold the same records in other bytes (compression.type
    changed, another codec library): what identifies a batch is compared, not its bytes.
    Another producer id at the same offsets is still a divergence."""

    async def scenario() -> None:
        leader, follower, _ = await behind(tmp_path)
        try:
            point, _, parts = leader.catch_up_point(0)
            (_, _, _, end) = parts[0]
            await follower.catch_up_prepare(0)
            assert await follower.catch_up_last_batch("t", 0) == 4
            theirs = leader.read("t", 0, 4, 1).data
            size = parse_header(theirs).size
            gzipped = recompress(theirs[:size], CODECS["gzip"])
            assert gzipped != bytes(theirs[:size]) and parse_header(gzipped).compression == 1
            other = bytearray(gzipped)
            struct.pack_into(">q", other, 43, 77)  # another producer id, CRC fixed below
            struct.pack_into(">I", other, 17, crc32c(memoryview(other)[21:]))
            rest = leader.read("t", 0, 5, 700).data
            with pytest.raises(StorageError, match="differs"):
                await follower.catch_up_append("t", 0, bytes(other) + bytes(rest), end, point)
            got = await follower.catch_up_append("t", 0, gzipped + bytes(rest), end, point)
            assert got > 5
            while got < end:
                got = await follower.catch_up_append(
                    "t", 0, leader.read("t", 0, got, 700).data, end, point
                )
            assert read_all(follower, "t", 0) == read_all(leader, "t", 0)
        finally:
            await leader.close()
            await follower.close()

    run(scenario())


def test_a_copy_accepts_increasing_offsets_with_a_gap_and_refuses_an_overlap(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Review F4: offsets missing in the leader's queue log (which its splitter accepts with
    a warning; Kafka's follower only requires increasing offsets) are accepted with a
    warning; a batch overlapping the log's end is refused."""

    async def scenario() -> None:
        leader, follower, _ = await behind(tmp_path)
        try:
            point, _, parts = leader.catch_up_point(0)
            (_, _, _, end) = parts[0]
            await follower.catch_up_prepare(0)
            later = leader.read("t", 0, 7, 700).data  # starts past the follower's end, 5
            assert parse_header(later).base_offset == 7
            overlapping = bytearray(later[: parse_header(later).size])
            set_base_offset(overlapping, 0, 4)  # 4..5 over the log's end, 5
            struct.pack_into(">I", overlapping, 17, crc32c(memoryview(overlapping)[21:]))
            with pytest.raises(StorageError, match="overlaps"):
                await follower.catch_up_append("t", 0, bytes(overlapping), end, point)
            assert follower.log_end_offset("t", 0) == 5
            with caplog.at_level(logging.WARNING, logger="stonemq"):
                got = await follower.catch_up_append("t", 0, later, end, point)
            assert got > 7
            assert "offsets 5..6 missing" in caplog.text
            while got < end:
                got = await follower.catch_up_append(
                    "t", 0, leader.read("t", 0, got, 700).data, end, point
                )
            held = [h.base_offset for _, h in iter_batches(read_all(follower, "t", 0))]
            assert 5 not in held and 6 not in held and 7 in held
            assert read_all(follower, "t", 0, 7) == read_all(leader, "t", 0, 7)
        finally:
            await leader.close()
            await follower.close()

    run(scenario())


def test_an_emptied_queue_log_stays_empty_after_a_power_loss(tmp_path: Path) -> None:
    """Review F5: emptying a queue log for the leader's later log start unlinks its segments
    and producer snapshots and fsyncs the directory (in a thread): after a power loss (the
    fault model's durability) none of them is back."""
    follower_root = tmp_path / "follower"
    queue_dir = follower_root / "queues" / "t-0"

    async def scenario() -> None:
        leader, follower, _ = await behind(tmp_path)
        try:
            assert await delete_records(leader, "t", 0, 40) == 40
            await follower.close()  # a clean stop: a producer snapshot, all durable
            follower = start(follower_root)
            assert any(n.endswith(".snapshot") for n in os.listdir(queue_dir))
            model = Durability([str(follower_root)])
            previous = fileio.install(FaultyFileOps(FaultPlan(), model))
            try:
                await follower.catch_up_prepare(0)
                await follower.catch_up_restart_queue("t", 0, 40)
                assert follower.log_end_offset("t", 0) == 40
                abandon(follower)
            finally:
                fileio.install(previous)
            model.power_loss()
            left = [n for n in os.listdir(queue_dir) if n.endswith((".log", ".snapshot"))]
            assert left == []
        finally:
            await leader.close()

    run(scenario())


@pytest.mark.parametrize("held", ["recovery-point-offset-checkpoint", CATCH_UP_FILE])
def test_become_leader_waits_for_an_install_which_rechecks_under_the_lock(
    tmp_path: Path, held: str
) -> None:
    """Review F6: become_leader (an unclean election of this out-of-ISR replica) during an
    install waits for it; an install not yet at its commit point (held at the queue logs'
    checkpoint) sees the leadership under the checkpoint lock and leaves the old state; one
    past it (held at the marker's rename) finishes, and the new epoch starts at P."""

    async def scenario() -> None:
        plan = FaultPlan()
        previous = fileio.install(FaultyFileOps(plan))
        hold = threading.Event()
        leader, follower, early = await behind(tmp_path)
        try:
            point, epochs, parts = leader.catch_up_point(0)
            await copy(leader, follower, point, parts)
            rule = plan.fail("replace", match=held, hold=hold)
            install = asyncio.ensure_future(follower.catch_up_install(0, point, epochs, [("t", 0)]))
            assert await asyncio.to_thread(rule.entered.wait, 10)
            elected = asyncio.ensure_future(follower.become_leader(0, 3))
            await asyncio.sleep(0.1)
            assert not elected.done()  # waits for the install
            hold.set()
            if held == CATCH_UP_FILE:
                await install
                await elected
                assert follower.journal_start(0) == point
                assert follower.epoch_entries(0)[-1] == (3, point)
            else:
                with pytest.raises(StorageError, match="led here"):
                    await install
                await elected
                assert follower.journal_start(0) == 0
                assert follower.epoch_entries(0)[-1] == (3, early)
            assert not (tmp_path / "follower" / "journal" / "journal-0" / CATCH_UP_FILE).exists()
        finally:
            hold.set()
            await leader.close()
            await follower.close()
            fileio.install(previous)

    run(scenario())


def test_the_splitter_never_stages_into_a_queue_log_another_writer_writes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Review F2, defensively: should an attempt end (catch_up_end) while its copy write is
    still in its thread (a caller's bug: the attempt's own end waits for it), the splitter,
    given journal entries for that queue log, skips its step (logged) instead of writing at
    the published size, and splits once the write is published: every batch once."""

    async def scenario() -> None:
        plan = FaultPlan()
        previous = fileio.install(FaultyFileOps(plan))
        hold = threading.Event()
        leader, follower = start(tmp_path / "leader"), start(tmp_path / "follower")
        try:
            await leader.become_leader(0, 1)
            for i in range(10):
                await leader.append("t", 0, build_batch([b"a%03d" % i * 40]), 1).written
            end = leader.journal_written_end(0)
            leader.set_split_limit(0, end)
            await settle(leader)
            reader = JournalReader(str(tmp_path / "leader" / "journal" / "journal-0"))
            try:
                data = reader.read_raw(0, end, 1 << 20)
            finally:
                reader.close()
            assert await follower.append_replica(0, 0, memoryview(data)) == end  # not split
            await follower.catch_up_prepare(0)
            queue_dir = str(tmp_path / "follower" / "queues" / "t-0")
            rule = plan.fail("pwritev", match=queue_dir, hold=hold)
            copied = asyncio.ensure_future(
                follower.catch_up_append("t", 0, leader.read("t", 0, 0, 1 << 20).data, 10, end)
            )
            assert await asyncio.to_thread(rule.entered.wait, 10)
            follower.catch_up_end(0)  # too early: the write is in its thread
            with caplog.at_level(logging.ERROR, logger="stonemq"):
                follower.set_split_limit(0, end)
                await asyncio.sleep(0.2)
                assert caplog.text.count("being written by another writer") == 1  # once
            assert follower.split_positions()[0] == 0  # skipped, not split past
            hold.set()
            assert await copied == 10
            await settle(follower)
            assert follower.split_positions()[0] == end
            assert read_all(follower, "t", 0) == read_all(leader, "t", 0)
        finally:
            hold.set()
            await leader.close()
            await follower.close()
            fileio.install(previous)
        root = tmp_path / "follower"
        report = check_storage(str(root / "journal"), str(root / "queues"))
        assert report.ok, report.defects

    run(scenario())
