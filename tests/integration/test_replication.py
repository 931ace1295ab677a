"""Journal replication across three brokers (default.replication.factor=3): real ZooKeeper,
three ``stonemq serve`` processes, unmodified clients. Every broker's journal holds the same
bytes at the same journal positions and every broker's queue logs the same batches at the same
offsets; acks=all waits for the ISR and is refused under min.insync.replicas; batches carry the
journal partition's real leader epoch."""

from __future__ import annotations

import os
import struct
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from diskfaults import immutable, mount_small_disk  # tests/ (on sys.path: root conftest)
from kazoo.client import KazooClient
from kio.schema.errors import ErrorCode

from stonemq.cluster.controller import read_journal_partitions
from stonemq.storage.checkpoint import CheckpointFile
from stonemq.storage.leader_epoch import LEADER_EPOCH_FILE

from .rawclient import RawConnection, build_batch, fetch_raw, leader_epochs_of, produce_raw
from .test_delete_records import raw_delete
from .test_disk_full import fill
from .test_list_offsets_versions import list_offsets_partition

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

NOT_ENOUGH_REPLICAS = 19
NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20


@pytest.fixture
def replicated(broker_factory, zookeeper) -> tuple[list[Any], str]:
    return _start_cluster(broker_factory, zookeeper)


def _start_cluster(
    broker_factory: Any,
    zookeeper: Any,
    ids: tuple[int, ...] = (1, 2, 3),
    journal_partitions: int = 1,
    data_dirs: dict[int, Path] | None = None,
    **extra: Any,
) -> tuple[list[Any], str]:
    """Brokers ``ids`` in a fresh chroot, replication factor ``len(ids)``, started together
    and ready; ``data_dirs``: where some keep their data; ``extra``: more settings."""
    chroot = f"{zookeeper.connect}/stonemq-repl-{uuid.uuid4().hex[:8]}"
    brokers = [
        broker_factory(
            zookeeper_connect=chroot,
            broker_id=b,
            journal_partitions=journal_partitions,
            data_dir=(data_dirs or {}).get(b),
            start=False,
            **{
                "default_replication_factor": len(ids),
                "replica_lag_time_max_ms": 3000,
                **extra,
            },
        )
        for b in ids
    ]
    for b in brokers:  # placement waits for every live broker: start them together
        b.spawn()
    for b in brokers:
        b.wait_ready(60)
    return brokers, chroot


def _storage_check(data_dir: Path) -> None:
    """``stonemq storage check`` finds no defect in a stopped broker's data dir."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "stonemq", "storage", "check", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _journal_bytes(data_dir: Path) -> dict[int, bytes]:
    """Each hosted journal partition's bytes from position 0, by global journal id."""
    journal_dir = data_dir / "journal"
    order = [
        int(row[0])
        for row in CheckpointFile(str(journal_dir / "hosted-journal-partitions"), 1).read() or []
    ]
    out = {}
    for local, j in enumerate(order):
        d = journal_dir / f"journal-{local}"
        names = sorted(n for n in os.listdir(d) if n.endswith(".journal"))
        assert names and int(names[0].split(".")[0]) == 0, (d, names)
        out[j] = b"".join((d / n).read_bytes() for n in names)
    return out


def _queue_bytes(data_dir: Path, topic: str, partitions: int) -> dict[int, bytes]:
    out = {}
    for p in range(partitions):
        d = data_dir / "queues" / f"{topic}-{p}"
        names = sorted(n for n in os.listdir(d) if n.endswith(".log"))
        out[p] = b"".join((d / n).read_bytes() for n in names)
    return out


def _same_queue_logs(brokers: list[Any], topic: str, partitions: int) -> dict[int, bytes]:
    """Every stopped broker holds the same queue-log bytes of ``topic``: one replica's."""
    queues = [_queue_bytes(b.data_dir, topic, partitions) for b in brokers]
    for p in range(partitions):
        assert queues[0][p] == queues[1][p] == queues[2][p], f"{topic}-{p}"
    return queues[0]


def _stop_checked(brokers: list[Any]) -> None:
    """Stop every broker once followers learned the last HW (their next fetch), and check
    each data directory with ``stonemq storage check``."""
    time.sleep(2)
    for b in brokers:
        b.stop()
        _storage_check(b.data_dir)


def _batch_epochs(log: bytes) -> list[tuple[int, int]]:
    """(base offset, partition leader epoch) of each batch of a queue-log file's bytes."""
    out = []
    at = 0
    while at + 61 <= len(log):
        base, length, epoch = struct.unpack_from(">qii", log, at)
        out.append((base, epoch))
        at += 12 + length
    return out


def _leaders(bootstrap: str, topic: str) -> dict[int, int]:
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return {p: m.leader for p, m in meta.topics[topic].partitions.items()}


def _isrs(chroot: str) -> dict[int, tuple[int, ...]]:
    zk = KazooClient(chroot)
    zk.start(10)
    try:
        return {j: p.state.isr for j, p in read_journal_partitions(zk).items()}
    finally:
        zk.stop()
        zk.close()


def _restart(broker: Any, chroot: str) -> None:
    """Start a killed broker again once its old ZooKeeper session has expired: as Kafka's, a
    broker refuses to start while its broker.id is registered by a live session, and the
    cluster moves on from a killed broker before its session ends (it is judged dead at once:
    stonemq/cluster/liveness.py), so a test restarting it at once would race the expiry."""
    from stonemq.cluster.membership import BROKER_IDS_PATH

    broker_id = str(broker.settings["broker_id"])

    def unregistered() -> bool:
        zk = KazooClient(chroot)
        zk.start(10)
        try:
            return broker_id not in zk.get_children(BROKER_IDS_PATH)
        finally:
            zk.stop()
            zk.close()

    _wait(unregistered, 60, f"broker {broker_id}'s old session to expire")
    broker.start()


