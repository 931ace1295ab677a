"""Split-progress back-pressure across replicas (issue 20 item 4, cluster.md invariant 8): when
an ISR follower fetches the journal but its splitter stalls, the leader holds produces once the
follower's unsplit journal bytes (its fetch position less its split position, both in every
replica fetch) pass ``splitter.max.lag.bytes``, so a follower that may lead after a failover is
never far behind in splitting. Consumers and admin requests are answered meanwhile; when the
follower's split progress moves again the produces go on, and every record is acknowledged and
stored once, with the same queue-log bytes on both replicas.

The stalled splitter is injected: the follower is paused (SIGSTOP) and a stand-in speaking the
replica-fetch API under its broker id fetches the leader's journal on and reports a split
position that does not move, then one that has caught up; the real follower resumes after.
(A full read directory cannot stall a follower's splitter: the follower then refuses the
appends, storage/space.py, and leaves the ISR after replica.lag.time.max.ms.)"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from stonemq.protocol.replica_fetch import FetchPartition

from .replica_peer import ReplicaPeer, journal_states
from .test_replication import _start_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

LAG_LIMIT = 256 * 1024  # splitter.max.lag.bytes on both brokers
RECORD = 1000
RECORDS = 6000  # 6 MB: far past the limit


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


class StandIn:
    """Fetches the journal partitions broker ``leader_id`` leads as replica ``broker_id``,
    reporting ``split`` as its split position: ``None`` for "split as far as fetched"."""

    def __init__(self, leader: Any, leader_id: int, broker_id: int, chroot: str) -> None:
        states = journal_states(chroot)
        self.epochs = {j: st.leader_epoch for j, st in states.items() if st.leader == leader_id}
        assert self.epochs and all(broker_id in states[j].isr for j in self.epochs), states
        self.positions = dict.fromkeys(self.epochs, 0)
        self.split: int | None = 0
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.peer = ReplicaPeer(leader.host, leader.port, broker_id)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                parts = [
                    FetchPartition(
                        j,
                        epoch,
                        self.positions[j],
                        epoch if self.positions[j] else -1,
                        self.positions[j] if self.split is None else self.split,
                        1 << 20,
                    )
                    for j, epoch in self.epochs.items()
                ]
                for data in self.peer.fetch(parts).partitions:
                    assert data.error_code == 0, data
                    assert data.diverging_epoch < 0 and data.diverging_end < 0, data
                    self.positions[data.journal_partition] += len(data.records)
        except BaseException as exc:
            if not self.stop.is_set():
                self.errors.append(exc)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.peer.close()


def test_a_follower_that_lags_in_splitting_holds_the_leaders_produces(
    broker_factory: Any, zookeeper: Any
) -> None:
    brokers, chroot = _start_cluster(
        broker_factory,
        zookeeper,
        ids=(1, 2),
        **{
            "splitter_max_lag_bytes": LAG_LIMIT,
            "replica_lag_time_max_ms": 120_000,  # the paused follower stays in the ISR
        },
    )
    bootstrap = ",".join(b.bootstrap for b in brokers)
    topic = "held"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 2)])[topic].result(30)
    leader_id = -1

    def led() -> bool:
        nonlocal leader_id
        meta = admin.list_topics(topic, timeout=10).topics[topic]
        leader_id = meta.partitions[0].leader if meta.partitions else -1
        return leader_id in (1, 2) and len(meta.partitions[0].isrs) == 2

    _wait(led, 60, "no leader with both replicas in the ISR")
    leader = brokers[leader_id - 1]
    follower_id = 3 - leader_id
    follower = brokers[follower_id - 1]

    acked: list[int] = []
    errors: list[Any] = []
    lock = threading.Lock()

    def on_delivery(err: Any, msg: Any) -> None:
        with lock:
            if err is not None:
                errors.append(err)
            else:
                acked.append(msg.offset())

    producer = Producer(
        {
            "bootstrap.servers": leader.bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "enable.idempotence": True,
            "message.timeout.ms": 180_000,
        }
    )
    producer.produce(topic, b"w" * RECORD, partition=0, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    _wait(lambda: acked == [0], 10, f"warm-up not acknowledged: {acked} {errors}")

    assert follower.proc is not None
    follower.proc.send_signal(signal.SIGSTOP)
    stand_in = StandIn(
        leader, leader_id, follower_id, chroot
    )  # fetches on; its splitter "stalls" at 0
    stop = threading.Event()

    def feed() -> None:
        for i in range(RECORDS):
            value = b"%08d" % i + b"v" * (RECORD - 8)
            while not stop.is_set():
                try:
                    producer.produce(topic, value, partition=0, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        while not stop.is_set() and len(producer):
            producer.poll(0.1)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        # held: the acknowledged count stops growing, far short of everything sent
        settled: list[int] = []

        def plateau() -> bool:
            with lock:
                settled.append(len(acked))
            return len(settled) >= 30 and settled[-1] == settled[-30] and settled[-1] > 1

        _wait(plateau, 90, "acknowledgements did not settle")
        held = settled[-1]
        assert not errors and not stand_in.errors, (errors[:3], stand_in.errors)
        # the leader stops reading produces once the follower's unsplit bytes pass the limit;
        # what it had read by then (a few in-flight requests of librdkafka's) gets through
        assert held * RECORD < LAG_LIMIT + 5 * 1024 * 1024, held
        assert held < RECORDS // 2, held

        # consumers and admin requests are not held: what was acknowledged is readable
        consumer = Consumer(
            {"bootstrap.servers": leader.bootstrap, "group.id": "r", "enable.auto.commit": False}
        )
        try:
            consumer.assign([TopicPartition(topic, 0, 0)])
            seen = 0
            deadline = time.monotonic() + 20
            while seen < held and time.monotonic() < deadline:
                seen += sum(1 for m in consumer.consume(500, 1.0) if m.error() is None)
            assert seen >= held, (seen, held)
        finally:
            consumer.close()
        leader_admin = AdminClient({"bootstrap.servers": leader.bootstrap})
        assert leader_admin.list_topics(topic, timeout=10).topics[topic].error is None
        with lock:
            assert len(acked) == held  # still held

        # the follower's split progress moves: the produces go on
        stand_in.split = None
        _wait(lambda: len(acked) == RECORDS + 1, 120, f"{len(acked)} acknowledged")
    finally:
        stop.set()
        stand_in.close()
        follower.proc.send_signal(signal.SIGCONT)
        feeder.join(30)
    assert not errors and not stand_in.errors, (errors[:3], stand_in.errors)
    assert sorted(acked) == list(range(RECORDS + 1))

    # every record once, in order, at its offset; and the real follower, fetching on from
    # where it was paused, splits its own copy into the same queue-log bytes as the leader's
    consumer = Consumer(
        {"bootstrap.servers": leader.bootstrap, "group.id": "check", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 60
        while len(got) < RECORDS + 1 and time.monotonic() < deadline:
            for m in consumer.consume(500, 1.0):
                assert m.error() is None, m.error()
                got.append((m.offset(), m.value()))
    finally:
        consumer.close()
    assert [o for o, _ in got] == list(range(RECORDS + 1))
    assert [int(v[:8]) for _, v in got[1:]] == list(range(RECORDS))

    def queue_log(b: Any) -> bytes:
        d = b.data_dir / "queues" / f"{topic}-0"
        return b"".join((d / n).read_bytes() for n in sorted(os.listdir(d)) if n.endswith(".log"))

    _wait(
        lambda: queue_log(follower) == queue_log(leader) != b"",
        60,
        "the follower's queue log differs from the leader's",
    )
    assert follower.proc.poll() is None and leader.proc.poll() is None
