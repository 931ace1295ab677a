"""Data survives a clean stop and start; a data dir in use is locked against a second broker."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from confluent_kafka.admin import ConfigResource
from kafka import KafkaProducer

from .helpers import (
    CODECS,
    Msg,
    admin,
    assert_same,
    consume,
    create_topic,
    produce,
    sample_messages,
    wait_for_topic,
    wait_high_watermark,
)

# Each test restarts a broker at least once: part of the slow set (CI runs every marker).
pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def test_data_survives_restart(broker):
    b = broker.bootstrap
    plain = create_topic(b, partitions=3)
    expected: dict[tuple[str, int], list[Msg]] = {}
    for p in range(3):
        expected[(plain, p)] = sample_messages(10 + p, tag=f"p{p}")
        produce(b, plain, expected[(plain, p)], partition=p, acks="all")
    for codec in CODECS:
        topic = create_topic(b)
        expected[(topic, 0)] = sample_messages(50, tag=codec)
        produce(b, topic, expected[(topic, 0)], acks="all", **{"compression.type": codec})
    big_topic = create_topic(b)
    expected[(big_topic, 0)] = [Msg(b"big", os.urandom(1_000_000), (), int(time.time() * 1000))]
    produce(b, big_topic, expected[(big_topic, 0)], acks="all", **{"message.max.bytes": 2_000_000})

    broker.restart()

    for (topic, p), msgs in expected.items():
        if p == 0:
            wait_for_topic(b, topic, 3 if topic == plain else 1)
        assert wait_high_watermark(b, topic, len(msgs), partition=p) == (0, len(msgs))
        assert_same(consume(b, topic, len(msgs), partition=p), msgs)

    # appends continue after the last offset
    more = sample_messages(5, tag="after")
    assert produce(b, plain, more, partition=1, acks="all") == list(range(11, 16))
    assert_same(consume(b, plain, 16, partition=1), expected[(plain, 1)] + more)


@pytest.mark.slow
def test_restart_twice_and_idempotent_producer_continues(broker):
    b = broker.bootstrap
    topic = create_topic(b)
    first = sample_messages(8, tag="one")
    produce(b, topic, first, acks="all")
    broker.restart()
    second = sample_messages(4, tag="two", null_headers=False, null_key_and_value=False)
    # kafka-python's default (idempotent) producer after a restart: a new producer id works
    producer = KafkaProducer(bootstrap_servers=b)
    try:
        futures = [
            producer.send(topic, value=m.value, key=m.key, headers=list(m.headers),
                          partition=0, timestamp_ms=m.timestamp)
            for m in second
        ]  # fmt: skip
        producer.flush(30)
        assert [f.get(30).offset for f in futures] == [8, 9, 10, 11]
    finally:
        producer.close(10)
    broker.restart()
    assert_same(consume(b, topic, 12), first + second)


def test_created_topics_and_configs_survive_restart(broker):
    b = broker.bootstrap
    topic = create_topic(b, partitions=5, config={"retention.ms": "123456789"})
    broker.restart()
    wait_for_topic(b, topic, 5)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    client = admin(b)
    configs = client.describe_configs([resource])[resource].result(timeout=15)
    assert configs["retention.ms"].value == "123456789"


def test_second_broker_on_same_data_dir_is_refused(broker, broker_factory):
    b = broker.bootstrap
    topic = create_topic(b)
    msgs = sample_messages(3)
    produce(b, topic, msgs, acks="all")

    second = broker_factory(data_dir=broker.data_dir, start=False)
    proc = second.spawn()
    try:
        code = proc.wait(20)
    except subprocess.TimeoutExpired:
        second.kill()
        pytest.fail(f"second broker on a locked data dir kept running\n{second.log_tail()}")
    assert code != 0, f"second broker exited 0\n{second.log_tail()}"
    assert "lock" in second.log(since_start=True).lower(), second.log_tail()
    # the first broker is unharmed
    assert broker.alive
    assert_same(consume(b, topic, 3), msgs)
    assert produce(b, topic, msgs, acks="all") == [3, 4, 5]


def test_stop_is_clean_and_lock_is_released(broker, broker_factory):
    b = broker.bootstrap
    topic = create_topic(b)
    msgs = sample_messages(4)
    produce(b, topic, msgs, acks="all")
    broker.stop()  # asserts exit code 0 within 10 s
    # the data dir is free again: another broker (new port) takes it and has the data
    other = broker_factory(data_dir=broker.data_dir)
    assert_same(consume(other.bootstrap, topic, 4), msgs)


def _damage_flip(path) -> None:  # type: ignore[no-untyped-def]
    with open(path, "r+b") as f:
        f.write(b"\xff" * 64)  # over SQLite's file header


@pytest.mark.parametrize(
    ("damage", "checked"),
    [
        (_damage_flip, True),
        (lambda path: os.truncate(path, 8192), True),
        (lambda path: os.truncate(path, 0), True),
        (os.remove, False),
    ],
    ids=["header-flipped", "cut-to-8KiB", "emptied", "removed"],
)
def test_a_damaged_topic_store_is_refused_by_serve_and_reported_by_check(
    broker_factory, damage, checked: bool
) -> None:
    """metadata.db (the topics, their ids and configs) damaged while the broker was down.
    `storage check` passed such a data dir ("no defect", exit 0), and `serve` died with a
    sqlite3 traceback, or, on an emptied or removed file, started with no topic and set
    every queue log aside. Now check reports a damaged or emptied store as a defect (exit 1;
    a missing one may be a ZooKeeper broker's, which keeps none), and serve refuses to start
    with one line naming the file, the queue logs left as they were."""
    broker = broker_factory()
    topic = create_topic(broker.bootstrap)
    produce(broker.bootstrap, topic, sample_messages(20), acks="all")
    broker.stop()
    store = broker.data_dir / "metadata.db"
    damage(store)
    queues = sorted(p.name for p in (broker.data_dir / "queues").iterdir())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(
        [sys.executable, "-m", "stonemq", "storage", "check", "--data-dir", str(broker.data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert "Traceback" not in done.stderr, done.stderr
    if checked:
        assert done.returncode == 1, done.stdout
        assert "DEFECT" in done.stdout and "metadata.db" in done.stdout, done.stdout
    proc = broker.spawn()
    assert proc.wait(30) == 1
    log = broker.log(since_start=True)
    assert "refusing to start" in log and str(store) in log, log
    assert "Traceback" not in log, log
    assert sorted(p.name for p in (broker.data_dir / "queues").iterdir()) == queues


def test_storage_check_refuses_a_data_directory_in_use(broker) -> None:
    """`storage check` of a running broker's data dir read files changing under it: under
    load it reported false defects (a segment base past the previous end, a partial journal
    entry) on a sound directory. It now refuses, naming the broker's pid, as serve does."""
    produce(broker.bootstrap, create_topic(broker.bootstrap), sample_messages(5), acks="all")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    command = [sys.executable, "-m", "stonemq", "storage", "check"]
    command += ["--data-dir", str(broker.data_dir)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2, done
    assert f"in use by pid {broker.proc.pid}" in done.stderr, done.stderr
    assert "passed" not in done.stdout
    broker.stop()
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done
    assert (broker.data_dir / ".lock").read_text().strip() == str(broker.proc.pid)