class _Producing:
    """An idempotent acks=all producer sending ``v<i>`` to partition ``i % partitions`` of
    ``topic`` in a thread until :meth:`stop`: what was acknowledged, as (partition, offset,
    value), and the delivery errors."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        import threading

        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
                "message.timeout.ms": 90_000,
            }
        )
        self.topic, self.partitions = topic, partitions
        self.acked: list[tuple[int, int, bytes]] = []
        self.errors: list[Any] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(err)
        else:
            self.acked.append((msg.partition(), msg.offset(), msg.value()))

    def _run(self) -> None:
        i = 0
        producer = self.producer
        while not self._stop.is_set():
            try:
                producer.produce(
                    self.topic,
                    value=b"v%06d" % i,
                    partition=i % self.partitions,
                    on_delivery=self._on_delivery,
                )
                i += 1
            except BufferError:
                pass
            producer.poll(0.001 if i % 50 else 0.02)

    def more(self, count: int, what: str) -> None:
        """Wait for ``count`` more acknowledgements."""
        before = len(self.acked)
        _wait(lambda: len(self.acked) > before + count, 60, what)

    def halt(self) -> None:
        """Stop sending (in a ``finally``: asserts nothing)."""
        self._stop.set()
        self._thread.join(10)

    def settle(self) -> None:
        """After :meth:`halt`: every record sent is acknowledged, none failed."""
        assert self.producer.flush(90) == 0
        assert not self.errors, self.errors[:5]


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_every_replica_holds_the_same_journal_and_queue_logs(replicated) -> None:
    brokers, chroot = replicated
    b1 = brokers[0]
    admin = AdminClient({"bootstrap.servers": b1.bootstrap})
    admin.create_topics([NewTopic("repl", 6, 3)])["repl"].result(30)
    led = _leaders(b1.bootstrap, "repl")
    assert set(led.values()) == {1, 2, 3}, led  # partitions led by every broker
    producer = Producer({"bootstrap.servers": b1.bootstrap, "acks": "all", "linger.ms": 5})
    sent = 0
    acked: list[tuple[int, int, bytes]] = []

    def on_delivery(err: Any, msg: Any) -> None:
        assert err is None, err
        acked.append((msg.partition(), msg.offset(), msg.value()))

    for i in range(600):
        producer.produce("repl", value=b"r%05d" % i, partition=i % 6, on_delivery=on_delivery)
        sent += 1
        if i % 100 == 99:
            producer.flush(30)
    assert producer.flush(30) == 0
    assert len(acked) == sent
    # every ISR is whole: all three replicas caught up (a follower slow to start may have
    # been out of it for a moment)
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 30, "ISR")
    consumer = Consumer(
        {
            "bootstrap.servers": brokers[2].bootstrap,
            "group.id": "repl-check",
            "auto.offset.reset": "earliest",
        }
    )
    for p in range(6):
        assert consumer.get_watermark_offsets(TopicPartition("repl", p), timeout=10) == (0, 100)
    # a commit is answered once the ISR holds it (the coordinator appends as acks=all)
    positions = [TopicPartition("repl", p, 40 + p) for p in range(6)]
    assert all(tp.error is None for tp in consumer.commit(offsets=positions, asynchronous=False))
    committed = consumer.committed([TopicPartition("repl", p) for p in range(6)], timeout=10)
    assert [tp.offset for tp in committed] == [40 + p for p in range(6)]
    consumer.close()
    time.sleep(2)  # followers learn the last HW in their next fetch
    for b in brokers:
        b.stop()
        _storage_check(b.data_dir)
    journals = [_journal_bytes(b.data_dir) for b in brokers]
    assert journals[0].keys() == journals[1].keys() == journals[2].keys() == {0, 1, 2}
    for j in range(3):
        assert len(journals[0][j]) > 600 * 6 // 3
        assert journals[0][j] == journals[1][j] == journals[2][j], f"journal partition {j}"
    queues = [_queue_bytes(b.data_dir, "repl", 6) for b in brokers]
    for p in range(6):
        assert queues[0][p] == queues[1][p] == queues[2][p], f"repl-{p}"
        batches = _batch_epochs(queues[0][p])
        assert batches and batches[0][0] == 0
    # the queue logs hold exactly what was acknowledged, at the acknowledged offsets
    values: dict[tuple[int, int], bytes] = {}
    for p in range(6):
        values.update(((p, off), val) for off, val in _records(queues[0][p]))
    assert {(p, off): v for p, off, v in acked} == values


def _journal_values(data_dir: Path) -> set[bytes]:
    """The value of every record in every hosted journal partition of a stopped broker."""
    from stonemq.protocol.record_batch import iter_records
    from stonemq.storage.journal import decode_entries

    out = set()
    for data in _journal_bytes(data_dir).values():
        entries, used = decode_entries(memoryview(data), 0, verify=True)
        assert used == len(data)
        for entry in entries:
            out.update(record.value for record in iter_records(entry.batch))
    return out


def _records(log: bytes) -> list[tuple[int, bytes]]:
    from stonemq.protocol.record_batch import iter_records

    out = []
    at = 0
    while at + 61 <= len(log):
        (length,) = struct.unpack_from(">i", log, at + 8)
        batch = log[at : at + 12 + length]
        for record in iter_records(batch):
            out.append((record.offset, record.value))
        at += 12 + length
    return out


def _offset_for_epoch(broker: Any, topic: str, partition: int, current: int, epoch: int) -> Any:
    from . import rawclient

    req = rawclient.schema("offset_for_leader_epoch", 4, "request")
    resp = rawclient.schema("offset_for_leader_epoch", 4, "response")
    with RawConnection(broker.host, broker.port) as conn:
        answer = conn.request(
            rawclient.build(
                req.OffsetForLeaderEpochRequest,
                replica_id=-1,
                topics=(
                    req.OffsetForLeaderTopic(
                        topic=topic,
                        partitions=(
                            req.OffsetForLeaderPartition(
                                partition=partition,
                                current_leader_epoch=current,
                                leader_epoch=epoch,
                            ),
                        ),
                    ),
                ),
            ),
            resp.OffsetForLeaderEpochResponse,
        )
    (part,) = answer.topics[0].partitions
    return part.error_code, part.leader_epoch, part.end_offset


def _produce_all(bootstrap: str, topic: str, count: int, tag: bytes) -> list[tuple[int, int]]:
    """acks=all through confluent-kafka; every message must be acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    acked: list[tuple[int, int]] = []
    errors: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            acked.append((msg.partition(), msg.offset()))

    for i in range(count):
        producer.produce(topic, value=tag + b"%04d" % i, partition=i % 6, on_delivery=on_delivery)
    assert producer.flush(60) == 0
    assert not errors, errors
    return acked


def _watermarks(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "wm"})
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(6)
        ]
    finally:
        consumer.close()


