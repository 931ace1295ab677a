"""Controlled shutdown (Kafka's ``controlled.shutdown.enable``, default true): a broker that
leads a journal partition and gets SIGTERM first has the controller move that leadership to
another ISR member, and only then leaves (its ZooKeeper registration goes last). An idempotent
acks=all producer running throughout sees no failed produce, and every acknowledged record
is stored once at its offset."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from acked import check_acknowledged
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient

from stonemq.cluster.controller import JOURNAL_PATH
from stonemq.cluster.journal_state import PartitionState
from stonemq.cluster.membership import BROKER_IDS_PATH

from .test_replication import _isrs, _queue_bytes, _records, _start_cluster, _storage_check, _wait

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(240)]


def test_a_stopping_leader_hands_its_leadership_over_before_it_leaves(
    broker_factory, zookeeper
) -> None:
    brokers, chroot = _start_cluster(broker_factory, zookeeper)
    bootstrap = ",".join(b.bootstrap for b in brokers)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("cs", 6, 3)])["cs"].result(30)
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 30, "ISR")
    victim = brokers[0]
    led = [j for j, isr in _isrs(chroot).items() if _leader(chroot, j) == 1]
    assert led
    # what ZooKeeper saw, in order: each led journal partition's leader, broker 1's node
    events: list[tuple[str, int, int]] = []
    zk = KazooClient(chroot)
    zk.start(10)

    def on_ids(children: list[str]) -> None:
        if "1" not in children:
            events.append(("broker 1 gone", -1, -1))

    def watch(j: int) -> Any:
        def on_state(data: bytes | None, _stat: Any) -> None:
            if data is not None:
                events.append(("leader", j, PartitionState.from_json(data).leader))

        return on_state

    for j in led:
        zk.DataWatch(f"{JOURNAL_PATH}/{j}/state", watch(j))
    zk.ChildrenWatch(BROKER_IDS_PATH, on_ids)

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    acked: list[tuple[int, int | None, bytes]] = []
    errors: list[Any] = []
    stop = threading.Event()

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            acked.append((msg.partition(), msg.offset(), msg.value()))

    def run() -> None:
        i = 0
        while not stop.is_set():
            try:
                producer.produce("cs", value=b"v%06d" % i, partition=i % 6, on_delivery=on_delivery)
                i += 1
            except BufferError:
                pass
            producer.poll(0.002)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        _wait(lambda: len(acked) > 300, 30, "producing")
        victim.stop()  # SIGTERM; asserts a clean exit
        before = len(acked)
        _wait(lambda: len(acked) > before + 300, 60, "producing without broker 1")
    finally:
        stop.set()
        thread.join(10)
        zk.stop()
        zk.close()
    assert producer.flush(60) == 0
    assert not errors, errors[:5]
    assert "controlled shutdown: leaderships moved" in victim.log(since_start=True)
    gone = events.index(("broker 1 gone", -1, -1))
    moved = {j for kind, j, leader in events[:gone] if kind == "leader" and leader not in (1, -1)}
    assert moved == set(led), events  # every leadership moved while broker 1 was there
    # and it left every ISR (a follower's too) before it went, so acks=all never waited for
    # it (replica.lag.time.max.ms is 3 s here: the producer would not notice a wait)
    assert all(1 not in isr for isr in _isrs(chroot).values()), _isrs(chroot)
    assert "brokers [1] lag" not in "".join(b.log(since_start=True) for b in brokers[1:])
    time.sleep(2)
    for b in brokers[1:]:
        b.stop()
    for b in brokers:
        _storage_check(b.data_dir)
    stored: dict[tuple[int, int], bytes] = {}
    for p, log in _queue_bytes(brokers[1].data_dir, "cs", 6).items():
        stored.update(((p, off), v) for off, v in _records(log))
    check_acknowledged(acked, stored)  # every record was acknowledged (no errors, flushed)


def _leader(chroot: str, j: int) -> int:
    zk = KazooClient(chroot)
    zk.start(10)
    try:
        data, _ = zk.get(f"{JOURNAL_PATH}/{j}/state")
        return PartitionState.from_json(data).leader
    finally:
        zk.stop()
        zk.close()
