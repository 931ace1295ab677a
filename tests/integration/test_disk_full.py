"""A real full disk: the broker's data directory on a small tmpfs. Produces that cannot be
written get KAFKA_STORAGE_ERROR, the broker stays up and keeps serving fetches of everything
acknowledged, writes succeed again once space returns, and no corrupt entry is left behind
(``stonemq storage check`` passes and a restart serves the same data).

Needs root (or CAP_SYS_ADMIN) to mount the tmpfs; skipped with that reason otherwise.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import diskfaults  # tests/ (on sys.path through the root conftest)
import pytest

from .rawclient import RawConnection, build_batch, fetch_batches, produce_raw

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

KAFKA_STORAGE_ERROR = 56
RECORDS_PER_PRODUCER = 2000
FULL = ("No space left on device", "refusing produces")  # a write failed, or would have
FS_BYTES = 24 << 20
SMALL_SEGMENTS = {"internal.segment.bytes": str(256 * 1024)}  # Kafka 4's, for tests


@pytest.fixture
def small_fs(tmp_path: Path):
    mount_point = tmp_path / "small-fs"
    mount_point.mkdir()
    disk = diskfaults.mount_small_disk(mount_point, FS_BYTES, kinds=("tmpfs",))
    if disk is None:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        yield mount_point
    finally:
        disk.close()


def fill(path: Path, leave_bytes: int) -> None:
    """Write a filler file until only about ``leave_bytes`` stay free. The broker writes
    meanwhile: when the disk fills before the filler is done (ENOSPC, seen once in CI), the
    filler gives ``leave_bytes`` back instead of failing the test."""
    st = os.statvfs(path.parent)
    free = st.f_bavail * st.f_frsize
    chunk = b"\0" * (1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written, wanted = 0, max(free - leave_bytes, 0)
        while written < wanted:
            try:
                written += os.write(fd, chunk[: min(len(chunk), wanted - written)])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                os.ftruncate(fd, max(written - leave_bytes, 0))
                break
    finally:
        os.close(fd)


def storage_check(data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STONEMQ_")}
    return subprocess.run(
        [sys.executable, "-m", "stonemq", "storage", "check", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_enospc_is_a_storage_error_and_the_broker_recovers(small_fs: Path, broker_factory) -> None:
    data_dir = small_fs / "data"
    broker = broker_factory(
        data_dir=data_dir,
        **{
            "journal.segment.bytes": 1 << 20,
            "journal.partitions": 1,
            "queue.checkpoint.interval.ms": 200,
        },
    )
    from .helpers import create_topic

    topic = create_topic(broker.bootstrap, partitions=2, config=SMALL_SEGMENTS)
    filler = small_fs / "filler"
    fill(filler, leave_bytes=3 << 20)

    acked: dict[int, list[bytes]] = {0: [], 1: []}
    errors = 0
    with RawConnection(broker.host, broker.port) as conn:
        for i in range(400):
            p = i % 2
            batch = bytes(build_batch([(b"k%d" % i, os.urandom(60_000))]))
            part = produce_raw(conn, topic, p, batch)
            if part.error_code == 0:
                assert part.base_offset == len(acked[p]), "an offset was skipped or reused"
                acked[p].append(batch)
            else:
                assert part.error_code == KAFKA_STORAGE_ERROR, part.error_code
                errors += 1
                if errors >= 10:
                    break
    assert errors >= 10, "the disk never filled up"
    assert sum(map(len, acked.values())) > 5
    assert broker.alive
    assert any(why in broker.log() for why in FULL), "no line says the disk is full"

    def stored_values(p: int, wait: bool = True) -> list[bytes]:
        batches = fetch_batches(broker, topic, p, 0, end=len(acked[p]) if wait else None)
        return [b[61:] for b in batches]  # record bytes of each one-record batch

    for p in (0, 1):  # fetches are served while the disk is full: what is split so far
        stored = stored_values(p, wait=False)
        assert stored == [b[61:] for b in acked[p]][: len(stored)]

    filler.unlink()  # space returns
    deadline = time.monotonic() + 20
    with RawConnection(broker.host, broker.port) as conn:
        while True:
            batch = bytes(build_batch([(b"after", b"space is back")]))
            part = produce_raw(conn, topic, 0, batch)
            if part.error_code == 0:
                assert part.base_offset == len(acked[0])
                acked[0].append(batch)
                break
            assert part.error_code == KAFKA_STORAGE_ERROR
            assert time.monotonic() < deadline, "writes not accepted after space returned"
            time.sleep(0.2)
        for p in (0, 1):
            batch = bytes(build_batch([(b"more", b"x" * 100)]))
            part = produce_raw(conn, topic, p, batch)
            assert part.error_code == 0 and part.base_offset == len(acked[p])
            acked[p].append(batch)
    for p in (0, 1):
        assert stored_values(p) == [b[61:] for b in acked[p]]

    broker.stop()
    check = storage_check(data_dir)
    assert check.returncode == 0, check.stdout + check.stderr
    broker.start()
    for p in (0, 1):
        assert stored_values(p) == [b[61:] for b in acked[p]]


def test_filling_filesystem_under_pipelining_producers_loses_nothing(
    small_fs: Path, broker_factory
) -> None:
    """The filesystem fills in the middle of a stream from three producers with acks=all and
    five requests in flight each (two idempotent, one not), then empties again. Every record
    acknowledged is stored exactly once at its acknowledged offset (an idempotent producer's
    retries never duplicate), the broker stays up, `stonemq storage check` is clean, and a
    restart serves the same log."""
    import threading

    from confluent_kafka import KafkaError, Producer

    from .helpers import consumer, create_topic

    data_dir = small_fs / "data"
    broker = broker_factory(
        data_dir=data_dir,
        **{
            "journal.segment.bytes": 1 << 20,
            "journal.partitions": 2,
            "queue.checkpoint.interval.ms": 200,
            "journal.flush.policy": "interval",
            "journal.flush.interval.ms": 50,
        },
    )
    topic = create_topic(broker.bootstrap, partitions=3, config=SMALL_SEGMENTS)
    acked: dict[tuple[int, int], bytes] = {}  # (partition, offset) -> value
    lock = threading.Lock()
    failures: list[str] = []

    def run(name: str, idempotent: bool) -> None:
        producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "acks": "all",
                "enable.idempotence": idempotent,
                "max.in.flight.requests.per.connection": 5,
                "linger.ms": 2,
                "batch.size": 128 * 1024,  # under the segment size: a larger one is refused
                "message.timeout.ms": 120_000,
                "retry.backoff.ms": 100,
            }
        )

        def delivered(err: KafkaError | None, msg) -> None:  # type: ignore[no-untyped-def]
            if err is not None:
                failures.append(f"{name}: {err}")
                return
            key = (msg.partition(), msg.offset())
            with lock:
                previous = acked.setdefault(key, msg.value())
            if previous != msg.value():
                failures.append(f"{name}: offset {key} acknowledged twice")

        i = 0
        while i < RECORDS_PER_PRODUCER:  # ~2 MB each: the disk is full only of the filler
            value = b"%s-%d-" % (name.encode(), i) + os.urandom(1000)
            try:
                producer.produce(topic, value, partition=i % 3, on_delivery=delivered)
                i += 1
            except BufferError:
                producer.poll(0.05)
                continue
            producer.poll(0)
            if i % 20 == 0:
                time.sleep(0.01)  # a stream over a few seconds, so the disk fills mid-way
        assert producer.flush(120) == 0, f"{name}: undelivered records"

    threads = [
        threading.Thread(target=run, args=(n, idem))
        for n, idem in (("idem-a", True), ("idem-b", True), ("plain", False))
    ]
    for t in threads:
        t.start()
    time.sleep(0.5)
    filler = small_fs / "filler"
    fill(filler, leave_bytes=2 << 20)  # fills within a second or two of the stream
    deadline = time.monotonic() + 20
    while not any(why in broker.log() for why in FULL):
        assert time.monotonic() < deadline, "the filesystem never filled"
        time.sleep(0.2)
    time.sleep(3.0)  # producers keep retrying against the full disk
    assert broker.alive
    filler.unlink()  # space returns
    for t in threads:
        t.join(180)
    assert not failures, failures[:5]
    assert len(acked) == 3 * RECORDS_PER_PRODUCER

    def stored() -> dict[tuple[int, int], bytes]:
        c = consumer(broker.bootstrap)
        from confluent_kafka import TopicPartition

        try:
            c.assign([TopicPartition(topic, p, 0) for p in range(3)])
            ends = {
                p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(3)
            }
            out: dict[tuple[int, int], bytes] = {}
            deadline = time.monotonic() + 60
            while sum(ends.values()) > len(out) and time.monotonic() < deadline:
                msg = c.poll(0.5)
                if msg is not None and msg.error() is None:
                    out[(msg.partition(), msg.offset())] = msg.value()
            assert sum(ends.values()) == len(out), "could not read the whole log"
            return out
        finally:
            c.close()

    log = stored()
    for key, value in acked.items():
        assert log.get(key) == value, f"acknowledged record {key} lost or changed"
    idempotent_values = [v for v in log.values() if v.startswith(b"idem-")]
    assert len(idempotent_values) == len(set(idempotent_values)), (
        "an idempotent retry was stored twice"
    )
    broker.stop()
    check = storage_check(data_dir)
    assert check.returncode == 0, check.stdout + check.stderr
    broker.start()
    assert stored() == log
