"""A leader whose journal holds a damaged entry answers a follower's fetch of it with
KAFKA_STORAGE_ERROR for that journal partition alone, logs it, and goes on serving the other
journal partitions of the same fetch on the same connection (before, the whole request failed
on every try, stalling every journal partition the follower fetched from that leader)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from stonemq.protocol.replica_fetch import FetchPartition
from stonemq.storage.checkpoint import CheckpointFile

from .replica_peer import ReplicaPeer, journal_states
from .test_replication import _start_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

KAFKA_STORAGE_ERROR = 56


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _journal_dirs(data_dir: Any) -> dict[int, Any]:
    """Global journal id -> its directory on this broker."""
    journal_dir = data_dir / "journal"
    rows = CheckpointFile(str(journal_dir / "hosted-journal-partitions"), 1).read() or []
    return {int(row[0]): journal_dir / f"journal-{local}" for local, row in enumerate(rows)}


def test_a_damaged_journal_entry_fails_only_its_partition(broker_factory: Any, zookeeper: Any):
    # no in-memory tail: the damaged bytes are read from the file, as every fetch behind the
    # tail is (with one, the leader answers these from what it wrote, never reading the file)
    brokers, chroot = _start_cluster(
        broker_factory, zookeeper, ids=(1, 2), journal_partitions=2, replica_fetch_tail_max_bytes=0
    )
    bootstrap = ",".join(b.bootstrap for b in brokers)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("t", 8, 2)])["t"].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(400):
        producer.produce("t", b"v%d" % i, partition=i % 8)
    assert producer.flush(60) == 0

    states = journal_states(chroot)
    led = sorted(j for j, st in states.items() if st.leader == 1)
    assert len(led) == 2 and all(set(states[j].isr) == {1, 2} for j in led), states
    leader = brokers[0]
    dirs = _journal_dirs(leader.data_dir)
    for j in led:
        assert any(os.path.getsize(f) for f in dirs[j].glob("*.journal")), j
    damaged, healthy = led
    follower = brokers[1]
    assert follower.proc is not None
    follower.proc.send_signal(signal.SIGSTOP)  # it already holds everything; it stays out of this
    peer = ReplicaPeer(leader.host, leader.port, 2)
    try:
        segment = dirs[damaged] / f"{0:020d}.journal"
        with open(segment, "r+b") as f:  # the first entry's length field: out of range
            f.write(b"\xff\xff\xff\xff")

        def part(j: int) -> FetchPartition:
            return FetchPartition(j, states[j].leader_epoch, 0, -1, 0, 1 << 20)

        for _ in range(2):  # answered the same way again, on the same connection
            response = peer.fetch([part(damaged), part(healthy)])
            by_journal = {p.journal_partition: p for p in response.partitions}
            assert by_journal[damaged].error_code == KAFKA_STORAGE_ERROR, by_journal[damaged]
            assert len(by_journal[damaged].records) == 0
            assert by_journal[healthy].error_code == 0, by_journal[healthy]
            assert len(by_journal[healthy].records) > 0
        log = leader.log(since_start=True)
        assert f"journal partition {damaged}" in log and "KAFKA_STORAGE_ERROR" in log, log[-3000:]
        assert leader.proc.poll() is None
    finally:
        peer.close()
        follower.proc.send_signal(signal.SIGCONT)
