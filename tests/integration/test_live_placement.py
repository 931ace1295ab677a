"""Journal partitions placed after a broker started are hosted without a restart: brokers 1
and 2 run (default.replication.factor=2), then broker 3 joins; the controller places broker
3's journal partition on broker 3 and one running broker, which opens it, registers the topic
partitions routed to it and follows it at once. Real ZooKeeper, real clients."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient

from stonemq.cluster.controller import read_journal_partitions

from .test_replication import (
    _journal_bytes,
    _produce_all,
    _storage_check,
    _wait,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def _journals(chroot: str) -> dict[int, Any]:
    zk = KazooClient(chroot)
    zk.start(10)
    try:
        return read_journal_partitions(zk)
    finally:
        zk.stop()
        zk.close()


def test_a_journal_partition_placed_after_the_start_is_hosted_live(
    broker_factory, zookeeper
) -> None:
    chroot = f"{zookeeper.connect}/stonemq-live-{uuid.uuid4().hex[:8]}"
    settings = {
        "zookeeper_connect": chroot,
        "journal_partitions": 1,
        "default_replication_factor": 2,
        "replica_lag_time_max_ms": 2000,
    }
    first = [broker_factory(broker_id=b, start=False, **settings) for b in (1, 2)]
    for b in first:
        b.spawn()
    for b in first:
        b.wait_ready(60)
    admin = AdminClient({"bootstrap.servers": first[0].bootstrap})
    admin.create_topics([NewTopic("early", 6, 2)])["early"].result(30)
    assert len(_produce_all(first[0].bootstrap, "early", 120, b"e")) == 120
    pids = [b.proc.pid for b in first]

    third = broker_factory(broker_id=3, **settings)
    placed = _journals(chroot)
    assert len(placed) == 3, placed
    new = next(j for j, p in placed.items() if p.assignment.home == 3)
    replicas = placed[new].assignment.replicas
    assert len(replicas) == 2 and replicas[0] == 3, replicas
    host = first[replicas[1] - 1]  # the running broker the new journal partition names
    _wait(
        lambda: f"hosting journal partition {new} (placed after the start)" in host.log(),
        30,
        "the running replica hosts the new journal partition",
    )
    # a topic created now spreads over all three journal partitions, the new one included
    admin.create_topics([NewTopic("late", 6, 2)])["late"].result(30)
    led = AdminClient({"bootstrap.servers": third.bootstrap}).list_topics("late", timeout=10)
    on_new = [p for p, m in led.topics["late"].partitions.items() if m.leader == 3]
    assert on_new, "no partition of the new topic on broker 3's journal partition"
    bootstrap = ",".join(b.bootstrap for b in (*first, third))
    assert len(_produce_all(bootstrap, "late", 300, b"l")) == 300
    # the follower kept up: its ISR never lost it (replica.lag.time.max.ms is 2 s)
    time.sleep(3)
    assert set(_journals(chroot)[new].state.isr) == set(replicas), _journals(chroot)[new]
    assert [b.proc.pid for b in first] == pids, "a running broker restarted"
    time.sleep(1)  # the follower learns the last HW in its next fetch
    for b in (*first, third):
        b.stop()
        _storage_check(b.data_dir)
    on_host = _journal_bytes(host.data_dir)
    on_third = _journal_bytes(third.data_dir)
    assert on_host[new] == on_third[new] and len(on_third[new]) > 0
    for p in on_new:
        here = _queue_log(host.data_dir, "late", p)
        assert here == _queue_log(third.data_dir, "late", p) and here, f"late-{p}"


def _queue_log(data_dir: Any, topic: str, partition: int) -> bytes:
    d = data_dir / "queues" / f"{topic}-{partition}"
    return b"".join((d / n).read_bytes() for n in sorted(os.listdir(d)) if n.endswith(".log"))
