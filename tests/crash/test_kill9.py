"""The crash suite: a confluent-kafka producer (acks=all, delivery reports) writes to several
topics and partitions while the real broker process is killed with SIGKILL at random moments.

Some cycles also damage the newest files before the restart, as a torn write or a disk could:
random garbage appended to the newest journal segment or queue-log segment, or bytes cut from
their unacknowledged / unflushed tails (the newest journal segment after its last acknowledged
entry; the newest queue segment after the recovery point its checkpoint records: what a power
loss could take back). Some cycles kill the broker while it is still recovering.

After every restart: each acknowledged message is at its acknowledged offset with its exact
bytes, offsets are contiguous from the log start, the log end is past every acknowledged
offset, ``stonemq storage check`` passes on the data directory, and the consumer-group offsets
committed (and answered) before the kill are the ones the broker returns.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import diskfaults  # tests/ (on sys.path through the root conftest)
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from stonemq.storage.checkpoint import QUEUE_RECOVERY_POINT_FILE, read_queue_recovery_points
from stonemq.storage.journal import decode_entries

pytestmark = [pytest.mark.crash, pytest.mark.timeout(900)]

TOPICS = {"crash-a": 3, "crash-b": 2, "crash-c": 1}
CYCLES = int(os.environ.get("STONEMQ_CRASH_CYCLES", "16"))
POLICIES = ("interval", "always", "never")
SMALL_SEGMENTS = {"internal.segment.bytes": str(24 * 1024)}  # queue-log rolls within a cycle

Key = tuple[str, int]


def broker_settings(policy: str) -> dict[str, object]:
    return {
        "journal.flush.policy": policy,
        "journal.flush.interval.ms": 50,
        "journal.partitions": 2,
        "journal.segment.bytes": 96 * 1024,  # rolls and journal retention within a cycle
        "queue.checkpoint.interval.ms": 150,
        "queue.max.open.files": 8,  # the LRU evicts all the time
        "auto.create.topics.enable": False,
    }


def create_topics(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [
            NewTopic(t, num_partitions=n, replication_factor=1, config=SMALL_SEGMENTS)
            for t, n in TOPICS.items()
        ]
    )
    for f in futures.values():
        f.result(timeout=20)


def produce_until_killed(
    broker, acked: dict[Key, dict[int, bytes]], rng: random.Random, cycle: int
) -> None:
    """Produce continuously; SIGKILL the broker after a random delay; keep the acks."""
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "acks": "all",
            "enable.idempotence": False,
            "linger.ms": rng.choice([0, 1, 5]),
            "batch.num.messages": rng.choice([1, 10, 200]),
            "batch.size": 16384,  # under the segment size: a larger batch is refused
            "message.timeout.ms": 30000,
            "socket.timeout.ms": 5000,
            "reconnect.backoff.max.ms": 200,
        }
    )

    def on_delivery(err: KafkaError | None, msg) -> None:
        if err is None:
            key = (msg.topic(), msg.partition())
            previous = acked[key].setdefault(msg.offset(), msg.value())
            assert previous == msg.value(), f"offset {key} {msg.offset()} acknowledged twice"

    targets = [(t, p) for t, n in TOPICS.items() for p in range(n)]
    kill_at = time.monotonic() + rng.uniform(0.2, 1.5)
    seq = 0
    budget = rng.randint(300, 3000)  # messages this cycle: keeps each verification cheap
    while time.monotonic() < kill_at and seq < budget:
        for _ in range(rng.randint(1, 40)):
            topic, partition = rng.choice(targets)
            value = b"c%d-s%d-" % (cycle, seq) + rng.randbytes(rng.randint(0, 300))
            try:
                producer.produce(topic, value, partition=partition, on_delivery=on_delivery)
            except BufferError:
                break
            seq += 1
        producer.poll(0.002)
    broker.kill()  # SIGKILL while requests are in flight
    producer.poll(0.2)  # acks that arrived before the kill
    producer.purge(in_queue=True, in_flight=True)
    producer.flush(5)


def consume_all(bootstrap: str, topic: str, partition: int) -> tuple[int, list[tuple[int, bytes]]]:
    """(log start offset, [(offset, value)...]) of the whole partition up to its high mark."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "crash-check",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.max.bytes": 4 << 20,
        }
    )
    try:
        tp = TopicPartition(topic, partition)
        low, high = consumer.get_watermark_offsets(tp, timeout=10)
        out: list[tuple[int, bytes]] = []
        if high == low:
            return low, out
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 30
        while (not out or out[-1][0] < high - 1) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            out.append((msg.offset(), msg.value()))
        return low, out
    finally:
        consumer.close()


