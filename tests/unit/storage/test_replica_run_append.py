"""A follower's fetched run written as one journal write with one completion
(``JournalLog.enqueue_run``, ``StorageEngine.append_replica``): the files hold exactly the
entries, no entry spans two segments, the run's one future answers for all of its entries,
and a write failing part way leaves the entries before it written with the topic partitions'
next offsets following them (and the rest fetched again from the journal's end)."""

from __future__ import annotations

import asyncio
import errno
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import OsFaults, add_topic, build_batch, new_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stonemq.storage.errors import StorageError
from stonemq.storage.journal import (
    JournalLog,
    JournalReader,
    decode_entries,
    encode_entry,
    encode_entry_header,
    list_segments,
)

TOPIC = uuid.UUID(int=7).bytes


def segment_entries(directory: str) -> list[list[bytes]]:
    """Each segment file's entries (raw bytes), checking that each file holds whole ones."""
    out = []
    for base in list_segments(directory):
        with open(os.path.join(directory, f"{base:020d}.journal"), "rb") as fh:
            data = fh.read()
        entries, used = decode_entries(memoryview(data), base, verify=True)
        assert used == len(data), "a segment ends inside an entry"
        out.append([data[e.position - base : e.end - base] for e in entries])
    return out


def entry(n: int, size: int) -> bytes:
    batch = bytes([n % 251]) * size
    return encode_entry(TOPIC, n % 3, n, 1, batch)


# a group: ("one", batch size) queued with enqueue, or ("run", [batch sizes]) with enqueue_run
group_st = st.one_of(
    st.tuples(st.just("one"), st.integers(0, 300)),
    st.tuples(st.just("run"), st.lists(st.integers(0, 300), min_size=1, max_size=12)),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    groups=st.lists(group_st, min_size=1, max_size=10),
    segment_bytes=st.integers(100, 2000),
    policy=st.sampled_from(["interval", "always"]),
    yields=st.lists(st.booleans(), min_size=10, max_size=10),
)
def test_runs_and_single_entries_are_written_in_order_whole_in_their_segments(
    tmp_path_factory: pytest.TempPathFactory,
    groups: list[tuple[str, Any]],
    segment_bytes: int,
    policy: str,
    yields: list[bool],
) -> None:
    directory = str(tmp_path_factory.mktemp("journal") / "journal-0")

    async def scenario() -> None:
        journal = JournalLog(directory, 0, segment_bytes=segment_bytes, flush_policy=policy)
        journal.open()
        expected: list[bytes] = []
        waits: list[tuple[asyncio.Future[None], int]] = []  # (future, journal end after it)
        loop = asyncio.get_running_loop()
        n = 0
        for (kind, spec), pause in zip(groups, yields, strict=False):
            done: asyncio.Future[None] = loop.create_future()
            if kind == "one":
                raw = entry(n, spec)
                n += 1
                journal.enqueue(raw[:41], raw[41:], (done, None, -1, len(raw)))
                expected.append(raw)
            else:
                raws = [entry(n + i, size) for i, size in enumerate(spec)]
                n += len(raws)
                data = b"".join(raws)
                journal.enqueue_run(memoryview(data), [len(r) for r in raws], done, len(data))
                expected.extend(raws)
            waits.append((done, sum(map(len, expected))))
            if pause:
                await asyncio.sleep(0)
        ends = []
        for done, end in waits:
            await done  # one completion per group, resolved once all of it is written
            ends.append((journal.written_end >= end, done.result()))
        await journal.drain()
        assert all(ok and result is None for ok, result in ends)
        assert journal.written_end == sum(map(len, expected))
        assert journal.queued_bytes == 0
        journal.close()

    asyncio.run(asyncio.wait_for(scenario(), 10))
    files = segment_entries(directory)
    assert [raw for seg in files for raw in seg] == expected_entries(groups)
    for seg in files[:-1]:  # a segment is only left for an entry that would not fit
        assert len(seg) >= 1
    # and the reader gives the same bytes back
    total = sum(map(len, expected_entries(groups)))
    assert read_journal(directory, total) == b"".join(expected_entries(groups))


def read_journal(directory: str, end: int) -> bytes:
    """The journal's bytes up to ``end``, read as a follower's fetches read them (one
    segment at most per read)."""
    reader = JournalReader(directory)
    got, pos = [], 0
    while pos < end:
        chunk = reader.read_raw(pos, end, end)
        assert chunk
        got.append(bytes(chunk))
        pos += len(chunk)
    reader.close()
    return b"".join(got)


def expected_entries(groups: list[tuple[str, Any]]) -> list[bytes]:
    out, n = [], 0
    for kind, spec in groups:
        sizes = [spec] if kind == "one" else spec
        for size in sizes:
            out.append(entry(n, size))
            n += 1
    return out


