"""Helpers for integration tests: topics, and produce/consume through confluent-kafka."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

CODECS = ("gzip", "snappy", "lz4", "zstd")

Headers = list[tuple[str, bytes | None]]


@dataclass(frozen=True)
class Msg:
    """What a consumer sees of one record; compared exactly with what was produced."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp: int | None = None
    offset: int | None = field(default=None, compare=False)
    partition: int | None = field(default=None, compare=False)


def unique_topic(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000})


def wait_for_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 20.0) -> None:
    """Until metadata lists ``topic`` with ``partitions`` partitions, each with a leader."""
    client = admin(bootstrap)
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        md = client.list_topics(topic, timeout=10)
        tmd = md.topics.get(topic)
        last = tmd
        if (
            tmd is not None
            and tmd.error is None
            and len(tmd.partitions) == partitions
            and all(p.leader >= 0 and p.error is None for p in tmd.partitions.values())
        ):
            return
        time.sleep(0.1)
    raise AssertionError(f"topic {topic} not ready in metadata: {last!r}")


def create_topic(
    bootstrap: str,
    topic: str | None = None,
    partitions: int = 1,
    config: dict[str, str] | None = None,
) -> str:
    topic = topic or unique_topic()
    client = admin(bootstrap)  # kept referenced until its futures resolve
    futures = client.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1, config=config or {})],
        operation_timeout=10,
        request_timeout=15,
    )
    futures[topic].result(timeout=20)
    wait_for_topic(bootstrap, topic, partitions)
    return topic


def producer_config(bootstrap: str, **extra: object) -> dict[str, object]:
    conf: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "linger.ms": 5,
        "message.timeout.ms": 20000,
        "socket.timeout.ms": 10000,
    }
    conf.update(extra)
    return conf


def produce(
    bootstrap: str,
    topic: str,
    messages: Sequence[Msg],
    partition: int = 0,
    **conf: object,
) -> list[int]:
    """Produce with confluent-kafka, flush, assert every delivery succeeded; the offsets."""
    p = Producer(producer_config(bootstrap, **conf))
    results: list[tuple[int, KafkaError | None, int]] = []

    def on_delivery(err: KafkaError | None, msg: object, i: int) -> None:
        results.append((i, err, msg.offset()))  # type: ignore[attr-defined]

    for i, m in enumerate(messages):
        kwargs: dict[str, object] = {"partition": partition}
        if m.key is not None:
            kwargs["key"] = m.key
        if m.headers:
            kwargs["headers"] = list(m.headers)
        if m.timestamp is not None:
            kwargs["timestamp"] = m.timestamp
        p.produce(
            topic, m.value, on_delivery=lambda err, msg, i=i: on_delivery(err, msg, i), **kwargs
        )
        p.poll(0)
    remaining = p.flush(30)
    assert remaining == 0, f"{remaining} messages still undelivered after 30s"
    results.sort()
    errors = [(i, err) for i, err, _ in results if err is not None]
    assert not errors, f"delivery errors: {errors[:5]}"
    assert len(results) == len(messages)
    return [offset for _, _, offset in results]


def consumer(bootstrap: str, **extra: object) -> Consumer:
    """A confluent-kafka consumer for assign(): no subscription, no commits.

    librdkafka insists on a group.id, but with assign() and explicit offsets it never needs
    the group coordinator.
    """
    conf: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "group.id": f"unused-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
        "socket.timeout.ms": 10000,
        "fetch.wait.max.ms": 100,
    }
    conf.update(extra)
    return Consumer(conf)


def consume(
    bootstrap: str,
    topic: str,
    count: int,
    partition: int = 0,
    offset: int = 0,
    timeout: float = 30.0,
    **conf: object,
) -> list[Msg]:
    """Read exactly ``count`` records from ``offset`` by assignment, then expect the end.

    ``offset`` may be a logical one (``OFFSET_BEGINNING``, resolved through ListOffsets).
    """
    c = consumer(bootstrap, **conf)
    try:
        c.assign([TopicPartition(topic, partition, offset)])
        out: list[Msg] = []
        deadline = time.monotonic() + timeout
        at_eof = False
        while time.monotonic() < deadline and not (len(out) >= count and at_eof):
            msg = c.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    at_eof = True
                    continue
                raise KafkaException(err)
            at_eof = False
            ts_type, ts = msg.timestamp()
            assert ts_type == TIMESTAMP_CREATE_TIME, f"timestamp type {ts_type}"
            out.append(
                Msg(
                    msg.key(),
                    msg.value(),
                    tuple(msg.headers() or ()),
                    ts,
                    offset=msg.offset(),
                    partition=msg.partition(),
                )
            )
        assert len(out) >= count, f"consumed {len(out)} of {count} records within {timeout}s"
        assert at_eof, "no end-of-partition after the expected records"
        return out
    finally:
        c.close()