def test_delete_records_is_answered_by_the_leader_and_kept_by_the_next_one(replicated) -> None:
    """Every replica holds its own copy of a partition, which only the leader's deletes may
    move: a DeleteRecords sent to a follower advanced the follower's copy alone and answered
    success. As in Kafka, a follower answers NOT_LEADER_OR_FOLLOWER (clients go to the
    leader), and the leader deletes. The deletion reaches every replica (a log-start entry in
    the journal partition): after the leader's SIGKILL the new leader starts the partition
    at the deleted offset too (it served the deleted records again before)."""
    brokers, _ = replicated
    admin = AdminClient({"bootstrap.servers": brokers[0].bootstrap})
    admin.create_topics([NewTopic("dr", 1, 3)])["dr"].result(30)
    _wait(lambda: _leaders(brokers[0].bootstrap, "dr")[0] in (1, 2, 3), 30, "a leader")
    producer = Producer({"bootstrap.servers": brokers[0].bootstrap, "acks": "all"})
    for i in range(10):
        producer.produce("dr", value=b"%d" % i, partition=0)
    assert producer.flush(30) == 0
    leader = _leaders(brokers[0].bootstrap, "dr")[0]
    by_id = dict(zip((1, 2, 3), brokers, strict=True))
    for broker_id, broker in by_id.items():
        if broker_id != leader:
            assert raw_delete(broker.port, 2, "dr", 0, 4) == (ErrorCode.not_leader_or_follower, -1)
    assert raw_delete(by_id[leader].port, 2, "dr", 0, 4) == (0, 4)
    by_id[leader].kill()
    survivors = [b for broker_id, b in by_id.items() if broker_id != leader]
    _wait(lambda: _leaders(survivors[0].bootstrap, "dr")[0] not in (leader, -1), 60, "failover")
    consumer = Consumer({"bootstrap.servers": survivors[0].bootstrap, "group.id": "dr-check"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition("dr", 0), timeout=10) == (4, 10)
    finally:
        consumer.close()
    for b in survivors:
        b.stop()
        _storage_check(b.data_dir)


def test_a_tiered_deletion_moves_every_replicas_archive(broker_factory, zookeeper) -> None:
    """Each broker archives its own copy into its own cold store. DeleteRecords below the
    local log start of a tiered partition moved only the leader's cold log start (no journal
    entry was written for it, and a follower's splitter did not touch its archive), so after
    a failover the new leader served the deleted records from its archive (an independent
    review). Now the log-start entry is written then too, and every follower's splitter moves
    its own cold log start with it."""
    from stonemq.tiering import manifest as mf
    from stonemq.tiering.archive_job import archive_in_process
    from stonemq.tiering.cold_store import StoreSpec

    from .helpers import local_log_start, sample_messages, wait_high_watermark
    from .helpers import produce as produce_msgs

    brokers, _ = _start_cluster(
        broker_factory,
        zookeeper,
        **{"log_retention_check_interval_ms": 200, "queue_checkpoint_interval_ms": 200},
    )
    admin = AdminClient({"bootstrap.servers": brokers[0].bootstrap})
    config = {
        "remote.storage.enable": "true",
        "internal.segment.bytes": "8192",
        "local.retention.ms": "0",
    }
    admin.create_topics([NewTopic("tdr", 1, 3, config=config)])["tdr"].result(30)
    _wait(lambda: _leaders(brokers[0].bootstrap, "tdr")[0] in (1, 2, 3), 30, "a leader")
    msgs = sample_messages(300)
    produce_msgs(brokers[0].bootstrap, "tdr", msgs, acks="all", **{"batch.size": 4096})
    wait_high_watermark(brokers[0].bootstrap, "tdr", 300)
    specs = {b: StoreSpec((b.data_dir / "tier").resolve().as_uri()) for b in brokers}

    def archived(b: Any) -> int:  # a follower splits what it fetched once it learns the HW
        if (b.data_dir / "queues" / "tdr-0").is_dir():
            archive_in_process(specs[b], str(b.data_dir / "queues"), "tdr", 0)
        return mf.load(specs[b].open(), "tdr", 0).next_offset

    for b in brokers:
        _wait(lambda b=b: archived(b) > 100, 30, f"{b.data_dir}: archived past 100")
    for b in brokers:  # local retention removes what each archived
        _wait(lambda b=b: local_log_start(b.data_dir, "tdr") >= 100, 30, "local segments gone")
    leader = _leaders(brokers[0].bootstrap, "tdr")[0]
    by_id = dict(zip((1, 2, 3), brokers, strict=True))
    assert raw_delete(by_id[leader].port, 2, "tdr", 0, 50) == (0, 50)  # archived offsets only
    for b in brokers:
        _wait(
            lambda b=b: mf.load(specs[b].open(), "tdr", 0).start_offset == 50,
            30,
            f"{b.data_dir}: its archive starts at 50",
        )
    by_id[leader].kill()
    survivors = [b for broker_id, b in by_id.items() if broker_id != leader]
    _wait(lambda: _leaders(survivors[0].bootstrap, "tdr")[0] not in (leader, -1), 60, "failover")
    consumer = Consumer({"bootstrap.servers": survivors[0].bootstrap, "group.id": "tdr-check"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition("tdr", 0), timeout=10) == (50, 300)
    finally:
        consumer.close()
    # DeleteTopics: every broker removes the topic's cold data from its own store, not only
    # the one that handled the request; the others kept the old topic's uploaded segments
    # and archived them as a re-created topic's offsets (audit37 p3)
    deleting = AdminClient({"bootstrap.servers": survivors[0].bootstrap})
    deleting.delete_topics(["tdr"], operation_timeout=30)["tdr"].result(30)

    def cold_data(b: Any) -> list[str]:
        store = specs[b].open()
        return store.list(mf.manifest_dir("tdr", 0)) + store.list(mf.segments_dir("tdr", 0))

    for b in survivors:
        _wait(lambda b=b: not cold_data(b), 30, f"{b.data_dir}: the topic's cold data gone")


def test_acks_all_waits_for_the_isr_and_min_insync_replicas_refuses(replicated) -> None:
    brokers, chroot = replicated
    b1, b2, b3 = brokers
    admin = AdminClient({"bootstrap.servers": b1.bootstrap})
    admin.create_topics([NewTopic("acks", 6, 3, config={"min.insync.replicas": "2"})])[
        "acks"
    ].result(30)
    assert len(_produce_all(b1.bootstrap, "acks", 60, b"a")) == 60
    assert _watermarks(b1.bootstrap, "acks") == [(0, 10)] * 6
    led = _leaders(b1.bootstrap, "acks")
    moved = [p for p, leader in led.items() if leader == 2]
    assert moved

    # broker 2 goes: its journal partition gets a new leader (epoch 1) from the ISR; acks=all
    # waits until the ISR has shrunk to the two live brokers (replica.lag.time.max.ms 3 s)
    b2.stop()
    _wait(lambda: all(_leaders(b1.bootstrap, "acks")[p] in (1, 3) for p in moved), 30, "failover")
    assert len(_produce_all(b1.bootstrap, "acks", 60, b"b")) == 60
    assert _watermarks(b1.bootstrap, "acks") == [(0, 20)] * 6
    new_leader = {1: b1, 3: b3}[_leaders(b1.bootstrap, "acks")[moved[0]]]
    # OffsetForLeaderEpoch from the batches' real epochs: epoch 0 ended where epoch 1 began
    assert _offset_for_epoch(new_leader, "acks", moved[0], 1, 0) == (0, 0, 10)
    assert _offset_for_epoch(new_leader, "acks", moved[0], 1, 1) == (0, 1, 20)

    # broker 3 goes too. Broker 1 keeps it in the ISR of the journal partition it leads until
    # replica.lag.time.max.ms (3 s) has passed: what it takes for acks=all meanwhile is on it
    # alone and is never acknowledged (appended, then NOT_ENOUGH_REPLICAS_AFTER_APPEND once
    # the ISR shrank below min.insync.replicas, as Kafka's DelayedProduce)
    led_by_1 = [p for p, leader in _leaders(b1.bootstrap, "acks").items() if leader == 1]
    assert led_by_1
    b3.stop()
    alone: dict[int, int] = {}
    with RawConnection(b1.host, b1.port) as conn:
        for p in led_by_1:
            batch = bytes(build_batch([(None, b"alone%d" % p)]))
            alone[p] = produce_raw(conn, "acks", p, batch, acks=-1).error_code
    assert all(
        code in (NOT_ENOUGH_REPLICAS, NOT_ENOUGH_REPLICAS_AFTER_APPEND) for code in alone.values()
    ), alone
    appended = {p for p, code in alone.items() if code == NOT_ENOUGH_REPLICAS_AFTER_APPEND}
    # everything acknowledged so far is on both brokers that were in the ISR when it was
    # (broker 1 and the stopped broker 3, in their journals: a follower splits later); no
    # record taken while broker 1 was alone reached broker 3
    acknowledged = {b"a%04d" % i for i in range(60)} | {b"b%04d" % i for i in range(60)}
    on_3 = _journal_values(b3.data_dir)
    assert acknowledged <= on_3, sorted(acknowledged - on_3)[:5]
    assert not any(v.startswith(b"alone") for v in on_3)
    _wait(lambda: set(_leaders(b1.bootstrap, "acks").values()) == {1}, 30, "all led by 1")
    _wait(lambda: all(isr == (1,) for isr in _isrs(chroot).values()), 30, "ISR shrinks to 1")
    with RawConnection(b1.host, b1.port) as conn:
        for p in range(6):
            part = produce_raw(conn, "acks", p, bytes(build_batch([(None, b"refused")])), acks=-1)
            assert part.error_code == NOT_ENOUGH_REPLICAS, (p, part.error_code)
        # acks=1 is still taken (Kafka's min.insync.replicas binds acks=all only)
        part = produce_raw(conn, "acks", 0, bytes(build_batch([(None, b"one")])), acks=1)
        assert part.error_code == 0 and part.base_offset == 20 + (0 in appended)
    assert acknowledged <= _journal_values(b1.data_dir)
    # nothing refused before the append is in any log
    assert _watermarks(b1.bootstrap, "acks")[1:] == [(0, 20 + (p in appended)) for p in range(1, 6)]

    # both come back, catch up, rejoin the ISR; acks=all is answered again
    b2.start()
    b3.start()
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 60, "ISR grows")
    assert len(_produce_all(b1.bootstrap, "acks", 60, b"c")) == 60
    marks = _watermarks(b1.bootstrap, "acks")
    assert marks == [(0, 30 + (p == 0) + (p in appended)) for p in range(6)], marks
    time.sleep(2)  # followers learn the last HW in their next fetch
    for b in brokers:
        b.stop()
    journals = [_journal_bytes(b.data_dir) for b in brokers]
    for j in range(3):
        assert journals[0][j] == journals[1][j] == journals[2][j], f"journal partition {j}"
    queue = _same_queue_logs(brokers, "acks", 6)
    # batches carry the leader epoch that wrote them: the moved partition's first ten
    # records in epoch 0, every later one in a later epoch
    epochs = _batch_epochs(queue[moved[0]])
    assert {e for base, e in epochs if base < 10} == {0}
    assert all(e >= 1 for base, e in epochs if base >= 10)
    # each journal partition's leader-epoch checkpoint agrees on every replica for the epochs
    # that wrote entries (a leader elected during the final stops wrote none: only it knows
    # that epoch, as in Kafka, where followers learn epochs from batches)
    for j in range(3):
        end = len(journals[0][j])
        files = [[e for e in _epoch_file(b.data_dir, j) if e[1] < end] for b in brokers]
        assert files[0] == files[1] == files[2], (j, files)
        assert files[0][0] == (0, 0)
    moved_journal = next(j for j in range(3) if len(_epoch_file(b1.data_dir, j)) > 1)
    assert [e for e, _ in _epoch_file(b1.data_dir, moved_journal)][:2] == [0, 1]


def _epoch_file(data_dir: Path, journal: int) -> list[tuple[int, int]]:
    journal_dir = data_dir / "journal"
    order = [
        int(row[0])
        for row in CheckpointFile(str(journal_dir / "hosted-journal-partitions"), 1).read() or []
    ]
    path = journal_dir / f"journal-{order.index(journal)}" / LEADER_EPOCH_FILE
    return [(int(e), int(s)) for e, s in CheckpointFile(str(path), 2).read() or []]


def _ack_delays(bootstrap: str, topic: str, partitions: list[int], timeout_s: float) -> list[float]:
    """One acks=all record to each partition: the seconds until each was acknowledged."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "message.timeout.ms": int(timeout_s * 1000) - 5000,
        }
    )
    started = time.monotonic()
    acked: list[float] = []
    for p in partitions:
        producer.produce(
            topic,
            value=b"acks-all",
            partition=p,
            on_delivery=lambda err, msg: (
                acked.append(time.monotonic() - started) if err is None else None
            ),
        )
    assert producer.flush(timeout_s) == 0
    return acked


def test_a_paused_follower_leaves_the_isr_and_rejoins_once_caught_up(replicated) -> None:
    """replica.lag.time.max.ms (3 s here): a follower that stops fetching (SIGSTOP, shorter
    than its ZooKeeper session) is dropped from the ISR of the journal partitions it follows,
    through the leader's conditional write (no election: the leader epoch stays); acks=all is
    answered only after that; once it runs again and catches up it is added back."""
    import signal

    brokers, chroot = replicated
    b1, _b2, b3 = brokers
    admin = AdminClient({"bootstrap.servers": b1.bootstrap})
    admin.create_topics([NewTopic("lag", 6, 3)])["lag"].result(30)
    assert len(_produce_all(b1.bootstrap, "lag", 60, b"x")) == 60
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 30, "ISR")
    zk = KazooClient(chroot)
    zk.start(10)
    try:
        before = read_journal_partitions(zk)
        assert all(set(p.state.isr) == {1, 2, 3} for p in before.values())
        not_led_by_3 = [j for j, p in before.items() if p.state.leader != 3]
        led = _leaders(b1.bootstrap, "lag")
        assert b3.proc is not None
        b3.proc.send_signal(signal.SIGSTOP)
        try:
            acked = _ack_delays(b1.bootstrap, "lag", [p for p, b in led.items() if b != 3], 30)
            # not acknowledged before broker 3 left the ISR: at least the lag time
            assert acked and min(acked) >= 2.5, acked
            after = read_journal_partitions(zk)
            for j in not_led_by_3:
                assert set(after[j].state.isr) == {1, 2} - {3}, after[j].state
                assert after[j].state.leader_epoch == before[j].state.leader_epoch
        finally:
            b3.proc.send_signal(signal.SIGCONT)
        _wait(
            lambda: all(
                set(p.state.isr) == {1, 2, 3} for p in read_journal_partitions(zk).values()
            ),
            30,
            "broker 3 back in every ISR",
        )
        assert all(
            p.state.leader_epoch == before[j].state.leader_epoch
            for j, p in read_journal_partitions(zk).items()
        )
    finally:
        zk.stop()
        zk.close()
    assert _watermarks(b1.bootstrap, "lag") == [
        (0, 11) if led[p] != 3 else (0, 10) for p in range(6)
    ]


def test_a_dead_follower_leaves_the_isr_as_soon_as_its_session_ends(
    broker_factory, zookeeper
) -> None:
    """A follower SIGKILLed leaves the ISR of the journal partitions it follows as soon as it
    is judged dead (its listener refuses connects), or at the latest when its ZooKeeper
    session ends (the controller's conditional write, the leader epoch kept, as Kafka's
    controller does for a dead broker), not replica.lag.time.max.ms later (60 s here):
    acks=all is answered within seconds; restarted, it catches up and is taken back."""
    brokers, chroot = _start_cluster(
        broker_factory,
        zookeeper,
        replica_lag_time_max_ms=60_000,
        zookeeper_session_timeout_ms=6000,
    )
    b1, _b2, b3 = brokers
    admin = AdminClient({"bootstrap.servers": b1.bootstrap})
    admin.create_topics([NewTopic("dead", 6, 3)])["dead"].result(30)
    assert len(_produce_all(b1.bootstrap, "dead", 60, b"x")) == 60
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 30, "ISR")
    zk = KazooClient(chroot)
    zk.start(10)
    try:
        before = read_journal_partitions(zk)
        not_led_by_3 = [j for j, p in before.items() if p.state.leader != 3]
        led = _leaders(b1.bootstrap, "dead")
        b3.kill()
        partitions = [p for p, b in led.items() if b != 3]
        acked = _ack_delays(b1.bootstrap, "dead", partitions, 55)
        assert len(acked) == len(partitions)
        # the session (6 s) and the controller, not the 60 s lag time
        assert max(acked) < 25, acked
        after = read_journal_partitions(zk)
        for j in not_led_by_3:
            assert set(after[j].state.isr) == {1, 2}, after[j].state
            assert after[j].state.leader_epoch == before[j].state.leader_epoch
        _restart(b3, chroot)
        _wait(
            lambda: all(
                set(p.state.isr) == {1, 2, 3} for p in read_journal_partitions(zk).values()
            ),
            60,
            "broker 3 back in every ISR",
        )
    finally:
        zk.stop()
        zk.close()


def test_a_returning_leader_truncates_the_tail_it_alone_had(broker_factory, zookeeper) -> None:
    """Invariant 6: a leader writes acks=1 batches its paused followers never fetch, and is
    killed; a follower from the ISR leads in the next epoch and takes acks=all writes. The old
    leader restarts, fetches with its last epoch, is told where that epoch ends on the new
    leader, truncates its journal there and then holds exactly the new leader's journal and
    queue logs. No consumer ever saw the lost tail (it was never below the HW)."""
    import signal

    brokers, chroot = _start_cluster(
        broker_factory,
        zookeeper,
        zookeeper_session_timeout_ms=6000,
        replica_fetch_wait_max_ms=100,
    )
    admin = AdminClient({"bootstrap.servers": brokers[0].bootstrap})
    admin.create_topics([NewTopic("trunc", 6, 3)])["trunc"].result(30)
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 30, "ISR")
    assert len(_produce_all(brokers[0].bootstrap, "trunc", 60, b"a")) == 60
    led = _leaders(brokers[0].bootstrap, "trunc")
    old = brokers[0]  # broker 1 leads its own journal partition
    mine = [p for p, leader in led.items() if leader == 1]
    assert mine
    with RawConnection(old.host, old.port) as conn:
        old_epoch = leader_epochs_of(conn, "trunc")[mine[0]]
    followers = brokers[1:]
    for f in followers:
        f.proc.send_signal(signal.SIGSTOP)
    # a fetch the followers sent before they stopped is answered (empty) within its 100 ms
    # long poll: none is left to carry what follows to them
    time.sleep(0.5)
    try:
        with RawConnection(old.host, old.port) as conn:
            for i in range(5):
                part = produce_raw(
                    conn, "trunc", mine[0], bytes(build_batch([(None, b"lost%d" % i)])), acks=1
                )
                assert part.error_code == 0 and part.base_offset == 10 + i
        old.kill()
    finally:
        for f in followers:
            f.proc.send_signal(signal.SIGCONT)
    b2 = brokers[1]
    _wait(lambda: _leaders(b2.bootstrap, "trunc")[mine[0]] in (2, 3), 60, "failover")
    new_leader = brokers[_leaders(b2.bootstrap, "trunc")[mine[0]] - 1]
    assert len(_produce_all(new_leader.bootstrap, "trunc", 60, b"b")) == 60
    # KIP-320: a consumer still holding the old leader's epoch is fenced by the new leader
    # (it refreshes its metadata), and one with the new epoch is served
    with RawConnection(new_leader.host, new_leader.port) as conn:
        new_epoch = leader_epochs_of(conn, "trunc")[mine[0]]
        assert new_epoch > old_epoch
        fenced = fetch_raw(conn, "trunc", mine[0], 0, current_leader_epoch=old_epoch)
        assert (fenced.error_code, fenced.records or b"") == (ErrorCode.fenced_leader_epoch, b"")
        ahead = fetch_raw(conn, "trunc", mine[0], 0, current_leader_epoch=new_epoch + 1)
        assert ahead.error_code == ErrorCode.unknown_leader_epoch
        served = fetch_raw(conn, "trunc", mine[0], 0, current_leader_epoch=new_epoch)
        assert served.error_code == ErrorCode.none and served.records
        # ListOffsets answers the epoch of the batch holding each offset (offsets audit:
        # always the current one), as Kafka's leader-epoch cache does
        for target, epoch in ((-2, old_epoch), (0, old_epoch), (-3, new_epoch), (-1, new_epoch)):
            answer = list_offsets_partition(conn, 9, "trunc", target, partition=mine[0])
            assert (answer.error_code, answer.leader_epoch) == (ErrorCode.none, epoch), target
    _restart(old, chroot)
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 60, "ISR grows")
    assert "diverged from leader" in old.log(since_start=True)
    assert len(_produce_all(new_leader.bootstrap, "trunc", 60, b"c")) == 60
    consumer = Consumer(
        {
            "bootstrap.servers": new_leader.bootstrap,
            "group.id": "trunc-check",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition("trunc", mine[0], 0)])
    seen: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(seen) < 30 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            seen.append(msg.value())
    consumer.close()
    assert len(seen) == 30 and not any(v.startswith(b"lost") for v in seen), seen
    _stop_checked(brokers)
    journals = [_journal_bytes(b.data_dir) for b in brokers]
    for j in range(3):
        assert journals[0][j] == journals[1][j] == journals[2][j], f"journal partition {j}"
    queue = _same_queue_logs(brokers, "trunc", 6)
    assert [v for _, v in _records(queue[mine[0]])] == seen


@pytest.mark.slow
def test_leader_sigkill_under_an_idempotent_producer_loses_and_doubles_nothing(
    broker_factory, zookeeper
) -> None:
    """An idempotent acks=all producer runs throughout; the leader of a journal partition is
    SIGKILLed and restarted. Every acknowledged record is then on every replica exactly once,
    at its acknowledged offset, and every replica holds the same queue logs."""
    brokers, chroot = _start_cluster(broker_factory, zookeeper, zookeeper_session_timeout_ms=6000)
    admin = AdminClient({"bootstrap.servers": brokers[1].bootstrap})
    admin.create_topics([NewTopic("fo", 6, 3)])["fo"].result(30)
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 30, "ISR")
    producing = _Producing(f"{brokers[1].bootstrap},{brokers[2].bootstrap}", "fo", 6)
    acked = producing.acked
    try:
        producing.more(300, "producing")
        mine = [p for p, leader in _leaders(brokers[1].bootstrap, "fo").items() if leader == 1]
        assert mine
        brokers[0].kill()  # leads its journal partition; maybe the controller
        _wait(
            lambda: all(_leaders(brokers[1].bootstrap, "fo")[p] in (2, 3) for p in mine),
            60,
            "failover once broker 1's session expired",
        )
        producing.more(300, "producing on the new leader")
        _restart(brokers[0], chroot)
        _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 60, "ISR")
        producing.more(100, "producing with all back")
    finally:
        producing.halt()
    producing.settle()
    _stop_checked(brokers)
    queue = _same_queue_logs(brokers, "fo", 6)
    stored: dict[tuple[int, int], bytes] = {}
    for p in range(6):
        records = _records(queue[p])
        values = [v for _, v in records]
        assert len(values) == len(set(values)), f"fo-{p}: a record stored twice"
        stored.update(((p, off), v) for off, v in records)
    for p, off, value in acked:
        assert stored.get((p, off)) == value, (p, off, value, stored.get((p, off)))
    assert len(acked) == len(stored)  # nothing stored that was not acknowledged


def test_committed_offsets_survive_the_coordinators_sigkill(broker_factory, zookeeper) -> None:
    """Offsets committed after every broker started are answered by the new coordinator once
    the old one is SIGKILLed: commits were acknowledged only once the ISR held them, and the
    new leader of the ``__consumer_offsets`` journal partition reloads its groups (answering
    COORDINATOR_LOAD_IN_PROGRESS meanwhile) before it coordinates them."""
    brokers, chroot = _start_cluster(broker_factory, zookeeper, zookeeper_session_timeout_ms=6000)
    admin = AdminClient({"bootstrap.servers": brokers[0].bootstrap})
    admin.create_topics([NewTopic("cg", 6, 3)])["cg"].result(30)
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 30, "ISR")
    assert len(_produce_all(brokers[0].bootstrap, "cg", 60, b"m")) == 60
    bootstrap = ",".join(b.bootstrap for b in brokers)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "survivor"})
    wanted = [TopicPartition("cg", p, 3 + p) for p in range(6)]
    assert all(tp.error is None for tp in consumer.commit(offsets=wanted, asynchronous=False))
    consumer.close()
    described = admin.describe_consumer_groups(["survivor"])["survivor"].result(30)
    coordinator = described.coordinator.id
    victim = brokers[coordinator - 1]
    victim.kill()
    others = [b for b in brokers if b is not victim]
    survivors = AdminClient({"bootstrap.servers": others[0].bootstrap})

    def coordinator_now() -> int:
        try:
            found = survivors.describe_consumer_groups(["survivor"])["survivor"].result(10)
        except Exception:  # no coordinator yet (its journal partition has no leader)
            return coordinator
        return found.coordinator.id

    _wait(lambda: coordinator_now() != coordinator, 60, "a new coordinator")
    consumer = Consumer(
        {"bootstrap.servers": ",".join(b.bootstrap for b in others), "group.id": "survivor"}
    )
    committed = consumer.committed([TopicPartition("cg", p) for p in range(6)], timeout=30)
    consumer.close()
    assert [tp.offset for tp in committed] == [3 + p for p in range(6)]
    assert "reloaded" in "".join(b.log(since_start=True) for b in others)


def test_a_broker_whose_journal_copy_fails_hands_over_its_leadership(
    broker_factory, zookeeper
) -> None:
    """A leader whose journal files stop taking writes (EPERM, as from a failing disk: the
    journal partition goes offline, fail-stop) kept its leaderships before: every produce to
    them failed until a restart. Now it reports its offline copies in ZooKeeper, and the
    controller elects other ISR members and takes it out of the ISRs (Kafka's controller does
    the same for a failed log directory): producers carry on by themselves, nothing is lost
    or doubled. Restarted, it recovers its copies and rejoins every ISR."""
    brokers, chroot = _start_cluster(broker_factory, zookeeper, zookeeper_session_timeout_ms=6000)
    admin = AdminClient({"bootstrap.servers": brokers[1].bootstrap})
    admin.create_topics([NewTopic("off", 6, 3)])["off"].result(30)
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 30, "ISR")
    assert len(_produce_all(brokers[1].bootstrap, "off", 60, b"a")) == 60
    old = brokers[0]
    assert 1 in _leaders(brokers[1].bootstrap, "off").values()  # broker 1 leads some
    files = sorted((old.data_dir / "journal").glob("journal-*/*.journal"))
    if not immutable(files, True):
        pytest.skip("chattr +i is not possible here (needs root and a filesystem with it)")
    try:
        assert len(_produce_all(brokers[1].bootstrap, "off", 60, b"b")) == 60
        assert 1 not in _leaders(brokers[1].bootstrap, "off").values()
        assert all(1 not in isr for isr in _isrs(chroot).values()), _isrs(chroot)
        assert "offline on this broker until it restarts" in old.log(since_start=True)
    finally:
        immutable(files, False)
    old.kill()
    _restart(old, chroot)
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 60, "ISR grows")
    assert len(_produce_all(brokers[1].bootstrap, "off", 60, b"c")) == 60
    _stop_checked(brokers)
    queue = _same_queue_logs(brokers, "off", 6)
    values = sorted(v for p in range(6) for _, v in _records(queue[p]))
    assert values == sorted(t + b"%04d" % i for t in (b"a", b"b", b"c") for i in range(60))


def test_a_leader_out_of_space_hands_over_its_leadership_and_comes_back(
    broker_factory, zookeeper, tmp_path: Path
) -> None:
    """Broker 1's disk fills up under acks=all producers. It kept its leaderships before:
    every produce to them failed (KAFKA_STORAGE_ERROR) until space returned. Now it reports
    its copies out of space in ZooKeeper, the controller moves their leadership to ISR
    members with room and takes it out of the ISRs (Kafka's controller does the same for a
    log directory that failed on ENOSPC), and producers carry on by themselves. Once space
    returns, its appends succeed again, it withdraws the report and rejoins every ISR
    without a restart (Kafka needs one). Nothing is lost or doubled."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    disk = mount_small_disk(mount, 64 << 20, kinds=("tmpfs",))
    if disk is None:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    brokers: list[Any] = []
    try:
        brokers, chroot = _start_cluster(
            broker_factory,
            zookeeper,
            data_dirs={1: mount / "data"},
            zookeeper_session_timeout_ms=6000,
        )
        admin = AdminClient({"bootstrap.servers": brokers[1].bootstrap})
        admin.create_topics([NewTopic("room", 6, 3)])["room"].result(30)
        _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 30, "ISR")
        assert len(_produce_all(brokers[1].bootstrap, "room", 60, b"a")) == 60
        assert 1 in _leaders(brokers[1].bootstrap, "room").values()  # broker 1 leads some
        filler = mount / "filler"
        fill(filler, 0)
        try:
            assert len(_produce_all(brokers[1].bootstrap, "room", 60, b"b")) == 60
            assert 1 not in _leaders(brokers[1].bootstrap, "room").values()
            _wait(lambda: all(1 not in isr for isr in _isrs(chroot).values()), 30, "ISR shrinks")
            assert "out of space on this broker" in brokers[0].log(since_start=True)
        finally:
            filler.unlink()
        _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 60, "ISR grows")
        assert "has room again on this broker" in brokers[0].log(since_start=True)
        assert len(_produce_all(brokers[1].bootstrap, "room", 60, b"c")) == 60
        _stop_checked(brokers)
        queue = _same_queue_logs(brokers, "room", 6)
        values = sorted(v for p in range(6) for _, v in _records(queue[p]))
        assert values == sorted(t + b"%04d" % i for t in (b"a", b"b", b"c") for i in range(60))
    finally:
        for broker in brokers:  # before its disk goes
            if broker.alive:
                broker.kill()
        disk.close()