def verify(broker, acked: dict[Key, dict[int, bytes]]) -> int:
    total = 0
    for (topic, partition), expected in acked.items():
        low, records = consume_all(broker.bootstrap, topic, partition)
        where = f"{topic}-{partition}"
        assert low == 0, f"{where}: log start {low} (nothing was deleted)"
        offsets = [o for o, _ in records]
        assert offsets == list(range(low, low + len(offsets))), f"{where}: offsets not contiguous"
        stored = dict(records)
        if expected:
            assert len(offsets) > max(expected), (
                f"{where}: log ends at {len(offsets)}, acknowledged up to {max(expected)}"
            )
        for offset, value in expected.items():
            assert stored.get(offset) == value, f"{where}: acknowledged offset {offset} changed"
        total += len(expected)
    return total


def commit_offsets(bootstrap: str, offsets: dict[Key, int]) -> None:
    """Commit ``offsets`` for the group ``crash-committer`` and wait for the answer."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "crash-committer", "enable.auto.commit": False}
    )
    try:
        consumer.commit(
            offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
            asynchronous=False,
        )
    finally:
        consumer.close()


def committed_offsets(bootstrap: str, keys: list[Key]) -> dict[Key, int]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "crash-committer", "enable.auto.commit": False}
    )
    try:
        got = consumer.committed([TopicPartition(t, p) for t, p in keys], timeout=20)
        return {(tp.topic, tp.partition): tp.offset for tp in got}
    finally:
        consumer.close()


def storage_check(data_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STONEMQ_")}
    result = subprocess.run(
        [sys.executable, "-m", "stonemq", "storage", "check", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, f"storage check failed:\n{result.stdout}\n{result.stderr}"


def storage_check_running(broker) -> None:  # type: ignore[no-untyped-def]
    """``storage_check`` of a running broker's files, as of one instant: of a copy taken with
    the broker frozen (SIGSTOP), since the check refuses a data directory in use."""
    copy = broker.data_dir.parent / f"{broker.data_dir.name}-check"
    broker.proc.send_signal(signal.SIGSTOP)
    try:
        shutil.copytree(broker.data_dir, copy, ignore=shutil.ignore_patterns("filler"))
    finally:
        broker.proc.send_signal(signal.SIGCONT)
    try:
        storage_check(copy)
    finally:
        shutil.rmtree(copy)


# -- damage ---------------------------------------------------------------------------------
def newest(directory: Path, suffix: str) -> Path | None:
    files = sorted(p for p in directory.glob(f"*{suffix}") if p.is_file())
    return files[-1] if files else None


def append_garbage(path: Path, rng: random.Random) -> str:
    junk = rng.choice([b"\x00" * rng.randint(1, 64), rng.randbytes(rng.randint(1, 4096))])
    with path.open("ab") as f:
        f.write(junk)
    return f"+{len(junk)} garbage on {path.name}"


def cut_journal_tail(path: Path, acked: dict[Key, dict[int, bytes]], rng: random.Random) -> str:
    """Cut somewhere after the last entry that holds an acknowledged offset (of any topic
    with that partition number: conservative)."""
    data = memoryview(path.read_bytes())
    entries, _ = decode_entries(data, 0, verify=False)
    acked_by_partition: dict[int, set[int]] = {}
    for (_, partition), offsets in acked.items():
        acked_by_partition.setdefault(partition, set()).update(offsets)
    keep = 0
    for e in entries:
        offsets = acked_by_partition.get(e.partition, set())
        if any(o in offsets for o in range(e.base_offset, e.base_offset + e.record_count)):
            keep = e.end
    if keep >= len(data):
        return f"nothing unacknowledged to cut in {path.name}"
    at = rng.randint(keep, len(data) - 1)
    os.truncate(path, at)
    return f"cut {len(data) - at} bytes of {path.name}"


def cut_queue_tail(queue_dir: Path, log_dir: Path, rng: random.Random) -> str:
    path = newest(log_dir, ".log")
    if path is None:
        return "no queue segment"
    topic, _, partition = log_dir.name.rpartition("-")
    rp = read_queue_recovery_points(str(queue_dir / QUEUE_RECOVERY_POINT_FILE)).get(
        (topic, int(partition))
    )
    base = int(path.stem)
    flushed = 0
    if rp is not None and rp.segment_base == base:
        flushed = rp.position
    elif rp is not None and rp.segment_base > base:
        return f"{path.name} is flushed"
    size = path.stat().st_size
    if size <= flushed:
        return f"nothing unflushed in {log_dir.name}/{path.name}"
    at = rng.randint(flushed, size - 1)
    os.truncate(path, at)
    return f"cut {size - at} unflushed bytes of {log_dir.name}/{path.name}"


def damage(data_dir: Path, acked: dict[Key, dict[int, bytes]], rng: random.Random) -> list[str]:
    done = []
    journals = [d for d in sorted((data_dir / "journal").glob("journal-*")) if d.is_dir()]
    queue_dir = data_dir / "queues"
    queues = [d for d in sorted(queue_dir.iterdir()) if d.is_dir()]
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(["journal-garbage", "journal-cut", "queue-garbage", "queue-cut"])
        if kind.startswith("journal"):
            path = newest(rng.choice(journals), ".journal")
            if path is None:
                continue
            if kind == "journal-garbage":
                done.append(append_garbage(path, rng))
            else:
                done.append(cut_journal_tail(path, acked, rng))
        elif queues:
            log_dir = rng.choice(queues)
            if kind == "queue-garbage":
                path = newest(log_dir, ".log")
                if path is not None:
                    done.append(append_garbage(path, rng))
            else:
                done.append(cut_queue_tail(queue_dir, log_dir, rng))
    return done


def test_acknowledged_messages_survive_sigkill(broker_factory, tmp_path: Path) -> None:
    seed = int(os.environ.get("STONEMQ_CRASH_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    print(f"crash suite seed {seed} ({CYCLES} cycles)")
    broker = broker_factory(**broker_settings("interval"))
    data_dir = broker.data_dir
    create_topics(broker.bootstrap)
    acked: dict[Key, dict[int, bytes]] = {(t, p): {} for t, n in TOPICS.items() for p in range(n)}
    kills = 0
    committed: dict[Key, int] = {}
    for cycle in range(CYCLES):
        produce_until_killed(broker, acked, rng, cycle)
        kills += 1
        notes = damage(data_dir, acked, rng) if rng.random() < 0.6 else []
        print(f"cycle {cycle}: killed; damage: {notes}")
        broker.settings = {**broker.settings, **broker_settings(POLICIES[cycle % 3])}
        if cycle % 5 == 4:  # a kill while recovering: recovery must survive its own crash
            broker.spawn()
            time.sleep(rng.uniform(0.05, 0.8))
            broker.kill()
            kills += 1
        broker.start()
        checked = verify(broker, acked)
        storage_check_running(broker)
        if committed:  # offsets committed (and answered) before the kill are intact
            assert committed_offsets(broker.bootstrap, list(committed)) == committed
        committed = {
            key: rng.randint(0, max(offsets, default=0) + 1) for key, offsets in acked.items()
        }
        commit_offsets(broker.bootstrap, committed)
        print(f"cycle {cycle}: {checked} acknowledged messages verified")
    assert kills >= min(CYCLES, 20)
    assert sum(len(v) for v in acked.values()) > 1000, "too few acknowledged messages"


# -- one idempotent producer across every kill, some of them while the disk is full ----------
IDEMPOTENT_TOPIC = "crash-idem"
IDEMPOTENT_CYCLES = int(os.environ.get("STONEMQ_CRASH_IDEMPOTENT_CYCLES", "12"))
SMALL_FS_BYTES = 128 << 20


def mount_small_fs(path: Path) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return diskfaults.mount_small_disk(path, SMALL_FS_BYTES, kinds=("tmpfs",)) is not None


def fill_disk(path: Path, leave_bytes: int) -> None:
    """Write a filler until about ``leave_bytes`` stay free (or the broker took the rest)."""
    st = os.statvfs(path.parent)
    remaining = max(st.f_bavail * st.f_frsize - leave_bytes, 0)
    try:
        with path.open("wb") as f:
            while remaining > 0:
                chunk = min(remaining, 1 << 20)
                f.write(b"\0" * chunk)
                f.flush()
                remaining -= chunk
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise


def test_idempotent_producer_survives_sigkill_and_disk_full(broker_factory, tmp_path: Path) -> None:
    """One idempotent producer (acks=all, max.in.flight 5) lives through every kill: after
    each restart it resends what was in flight with the same producer id and sequences. Some
    kills land while the disk is full (the data dir on a small tmpfs). Every record is
    delivered, exactly once, at its acknowledged offset; the producer never sees a sequence
    error (librdkafka raises it as a fatal error); `stonemq storage check` passes each time."""
    import threading

    from confluent_kafka import Producer

    seed = int(os.environ.get("STONEMQ_CRASH_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    print(f"idempotent crash suite seed {seed} ({IDEMPOTENT_CYCLES} cycles)")
    fs = tmp_path / "small-fs"
    on_small_fs = mount_small_fs(fs)
    broker = None
    try:
        data_dir = (fs if on_small_fs else tmp_path) / "data"
        broker = broker_factory(data_dir=data_dir, **broker_settings("interval"))
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(IDEMPOTENT_TOPIC, num_partitions=3, config=SMALL_SEGMENTS)])[
            IDEMPOTENT_TOPIC
        ].result(timeout=20)
        acked: dict[tuple[int, int], bytes] = {}
        errors: list[str] = []
        lock = threading.Lock()
        stop = threading.Event()
        sent = [0]

        def delivered(err: KafkaError | None, msg) -> None:  # type: ignore[no-untyped-def]
            if err is not None:
                errors.append(str(err))
                return
            key = (msg.partition(), msg.offset())
            with lock:
                previous = acked.setdefault(key, msg.value())
            if previous != msg.value():
                errors.append(f"offset {key} acknowledged for two records")

        def produce() -> None:
            producer = Producer(
                {
                    "bootstrap.servers": broker.bootstrap,
                    "acks": "all",
                    "enable.idempotence": True,
                    "max.in.flight.requests.per.connection": 5,
                    "linger.ms": 2,
                    "batch.size": 16384,  # under the segment size: a larger batch is refused
                    "message.timeout.ms": 300_000,
                    "reconnect.backoff.max.ms": 200,
                    "error_cb": lambda err: errors.append(f"fatal: {err}") if err.fatal() else None,
                }
            )
            i = 0
            while not stop.is_set():
                value = b"idem-%d-" % i + rng.randbytes(rng.randint(0, 400))
                try:
                    producer.produce(
                        IDEMPOTENT_TOPIC, value, partition=i % 3, on_delivery=delivered
                    )
                    i += 1
                    sent[0] = i
                except BufferError:
                    producer.poll(0.05)
                producer.poll(0)
                if i % 50 == 0:
                    time.sleep(0.01)  # at most ~1 MB/s: the disk fills only with the filler
            assert producer.flush(300) == 0, "records left undelivered"

        thread = threading.Thread(target=produce)
        thread.start()
        full_kills = 0
        try:
            for cycle in range(IDEMPOTENT_CYCLES):
                time.sleep(rng.uniform(0.3, 1.5))
                filler = fs / "filler"
                disk_full = on_small_fs and cycle % 3 == 1
                if disk_full:  # fill, let produces fail for a while, and kill meanwhile
                    fill_disk(filler, leave_bytes=rng.randint(0, 3 << 20))
                    time.sleep(rng.uniform(0.2, 1.0))
                    full_kills += 1
                broker.kill()
                with lock:  # torn tails only ever past what was acknowledged
                    by_key: dict[Key, dict[int, bytes]] = {}
                    for (p, o), v in acked.items():
                        by_key.setdefault((IDEMPOTENT_TOPIC, p), {})[o] = v
                if disk_full:  # first: the damage below writes too (a full disk failed it)
                    filler.unlink()
                notes = damage(data_dir, by_key, rng) if rng.random() < 0.3 else []
                print(f"cycle {cycle}: killed{' with the disk full' if disk_full else ''}; {notes}")
                broker.settings = {**broker.settings, **broker_settings(POLICIES[cycle % 3])}
                broker.start()
                assert not errors, errors[:5]
        finally:
            stop.set()
            thread.join(320)
        assert not errors, errors[:5]
        assert not on_small_fs or full_kills >= IDEMPOTENT_CYCLES // 3
        assert len(acked) == sent[0], f"{sent[0] - len(acked)} records not acknowledged"
        stored: dict[tuple[int, int], bytes] = {}
        for p in range(3):
            low, records = consume_all(broker.bootstrap, IDEMPOTENT_TOPIC, p)
            assert low == 0
            offsets = [o for o, _ in records]
            assert offsets == list(range(len(offsets))), f"partition {p}: offsets not contiguous"
            stored.update(((p, o), v) for o, v in records)
        for key, value in acked.items():
            assert stored.get(key) == value, f"acknowledged record {key} lost or changed"
        values = list(stored.values())
        assert len(values) == len(set(values)), "a record was stored twice"
        broker.stop()
        storage_check(data_dir)
    finally:
        if broker is not None and broker.alive:
            broker.kill()  # before its data dir goes away with the filesystem
        if on_small_fs:
            subprocess.run(["umount", "-l", str(fs)], check=False)
