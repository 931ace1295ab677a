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
from acked import check_held
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient

from stonemq.cluster.controller import read_controller

from .rawclient import RawConnection, build_batch, produce_raw
from .replica_peer import journal_states
from .test_replication import (
    _isrs,
    _leaders,
    _queue_bytes,
    _records,
    _start_cluster,
    _storage_check,
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
        # librdkafka acknowledges a batch whose answer was lost without an offset
        # (rd_kafka_dr_implicit_ack) once a later one succeeds: held by value (a CI run
        # failed on ('librdkafka', 5, None, b'rd000179') looked up at offset None)
        check_held([(p, offset, value) for _, p, offset, value in acks.acked], stored)
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
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._server is not server:  # cut meanwhile
                    client.close()
                    upstream.close()
                    return
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
        with self._lock:
            server, self._server = self._server, None
            pipes, self._pipes = self._pipes, []
        assert server is not None
        server.shutdown(socket.SHUT_RDWR)  # a close alone leaves a blocked accept listening
        server.close()
        for s in pipes:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


def _registered(chroot: str) -> list[int]:
    zk = KazooClient(chroot)
    zk.start(10)
    try:
        return sorted(int(c) for c in zk.get_children("/brokers/ids"))
    finally:
        zk.stop()
        zk.close()


def _produce_acked(bootstrap: str, topic: str, partitions: list[int], tag: bytes) -> list[Any]:
    """50 acks=all records to ``partitions`` (idempotent); (partition, offset, value) each."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    acked: list[tuple[int, int, bytes]] = []

    def on_delivery(err: Any, msg: Any) -> None:
        assert err is None, err
        acked.append((msg.partition(), msg.offset(), msg.value()))

    for i in range(50):
        p = partitions[i % len(partitions)]
        producer.produce(topic, tag + b"%04d" % i, partition=p, on_delivery=on_delivery)
    assert producer.flush(60) == 0
    return acked


def test_a_leader_judged_dead_while_alive_is_deposed_safely_and_rejoins(
    broker_factory, zookeeper
) -> None:
    """Broker 1 advertises a proxy in front of its listener; the proxy is cut, so the other
    brokers judge broker 1 dead although its process and its ZooKeeper session live on (a
    misjudgement). Its leaderships move, in a new leader epoch, within seconds. Meanwhile a
    client that still reaches broker 1 directly keeps sending it acks=all and acks=1 produces,
    and a producer writes to the new leaders. Every acks=all write broker 1 acknowledged is
    at its offset on every replica in the end (acks=1 writes it took after its deposition
    may be cut, as in Kafka). With the proxy back, broker 1 is live again and rejoins every
    ISR; all three brokers hold the same queue logs, each `stonemq storage check` clean."""
    import uuid

    chroot = f"{zookeeper.connect}/stonemq-misjudged-{uuid.uuid4().hex[:8]}"
    brokers = [
        broker_factory(
            zookeeper_connect=chroot,
            broker_id=b,
            journal_partitions=1,
            default_replication_factor=3,
            replica_lag_time_max_ms=3000,
            replica_fetch_wait_max_ms=100,
            zookeeper_session_timeout_ms=SESSION_MS,
            start=False,
        )
        for b in (1, 2, 3)
    ]
    proxy = Proxy(brokers[0].port)
    brokers[0].settings["advertised_listeners"] = f"PLAINTEXT://127.0.0.1:{proxy.port}"
    for b in brokers:  # placement waits for three live brokers: start them together
        b.spawn()
    for b in brokers:
        b.wait_ready(60)
    assert f"advertised 127.0.0.1:{proxy.port}" in brokers[0].log(since_start=True)
    topic = "misjudged"
    all_bootstrap = ",".join(b.bootstrap for b in brokers)
    others = ",".join(b.bootstrap for b in brokers[1:])
    admin = AdminClient({"bootstrap.servers": others})
    admin.create_topics([NewTopic(topic, 6, 3)])[topic].result(30)
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 30, "ISR")
    mine = sorted(p for p, leader in _leaders(others, topic).items() if leader == 1)
    assert mine
    acked = _produce_acked(all_bootstrap, topic, mine, b"before")

    direct: list[tuple[int, int, bytes]] = []  # acks=all answered by broker 1 itself
    direct_acks1: list[tuple[int, int, bytes]] = []
    answers: list[int] = []
    stop = threading.Event()

    def hammer() -> None:
        with RawConnection(brokers[0].host, brokers[0].port, timeout=30) as conn:
            i = 0
            while not stop.is_set():
                acks = -1 if i % 2 == 0 else 1
                value = b"direct%05d" % i
                p = mine[i % len(mine)]
                part = produce_raw(conn, topic, p, bytes(build_batch([(None, value)])), acks=acks)
                answers.append(part.error_code)
                if part.error_code == 0:
                    (direct if acks == -1 else direct_acks1).append((p, part.base_offset, value))
                else:
                    time.sleep(0.01)
                i += 1

    thread = threading.Thread(target=hammer, daemon=True)
    thread.start()
    try:
        _wait(lambda: len(direct) >= 20, 30, "broker 1 acknowledging directly")
        cut_at = time.monotonic()
        proxy.cut()
        _wait(
            lambda: all(s.leader != 1 and 1 not in s.isr for s in journal_states(chroot).values()),
            30,
            "broker 1 deposed and out of every ISR",
        )
        deposed_s = time.monotonic() - cut_at
        assert deposed_s < FIRST_ACK_BOUND_S, deposed_s
        assert 1 in _registered(chroot)  # alive, its session intact: a misjudgement
        assert brokers[0].proc.poll() is None
        acked += _produce_acked(others, topic, mine, b"during")
        time.sleep(1.0)  # broker 1 goes on answering its direct client meanwhile
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive()
    assert any(code != 0 for code in answers), "broker 1 never noticed its deposition"
    proxy.restore()
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 60, "rejoined")
    logs = brokers[1].log(since_start=True) + brokers[2].log(since_start=True)
    assert "broker 1 judged dead" in logs and "accepts connections again: live" in logs
    acked += _produce_acked(all_bootstrap, topic, mine, b"after")
    time.sleep(2)  # followers learn the last HW in their next fetch
    for b in brokers:
        b.stop()
        _storage_check(b.data_dir)
    queues = [_queue_bytes(b.data_dir, topic, 6) for b in brokers]
    stored: dict[tuple[int, int], bytes] = {}
    for p in range(6):
        assert queues[0][p] == queues[1][p] == queues[2][p], f"{topic}-{p}"
        stored.update(((p, off), v) for off, v in _records(queues[0][p]))
    check_held(acked + direct, stored)
    values = list(stored.values())
    assert len(values) == len(set(values)), "a record stored twice"