def test_unclean_leader_election_turned_on_dynamically_elects_a_leader(
    broker_factory, zookeeper
) -> None:
    """Reproduced (an independent audit, f1): unclean.leader.election.enable could not be
    changed at runtime (INVALID_REQUEST "Cannot update these configs dynamically"). Kafka's is
    a dynamic broker config, and its controller elects an out-of-sync replica as soon as it is
    turned on. Here every journal partition's ISR is the one broker left, which is then
    killed; the other broker, restarted, stays out of leadership while the config is false,
    and takes it once the cluster-wide default is set to true through it."""
    from .test_cluster_admin import _set_default

    brokers, chroot = _start_cluster(broker_factory, zookeeper, zookeeper_session_timeout_ms=6000)
    b1, b2, b3 = brokers
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 30, "full ISRs")
    b2.kill()
    b3.kill()
    _wait(lambda: all(set(isr) == {1} for isr in _isrs(chroot).values()), 30, "ISRs of {1}")
    b1.kill()
    _restart(b2, chroot)
    zk = KazooClient(chroot)
    zk.start(10)
    try:

        def leaders() -> set[int]:
            return {p.state.leader for p in read_journal_partitions(zk).values()}

        # the restarted broker takes the controller's role from the killed one and takes the
        # leadership away from it: no leader, as no live replica is in sync
        _wait(lambda: leaders() == {-1}, 30, "the leaderships taken from broker 1")
        time.sleep(2)
        assert leaders() == {-1}, read_journal_partitions(zk)
        assert _set_default(b2, "unclean.leader.election.enable", "true") == 0
        _wait(lambda: leaders() == {2}, 30, "broker 2 elected uncleanly")
        for p in read_journal_partitions(zk).values():
            assert p.state.isr == (2,), p.state
    finally:
        zk.stop()
        zk.close()


