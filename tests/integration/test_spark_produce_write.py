"""The Spark sink's own producer (stonemq/spark/produce_write.py) against a real broker: every
row written is read back once by confluent-kafka with its key, value, headers and the
partition Kafka's Java producer would choose (kafka-python's partitioner, which follows it),
in every codec; the errors a user gets; and, with replication factor 3, a leader killed in the
middle of a write loses and duplicates nothing (the idempotent producer's retries)."""

from __future__ import annotations

import random
import socket
import struct
import time
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.partitioner.default import murmur2

from stonemq.protocol.fetch_client import (
    CONSUMER_REPLICA_ID,
    FetchWant,
    decode_fetch,
    encode_fetch,
)
from stonemq.protocol.record_batch import parse_header
from stonemq.spark import options as so
from stonemq.spark import produce_write, source
from stonemq.spark.kafka_io import SourceError

_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

# slow: about 25 s of the fast set, which must stay under a minute (CI runs every marker)
pytestmark = pytest.mark.slow


def _create(bootstrap: str, topic: str, partitions: int, replicas: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, replicas)])[topic].result(timeout=30)


def _sink(bootstrap: str, topic: str | None = "t", **kafka: str) -> so.SinkOptions:
    options = {"kafka.bootstrap.servers": bootstrap, **{f"kafka.{k}": v for k, v in kafka.items()}}
    if topic is not None:
        options["topic"] = topic
    return so.parse_sink(options)


