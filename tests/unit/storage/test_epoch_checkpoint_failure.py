"""A leader-epoch checkpoint that cannot be written (stonemq/storage/leader_epoch.py and its
callers in the engine and the replica manager): the history in memory stays what the file
holds, the journal partition goes offline as Kafka's log directory does, and the replica
manager neither leads an offline copy nor retries a failed election in a tight loop.

Real files with real ``os`` calls failing (the ``os_faults`` fixture); the ReplicaManager is the
real one, routing reduced to what ``reconcile`` reads. Also the manager across epochs: an
ISR write refused for an old epoch leaves a newer leadership alone."""

from __future__ import annotations

import asyncio
import errno
import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import OsFaults, add_topic, build_batch, new_engine, started_leader

from stonemq.config import Settings
from stonemq.replication.manager import BECOME_LEADER_RETRY_S, ReplicaManager
from stonemq.storage.engine import StorageError
from stonemq.storage.health import Health
from stonemq.storage.journal import JournalReader
from stonemq.storage.leader_epoch import LeaderEpochCache

EPOCH_TMP = "leader-epoch-checkpoint.tmp"


def run(coro: object) -> object:
    return asyncio.run(asyncio.wait_for(coro, 10))  # type: ignore[arg-type]


def test_a_failed_write_changes_neither_the_file_nor_memory(
    tmp_path: Path, os_faults: OsFaults
) -> None:
    cache = LeaderEpochCache(str(tmp_path))
    cache.assign(1, 0)
    cache.assign(2, 100)
    for change in (
        lambda: cache.assign(3, 200),
        lambda: cache.truncate_from_end(100),
        lambda: cache.truncate_from_start(150),
    ):
        os_faults.fail("open", EPOCH_TMP, errno.EIO)
        with pytest.raises(OSError):
            change()
        assert [(e.epoch, e.start) for e in cache.entries] == [(1, 0), (2, 100)]
        assert LeaderEpochCache(str(tmp_path)).entries == cache.entries
    # the same change, tried again, is written (memory did not take it: nothing skipped)
    assert cache.assign(3, 200)
    assert [(e.epoch, e.start) for e in LeaderEpochCache(str(tmp_path)).entries] == [
        (1, 0),
        (2, 100),
        (3, 200),
    ]


def test_a_leader_whose_epoch_cannot_be_written_goes_offline(
    tmp_path: Path, os_faults: OsFaults
) -> None:
    async def scenario() -> None:
        engine = await started_leader(tmp_path)
        try:
            await engine.append("t", 0, build_batch([b"a"]), 1).written
            os_faults.fail("open", EPOCH_TMP, errno.EIO)
            with pytest.raises(StorageError, match="leader-epoch checkpoint"):
                await engine.become_leader(0, 2)
            assert engine._journals[0].health.state is Health.OFFLINE
            assert engine.epoch_entries(0) == [(1, 0)]
            # led again (the retry that used to succeed, appending in an epoch only memory
            # held): refused, the copy is offline
            with pytest.raises(StorageError, match="offline"):
                await engine.become_leader(0, 2)
            assert engine.epoch_entries(0) == [(1, 0)]
            journal_dir = str(tmp_path / "journal" / "journal-0")
            assert [(e.epoch, e.start) for e in LeaderEpochCache(journal_dir).entries] == [(1, 0)]
        finally:
            await engine.close()

    run(scenario())


def test_a_follower_whose_new_epoch_cannot_be_written_goes_offline(
    tmp_path: Path, os_faults: OsFaults
) -> None:
    async def scenario() -> None:
        leader = await started_leader(tmp_path / "leader")
        follower = new_engine(tmp_path / "follower", replicated=True)
        add_topic(follower, partitions=2)
        follower.recover()
        follower.start(lambda *a: None)
        try:
            await leader.append("t", 0, build_batch([b"a", b"b"]), 2).written
            end = leader.journal_written_end(0)
            data = JournalReader(str(tmp_path / "leader" / "journal" / "journal-0")).read_raw(
                0, end, 1 << 20
            )
            os_faults.fail("open", f"follower/journal/journal-0/{EPOCH_TMP}", errno.EIO)
            with pytest.raises(StorageError, match="leader-epoch checkpoint"):
                await follower.append_replica(0, 0, memoryview(data))
            assert follower._journals[0].health.state is Health.OFFLINE
            assert follower.journal_end(0) == 0 and follower.epoch_entries(0) == []
            with pytest.raises(StorageError):  # nothing taken while offline
                await follower.append_replica(0, 0, memoryview(data))
            assert follower.journal_end(0) == 0
        finally:
            await leader.close()
            await follower.close()

    run(scenario())