def _elect_raw(
    broker: Any, topic: str, partitions: list[int], client_id: str = "raw-test"
) -> dict[int, int]:
    """ElectLeaders(PREFERRED) sent to ``broker`` itself: partition → error code."""
    from . import rawclient

    req = rawclient.schema("elect_leaders", 2, "request")
    resp = rawclient.schema("elect_leaders", 2, "response")
    with RawConnection(broker.host, broker.port, client_id=client_id) as conn:
        answer = conn.request(
            req.ElectLeadersRequest(
                election_type=0,
                topic_partitions=(req.TopicPartitions(topic=topic, partitions=tuple(partitions)),),
                timeout=rawclient.ms(30000),
            ),
            resp.ElectLeadersResponse,
        )
    assert answer.error_code == ErrorCode.none
    (result,) = answer.replica_election_results
    return {p.partition_id: p.error_code for p in result.partition_result}


def test_a_rolling_restart_then_a_preferred_election_leaves_no_follower_looping(
    broker_factory, zookeeper
) -> None:
    """Reproduced (an independent audit): stop the preferred leader (controlled shutdown: its
    leadership moves in a new epoch in which nothing is written), start it again, elect it
    back with ElectLeaders(PREFERRED). The follower that led meanwhile kept that empty epoch
    at its journal end, was told its previous epoch ends right there, cut nothing, kept the
    epoch and diverged again at every fetch (about 100,000 log lines in 20 s): the HW stopped
    and acks=all was never answered. Now the empty epoch goes with the truncation, the
    acks=all records are answered and the divergence is met once."""
    from confluent_kafka import ElectionType

    brokers, chroot = _start_cluster(
        broker_factory, zookeeper, journal_partitions=1, zookeeper_session_timeout_ms=6000
    )
    bootstrap = ",".join(b.bootstrap for b in brokers)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("roll", 1, 3)])["roll"].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(20):
        producer.produce("roll", b"before-%d" % i, partition=0)
    assert producer.flush(30) == 0
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 30, "ISR")
    meta = admin.list_topics("roll", timeout=10).topics["roll"].partitions[0]
    preferred = meta.replicas[0]
    assert meta.leader == preferred
    victim = brokers[preferred - 1]
    assert victim.stop() == 0  # SIGTERM: controlled shutdown hands the leadership over
    _restart(victim, chroot)
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 60, "ISR")

    def elected() -> bool:
        # librdkafka sends ElectLeaders to the controller it last saw; any live broker
        # forwards it to the controller, but one that cannot reach it answers NOT_CONTROLLER
        answer = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition("roll", 0)])
        error = answer.result(60)[TopicPartition("roll", 0)]
        assert error is None or error.code() == ErrorCode.not_controller, error
        return error is None

    _wait(elected, 30, "the preferred election")
    _wait(lambda: _leaders(brokers[0].bootstrap, "roll")[0] == preferred, 30, "leader back")
    for i in range(10):
        producer.produce("roll", b"after-%d" % i, partition=0)
    assert producer.flush(20) == 0  # acks=all: every ISR member fetched them
    others = [b for b in brokers if b is not victim]
    diverged = {b.settings["broker_id"]: b.log().count("diverged from leader") for b in others}
    assert all(n <= 2 for n in diverged.values()), diverged