def _rows(seed: int, count: int, partitions: int) -> list[tuple[Any, ...]]:
    """(key, value, partition or None, headers) rows: null keys, explicit partitions, headers
    with null values, empty and 5,000-byte values."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        key = None if rng.random() < 0.3 else f"key-{rng.randrange(500)}".encode()
        value = (
            None if rng.random() < 0.02 else b"%d:" % i + rng.randbytes(rng.choice((0, 40, 5000)))
        )
        partition = rng.randrange(partitions) if rng.random() < 0.1 else None
        headers = [("h", b"%d" % i), ("n", None)] if rng.random() < 0.2 else []
        rows.append((key, value, partition, headers))
    return rows


def _arrow(rows: list[tuple[Any, ...]], chunk: int) -> list[pa.RecordBatch]:
    out = []
    for start in range(0, len(rows), chunk):
        part = rows[start : start + chunk]
        out.append(
            pa.RecordBatch.from_arrays(
                [
                    pa.array([r[0] for r in part], pa.binary()),
                    pa.array([r[1] for r in part], pa.binary()),
                    pa.array([r[2] for r in part], pa.int32()),
                    pa.array([[{"key": k, "value": v} for k, v in r[3]] for r in part], _HEADERS),
                ],
                names=["key", "value", "partition", "headers"],
            )
        )
    return out


def _read(bootstrap: str, topic: str, partitions: int, count: int) -> list[Any]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "check", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[Any] = []
    try:
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            got += _checked(consumer.consume(1000, timeout=0.5))
        got += _checked(consumer.consume(1000, timeout=0.5))  # one more: a duplicate shows
    finally:
        consumer.close()
    return got


def _checked(messages: list[Any]) -> list[Any]:
    for m in messages:
        assert m.error() is None, m.error()
    return messages


def _expected_partition(row: tuple[Any, ...], partitions: int) -> int | None:
    key, _, explicit, _ = row
    if explicit is not None:
        return int(explicit)
    if key is not None:
        return (murmur2(key) & 0x7FFFFFFF) % partitions
    return None  # sticky: any partition


@pytest.mark.parametrize("codec", ["none", "lz4", "zstd", "gzip", "snappy"])
def test_rows_are_read_back_once_in_the_java_producers_partitions(broker: Any, codec: str) -> None:
    bootstrap = broker.bootstrap
    _create(bootstrap, "t", 3)
    rows = _rows(seed=len(codec), count=3000, partitions=3)
    sink = _sink(bootstrap, **{"compression.type": codec, "batch.size": "20000"})
    assert produce_write.usable(sink)
    delivered = source.produce_batches(sink, iter(_arrow(rows, 700)))
    assert delivered.records == len(rows)
    got = _read(bootstrap, "t", 3, len(rows))
    assert len(got) == len(rows)
    by_value = {m.value(): m for m in got if m.value() is not None}
    assert len(by_value) == sum(r[1] is not None for r in rows)  # every value once
    for row in rows:
        if row[1] is None:
            continue
        m = by_value[row[1]]
        assert m.key() == row[0]
        assert (m.headers() or []) == row[3]
        want = _expected_partition(row, 3)
        if want is not None:
            assert m.partition() == want, row

    def nulls_first(k: bytes | None) -> tuple[bool, bytes]:
        return (k is not None, k or b"")

    tombstones = sorted((m.key() for m in got if m.value() is None), key=nulls_first)
    assert tombstones == sorted((r[0] for r in rows if r[1] is None), key=nulls_first)
    # each partition holds its rows in the order they were written
    for p in range(3):
        written = [int(m.value().split(b":")[0]) for m in got if m.partition() == p and m.value()]
        assert written == sorted(written)
    # null-keyed rows go in runs to every partition in turn, not all to one
    assert {m.partition() for m in got if m.key() is None and m.value() is not None} == {0, 1, 2}


def test_null_keyed_rows_go_in_runs_of_the_batch_size_in_order(broker: Any) -> None:
    bootstrap = broker.bootstrap
    _create(bootstrap, "t", 3)
    rows = [(None, b"%d:" % i + bytes(1000), None, []) for i in range(3000)]
    sink = _sink(bootstrap, **{"batch.size": "20000"})
    assert source.produce_batches(sink, iter(_arrow(rows, 1000))).records == 3000
    got = _read(bootstrap, "t", 3, 3000)
    assert sorted(int(m.value().split(b":")[0]) for m in got) == list(range(3000))
    runs: list[tuple[int, int]] = []  # (partition, rows) in the order written
    for m in sorted(got, key=lambda m: int(m.value().split(b":")[0])):
        if runs and runs[-1][0] == m.partition():
            runs[-1] = (m.partition(), runs[-1][1] + 1)
        else:
            runs.append((m.partition(), 1))
    first = runs[0][0]  # a random partition starts the first run
    assert [(p - first) % 3 for p, _ in runs[:6]] == [0, 1, 2, 0, 1, 2]  # turn by turn
    # runs end at 15/16 of batch.size (18,750 bytes): 19 records of 1,003-1,004 bytes and
    # their overhead, one batch each
    assert all(n == 19 for _, n in runs[:-1])
    for p in range(3):
        written = [int(m.value().split(b":")[0]) for m in got if m.partition() == p]
        assert written == sorted(written)


def test_each_producer_starts_its_null_keyed_run_at_a_random_partition(broker: Any) -> None:
    """Twelve producers (Spark's tasks on as many executors) write five null-keyed rows each,
    far from a full run: each starts its run at a random partition, as Kafka's producer does.
    Every producer started at partition 0, so small writes and micro-batches all went there
    (4,000 rows to partition 0 of 4, none elsewhere, in a Spark check). That all twelve pick
    the same of four partitions has a chance of 4 in 4**12 (about 2.4e-7)."""
    bootstrap = broker.bootstrap
    _create(bootstrap, "spread", 4)
    sink = _sink(bootstrap, "spread")
    for w in range(12):
        producer = produce_write.ArrowProducer(produce_write.Settings.of(sink))
        try:
            rows = [(None, b"%d-%d" % (w, i), None, []) for i in range(5)]
            assert producer.write(sink, iter(_arrow(rows, 5))) == 5
        finally:
            producer.close()
    got = _read(bootstrap, "spread", 4, 60)
    assert len(got) == 60
    firsts = {m.partition() for m in got if m.value().endswith(b"-0")}
    assert len(firsts) > 1, firsts
    for w in range(12):  # one run each: a producer's five rows together
        assert len({m.partition() for m in got if m.value().startswith(b"%d-" % w)}) == 1


def test_a_topic_with_a_small_max_message_bytes_gets_batches_it_takes(broker: Any) -> None:
    """The default batch.size (512 KiB) is above this topic's max.message.bytes: the
    producer reads it (DescribeConfigs) and cuts smaller batches instead of failing."""
    bootstrap = broker.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic("small", 2, 1, config={"max.message.bytes": "100000"})
    admin.create_topics([new])["small"].result(timeout=30)
    rows = [(None, b"%d:" % i + bytes(1000), None, []) for i in range(2000)]
    assert (
        source.produce_batches(_sink(bootstrap, "small"), iter(_arrow(rows, 500))).records == 2000
    )
    got = _read(bootstrap, "small", 2, 2000)
    assert sorted(int(m.value().split(b":")[0]) for m in got) == list(range(2000))
    # a single record above it is refused with the broker's error and a hint
    big = [(None, bytes(200_000), None, [])]
    with pytest.raises(SourceError, match="MESSAGE_TOO_LARGE"):
        source.produce_batches(_sink(bootstrap, "small"), iter(_arrow(big, 1)))


def test_columns_spark_may_hand_over(broker: Any) -> None:
    """Null-typed key and headers columns are no keys and no headers; a partition column of
    another integer type is taken when it fits an int, refused when it does not; more than
    five requests in flight are refused (an idempotent producer's limit)."""
    bootstrap = broker.bootstrap
    _create(bootstrap, "t", 2)
    batch = pa.RecordBatch.from_arrays(
        [pa.nulls(3), pa.array([b"a", b"b", b"c"]), pa.array([1, 1, 0], pa.int64())],
        names=["key", "value", "partition"],
    )
    assert source.produce_batches(_sink(bootstrap), iter([batch])).records == 3
    got = _read(bootstrap, "t", 2, 3)
    assert sorted((m.partition(), m.value(), m.key()) for m in got) == [
        (0, b"c", None),
        (1, b"a", None),
        (1, b"b", None),
    ]
    wide = pa.RecordBatch.from_arrays(
        [pa.array([b"a"]), pa.array([2**32 + 1], pa.int64())], names=["value", "partition"]
    )
    with pytest.raises(so.OptionError, match="partition attribute must be an int"):
        source.produce_batches(_sink(bootstrap), iter([wide]))
    with pytest.raises(so.OptionError, match="between 1 and 5"):
        produce_write.Settings.of(
            _sink(bootstrap, **{"max.in.flight.requests.per.connection": "6"})
        )


def test_batches_are_idempotent_and_cut_at_the_batch_size(broker: Any) -> None:
    """The stored batches carry one producer id, consecutive sequences per partition, and no
    batch's records exceed batch.size unless it holds one record."""
    bootstrap = broker.bootstrap
    _create(bootstrap, "t", 1)
    rows = [(None, bytes([i % 256]) * (100 + i % 900), 0, []) for i in range(2000)]
    rows[1000] = (None, b"x" * 50_000, 0, [])  # larger than batch.size: alone in its batch
    sink = _sink(bootstrap, **{"batch.size": "16384"})
    source.produce_batches(sink, iter(_arrow(rows, 333)))
    host, port = bootstrap.split(":")
    pos, pids, sequence, counted = 0, set(), 0, 0
    deadline = time.monotonic() + 30
    with socket.create_connection((host, int(port))) as sock:
        while counted < 2000 and time.monotonic() < deadline:  # split after acknowledged
            want = FetchWant("t", 0, counted, 1 << 24)
            sock.sendall(encode_fetch(CONSUMER_REPLICA_ID, -1, [want], 1 << 24, 1, "t", 500, 1))
            (size,) = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))
            frame = b""
            while len(frame) < size:
                frame += sock.recv(size - len(frame))
            _, _, parts = decode_fetch(frame)
            records, pos = parts[0].records, 0
            while len(records) - pos >= 61:
                h = parse_header(records, pos)
                if pos + h.size > len(records):
                    break
                pids.add(h.producer_id)
                assert h.base_offset == counted
                assert h.base_sequence == sequence
                assert h.size - 61 <= 16384 or h.record_count == 1
                sequence += h.record_count
                counted += h.record_count
                pos += h.size
    assert counted == 2000
    assert len(pids) == 1 and next(iter(pids)) >= 0


