"""A follower behind the leader's journal start: it was down while the leader split, checkpointed
and deleted the journal segments it still needed (the leader keeps them for its ISR only).
Kafka's follower would truncate everything and start at the leader's log start; a StoneMQ
follower must not (its queue logs would lack what the leader split from the deleted bytes).
It catches up from the leader's state at one point (replication/catchup.py): a copy of the
leader's queue logs up to there, then its journal restarts at that point; it comes back into
the ISR, holds byte-identical queue logs, and can lead. Real ZooKeeper, two brokers,
default.replication.factor=2."""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.faults.logs import records

from .test_replication import _isrs, _journal_bytes, _produce_all, _storage_check, _wait

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(300)]

PARTITIONS = 6


def _journal_start(data_dir: Any, journal: int) -> int:
    from stonemq.storage.checkpoint import CheckpointFile

    journal_dir = data_dir / "journal"
    order = [
        int(row[0])
        for row in CheckpointFile(str(journal_dir / "hosted-journal-partitions"), 1).read() or []
    ]
    d = journal_dir / f"journal-{order.index(journal)}"
    return min(int(n.split(".")[0]) for n in os.listdir(d) if n.endswith(".journal"))


def _journal_end(data_dir: Any, journal: int) -> int:
    """The end of a broker's copy of journal partition ``journal`` (its last segment's base
    plus its size)."""
    from stonemq.storage.checkpoint import CheckpointFile

    journal_dir = data_dir / "journal"
    order = [
        int(row[0])
        for row in CheckpointFile(str(journal_dir / "hosted-journal-partitions"), 1).read() or []
    ]
    d = journal_dir / f"journal-{order.index(journal)}"
    last = max(n for n in os.listdir(d) if n.endswith(".journal"))
    return int(last.split(".")[0]) + (d / last).stat().st_size


def _queue_log(data_dir: Any, topic: str, partition: int) -> bytes:
    d = data_dir / "queues" / f"{topic}-{partition}"
    if not d.is_dir():
        return b""
    return b"".join((d / n).read_bytes() for n in sorted(os.listdir(d)) if n.endswith(".log"))


