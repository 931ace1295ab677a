"""The follower's fetcher (stonemq/replication/fetcher.py) on a real follower StorageEngine:
the leader's HW reaches the splitter within ``SPLIT_DELAY_S`` (the HWs reported meanwhile
held together), at once when it is ``splitter.batch.bytes`` ahead or when the held limits
are applied (before a truncation, a catch-up, a close); and a failed catch-up attempt is
tried again after ``replica.fetch.backoff.ms``, as Kafka's fetcher delays a failed
partition. The manager around the fetcher is reduced to what these paths read (its
storage, settings and routing); the fetcher and the storage are the real ones."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from conftest import add_topic, build_batch, new_engine, started_leader, wait_hw

from stonemq.config import Settings
from stonemq.replication.fetcher import SPLIT_DELAY_S, LeaderFetcher
from stonemq.storage.journal import JournalReader, decode_entries


async def leader_entries(root: Path, batches: int) -> bytes:
    leader = await started_leader(root)
    try:
        for i in range(batches):
            await leader.append("t", 0, build_batch([b"v%03d" % i]), 1).written
        end = leader.journal_written_end(0)
    finally:
        await leader.close()
    data = JournalReader(str(root / "journal" / "journal-0")).read_raw(0, end, 1 << 20)
    assert len(data) == end
    return data


def test_the_leaders_hw_reaches_the_follower_splitter_within_the_split_delay(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        data = await leader_entries(tmp_path / "leader", 8)
        entries, _ = decode_entries(memoryview(data), 0)
        size = entries[0].size
        assert all(e.size == size for e in entries)
        ends = [e.end for e in entries]
        follower = new_engine(tmp_path / "follower", replicated=True)
        add_topic(follower, partitions=2)
        follower.recover()
        follower.start(lambda *a: None)
        settings = Settings(splitter_batch_bytes=3 * size)
        fetcher = LeaderFetcher(SimpleNamespace(storage=follower, settings=settings), 1)
        try:
            assert await follower.append_replica(0, 0, memoryview(data)) == len(data)
            # two HWs less than splitter.batch.bytes ahead: held, then applied together
            held_at = time.monotonic()
            fetcher._advance_split(0, ends[0])
            fetcher._advance_split(0, ends[1])
            assert follower.split_limit(0) == 0
            await asyncio.sleep(SPLIT_DELAY_S / 4)
            if time.monotonic() - held_at < SPLIT_DELAY_S:  # a loaded machine may oversleep it
                assert follower.split_limit(0) == 0 and follower.high_watermark("t", 0) == 0
            await wait_hw(follower, 2)
            assert time.monotonic() - held_at >= SPLIT_DELAY_S * 0.9
            assert follower.split_limit(0) == ends[1]
            # splitter.batch.bytes ahead of the splitter's limit: at once
            fetcher._advance_split(0, ends[4])
            # handed over before any await, no hold armed (the split's own time is not bounded
            # here: beside a CI run it took 28 ms, past the 10 ms delay)
            assert follower.split_limit(0) == ends[4] and fetcher._split_timer is None
            await wait_hw(follower, 5)
            # held again, then applied at once (what a truncation, a catch-up, a close do)
            fetcher._advance_split(0, ends[5])
            assert follower.split_limit(0) == ends[4]
            fetcher.apply_split_limits()
            assert follower.split_limit(0) == ends[5]
            await wait_hw(follower, 6)
            # a HW below what is held never moves the limit back
            fetcher._advance_split(0, ends[7])
            fetcher._advance_split(0, ends[6])
            await asyncio.sleep(SPLIT_DELAY_S * 2)
            assert follower.split_limit(0) == ends[7]
            await wait_hw(follower, 8)
        finally:
            await fetcher.close()
            await follower.close()

    asyncio.run(asyncio.wait_for(scenario(), 20))


class _Routing:
    """Routing as a follower of journal partition 3 (local 0) led by broker 1, whose
    endpoint is not known (it is not live): a catch-up attempt fails at once."""

    def local_index(self, journal: int) -> int | None:
        return 0 if journal == 3 else None

    def leadership(self, journal: int) -> Any:
        return SimpleNamespace(leader=1, leader_epoch=4)

    def broker(self, broker_id: int) -> Any:
        return None


def test_a_failed_catch_up_is_tried_again_after_the_fetch_back_off(tmp_path: Path) -> None:
    async def attempt(backoff_ms: int) -> None:
        settings = Settings(replica_fetch_backoff_ms=backoff_ms)
        manager = SimpleNamespace(
            settings=settings, routing=_Routing(), behind_start={3: (0, 9)}, storage=None
        )
        fetcher = LeaderFetcher(manager, 1)  # type: ignore[arg-type]
        fetcher.set_partitions([3])
        started = time.monotonic()
        fetcher._start_catch_up(3)
        assert fetcher._paused[3] == float("inf")  # not fetched while it runs
        await fetcher._catch_ups[3]
        failed = time.monotonic()
        assert 3 not in fetcher._catch_ups and 3 not in manager.behind_start
        # fetched again (and so caught up again) one back-off after the failure
        assert started + backoff_ms / 1000 <= fetcher._paused[3] <= failed + backoff_ms / 1000

    async def scenario() -> None:
        await attempt(300)
        await attempt(0)
        await attempt(1000)  # Kafka's default

    asyncio.run(asyncio.wait_for(scenario(), 10))