def wait_high_watermark(
    bootstrap: str, topic: str, end: int, partition: int = 0, timeout: float = 10.0
) -> tuple[int, int]:
    """Watermarks once the high watermark reaches ``end``.

    An acknowledged record becomes visible once the splitter has moved it from the journal
    to its queue log, which may be a moment after the ack.
    """
    c = consumer(bootstrap)
    try:
        deadline = time.monotonic() + timeout
        while True:
            marks = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            if marks[1] >= end or time.monotonic() > deadline:
                return marks
            time.sleep(0.05)
    finally:
        c.close()


def sample_messages(
    n: int = 10,
    base_ts: int | None = None,
    tag: str = "m",
    null_headers: bool = True,
    null_key_and_value: bool = True,
) -> list[Msg]:
    """Records exercising keys, null keys, null values, headers (repeated, null) and timestamps.

    Some clients refuse parts of what Kafka allows: kafka-python a null header value
    (``null_headers=False``), aiokafka a record with neither key nor value
    (``null_key_and_value=False``).
    """
    base_ts = base_ts or (int(time.time() * 1000) - 3_600_000)
    out = []
    for i in range(n):
        key = None if i % 4 == 3 else f"{tag}-key-{i}".encode()
        value = None if i % 5 == 4 else f"{tag}-value-{i}-".encode() + os.urandom(8) * (i + 1)
        if key is None and value is None and not null_key_and_value:
            key = f"{tag}-key-{i}".encode()
        headers: tuple[tuple[str, bytes | None], ...] = ()
        if i % 3 == 0:
            headers = (("h1", f"v{i}".encode()), ("h1", b"again"), ("empty", b""))
        elif i % 3 == 1:
            headers = (("null-header", None if null_headers else b""), ("bin", bytes(range(256))))
        out.append(Msg(key, value, headers, base_ts + i * 7))
    return out


def assert_same(consumed: Iterable[Msg], expected: Iterable[Msg]) -> None:
    consumed, expected = list(consumed), list(expected)
    assert len(consumed) == len(expected), f"{len(consumed)} records != {len(expected)}"
    for i, (got, want) in enumerate(zip(consumed, expected, strict=True)):
        assert got == want, f"record {i} differs:\n got  {got!r}\nwant {want!r}"


def assert_broker_healthy(broker: object, tag: str = "health") -> None:
    """The process is alive and a normal client still round-trips on a fresh topic."""
    proc = broker.proc  # type: ignore[attr-defined]
    assert proc.poll() is None, f"broker process exited with code {proc.returncode}"
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    topic = create_topic(bootstrap, unique_topic(tag))
    msgs = sample_messages(3, tag=tag)
    offsets = produce(bootstrap, topic, msgs, acks="all")
    assert offsets == [0, 1, 2]
    assert_same(consume(bootstrap, topic, 3), msgs)
    assert proc.poll() is None, f"broker process exited with code {proc.returncode}"


def low_watermark(bootstrap: str, topic: str, partition: int = 0) -> int:
    """The partition's log start offset (ListOffsets earliest), as a consumer sees it."""
    c = consumer(bootstrap)
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[0])
    finally:
        c.close()


def local_log_start(data_dir: str | os.PathLike[str], topic: str, partition: int = 0) -> int:
    """The base offset of the oldest queue-log segment left on the broker's disk."""
    queue_dir = os.path.join(data_dir, "queues", f"{topic}-{partition}")
    return min(int(name[:-4]) for name in os.listdir(queue_dir) if name.endswith(".log"))


def broker_counters(port: int) -> dict[str, float]:
    """The broker's counters on its ``metrics.listen`` endpoint (Prometheus text), by field
    name: ``stonemq_<name>_total`` read as ``<name>``."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("stonemq_") and name.endswith("_total"):
            out[name[len("stonemq_") : -len("_total")]] = float(value)
    return out