def _consume_all(bootstrap: str, topic: str) -> dict[tuple[int, int], bytes]:
    """Every record of ``topic`` from offset 0 to the high watermark, by (partition, offset)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex[:6]}"}
    )
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(PARTITIONS)
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        got: dict[tuple[int, int], bytes] = {}
        deadline = time.monotonic() + 60
        while any(sum(1 for k in got if k[0] == p) < ends[p] for p in range(PARTITIONS)):
            assert time.monotonic() < deadline, (ends, len(got))
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            got[(msg.partition(), msg.offset())] = msg.value()
        return got
    finally:
        consumer.close()


def _produce_single(bootstrap: str, topic: str, count: int, tag: bytes) -> list[tuple[int, int]]:
    """As ``_produce_all``, one record per batch (a queue log of many batches)."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "batch.num.messages": 1}
    )
    acked: list[tuple[int, int]] = []

    def on_delivery(err: Any, msg: Any) -> None:
        assert err is None, err
        acked.append((msg.partition(), msg.offset()))

    for i in range(count):
        producer.produce(topic, value=tag + b"%04d" % i, partition=i % 6, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert len(acked) == count
    return acked


def _two_brokers(broker_factory: Any, zookeeper: Any, **extra: Any) -> tuple[Any, Any, str]:
    """Brokers 1 and 2 under a chroot of their own, small journal segments, a short lag time
    and a 6 s session; returns (broker 1, broker 2, the chroot)."""
    chroot = f"{zookeeper.connect}/stonemq-behind-{uuid.uuid4().hex[:8]}"
    settings = {
        "zookeeper_connect": chroot,
        "journal_partitions": 1,
        "default_replication_factor": 2,
        "replica_lag_time_max_ms": 2000,
        "zookeeper_session_timeout_ms": 6000,
        "journal_segment_bytes": 16 * 1024,
        "queue_checkpoint_interval_ms": 200,
        **extra,
    }
    brokers = [broker_factory(broker_id=b, start=False, **settings) for b in (1, 2)]
    for b in brokers:
        b.spawn()
    for b in brokers:
        b.wait_ready(60)
    return brokers[0], brokers[1], chroot


def _behind(
    broker_factory: Any, zookeeper: Any, produce: Any = _produce_all, **extra: Any
) -> tuple[Any, Any, str, list]:
    """Two brokers; broker 2 killed, broker 1 goes on alone until it deleted the journal
    segments broker 2 needs; broker 2 not started again. Returns (leader, follower, chroot,
    the acknowledged (partition, offset, value))."""
    leader, follower, chroot = _two_brokers(broker_factory, zookeeper, **extra)
    admin = AdminClient({"bootstrap.servers": leader.bootstrap})
    admin.create_topics([NewTopic("behind", PARTITIONS, 2)])["behind"].result(30)
    _wait(lambda: all(set(i) == {1, 2} for i in _isrs(chroot).values()), 30, "full ISR")
    acked = _tagged(_produce_all(leader.bootstrap, "behind", 60, b"a"), b"a")
    time.sleep(1)  # the follower has it all
    follower.kill()
    # broker 1 leads both journal partitions alone once broker 2's session expired
    _wait(lambda: all(i == (1,) for i in _isrs(chroot).values()), 30, "broker 2 leaves the ISR")
    # far more than a segment, split and checkpointed: the leader deletes old segments
    for round_ in range(6):
        tag = b"x%d-" % round_ + b"x" * 200
        acked += _tagged(produce(leader.bootstrap, "behind", 200, tag), tag)
    journals = sorted(_isrs(chroot))
    _wait(
        lambda: all(_journal_start(leader.data_dir, j) > 0 for j in journals),
        30,
        "journal segments deleted",
    )
    ends = _journal_bytes(follower.data_dir)
    assert all(_journal_start(leader.data_dir, j) > len(ends[j]) for j in journals)
    return leader, follower, chroot, acked


def _tagged(acked: list[tuple[int, int]], tag: bytes) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of what ``_produce_all`` acknowledged (its i-th message,
    in partition i % 6, is ``tag`` + i: the k-th acknowledgement of a partition is its k-th
    message, librdkafka keeping a partition's order)."""
    out = []
    seen: dict[int, int] = {}
    for p, off in sorted(acked, key=lambda a: (a[0], a[1])):
        k = seen.get(p, 0)
        seen[p] = k + 1
        out.append((p, off, tag + b"%04d" % (p + PARTITIONS * k)))
    return out


def _holds(broker: Any, acked: list[tuple[int, int, bytes]]) -> bool:
    """Whether ``broker``'s queue logs hold every acknowledged record at its offset."""
    held = {p: dict(records(_queue_log(broker.data_dir, "behind", p))) for p in range(PARTITIONS)}
    return all(held[p].get(off) == value for p, off, value in acked)


def _identical(leader: Any, follower: Any) -> bool:
    return all(
        _queue_log(follower.data_dir, "behind", p) == _queue_log(leader.data_dir, "behind", p)
        for p in range(PARTITIONS)
    )


def test_a_follower_behind_the_leaders_journal_start_catches_up_and_can_lead(
    broker_factory, zookeeper
) -> None:
    leader, follower, chroot, acked = _behind(broker_factory, zookeeper)
    journals = sorted(_isrs(chroot))
    follower.start()
    caught = [
        f"journal partition {j}: caught up from leader 1 at journal position" for j in journals
    ]
    _wait(
        lambda: all(c in follower.log(since_start=True) for c in caught),
        60,
        "the follower's catch-ups",
    )
    _wait(lambda: all(set(i) == {1, 2} for i in _isrs(chroot).values()), 30, "back in the ISR")
    more = _tagged(_produce_all(leader.bootstrap, "behind", 60, b"b"), b"b")
    acked += more  # acks=all: on both brokers
    # byte-identical queue logs (the follower splits below the HW its next fetch learns)
    _wait(lambda: _holds(follower, acked), 30, "the follower splits every acknowledged record")
    _wait(lambda: _identical(leader, follower), 30, "the follower's queue logs = the leader's")
    log = follower.log(since_start=True)
    for j, line in zip(journals, caught, strict=True):  # its journal restarted at the point
        point = int(log.split(line, 1)[1].split()[0])
        assert point > 0 and _journal_start(follower.data_dir, j) >= point, (j, point)
    follower.stop()
    _storage_check(follower.data_dir)
    follower.start()  # a restart after the catch-up: fetching from where it was
    _wait(lambda: all(set(i) == {1, 2} for i in _isrs(chroot).values()), 30, "ISR after restart")
    log = follower.log(since_start=True)
    assert "catching up" not in log, log[-3000:]
    # the old leader dies: the caught-up follower leads and serves every acknowledged record
    leader.kill()
    _wait(lambda: all(i == (2,) for i in _isrs(chroot).values()), 30, "broker 2 leads")
    got = _consume_all(follower.bootstrap, "behind")
    for p, off, value in acked:
        assert got.get((p, off)) == value, (p, off, value, got.get((p, off)))
    assert len(_produce_all(follower.bootstrap, "behind", 60, b"c")) == 60  # it takes produces
    follower.stop()
    _storage_check(follower.data_dir)


def test_the_leader_takes_produces_throughout_the_catch_up(broker_factory, zookeeper) -> None:
    """The leader takes acks=all produces and splits them during the CatchUpPoint answer and
    the whole copy (one batch per Fetch): the follower's point P is passed at once, it
    fetches the journal from P, rejoins the ISR, and holds every acknowledged record at its
    offset, its queue logs byte-identical to the leader's; ``stonemq storage check`` is
    clean. The leader's journal rolls and its retention runs meanwhile: its segments from P
    stay for the follower (one CatchUpPoint per journal partition)."""
    leader, follower, chroot, acked = _behind(broker_factory, zookeeper, produce=_produce_single)
    journals = sorted(_isrs(chroot))
    normal = dict(follower.settings)
    # one batch per Fetch: the copy lasts seconds while the leader rolls ten segments a second
    follower.settings.update(replica_fetch_max_bytes=1, replica_fetch_response_max_bytes=1)
    stop = threading.Event()
    produced: list[tuple[int, int, bytes]] = []
    errors: list[Any] = []

    def produce_throughout() -> None:
        producer = Producer({"bootstrap.servers": leader.bootstrap, "acks": "all", "linger.ms": 0})

        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                produced.append((msg.partition(), msg.offset(), msg.value()))

        i = 0
        while not stop.is_set():
            value = b"t%06d-" % i + b"v" * 300
            producer.produce("behind", value=value, partition=i % 6, on_delivery=on_delivery)
            producer.poll(0)
            i += 1
            time.sleep(0.002)
        assert producer.flush(60) == 0

    thread = threading.Thread(target=produce_throughout, daemon=True)
    thread.start()
    started = [f"journal partition {j}: catching up from leader 1's state" for j in journals]
    caught = [f"journal partition {j}: caught up from leader 1 at" for j in journals]
    try:
        _wait(lambda: len(produced) > 50, 30, "produces under way")
        follower.spawn()
        deadline = time.monotonic() + 120
        while not all(line in follower.log(since_start=True) for line in started):
            assert time.monotonic() < deadline, follower.log_tail()
            time.sleep(0.005)
        at_start = len(produced)
        _wait(
            lambda: all(line in follower.log(since_start=True) for line in caught),
            120,
            "the follower's catch-ups",
        )
        during = len(produced) - at_start
        _wait(lambda: all(set(i) == {1, 2} for i in _isrs(chroot).values()), 60, "back in ISR")
        time.sleep(0.5)  # produces go on with the follower back in the ISR
    finally:
        stop.set()
        thread.join(90)
    assert not errors, errors[:5]
    assert during > 0, "no produce was acknowledged during the catch-up"
    # the leader's journal rolled and its retention ran (16 KiB segments, checkpoints every
    # 200 ms) during the copy, but kept its segments from P for the follower: exactly one
    # CatchUpPoint per journal partition, no second attempt for a deleted P
    log = follower.log(since_start=True)
    assert [log.count(line) for line in started] == [1] * len(journals), log[-4000:]
    assert "catch-up from leader 1 failed" not in log, log[-4000:]
    assert all(_journal_start(leader.data_dir, j) > 0 for j in journals)
    acked += produced
    _wait(lambda: _holds(follower, acked), 60, "the follower holds every acknowledged record")
    _wait(lambda: _identical(leader, follower), 30, "the follower's queue logs = the leader's")
    follower.settings = normal
    follower.stop()
    _storage_check(follower.data_dir)


def test_the_leaders_log_start_passes_the_copy_meanwhile(broker_factory, zookeeper) -> None:
    """DeleteRecords on the leader during the copy (one batch per Fetch) moves every
    partition's log start past where the follower's copy stands: the leader's Fetch answers
    OFFSET_OUT_OF_RANGE with its new log start, the follower empties that queue log to
    start there and copies on; it rejoins the ISR with the leader's log starts and every
    acknowledged record from there at its offset; ``stonemq storage check`` is clean."""
    leader, follower, chroot, acked = _behind(broker_factory, zookeeper, produce=_produce_single)
    journals = sorted(_isrs(chroot))
    normal = dict(follower.settings)
    follower.settings.update(replica_fetch_max_bytes=1, replica_fetch_response_max_bytes=1)
    admin = AdminClient({"bootstrap.servers": leader.bootstrap})
    admin.list_topics(timeout=10)  # connected ahead: the deletion lands within the copy
    follower.spawn()
    started = [f"journal partition {j}: catching up from leader 1's state" for j in journals]
    deadline = time.monotonic() + 60
    while not any(line in follower.log(since_start=True) for line in started):
        assert time.monotonic() < deadline, follower.log_tail()
        time.sleep(0.005)
    # of about 210 per partition: past what the follower held; the copy goes partition by
    # partition (one batch per Fetch), so at least the last ones are still below it
    cut = 200
    futures = admin.delete_records([TopicPartition("behind", p, cut) for p in range(PARTITIONS)])
    for future in futures.values():
        assert future.result(30).low_watermark == cut
    caught = [f"journal partition {j}: caught up from leader 1 at" for j in journals]
    _wait(
        lambda: all(line in follower.log(since_start=True) for line in caught),
        120,
        "the follower's catch-ups",
    )
    log = follower.log(since_start=True)
    assert "emptied (" in log and f"to start at offset {cut}" in log, log[-4000:]
    _wait(lambda: all(set(i) == {1, 2} for i in _isrs(chroot).values()), 60, "back in the ISR")
    kept = [(p, off, value) for p, off, value in acked if off >= cut]
    _wait(lambda: _holds(follower, kept), 60, "the follower holds every record from the cut")
    for p in range(PARTITIONS):
        held = dict(records(_queue_log(follower.data_dir, "behind", p)))
        assert min(held) <= cut, (p, min(held))  # the batch holding the log start on
        theirs = dict(records(_queue_log(leader.data_dir, "behind", p)))
        assert {o: v for o, v in held.items() if o >= cut} == {
            o: v for o, v in theirs.items() if o >= cut
        }
    follower.settings = normal
    follower.stop()
    _storage_check(follower.data_dir)


def test_a_follower_killed_during_its_catch_up_finishes_it_after_a_restart(
    broker_factory, zookeeper
) -> None:
    """SIGKILL of the follower while it copies the leader's queue logs (one batch per Fetch:
    replica.fetch.max.bytes and replica.fetch.response.max.bytes of 1 byte, as Kafka's
    fetches still return a first whole batch), then a restart: the copy goes on from what
    its queue logs kept (a torn tail cut by recovery) and the follower catches up."""
    leader, follower, chroot, acked = _behind(broker_factory, zookeeper, _produce_single)
    journals = sorted(_isrs(chroot))
    normal = dict(follower.settings)
    follower.settings.update(replica_fetch_max_bytes=1, replica_fetch_response_max_bytes=1)
    before = {p: _queue_log(follower.data_dir, "behind", p) for p in range(PARTITIONS)}
    follower.spawn()
    started = "catching up from leader 1's state at journal position"
    deadline = time.monotonic() + 60
    while started not in follower.log(since_start=True):
        assert time.monotonic() < deadline, follower.log_tail()
        time.sleep(0.005)
    while not any(  # copying: some batches in
        len(_queue_log(follower.data_dir, "behind", p)) > len(before[p]) for p in range(PARTITIONS)
    ):
        assert time.monotonic() < deadline, follower.log_tail()
        time.sleep(0.005)
    follower.kill()
    log = follower.log(since_start=True)
    assert "caught up from leader 1" not in log, "the copy ended before the kill"
    copied = {p: _queue_log(follower.data_dir, "behind", p) for p in range(PARTITIONS)}
    full = {p: _queue_log(leader.data_dir, "behind", p) for p in range(PARTITIONS)}
    assert any(len(copied[p]) < len(full[p]) for p in range(PARTITIONS))  # not done
    assert any(len(copied[p]) > len(before[p]) for p in range(PARTITIONS))  # begun
    follower.settings = normal
    follower.start()
    caught = [
        f"journal partition {j}: caught up from leader 1 at journal position" for j in journals
    ]
    _wait(
        lambda: all(c in follower.log(since_start=True) for c in caught),
        120,
        "the follower's catch-ups after the restart",
    )
    _wait(lambda: all(set(i) == {1, 2} for i in _isrs(chroot).values()), 30, "back in the ISR")
    acked += _tagged(_produce_all(leader.bootstrap, "behind", 60, b"b"), b"b")
    _wait(lambda: _holds(follower, acked), 30, "the follower splits every acknowledged record")
    _wait(lambda: _identical(leader, follower), 30, "the follower's queue logs = the leader's")
    follower.stop()
    _storage_check(follower.data_dir)
    leader.stop()
    _storage_check(leader.data_dir)
    assert _holds(follower, acked)


def test_a_leader_change_during_the_copy_restarts_it_from_the_new_leader(
    broker_factory, zookeeper
) -> None:
    """Three brokers at replication factor 3: broker 3 is behind every leader's journal start;
    while it copies a journal partition's queue logs from its leader (one batch per Fetch),
    that leader is SIGKILLed. The copy stops (the leadership moved, or the connection went)
    and starts again from the new leader, elected from the ISR in a new epoch; broker 3 ends
    in every ISR with queue logs byte-identical to the new leader's."""
    chroot = f"{zookeeper.connect}/stonemq-behind-{uuid.uuid4().hex[:8]}"
    settings = {
        "zookeeper_connect": chroot,
        "journal_partitions": 1,
        "default_replication_factor": 3,
        "replica_lag_time_max_ms": 2000,
        "zookeeper_session_timeout_ms": 6000,
        "journal_segment_bytes": 16 * 1024,
        "queue_checkpoint_interval_ms": 200,
    }
    brokers = {b: broker_factory(broker_id=b, start=False, **settings) for b in (1, 2, 3)}
    for b in brokers.values():
        b.spawn()
    for b in brokers.values():
        b.wait_ready(60)
    bootstrap = f"{brokers[1].bootstrap},{brokers[2].bootstrap}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("behind", PARTITIONS, 3)])["behind"].result(30)
    _wait(lambda: all(len(i) == 3 for i in _isrs(chroot).values()), 30, "full ISR")
    acked = _tagged(_produce_all(bootstrap, "behind", 60, b"a"), b"a")
    time.sleep(1)
    behind = brokers[3]
    behind.kill()
    _wait(lambda: all(set(i) == {1, 2} for i in _isrs(chroot).values()), 30, "3 leaves")
    for round_ in range(6):
        tag = b"x%d-" % round_ + b"x" * 200
        acked += _tagged(_produce_single(bootstrap, "behind", 200, tag), tag)
    journals = sorted(_isrs(chroot))
    _wait(
        lambda: all(_journal_start(brokers[b].data_dir, j) > 0 for j in journals for b in (1, 2)),
        30,
        "journal segments deleted on brokers 1 and 2",
    )
    normal = dict(behind.settings)
    behind.settings.update(replica_fetch_max_bytes=1, replica_fetch_response_max_bytes=1)
    behind.spawn()
    started = re.compile(r"journal partition (\d+): catching up from leader ([12])'s state")
    deadline = time.monotonic() + 60
    while (found := started.search(behind.log(since_start=True))) is None:
        assert time.monotonic() < deadline, behind.log_tail()
        time.sleep(0.005)
    journal, old = int(found[1]), int(found[2])
    time.sleep(0.05)  # copying
    brokers[old].kill()
    assert f"journal partition {journal}: caught up" not in behind.log(since_start=True)
    new = 3 - old
    _wait(
        lambda: all(i == (new,) or set(i) == {new, 3} for i in _isrs(chroot).values()),
        30,
        f"broker {new} leads every journal partition",
    )
    _wait(
        lambda: (
            f"journal partition {journal}: caught up from leader {new}"
            in behind.log(since_start=True)
        ),
        120,
        f"the copy restarted from broker {new}",
    )
    _wait(lambda: all(set(i) == {new, 3} for i in _isrs(chroot).values()), 60, "3 rejoins")
    survivor = brokers[new]
    acked += _tagged(_produce_all(survivor.bootstrap, "behind", 60, b"b"), b"b")
    _wait(lambda: _holds(behind, acked), 30, "broker 3 splits every acknowledged record")
    _wait(lambda: _identical(survivor, behind), 30, "broker 3's queue logs = the leader's")
    behind.settings = normal
    behind.stop()
    survivor.stop()
    _storage_check(behind.data_dir)
    _storage_check(survivor.data_dir)


def test_a_deleterecords_it_missed_moves_the_followers_archive_at_its_catch_up(
    broker_factory, zookeeper
) -> None:
    """A tiered partition's DeleteRecords while a follower is down: the follower had
    archived the deleted offsets into its own cold store. Its catch-up takes the leader's
    log start (the whole log's, from the leader's Fetch answers) for its archive too; it
    moved its local log start only, and once it led, its archive served the deleted
    records again (audit37 p2)."""
    from confluent_kafka.admin import AdminClient as Admin

    from stonemq.tiering import manifest as mf
    from stonemq.tiering.archive_job import archive_in_process
    from stonemq.tiering.cold_store import StoreSpec

    leader, follower, chroot = _two_brokers(broker_factory, zookeeper)
    admin = Admin({"bootstrap.servers": leader.bootstrap})
    config = {"remote.storage.enable": "true", "internal.segment.bytes": "8192"}
    admin.create_topics([NewTopic("tdr2", 1, 2, config=config)])["tdr2"].result(30)
    _wait(lambda: all(set(i) == {1, 2} for i in _isrs(chroot).values()), 30, "full ISR")

    def produce(count: int) -> None:
        producer = Producer(
            {"bootstrap.servers": leader.bootstrap, "acks": "all", "batch.size": 4096}
        )
        for i in range(count):
            producer.produce("tdr2", value=b"v%04d" % i + b"v" * 200, partition=0)
        assert producer.flush(60) == 0

    produce(200)
    spec = StoreSpec((follower.data_dir / "tier").resolve().as_uri())

    def archived() -> int:
        if (follower.data_dir / "queues" / "tdr2-0").is_dir():
            archive_in_process(spec, str(follower.data_dir / "queues"), "tdr2", 0)
        return mf.load(spec.open(), "tdr2", 0).next_offset

    _wait(lambda: archived() > 100, 30, "the follower archived past offset 100")
    follower.kill()
    _wait(lambda: all(i == (1,) for i in _isrs(chroot).values()), 30, "broker 2 leaves the ISR")
    deleted = admin.delete_records([TopicPartition("tdr2", 0, 100)])
    assert deleted[TopicPartition("tdr2", 0, 100)].result(30).low_watermark == 100
    for _ in range(6):  # the leader deletes the journal segments the follower needs
        produce(200)
    journals = sorted(_isrs(chroot))
    ends = {j: _journal_end(follower.data_dir, j) for j in journals}
    _wait(
        lambda: any(_journal_start(leader.data_dir, j) > ends[j] for j in journals),
        30,
        "journal segments deleted",  # of the journal partition carrying tdr2-0
    )
    assert mf.load(spec.open(), "tdr2", 0).start_offset == 0  # the follower's archive
    follower.start()
    _wait(lambda: "caught up from leader 1" in follower.log(since_start=True), 60, "catch-up")
    _wait(
        lambda: mf.load(spec.open(), "tdr2", 0).start_offset == 100,
        30,
        "the follower's archive starts at the DeleteRecords offset",
    )