def test_what_only_librdkafka_does_still_goes_through_it(broker: Any) -> None:
    bootstrap = broker.bootstrap
    assert not produce_write.usable(_sink(bootstrap, **{"security.protocol": "SASL_PLAINTEXT"}))
    assert not produce_write.usable(_sink(bootstrap, **{"transactional.id": "x"}))
    assert not produce_write.usable(_sink(bootstrap, **{"queue.buffering.max.kbytes": "1000"}))
    _create(bootstrap, "t", 2)
    rows = _rows(seed=3, count=200, partitions=2)
    sink = _sink(bootstrap, **{"queue.buffering.max.kbytes": "100000"})
    assert source.produce_batches(sink, iter(_arrow(rows, 50))).records == 200
    got = _read(bootstrap, "t", 2, 200)
    assert len(got) == 200
    # keyed rows where Kafka's Java producer puts them (murmur2), as on the other path: with
    # librdkafka's default partitioner (CRC32) only some of them were
    by_value = {m.value(): m for m in got if m.value() is not None}
    for row in rows:
        want = _expected_partition(row, 2)
        if row[1] is not None and want is not None:
            assert by_value[row[1]].partition() == want, row


def test_a_partition_out_of_range_and_a_missing_topic_fail_the_task(broker: Any) -> None:
    bootstrap = broker.bootstrap
    _create(bootstrap, "t", 2)
    rows = [(None, b"v", 5, [])]
    with pytest.raises(SourceError, match=r"partition 5 of topic t with 2 partitions"):
        source.produce_batches(_sink(bootstrap), iter(_arrow(rows, 10)))
    with pytest.raises(so.OptionError, match="acks=all"):
        produce_write.Settings.of(_sink(bootstrap, acks="1"))
    # rows name their topics; a null topic is refused
    batch = pa.RecordBatch.from_arrays(
        [pa.array([b"a", b"b"]), pa.array(["t", None])], names=["value", "topic"]
    )
    with pytest.raises(so.OptionError, match="topic"):
        source.produce_batches(_sink(bootstrap, topic=None), iter([batch]))


