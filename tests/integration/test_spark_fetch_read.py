"""The Spark source's Kafka range reads without librdkafka (stonemq/spark/fetch_read.py)
against a real broker: the rows equal what a confluent-kafka consumer's read of the same
range gives (every column, ranges cut inside batches, compressed batches, headers, fetch
sizes smaller than a batch), and the errors are those of the confluent-kafka read."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from stonemq.spark import fetch_read, kafka_io
from stonemq.spark import options as so
from stonemq.spark.options import OffsetRange

# slow: about 19 s of the fast set, which must stay under a minute (CI runs every marker)
pytestmark = pytest.mark.slow


def _opts(bootstrap: str, **extra: str) -> so.SourceOptions:
    return so.parse(
        {
            "kafka.bootstrap.servers": bootstrap,
            "subscribe": "t",
            "kafkaConsumer.pollTimeoutMs": "10000",
            **extra,
        },
        streaming=False,
    )


def _create(bootstrap: str, topic: str, partitions: int = 1, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, partitions, 1, config=config)
    admin.create_topics([new])[topic].result(timeout=30)


def _produce(bootstrap: str, topic: str, seed: int, count: int) -> None:
    """``count`` records in batches of every codec and size, some keys null, some headers."""
    rng = random.Random(seed)
    for codec in ("none", "lz4", "zstd", "gzip", "snappy"):
        producer = Producer(
            {"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 20}
        )
        for i in range(count // 5):
            headers: Any = None
            if rng.random() < 0.2:
                headers = [("h", rng.randbytes(3)), ("g", None)]
            producer.produce(
                topic,
                value=rng.randbytes(rng.choice((0, 10, 300, 5000))),
                key=None if rng.random() < 0.3 else f"k{i}".encode(),
                headers=headers,
                timestamp=1_700_000_000_000 + i,
            )
            if rng.random() < 0.05:
                producer.flush()
        assert producer.flush(30) == 0


def _rows(batches: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in batches:
        assert isinstance(b, pa.RecordBatch)
        out += b.to_pylist()
    return out


@pytest.mark.parametrize(
    ("headers", "timestamps"), [("true", "CreateTime"), ("false", "LogAppendTime")]
)
def test_fetched_rows_equal_a_confluent_kafka_read_of_the_same_ranges(
    broker: Any, headers: str, timestamps: str
) -> None:
    bootstrap = broker.bootstrap
    _create(bootstrap, "t", **{"message.timestamp.type": timestamps})
    _produce(bootstrap, "t", seed=7, count=2000)
    opts = _opts(bootstrap, includeHeaders=headers)
    assert fetch_read.usable(opts)
    small = _opts(bootstrap, includeHeaders=headers, **{"kafka.max.partition.fetch.bytes": "1000"})
    end = 2000
    for start, stop in [(0, end), (1, end - 1), (333, 334), (517, 1499), (end - 1, end)]:
        r = OffsetRange("t", 0, start, stop)
        expected = _rows(kafka_io._read_librdkafka(opts, r))
        assert [row["offset"] for row in expected] == list(range(start, stop))
        assert {row["timestampType"] for row in expected} == {int(timestamps != "CreateTime")}
        if headers == "true" and stop - start > 10:  # no headers: null, as Spark's Kafka source
            assert any(row["headers"] is None for row in expected)
            assert all(row["headers"] is None or row["headers"] for row in expected)
        assert _rows(kafka_io.read_kafka(opts, r)) == expected
        # a fetch size below a batch's: each batch is asked for again, whole
        assert _rows(kafka_io.read_kafka(small, r)) == expected


def test_offsets_lost_to_retention_are_data_loss_and_skipped_without_fail_on_data_loss(
    broker: Any,
) -> None:
    bootstrap = broker.bootstrap
    _create(bootstrap, "t")
    _produce(bootstrap, "t", seed=3, count=500)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_records([TopicPartition("t", 0, 200)])[TopicPartition("t", 0, 200)].result(30)
    r = OffsetRange("t", 0, 100, 300)
    with pytest.raises(kafka_io.DataLossError, match="offset out of range"):
        _rows(kafka_io.read_kafka(_opts(bootstrap), r))
    # failOnDataLoss=false goes on from the log start inside the range, as Spark's Kafka
    # source does (KafkaDataConsumer.getEarliestAvailableOffsetBetween); the whole range was
    # dropped (audit36 p2)
    lenient = _rows(kafka_io.read_kafka(_opts(bootstrap, failOnDataLoss="false"), r))
    assert [row["offset"] for row in lenient] == list(range(200, 300))
    # the log ends before the range does (a range planned past today's end): data loss once
    # it still does at the poll timeout, with either reader
    r = OffsetRange("t", 0, 490, 600)
    short = _opts(bootstrap, **{"kafkaConsumer.pollTimeoutMs": "1000"})
    with pytest.raises(kafka_io.DataLossError, match="the log now ends at 500"):
        _rows(kafka_io.read_kafka(short, r))
    with pytest.raises(kafka_io.DataLossError, match="the log now ends at 500"):
        _rows(kafka_io._read_librdkafka(short, r))
    lenient = _opts(bootstrap, failOnDataLoss="false", **{"kafkaConsumer.pollTimeoutMs": "1000"})
    assert [row["offset"] for row in _rows(kafka_io.read_kafka(lenient, r))] == list(
        range(490, 500)
    )
    # a partition that does not exist
    r = OffsetRange("t", 5, 0, 10)
    with pytest.raises(kafka_io.DataLossError, match="gone"):
        _rows(kafka_io.read_kafka(_opts(bootstrap), r))


def test_the_librdkafka_read_is_kept_for_what_only_librdkafka_does(broker: Any) -> None:
    bootstrap = broker.bootstrap
    assert not fetch_read.usable(_opts(bootstrap, **{"kafka.isolation.level": "read_committed"}))
    assert not fetch_read.usable(_opts(bootstrap, **{"kafka.security.protocol": "SASL_SSL"}))
    assert not fetch_read.usable(_opts(bootstrap, **{"kafka.ssl.ca.location": "/x"}))
    assert fetch_read.usable(_opts(bootstrap, **{"kafka.security.protocol": "PLAINTEXT"}))


def test_a_stopped_broker_fails_the_read_after_the_poll_timeout(broker: Any) -> None:
    bootstrap = broker.bootstrap
    _create(bootstrap, "t")
    _produce(bootstrap, "t", seed=1, count=50)
    opts = _opts(bootstrap, **{"kafkaConsumer.pollTimeoutMs": "1500"})
    r = OffsetRange("t", 0, 0, 50)
    assert len(_rows(kafka_io.read_kafka(opts, r))) == 50  # the leader is known now
    broker.stop()
    with pytest.raises(kafka_io.SourceError, match="pollTimeoutMs"):
        _rows(kafka_io.read_kafka(opts, r))


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_a_read_goes_on_at_the_new_leader_when_its_leader_is_killed(
    broker_factory: Any, zookeeper: Any
) -> None:
    """Replication factor 3: the leader is SIGKILLed in the middle of a range read (a fetch
    may be in flight); the read finds the new leader and returns every offset once."""
    from .test_replication import _isrs, _leaders, _start_cluster, _wait

    brokers, chroot = _start_cluster(broker_factory, zookeeper, zookeeper_session_timeout_ms=6000)
    everyone = ",".join(b.bootstrap for b in brokers)
    _create(brokers[0].bootstrap, "t", partitions=1)
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 30, "ISR")
    producer = Producer(
        {"bootstrap.servers": everyone, "acks": "all", "linger.ms": 5, "batch.size": 16384}
    )
    for i in range(3000):
        producer.produce("t", value=b"%d" % i + bytes(500), partition=0)
    assert producer.flush(30) == 0
    opts = _opts(
        everyone,
        **{"kafka.max.partition.fetch.bytes": "20000", "kafkaConsumer.pollTimeoutMs": "30000"},
    )
    r = OffsetRange("t", 0, 0, 3000)
    reading = kafka_io.read_kafka(opts, r)
    rows = _rows([next(reading)])
    assert len(rows) < 100  # 20,000-byte fetches: one more may be in flight, the rest is not
    leader = brokers[_leaders(everyone, "t")[0] - 1]
    leader.kill()
    rows += _rows(reading)
    assert leader.proc.poll() is not None  # the rest came from the new leader
    assert [row["offset"] for row in rows] == list(range(3000))
    assert [row["value"] for row in rows] == [b"%d" % i + bytes(500) for i in range(3000)]
