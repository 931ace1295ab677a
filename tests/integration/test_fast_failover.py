"""Failover faster than the ZooKeeper session (issue 20, item 5): three brokers and a real
ZooKeeper with ``zookeeper.session.timeout.ms`` 6000. A SIGKILLed leader is judged dead by
the other brokers as soon as its kernel closes its sockets (stonemq/cluster/liveness.py), so
unmodified idempotent producers (librdkafka and kafka-python, acks=all) get their first
acknowledgement from the new leader well before the killed broker's session could end,
whether or not it was also the controller; and a broker judged dead while alive (its
listener unreachable, its session intact) is deposed safely: nothing it acknowledges with
acks=all is missing from the new leader, and once reachable again it rejoins the ISR with the
same logs as the others."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient

from stonemq.cluster.controller import read_controller

from .test_replication import (
    _isrs,
    _leaders,
    _start_cluster,
    _wait,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

SESSION_MS = 6000
FIRST_ACK_BOUND_S = 3.5
"""The bound on SIGKILL → first acknowledgement: more than three times what it takes on an
idle machine (about 0.3-1.1 s), well under the 6 s session, after which alone it could
happen before brokers were judged dead."""


def _controller(chroot: str) -> int:
    zk = KazooClient(chroot)
    zk.start(10)
    try:
        return read_controller(zk)[0]
    finally:
        zk.stop()
        zk.close()


class Acks:
    """One producer's acknowledgements: (monotonic time, partition, offset, value)."""

    def __init__(self) -> None:
        self.acked: list[tuple[float, int, int, bytes]] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def first_after(self, t: float) -> float | None:
        return min((at for at, *_ in self.acked if at > t), default=None)


def _librdkafka(bootstrap: str, topic: str, partitions: list[int], acks: Acks) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "enable.idempotence": True}
    )

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            acks.errors.append(str(err))
        else:
            acks.acked.append((time.monotonic(), msg.partition(), msg.offset(), msg.value()))

    i = 0
    while not acks.stop.is_set():
        with contextlib.suppress(BufferError):
            p = partitions[i % len(partitions)]
            producer.produce(topic, b"rd%06d" % i, partition=p, on_delivery=on_delivery)
            i += 1
        producer.poll(0.005)
    assert producer.flush(60) == 0


def _kafka_python(bootstrap: str, topic: str, partitions: list[int], acks: Acks) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap.split(","), acks="all")
    try:
        i = 0
        while not acks.stop.is_set():
            value = b"kp%06d" % i
            future = producer.send(topic, value, partition=partitions[i % len(partitions)])
            future.add_callback(
                lambda md, v=value: acks.acked.append(
                    (time.monotonic(), md.partition, md.offset, v)
                )
            )
            future.add_errback(lambda exc, v=value: acks.errors.append(f"{v!r}: {exc!r}"))
            i += 1
            time.sleep(0.005)
        producer.flush(60)
    finally:
        producer.close(10)


def _stored(bootstrap: str, topic: str, partitions: list[int]) -> dict[tuple[int, int], bytes]:
    """Every record of ``partitions`` up to the high watermark: (partition, offset) → value."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "ff-check", "enable.auto.commit": False}
    )
    try:
        out: dict[tuple[int, int], bytes] = {}
        for p in partitions:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            consumer.assign([TopicPartition(topic, p, 0)])
            deadline = time.monotonic() + 60
            while sum(1 for q, _ in out if q == p) < high:
                assert time.monotonic() < deadline, (p, high)
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    out[(p, msg.offset())] = msg.value()
        return out
    finally:
        consumer.close()


@pytest.mark.parametrize("victim_role", ["leader", "controller"])
def test_producers_reach_the_new_leader_well_before_the_session_ends(
    broker_factory, zookeeper, victim_role: str
) -> None:
    brokers, chroot = _start_cluster(
        broker_factory, zookeeper, zookeeper_session_timeout_ms=SESSION_MS
    )
    topic = f"ff-{victim_role}"
    admin = AdminClient({"bootstrap.servers": brokers[0].bootstrap})
    admin.create_topics([NewTopic(topic, 6, 3)])[topic].result(30)
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 30, "ISR")
    controller = _controller(chroot)
    leaders = _leaders(brokers[0].bootstrap, topic)
    if victim_role == "controller":
        victim = controller  # it leads its home journal partition too
    else:
        victim = next(leader for leader in leaders.values() if leader != controller)
    mine = sorted(p for p, leader in leaders.items() if leader == victim)
    assert mine, leaders
    bootstrap = ",".join(b.bootstrap for b in brokers)
    clients = {"librdkafka": (_librdkafka, Acks()), "kafka-python": (_kafka_python, Acks())}
    threads = [
        threading.Thread(target=run, args=(bootstrap, topic, mine, acks), daemon=True)
        for run, acks in clients.values()
    ]
    for t in threads:
        t.start()
    try:
        _wait(lambda: all(len(acks.acked) >= 50 for _, acks in clients.values()), 60, "producing")
        killed_at = time.monotonic()
        brokers[victim - 1].kill()
        _wait(
            lambda: all(acks.first_after(killed_at + 0.05) for _, acks in clients.values()),
            60,
            "acknowledgements after the kill",
        )
    finally:
        for _, acks in clients.values():
            acks.stop.set()
        for t in threads:
            t.join(90)
    took = {
        name: round(acks.first_after(killed_at + 0.05) - killed_at, 3)  # type: ignore[operator]
        for name, (_, acks) in clients.items()
    }
    print(f"SIGKILL of broker {victim} ({victim_role}) to the first acknowledgement, s: {took}")
    assert all(s < FIRST_ACK_BOUND_S for s in took.values()), took
    survivor = next(b for b in brokers if b is not brokers[victim - 1])
    assert all(leader != victim for leader in _leaders(survivor.bootstrap, topic).values())
    # nothing acknowledged was lost or doubled on the new leaders
    stored = _stored(survivor.bootstrap, topic, mine)
    for name, (_, acks) in clients.items():
        assert not acks.errors, (name, acks.errors[:5])
        for _, p, offset, value in acks.acked:
            assert stored.get((p, offset)) == value, (name, p, offset, value)
    assert len(set(stored.values())) == len(stored)


class Proxy:
    """A TCP forwarder standing for a broker's advertised listener: :meth:`cut` closes its
    listener and every forwarded connection (the broker behind it lives on and keeps its
    ZooKeeper session), :meth:`restore` listens on the same port again."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.port = 0
        self._server: socket.socket | None = None
        self._pipes: list[socket.socket] = []
        self._lock = threading.Lock()
        self.restore()

    def restore(self) -> None:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(64)
        self.port = server.getsockname()[1]
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pipes += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        assert self._server is not None
        self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        self._server = None
        with self._lock:
            pipes, self._pipes = self._pipes, []
        for s in pipes:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
