"""A broker process with many partitions, each written once and left idle, holds open files
under ``queue.max.open.files`` (plus a constant: journals, sockets, metadata) and reports its
RSS; every record stays readable through the bounded file cache."""

from __future__ import annotations

import os

import pytest
from confluent_kafka import Producer

from .helpers import create_topic, producer_config, wait_high_watermark

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

PARTITIONS = 3000
MAX_OPEN_FILES = 8


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_many_idle_partitions_under_a_small_open_file_cap(broker_factory) -> None:
    broker = broker_factory(
        **{"queue.max.open.files": MAX_OPEN_FILES, "queue.checkpoint.interval.ms": 500}
    )
    pid = broker.proc.pid
    baseline = fd_count(pid)
    topic = create_topic(broker.bootstrap, partitions=PARTITIONS)
    producer = Producer(producer_config(broker.bootstrap, acks="all", **{"linger.ms": 20}))
    failures: list[object] = []
    for p in range(PARTITIONS):
        producer.produce(
            topic,
            b"once-%d" % p,
            partition=p,
            on_delivery=lambda err, msg: failures.append(err) if err else None,
        )
        producer.poll(0)
    assert producer.flush(60) == 0 and not failures
    for p in (0, PARTITIONS // 2, PARTITIONS - 1):
        assert wait_high_watermark(broker.bootstrap, topic, 1, partition=p) == (0, 1)
    fds = fd_count(pid)
    rss = rss_bytes(pid)
    print(f"{PARTITIONS} partitions: {fds} open files (baseline {baseline}), RSS {rss >> 20} MiB")
    # the queue-log cache, the journals and a few connections: nothing per partition
    assert fds <= baseline + MAX_OPEN_FILES + 32, f"{fds} open files"
    assert rss < 400 << 20