def _broker_3_killed_under_a_producer(
    broker_factory: Any, zookeeper: Any, topic: str, partitions: int, count: int, **extra: Any
) -> tuple[list[Any], str, Any, Any, list[int]]:
    """Three brokers (two journal partitions each), ``topic`` with every ISR full, an
    idempotent acks=all producer (:class:`_Producing`) that has ``count`` acknowledged;
    then broker 3 SIGKILLed and its home journal partitions led by 1 or 2. Returns the
    brokers, the chroot, the producer, a started ZooKeeper client, those journal
    partitions; the caller halts the producer and stops the client."""
    brokers, chroot = _start_cluster(
        broker_factory, zookeeper, journal_partitions=2, zookeeper_session_timeout_ms=6000, **extra
    )
    bootstrap = ",".join(b.bootstrap for b in brokers)
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the answer is in
    admin.create_topics([NewTopic(topic, partitions, 3)])[topic].result(30)
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 30, "ISR")
    zk = KazooClient(chroot)
    zk.start(10)
    producing = _Producing(bootstrap, topic, partitions)
    try:
        producing.more(count, "producing")
        homed = sorted(j for j, p in read_journal_partitions(zk).items() if p.assignment.home == 3)
        assert len(homed) == 2
        brokers[2].kill()
        _wait(
            lambda: all(read_journal_partitions(zk)[j].state.leader in (1, 2) for j in homed),
            60,
            "failover of broker 3's journal partitions",
        )
    except BaseException:
        producing.halt()
        zk.stop()
        zk.close()
        raise
    return brokers, chroot, producing, zk, homed