def test_rows_go_to_the_topic_each_names(broker: Any) -> None:
    bootstrap = broker.bootstrap
    _create(bootstrap, "a", 1)
    _create(bootstrap, "b", 2)
    batch = pa.RecordBatch.from_arrays(
        [pa.array([b"%d" % i for i in range(100)]), pa.array(["a", "b"] * 50)],
        names=["value", "topic"],
    )
    assert source.produce_batches(_sink(bootstrap, topic=None), iter([batch])).records == 100
    assert sorted(m.value() for m in _read(bootstrap, "a", 1, 50)) == sorted(
        b"%d" % i for i in range(0, 100, 2)
    )
    assert sorted(m.value() for m in _read(bootstrap, "b", 2, 50)) == sorted(
        b"%d" % i for i in range(1, 100, 2)
    )


def test_an_unreachable_broker_fails_the_task_at_the_delivery_timeout() -> None:
    sink = _sink("127.0.0.1:1", **{"delivery.timeout.ms": "1500"})
    with pytest.raises(SourceError, match=r"delivery\.timeout\.ms"):
        source.produce_batches(sink, iter(_arrow([(None, b"v", None, [])], 1)))


def test_a_write_goes_on_after_the_broker_is_killed_and_restarted(broker: Any) -> None:
    """SIGKILL of the only broker in the middle of a write, started again a second later:
    the producer's connection fails, its batches go again with their sequence numbers once
    the broker is back, and every row is stored exactly once."""
    bootstrap = broker.bootstrap
    _create(bootstrap, "t", 2)
    total = 20_000

    def batches() -> Any:
        for start in range(0, total, 1000):
            if start == total // 4:
                broker.kill()
            if start == total // 2:  # (started here: a broker started by another thread
                time.sleep(1.0)  # dies with it, tests/conftest.py's _die_with_parent)
                broker.start()
            yield pa.RecordBatch.from_arrays(
                [pa.array([b"%d:" % i + bytes(300) for i in range(start, start + 1000)])],
                names=["value"],
            )

    sink = _sink(bootstrap, **{"batch.size": "16384"})
    assert source.produce_batches(sink, batches()).records == total
    key = (sink.bootstrap, source.config_key(sink.producer_config))
    producer = source.ARROW_PRODUCERS.take(key)
    assert producer is not None and producer.failed_sends > 0  # batches were sent again
    producer.close()
    got = _read(bootstrap, "t", 2, total)
    assert sorted(int(m.value().split(b":")[0]) for m in got) == list(range(total))


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_a_write_goes_on_at_the_new_leader_when_its_leader_is_killed(
    broker_factory: Any, zookeeper: Any
) -> None:
    """Replication factor 3: the leader is SIGKILLed while a write is in flight; the write
    finishes at the new leader and every row is stored exactly once (the batches resent
    after the failover keep their sequence numbers)."""
    from .test_replication import _isrs, _leaders, _start_cluster, _wait

    brokers, chroot = _start_cluster(broker_factory, zookeeper, zookeeper_session_timeout_ms=6000)
    everyone = ",".join(b.bootstrap for b in brokers)
    _create(brokers[0].bootstrap, "t", 1, replicas=3)
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 30, "ISR")
    leader = brokers[_leaders(everyone, "t")[0] - 1]
    total = 40_000
    killed = False

    def batches() -> Any:
        nonlocal killed
        for start in range(0, total, 1000):
            if start == total // 4:
                leader.kill()
                killed = True
            yield pa.RecordBatch.from_arrays(
                [pa.array([b"%d:" % i + bytes(200) for i in range(start, start + 1000)])],
                names=["value"],
            )

    sink = _sink(everyone, **{"batch.size": "16384"})
    assert source.produce_batches(sink, batches()).records == total
    assert killed and leader.proc.poll() is not None
    key = (sink.bootstrap, source.config_key(sink.producer_config))
    producer = source.ARROW_PRODUCERS.take(key)
    assert producer is not None and producer.failed_sends > 0  # batches were sent again
    producer.close()
    got = _read(",".join(b.bootstrap for b in brokers if b is not leader), "t", 1, total)
    assert sorted(int(m.value().split(b":")[0]) for m in got) == list(range(total))
    assert [m.offset() for m in got] == list(range(total))
