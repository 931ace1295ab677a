"""Reads of a queue log whose sealed segments were damaged on disk while the broker was down,
over a real broker and librdkafka: the damage stays the damaged partition's, as in Kafka
(``ReplicaManager.readFromLog`` answers one partition's read failure as that partition's
error; ``LocalLog.read`` moves to the next segment when one holds nothing at the offset).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from .helpers import create_topic, producer_config
from .rawclient import RawConnection, fetch_raw
from .test_list_offsets_versions import list_offsets_partition

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

RECORDS = 1000
CORRUPT_MESSAGE = 2
BASE_MS = int(time.time() * 1000) - 3_600_000


def _fill(broker, topic: str) -> None:
    """``RECORDS`` records in batches of 10 on partition 0 of ``topic`` (16 KiB segments),
    record i timestamped ``BASE_MS + i``."""
    create_topic(broker.bootstrap, topic, 1, {"internal.segment.bytes": "16384"})
    producer = Producer(producer_config(broker.bootstrap, **{"batch.num.messages": 10}))
    for i in range(RECORDS):
        value = b"v%d" % i + b"z" * 80
        producer.produce(topic, key=b"k%d" % i, value=value, partition=0, timestamp=BASE_MS + i)
    assert producer.flush(30) == 0


def _segments(broker, topic: str) -> list[Path]:
    """The segment files of ``topic``-0 in offset order (the broker stopped)."""
    return sorted((broker.data_dir / "queues" / f"{topic}-0").glob("*.log"))


def _consume(bootstrap: str, topics: list[str], wanted: int) -> dict[str, list[int]]:
    """Offsets read per topic by a librdkafka consumer assigned partition 0 of each from 0,
    until ``wanted`` of the last topic's arrived or 20 s passed."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "damaged", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0) for topic in topics])
    got: dict[str, list[int]] = {topic: [] for topic in topics}
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline and len(got[topics[-1]]) < wanted:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                got[message.topic()].append(message.offset())
    finally:
        consumer.close()
    return got


def test_a_corrupt_batch_in_one_partition_fails_that_partition_only(broker_factory) -> None:
    """The length field of the first batch of a sealed segment of ``bad-0`` is flipped. A
    fetch naming ``bad-0`` and ``good-0`` failed whole: the connection was closed ("internal
    error handling api 1"), and a consumer assigned both never got ``good-0``'s records
    past its first fetch. Now ``bad-0`` alone answers CORRUPT_MESSAGE at the damaged
    offset (Kafka: ``CorruptRecordException``), its intact offsets before the damage are
    served, and ``good-0`` is read whole. A ListOffsets by a timestamp in the damaged
    segment closed the connection too; it answers CORRUPT_MESSAGE for that partition."""
    broker = broker_factory(**{"queue.checkpoint.interval.ms": 300})
    _fill(broker, "bad")
    _fill(broker, "good")
    broker.stop()
    segments = _segments(broker, "bad")
    assert len(segments) >= 3
    damaged = int(segments[1].stem)
    with open(segments[1], "r+b") as f:
        f.seek(8)
        length = f.read(4)
        f.seek(8)
        f.write(bytes(b ^ 0xFF for b in length))
    broker.start()
    got = _consume(broker.bootstrap, ["bad", "good"], RECORDS)
    assert got["good"] == list(range(RECORDS))
    assert got["bad"] == list(range(damaged))
    with RawConnection(broker.host, broker.port) as conn:
        part = fetch_raw(conn, "bad", 0, damaged)
        assert part.error_code == CORRUPT_MESSAGE
        assert part.records is None or len(part.records) == 0
        assert fetch_raw(conn, "good", 0, damaged).error_code == 0  # the connection stays
        found = list_offsets_partition(conn, 7, "bad", BASE_MS + damaged + 5)
        assert (found.error_code, found.offset) == (CORRUPT_MESSAGE, -1)
        found = list_offsets_partition(conn, 7, "good", BASE_MS + damaged + 5)
        assert (found.error_code, found.offset) == (0, damaged + 5)
    log = broker.log(since_start=True)
    assert "internal error" not in log
    assert f"bad-0 at offset {damaged}" in log


def test_a_fetch_moves_past_a_sealed_segment_that_lost_its_tail(broker_factory) -> None:
    """A sealed segment cut short on disk (the broker down) kept its first batches only. A
    consumer reading on stopped at the hole for good: a fetch at an offset the segment no
    longer holds answered nothing. Now, as Kafka's ``LocalLog.read``, the read goes on to
    the next segment: the lost offsets are skipped, every later record is read."""
    broker = broker_factory(**{"queue.checkpoint.interval.ms": 300})
    _fill(broker, "cut")
    broker.stop()
    segments = _segments(broker, "cut")
    assert len(segments) >= 4
    os.truncate(segments[2], 5000)
    start, following = int(segments[2].stem), int(segments[3].stem)
    broker.start()
    got = _consume(broker.bootstrap, ["cut"], RECORDS)["cut"]
    kept = [offset for offset in got if offset < following]
    assert kept == list(range(len(kept))) and start < len(kept) < following
    assert got[len(kept) :] == list(range(following, RECORDS))
