"""Kafka client workers (confluent-kafka / librdkafka), each run in its own process.

Owns the producer and consumer loops of every StoneMQ workload. A worker reports over a
``multiprocessing`` queue: ``("start", None)`` when it is connected and about to send or read
(the parent starts measuring the broker then), and ``("done", result)`` with its counts and
elapsed time (or ``("error", text)``). Every loop is bounded by a count and a deadline.
"""

from __future__ import annotations

import os
import resource
import struct
import time
import traceback
from multiprocessing.queues import Queue
from typing import Any

_TS = struct.Struct(">q")


def entry(q: Queue[Any], name: str, *args: Any) -> None:
    """Process target: run the worker called ``name`` and report its result on ``q``, with
    the CPU seconds this client process used (all threads, librdkafka's included)."""
    try:
        result = globals()[name](q, *args)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        result["client_cpu_s"] = round(usage.ru_utime + usage.ru_stime, 3)
        q.put(("done", result))
    except BaseException:
        q.put(("error", traceback.format_exc()))


def producer_conf(bootstrap: str, acks: str, linger_ms: int = 5) -> dict[str, Any]:
    """librdkafka's defaults but for the message count bound, raised from 100,000 so that the
    byte bound (``queue.buffering.max.kbytes``, 1 GiB by default) is the one 1 KiB records
    meet. That buffer matters with many partitions: librdkafka sends one partition per
    ProduceRequest and visits every partition between two requests, so the batch a request
    carries is about the buffer divided by the partitions (at 10,000 partitions a 256 MiB
    buffer gave 49-record requests and 109 MB/s, the default 1 GiB 100 KiB and 158 MB/s).
    With one to four partitions the larger buffer measured about 15% slower in paired runs
    on this machine (docs/benchmarks/analysis.md); the defaults are kept all the same, as a
    user's client would have them."""
    return {
        "bootstrap.servers": bootstrap,
        "acks": acks,
        "linger.ms": linger_ms,
        "enable.idempotence": False,
        "compression.type": "none",
        "queue.buffering.max.messages": 1_000_000,
        "message.timeout.ms": 120_000,
    }


