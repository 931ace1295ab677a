"""A follower's cold log-start move (stonemq/tiering/service.py ``TierService.on_log_start``,
its leader's DeleteRecords on a tiered partition) that fails is tried again, backing off, until
it is made; nothing else would move that replica's archive start (an independent review: a
failure was only logged). The store's move itself (``delete_records``) fails on cue here: what
is under test is the retry around it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from stonemq.config import Settings
from stonemq.tiering import service
from stonemq.tiering.service import TierService


def _tier(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    calls: list[tuple[str, int, int]],
    failures: int,
) -> TierService:
    """A TierService whose every topic tiers and whose store move records each call in
    ``calls`` and fails while ``calls`` holds at most ``failures`` of them."""
    tier = TierService(Settings(data_dir=tmp_path), topics=None)
    monkeypatch.setattr(tier, "tiered", lambda topic: True)

    def delete_records(topic: str, partition: int, offset: int) -> asyncio.Future[None]:
        calls.append((topic, partition, offset))
        future = asyncio.get_running_loop().create_future()
        if len(calls) <= failures:
            future.set_exception(OSError("store unreachable"))
        else:
            future.set_result(None)
        return future

    monkeypatch.setattr(tier, "delete_records", delete_records)
    return tier


def test_a_failed_cold_move_is_tried_again_until_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "COLD_MOVE_RETRY_S", 0.01)
    calls: list[tuple[str, int, int]] = []
    tier = _tier(tmp_path, monkeypatch, calls, failures=3)  # the store unreachable 3 times

    async def scenario() -> None:
        tier.on_log_start("t", 0, 50)
        for _ in range(200):
            if len(calls) >= 4:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # made: no further attempt
        assert calls == [("t", 0, 50)] * 4
        # a move still failing when the broker stops is not tried after it
        calls.clear()
        monkeypatch.setattr(service, "COLD_MOVE_RETRY_S", 0.2)
        tier.on_log_start("t", 1, 7)
        await asyncio.sleep(0.05)
        await tier.close()
        await asyncio.sleep(0.3)
        assert calls == [("t", 1, 7)]

    asyncio.run(scenario())


def test_a_move_met_before_the_broker_runs_is_made_once_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recovery's re-split applies log-start entries before the event loop runs: their
    moves were dropped, so a replica restarted after its leader's DeleteRecords kept the
    deleted records in its archive (an independent review). They are kept, the largest
    offset per partition, and made when the service starts."""
    calls: list[tuple[str, int, int]] = []
    tier = _tier(tmp_path, monkeypatch, calls, failures=0)
    tier.on_log_start("t", 0, 5)  # no loop running: recovery
    tier.on_log_start("t", 0, 9)
    tier.on_log_start("t", 1, 3)
    assert calls == []

    async def scenario() -> None:
        tier.start()
        try:
            assert sorted(calls) == [("t", 0, 9), ("t", 1, 3)]
        finally:
            await tier.close()

    asyncio.run(scenario())
