"""Group unload on a coordinator move: the coordinator of a live consumer group is SIGSTOPped
past its ZooKeeper session, another broker becomes leader of the journal partition carrying
the group's ``__consumer_offsets`` partition (and coordinator, after loading the group), and
the old one, SIGCONTed, unloads the group (no timer of it runs there any more, its requests
get NOT_COORDINATOR), as Kafka's GroupMetadataManager. The unmodified confluent-kafka group
consumer goes on with its committed offsets intact."""

from __future__ import annotations

import signal
import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from .test_replication import _isrs, _produce_all, _start_cluster, _wait

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(240)]


def _coordinator(admin: AdminClient, group: str) -> int:
    try:
        return admin.describe_consumer_groups([group])[group].result(10).coordinator.id
    except Exception:  # no coordinator at the moment
        return -1


def test_the_old_coordinator_unloads_the_group_and_the_consumer_goes_on(
    broker_factory, zookeeper
) -> None:
    brokers, chroot = _start_cluster(broker_factory, zookeeper, zookeeper_session_timeout_ms=6000)
    bootstrap = ",".join(b.bootstrap for b in brokers)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("ug", 6, 3)])["ug"].result(30)
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 30, "ISR")
    first = {b"a%04d" % i for i in range(60)}
    _produce_all(bootstrap, "ug", 60, b"a")
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "ug",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 500,
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe(["ug"])
    seen: set[bytes] = set()

    def consume_until(wanted: set[bytes], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not wanted <= seen:
            assert time.monotonic() < deadline, (len(wanted - seen), sorted(wanted - seen)[:5])
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                seen.add(msg.value())
                consumer.commit(message=msg, asynchronous=True)

    try:
        consume_until(first, 60)
        consumer.commit(asynchronous=False)
        old = _coordinator(admin, "ug")
        assert old in (1, 2, 3)
        victim = brokers[old - 1]
        others = [b for b in brokers if b is not victim]
        survivors = AdminClient({"bootstrap.servers": ",".join(b.bootstrap for b in others)})
        victim.proc.send_signal(signal.SIGSTOP)
        try:
            _wait(lambda: _coordinator(survivors, "ug") not in (old, -1), 60, "new coordinator")
        finally:
            victim.proc.send_signal(signal.SIGCONT)
        _wait(
            lambda: "unloaded 1 groups of __consumer_offsets" in victim.log(since_start=True),
            30,
            "the old coordinator unloads the group",
        )
        second = {b"b%04d" % i for i in range(60)}
        _produce_all(",".join(b.bootstrap for b in others), "ug", 60, b"b")
        consume_until(second, 90)
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition("ug", p) for p in range(6)], timeout=30)
        assert sum(tp.offset for tp in committed) == 120, committed
        described = survivors.describe_consumer_groups(["ug"])["ug"].result(30)
        assert described.coordinator.id != old
        assert len(described.members) == 1
    finally:
        consumer.close()
    for b in brokers:
        b.stop()