def test_an_empty_run_piece_is_the_only_padding(tmp_path: Path) -> None:
    """enqueue_run's queued bytes and its header piece: nothing but the entries is written
    (the header encoder is the one the format defines)."""
    raw = entry(0, 10)
    assert raw[:41] == encode_entry_header(TOPIC, 0, 0, 1, raw[41:])

    async def scenario() -> None:
        journal = JournalLog(str(tmp_path / "j"), 0, segment_bytes=1 << 20, flush_policy="interval")
        journal.open()
        done = asyncio.get_running_loop().create_future()
        journal.enqueue_run(memoryview(raw * 3), [len(raw)] * 3, done, 3 * len(raw))
        assert journal.queued_bytes == 3 * len(raw)
        await done
        assert journal.written_end == 3 * len(raw) and journal.queued_bytes == 0
        journal.close()

    asyncio.run(scenario())
    assert (tmp_path / "j" / f"{0:020d}.journal").read_bytes() == raw * 3


def leader_journal(root: Path, batches: int, segment_bytes: int) -> bytes:
    """A leader's journal bytes: ``batches`` one-record batches over two topic partitions."""

    async def scenario() -> bytes:
        leader = new_engine(root, replicated=True, journal_segment_bytes=segment_bytes)
        add_topic(leader, partitions=4)  # partitions 0 and 2 on journal partition 0
        leader.recover()
        leader.start(lambda *a: None)
        try:
            await leader.become_leader(0, 1)
            for i in range(batches):
                await leader.append("t", 2 * (i % 2), build_batch([b"v%03d" % i]), 1).written
            end = leader.journal_written_end(0)
        finally:
            await leader.close()
        return read_journal(str(root / "journal" / "journal-0"), end)

    return asyncio.run(scenario())


@pytest.mark.parametrize("policy", ["never", "always"])
def test_a_run_failing_part_way_keeps_what_was_written_and_its_next_offsets(
    tmp_path: Path, os_faults: OsFaults, policy: str
) -> None:
    segment_bytes = 1000  # entries of ~110 bytes: several segments per run
    data = leader_journal(tmp_path / "leader", 40, segment_bytes)
    entries, used = decode_entries(memoryview(data), 0)
    assert used == len(data) and len(entries) == 40
    leader_dir = str(tmp_path / "leader" / "journal" / "journal-0")

    async def scenario() -> None:
        follower = new_engine(
            tmp_path / "follower",
            replicated=True,
            journal_segment_bytes=segment_bytes,
            flush_policy=policy,
        )
        add_topic(follower, partitions=4)
        follower.recover()
        follower.start(lambda *a: None)
        try:
            first = memoryview(data)[: entries[9].end]
            assert await follower.append_replica(0, 0, first) == entries[9].end
            # the next run: its write into the second segment it starts fails for lack of
            # space, after the entries before that segment were written
            later = [b for b in list_segments(leader_dir) if b > entries[9].end]
            os_faults.fail("pwritev", f"{later[1]:020d}.journal", errno.ENOSPC)
            rest = memoryview(data)[entries[9].end :]
            with pytest.raises(StorageError):
                await follower.append_replica(0, entries[9].end, rest)
            end = follower.journal_end(0)
            assert end == follower.journal_written_end(0)
            whole = [e for e in entries if e.end <= end]
            assert whole[-1].end == end == later[1] and len(whole) < len(entries)
            # the next offsets follow exactly the entries in the file
            for p in (0, 2):
                mine = [e for e in whole if e.partition == p]
                assert follower.log_end_offset("t", p) == mine[-1].base_offset + 1
            # the next fetch starts at the journal's end and brings the rest
            assert await follower.append_replica(0, end, memoryview(data)[end:]) == len(data)
            assert follower.log_end_offset("t", 0) == 40 // 2
            assert follower.log_end_offset("t", 2) == 40 // 2
        finally:
            await follower.close()

    asyncio.run(asyncio.wait_for(scenario(), 20))
    assert os_faults.seen  # the fault did happen
    follower_dir = str(tmp_path / "follower" / "journal" / "journal-0")
    assert segment_entries(follower_dir) == segment_entries(leader_dir)


def test_a_cancelled_fetch_still_has_its_next_offsets_once_written(tmp_path: Path) -> None:
    """The fetcher is cancelled while its run is being written (a leadership change): the
    write goes on, and the next offsets follow it, as a new leader needs."""
    data = leader_journal(tmp_path / "leader", 12, 1 << 20)

    async def scenario() -> None:
        follower = new_engine(tmp_path / "follower", replicated=True)
        add_topic(follower, partitions=4)
        follower.recover()
        follower.start(lambda *a: None)
        try:
            entries, _ = decode_entries(memoryview(data), 0)
            first = entries[1].end  # the epoch is checkpointed with these
            assert await follower.append_replica(0, 0, memoryview(data)[:first]) == first
            rest = memoryview(data)[first:]
            task = asyncio.ensure_future(follower.append_replica(0, first, rest))
            await asyncio.sleep(0)  # the run is queued; the write is the next loop step
            assert follower.journal_written_end(0) == first < follower.journal_end(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(20):
                await asyncio.sleep(0.005)
            assert follower.journal_written_end(0) == len(data)
            assert follower.log_end_offset("t", 0) == 6
            assert follower.log_end_offset("t", 2) == 6
        finally:
            await follower.close()

    asyncio.run(asyncio.wait_for(scenario(), 10))
