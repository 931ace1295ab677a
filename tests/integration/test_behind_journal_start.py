"""A follower behind the leader's journal start: it was down while the leader split, checkpointed
and deleted the journal segments it still needed (the leader keeps them for its ISR only).
Kafka's follower would truncate everything and start at the leader's log start; a StoneMQ
follower must not (its queue logs would lack what the leader split from the deleted bytes).
It keeps its logs as they were, stays out of the ISR and says why; the rest of the cluster
goes on. Real ZooKeeper, two brokers, default.replication.factor=2."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from .test_replication import _isrs, _journal_bytes, _produce_all, _storage_check, _wait

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(240)]


def _journal_start(data_dir: Any, journal: int) -> int:
    from stonemq.storage.checkpoint import CheckpointFile

    journal_dir = data_dir / "journal"
    order = [
        int(row[0])
        for row in CheckpointFile(str(journal_dir / "hosted-journal-partitions"), 1).read() or []
    ]
    d = journal_dir / f"journal-{order.index(journal)}"
    return min(int(n.split(".")[0]) for n in os.listdir(d) if n.endswith(".journal"))


def _queue_log(data_dir: Any, topic: str, partition: int) -> bytes:
    d = data_dir / "queues" / f"{topic}-{partition}"
    if not d.is_dir():
        return b""
    return b"".join((d / n).read_bytes() for n in sorted(os.listdir(d)) if n.endswith(".log"))


def test_a_follower_behind_the_leaders_journal_start_stays_out_and_keeps_a_right_log(
    broker_factory, zookeeper
) -> None:
    chroot = f"{zookeeper.connect}/stonemq-behind-{uuid.uuid4().hex[:8]}"
    settings = {
        "zookeeper_connect": chroot,
        "journal_partitions": 1,
        "default_replication_factor": 2,
        "replica_lag_time_max_ms": 2000,
        "zookeeper_session_timeout_ms": 6000,
        "journal_segment_bytes": 16 * 1024,
        "queue_checkpoint_interval_ms": 200,
    }
    brokers = [broker_factory(broker_id=b, start=False, **settings) for b in (1, 2)]
    for b in brokers:
        b.spawn()
    for b in brokers:
        _wait(lambda b=b: "ready" in b.log(since_start=True), 60, "brokers ready")
    leader, follower = brokers
    admin = AdminClient({"bootstrap.servers": leader.bootstrap})
    admin.create_topics([NewTopic("behind", 6, 2)])["behind"].result(30)
    _wait(lambda: all(set(i) == {1, 2} for i in _isrs(chroot).values()), 30, "full ISR")
    assert len(_produce_all(leader.bootstrap, "behind", 60, b"a")) == 60
    time.sleep(1)  # the follower has it all
    follower.kill()
    # broker 1 leads both journal partitions alone once broker 2's session expired
    _wait(lambda: all(i == (1,) for i in _isrs(chroot).values()), 30, "broker 2 leaves the ISR")
    # far more than a segment, split and checkpointed: the leader deletes old segments
    for _ in range(6):
        _produce_all(leader.bootstrap, "behind", 200, b"x" * 200)
    journals = sorted(_isrs(chroot))
    _wait(
        lambda: all(_journal_start(leader.data_dir, j) > 0 for j in journals),
        30,
        "journal segments deleted",
    )
    ends = _journal_bytes(follower.data_dir)
    assert all(_journal_start(leader.data_dir, j) > len(ends[j]) for j in journals)
    before = {p: _queue_log(follower.data_dir, "behind", p) for p in range(6)}

    follower.start()
    refusals = [
        f"journal partition {j}: position {len(ends[j])} is below leader 1's" for j in journals
    ]
    _wait(
        lambda: all(r in follower.log(since_start=True) for r in refusals),
        30,
        "the follower's refusals",
    )
    assert len(_produce_all(leader.bootstrap, "behind", 60, b"b")) == 60  # the leader goes on
    time.sleep(3)  # more than replica.lag.time.max.ms: it is never taken back into the ISR
    assert all(i == (1,) for i in _isrs(chroot).values()), _isrs(chroot)
    assert all(follower.log(since_start=True).count(r) == 1 for r in refusals)  # said once
    for b in brokers:
        b.stop()
        _storage_check(b.data_dir)
    # the follower's copy of the topic data is what it was: a prefix of the leader's, nothing
    # cut, nothing appended past a gap
    for p in range(6):
        kept = _queue_log(follower.data_dir, "behind", p)
        assert kept == before[p] and kept, f"behind-{p}"
        assert _queue_log(leader.data_dir, "behind", p).startswith(kept), f"behind-{p}"