def produce(
    q: Queue[Any],
    conf: dict[str, Any],
    topic: str,
    size: int,
    duration: float,
    max_bytes: int,
    key_count: int,
) -> dict[str, Any]:
    """Produce ``size``-byte records as fast as the client goes, for ``duration`` seconds or
    ``max_bytes`` of payload, keyed over ``key_count`` keys (0: no key); then flush."""
    from confluent_kafka import KafkaException, Producer

    errors = [0]

    def on_error(err: Any, _msg: Any) -> None:
        if err is not None:
            errors[0] += 1

    producer = Producer({**conf, "delivery.report.only.error": True, "on_delivery": on_error})
    producer.list_topics(topic, timeout=30)
    payload = os.urandom(size)
    keys = [b"key-%d" % i for i in range(key_count)] if key_count else None
    max_msgs = max(1, max_bytes // size)
    produce = producer.produce
    poll = producer.poll
    q.put(("start", os.getpid()))  # the pid lets the bench profile this client
    started = time.monotonic()
    deadline = started + duration
    sent = 0
    while sent < max_msgs:
        if sent % 1024 == 0:
            poll(0)
            if time.monotonic() >= deadline:
                break
        try:
            if keys is None:
                produce(topic, payload)
            else:
                produce(topic, payload, keys[sent % key_count])
        except BufferError:
            poll(0.005)
            continue
        except KafkaException:
            errors[0] += 1
        sent += 1
    left = producer.flush(120)
    elapsed = time.monotonic() - started
    failed = errors[0] + left
    return {
        "msgs": sent - failed,
        "bytes": (sent - failed) * size,
        "seconds": elapsed,
        "errors": failed,
    }


def produce_each_partition(
    q: Queue[Any], bootstrap: str, topics: list[tuple[str, int]], size: int
) -> dict[str, Any]:
    """Write one ``size``-byte record to every partition of ``topics`` (name, partitions).

    One producer per topic, one after the other: librdkafka's per-message cost grows with
    every partition a producer knows (~0.75 ms CPU a message at 30,000 partitions), so one
    producer for 100,000 partitions could not write them all within its message timeout."""
    from confluent_kafka import Producer

    errors = [0]
    reasons: dict[str, int] = {}

    def on_error(err: Any, _msg: Any) -> None:
        if err is not None:
            errors[0] += 1
            reasons[err.name()] = reasons.get(err.name(), 0) + 1

    conf = producer_conf(bootstrap, "1", linger_ms=20)
    payload = os.urandom(size)
    q.put(("start", None))
    started = time.monotonic()
    sent = 0
    left = 0
    for topic, partitions in topics:
        producer = Producer({**conf, "delivery.report.only.error": True, "on_delivery": on_error})
        producer.list_topics(topic, timeout=60)
        for p in range(partitions):
            for _attempt in range(1000):
                try:
                    producer.produce(topic, payload, partition=p)
                    break
                except BufferError:
                    producer.poll(0.01)
            sent += 1
            if sent % 1024 == 0:
                producer.poll(0)
        left += producer.flush(300)
    return {
        "msgs": sent - errors[0] - left,
        "bytes": (sent - errors[0] - left) * size,
        "seconds": time.monotonic() - started,
        "errors": errors[0] + left,
        "error_kinds": reasons,
    }


def consumer_conf(bootstrap: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": "stonemq-bench",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
    }


def consume(
    q: Queue[Any], bootstrap: str, topic: str, partitions: int, expected: int, timeout: float
) -> dict[str, Any]:
    """Read ``topic`` from offset 0 on every partition until ``expected`` records arrived."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(consumer_conf(bootstrap))
    try:
        consumer.list_topics(topic, timeout=30)
        q.put(("start", None))
        started = time.monotonic()
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        msgs = 0
        nbytes = 0
        errors = 0
        deadline = started + timeout
        while msgs < expected and time.monotonic() < deadline:
            # consume(n) waits for n records or its timeout: never ask for more than are left,
            # or the last call waits out the timeout (0.5 s of a 1.5 s catch-up)
            for m in consumer.consume(num_messages=min(10_000, expected - msgs), timeout=0.5):
                if m.error() is not None:
                    errors += 1
                    continue
                msgs += 1
                nbytes += len(m.value())
        elapsed = time.monotonic() - started
    finally:
        consumer.close()
    return {"msgs": msgs, "bytes": nbytes, "seconds": elapsed, "errors": errors}


def latency_consumer(
    q: Queue[Any], bootstrap: str, topic: str, partitions: int, expected: int, timeout: float
) -> dict[str, Any]:
    """Read from the start and record, per record, now minus the producer's timestamp (the
    first 8 bytes: ``CLOCK_MONOTONIC`` in ns, system-wide on Linux)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({**consumer_conf(bootstrap), "fetch.wait.max.ms": 500})
    latencies: list[int] = []
    try:
        consumer.list_topics(topic, timeout=30)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        consumer.consume(num_messages=1, timeout=1.0)  # fetchers running
        q.put(("start", None))
        deadline = time.monotonic() + timeout
        unpack = _TS.unpack_from
        now = time.monotonic_ns
        while len(latencies) < expected and time.monotonic() < deadline:
            # poll, not consume(n): consume waits for n records or its timeout
            m = consumer.poll(0.1)
            if m is not None and m.error() is None:
                latencies.append(now() - unpack(m.value())[0])
    finally:
        consumer.close()
    return {"latencies_ns": latencies}


def paced_producer(
    q: Queue[Any], bootstrap: str, topic: str, rate: int, duration: float, size: int
) -> dict[str, Any]:
    """Produce ``rate`` records/s of ``size`` bytes for ``duration`` s, each stamped with
    ``CLOCK_MONOTONIC`` ns at the moment it is handed to the client."""
    from confluent_kafka import Producer

    producer = Producer({**producer_conf(bootstrap, "1", linger_ms=1)})
    producer.list_topics(topic, timeout=30)
    body = bytearray(os.urandom(size))
    total = int(rate * duration)
    q.put(("start", None))
    started = time.monotonic()
    sent = 0
    while sent < total:
        due = started + sent / rate
        now = time.monotonic()
        if now < due:
            time.sleep(min(due - now, 0.001))
            producer.poll(0)
            continue
        _TS.pack_into(body, 0, time.monotonic_ns())
        try:
            producer.produce(topic, bytes(body))
        except BufferError:
            producer.poll(0.001)
            continue
        sent += 1
        if sent % 64 == 0:
            producer.poll(0)
    left = producer.flush(60)
    elapsed = time.monotonic() - started
    return {"msgs": sent - left, "bytes": (sent - left) * size, "seconds": elapsed}