def test_a_preferred_election_gives_a_restarted_broker_its_leaderships_back(
    broker_factory, zookeeper
) -> None:
    """Reproduced: a broker SIGKILLed and restarted rejoins every ISR but never leads again
    (ElectLeaders answered PREFERRED_LEADER_NOT_AVAILABLE although its preferred replica was
    live and in sync), so leaderships piled up on the others. Now ElectLeaders(PREFERRED),
    sent to the controller by confluent-kafka's AdminClient, moves every journal partition
    homed on it back to it, in a higher leader epoch with the same ISR; the old leaders
    refuse appends to them; an idempotent acks=all producer running throughout loses and
    doubles nothing. Sent to a broker that is not the controller (a client's metadata older
    than a controller change), it is forwarded to the controller, as Kafka 4 forwards it; a
    request another broker forwarded is answered NOT_CONTROLLER there (one hop at most)."""
    from confluent_kafka import ElectionType

    brokers, chroot, producing, zk, homed = _broker_3_killed_under_a_producer(
        broker_factory, zookeeper, "pref", 12, 300, auto_leader_rebalance_enable=False
    )  # ElectLeaders alone
    bootstrap = ",".join(b.bootstrap for b in brokers)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    victim = brokers[2]  # broker 3
    acked, more = producing.acked, producing.more
    try:
        more(300, "producing on the new leaders")
        _restart(victim, chroot)
        _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 60, "ISR")
        more(100, "producing with broker 3 back")
        before = read_journal_partitions(zk)
        # nothing moves leaderships back by itself (auto.leader.rebalance.enable=false)
        assert all(before[j].state.leader in (1, 2) for j in homed), before
        meta = admin.list_topics("pref", timeout=10).topics["pref"].partitions
        preferred = {p: m.replicas[0] for p, m in meta.items()}
        moved = sorted(p for p, home in preferred.items() if home == 3)
        assert moved and len(moved) < 12
        controller = admin.describe_cluster().result(10).controller.id
        elsewhere = next(b for b in brokers if b.settings["broker_id"] not in (controller, 3))
        # a request another broker forwarded is not forwarded again, nor elected there
        forwarded = _elect_raw(elsewhere, "pref", moved, client_id="stonemq-forwarded-by-9")
        assert set(forwarded.values()) == {ErrorCode.not_controller}
        assert all(read_journal_partitions(zk)[j].state.leader in (1, 2) for j in homed)
        # a client's request at a broker that is not the controller: forwarded, elected
        assert _elect_raw(elsewhere, "pref", moved) == {p: ErrorCode.none for p in moved}
        answer = admin.elect_leaders(
            ElectionType.PREFERRED, [TopicPartition("pref", p) for p in range(12)]
        ).result(60)
        for tp, error in answer.items():  # elected already
            assert error is not None and error.code() == ErrorCode.election_not_needed, (tp, error)
        after = read_journal_partitions(zk)
        for j in homed:
            assert after[j].state.leader == 3, after[j].state
            assert after[j].state.leader_epoch > before[j].state.leader_epoch
            assert after[j].state.isr == before[j].state.isr
        # the old leaders refuse appends to the moved partitions once they see the new epoch
        old_leader = {p: meta[p].leader for p in moved}

        def refused() -> bool:
            for p in moved:
                b = brokers[old_leader[p] - 1]
                with RawConnection(b.host, b.port) as conn:
                    batch = bytes(build_batch([(None, b"stray")]))
                    part = produce_raw(conn, "pref", p, batch, acks=1)
                    if part.error_code != ErrorCode.not_leader_or_follower:
                        return False
            return True

        _wait(refused, 30, "the old leaders refusing appends")
        _wait(
            lambda: all(_leaders(brokers[0].bootstrap, "pref")[p] == 3 for p in moved),
            30,
            "metadata naming broker 3 the leader again",
        )
        more(300, "producing after the election")
    finally:
        producing.halt()
        zk.stop()
        zk.close()
    producing.settle()
    _acked_once_everywhere(brokers, bootstrap, "pref", 12, acked)