class _Routing(SimpleNamespace):
    """Journal partition 0 hosted here and led by this broker (0) in ``epoch``."""

    def __init__(self, epoch: int) -> None:
        super().__init__(client=SimpleNamespace(client_id=None), on_change=None, epoch=epoch)

    def hosted(self) -> list[int]:
        return [0]

    def leadership(self, journal: int) -> SimpleNamespace:
        return SimpleNamespace(leader=0, leader_epoch=self.epoch, isr=(0, 1), replicas=(0, 1))

    def local_index(self, journal: int) -> int:
        return journal

    def journal_of(self, local: int) -> int:
        return local


def test_the_manager_retries_a_failed_election_after_a_pause_and_never_leads_offline(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        engine = await started_leader(tmp_path)
        calls: list[int] = []
        real = engine.become_leader

        async def failing(j: int, epoch: int) -> None:  # a defect, not an I/O error
            calls.append(epoch)
            raise RuntimeError("injected")

        engine.become_leader = failing  # type: ignore[method-assign]
        manager = ReplicaManager(0, _Routing(2), engine, Settings())  # type: ignore[arg-type]
        manager.start()
        try:
            await asyncio.sleep(BECOME_LEADER_RETRY_S / 2)
            assert calls == [2]  # not again at once (it looped on the event loop)
            await asyncio.sleep(BECOME_LEADER_RETRY_S)
            assert calls == [2, 2]
            # the copy goes offline: no further attempt, whatever routing says
            engine.become_leader = real  # type: ignore[method-assign]
            manager._journal_offline(0)
            await asyncio.sleep(BECOME_LEADER_RETRY_S * 1.5)
            assert not manager.leads(0) and calls == [2, 2]
        finally:
            await manager.close()
            await engine.close()

    run(scenario())


class _StateNode:
    """ZooKeeper's state node of journal partition 0 for ``write_isr``: get and a conditional
    set, the set answered once ``release`` is set (a write in flight)."""

    def __init__(self, epoch: int) -> None:
        from stonemq.cluster.journal_state import PartitionState

        self.state = PartitionState(leader=0, leader_epoch=epoch, isr=(0, 1), controller_epoch=1)
        self.version = 0
        self.release = threading.Event()
        self.client_id = None

    def get(self, path: str) -> tuple[bytes, SimpleNamespace]:
        self.release.wait(10)
        return self.state.to_json(), SimpleNamespace(version=self.version)

    def set(self, path: str, data: bytes, version: int) -> None:
        from stonemq.cluster.journal_state import PartitionState

        self.state = PartitionState.from_json(data)
        self.version += 1


def test_a_refused_isr_write_of_an_old_epoch_leaves_the_new_leadership(tmp_path: Path) -> None:
    """An ISR change written for epoch 1 is still in flight when this broker is elected
    again in epoch 2: ZooKeeper's node names epoch 2, so the write is refused, and that
    refusal is the old leadership's, not the new one's (the manager resigned by journal id,
    dropping the leadership it had just taken)."""

    async def scenario() -> None:
        engine = await started_leader(tmp_path)
        routing = _Routing(1)
        node = _StateNode(1)
        routing.client = node
        manager = ReplicaManager(0, routing, engine, Settings())  # type: ignore[arg-type]
        manager.start()
        try:
            await wait_for_async(lambda: manager.leads(0))
            old = manager.leader_state(0)
            assert old is not None and old.epoch == 1
            manager._change_isr(old, (0,), "a test's shrink")  # blocks in node.get
            routing.epoch = 2
            node.state = replace(node.state, leader_epoch=2)
            node.version += 1
            manager.reconcile()
            await wait_for_async(
                lambda: (s := manager.leader_state(0)) is not None and s.epoch == 2
            )
            node.release.set()  # the epoch-1 write reads epoch 2: refused
            await wait_for_async(lambda: not old.isr_change_pending)
            await asyncio.sleep(0.05)
            new = manager.leader_state(0)
            assert new is not None and new.epoch == 2, "the new leadership was resigned"
            assert node.state.isr == (0, 1)  # nothing written for the old epoch
        finally:
            node.release.set()
            await manager.close()
            await engine.close()

    run(scenario())


async def wait_for_async(check: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)