def _acked_once_everywhere(
    brokers: list[Any], bootstrap: str, topic: str, partitions: int, acked: list[Any]
) -> None:
    """Consumed: every acknowledged record exactly once, at its acknowledged offset; and,
    the brokers stopped, every replica holds the same queue logs: those records, once each."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "acked-check", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    consumed: dict[tuple[int, int], bytes] = {}
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(values) < len(acked) and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            consumed[(msg.partition(), msg.offset())] = msg.value()
            values.append(msg.value())
    consumer.close()
    assert len(values) == len(set(values)) == len(acked), (len(values), len(acked))
    assert consumed == {(p, off): v for p, off, v in acked}
    _stop_checked(brokers)
    queue = _same_queue_logs(brokers, topic, partitions)
    stored = {(p, off): v for p in range(partitions) for off, v in _records(queue[p])}
    assert stored == consumed


def test_the_controller_gives_a_restarted_broker_its_leaderships_back_by_itself(
    broker_factory, zookeeper
) -> None:
    """auto.leader.rebalance.enable (Kafka's default, true): a broker SIGKILLed and restarted
    rejoined every ISR but never led again unless ElectLeaders was sent, so leaderships piled
    up on the others after any restart. Now the controller checks the imbalance every
    leader.imbalance.check.interval.seconds (1 here) and runs a preferred election for the
    journal partitions of a home broker that leads too few of its own: they come back to it
    in a higher leader epoch with the same ISR, and an idempotent acks=all producer running
    throughout loses and doubles nothing."""
    brokers, chroot, producing, zk, homed = _broker_3_killed_under_a_producer(
        broker_factory, zookeeper, "auto", 6, 200, leader_imbalance_check_interval_seconds=1
    )
    bootstrap = ",".join(b.bootstrap for b in brokers)
    victim = brokers[2]  # broker 3
    acked, more = producing.acked, producing.more
    try:
        moved = read_journal_partitions(zk)
        more(200, "producing on the new leaders")
        _restart(victim, chroot)
        _wait(
            lambda: all(read_journal_partitions(zk)[j].state.leader == 3 for j in homed),
            60,
            "broker 3 leading its journal partitions again",
        )
        after = read_journal_partitions(zk)
        for j in homed:
            assert after[j].state.leader_epoch > moved[j].state.leader_epoch
            assert set(after[j].state.isr) == {1, 2, 3}
        assert "leader imbalance above 10%" in "".join(b.log(since_start=True) for b in brokers)
        more(200, "producing after the rebalance")
    finally:
        producing.halt()
        zk.stop()
        zk.close()
    producing.settle()
    _acked_once_everywhere(brokers, bootstrap, "auto", 6, acked)
