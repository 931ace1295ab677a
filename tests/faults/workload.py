"""The fault suite's clients, running throughout in threads: an idempotent acks=all producer
and a committing group consumer (confluent-kafka, unmodified), each recording what the
brokers told it: every acknowledged (partition, offset, value), every consumed record and
every offset commit the coordinator acknowledged."""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer


class ProducerLoad:
    """Produces unique values (``b"<partition>:<serial>"``) round robin over the partitions
    at about ``rate`` records a second; ``acked`` grows in delivery order."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float) -> None:
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        # offset None: acknowledged without one (librdkafka's implicit ack of a batch whose
        # answer was lost, once a later batch succeeded)
        self.acked: list[tuple[int, int | None, bytes]] = []
        self.errors: list[str] = []
        self.sent = 0
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "log_level": 2,
                "message.timeout.ms": 300_000,
                "request.timeout.ms": 30_000,
            }
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-producer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(f"{msg.partition()} {msg.value()!r}: {err}")
        else:
            self.acked.append((msg.partition(), msg.offset(), msg.value()))

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - started) * self.rate)
            while self.sent < due and not self._stop.is_set():
                p = self.sent % self.partitions
                try:
                    self.producer.produce(
                        self.topic,
                        value=b"%d:%09d" % (p, self.sent),
                        partition=p,
                        on_delivery=self._on_delivery,
                    )
                except BufferError:
                    break
                self.sent += 1
            self.producer.poll(0.02)

    def stop(self, flush_s: float = 120.0) -> int:
        """Stop producing; the number of records still not delivered after ``flush_s``."""
        self._stop.set()
        self._thread.join(30)
        return self.producer.flush(flush_s)


class ConsumerLoad:
    """A group member reading ``topic`` from the earliest offset, committing its position
    synchronously about every ``commit_every_s`` (auto commit off, so commits never race)."""

    def __init__(self, bootstrap: str, topic: str, group: str, commit_every_s: float) -> None:
        self.topic = topic
        self.group = group
        self.commit_every_s = commit_every_s
        self.consumed: list[tuple[int, int, bytes]] = []
        self.errors: list[str] = []
        # the highest offset per partition whose commit the coordinator acknowledged
        self.committed: dict[int, int] = {}
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 1_000,
                "log_level": 2,
            }
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-consumer", daemon=True)

    def start(self) -> None:
        self.consumer.subscribe([self.topic])
        self._thread.start()

    def _run(self) -> None:
        last_commit = time.monotonic()
        while not self._stop.is_set():
            msg = self.consumer.poll(0.2)
            if msg is not None:
                if msg.error() is not None:
                    self.errors.append(str(msg.error()))
                else:
                    self.consumed.append((msg.partition(), msg.offset(), msg.value()))
            if time.monotonic() - last_commit >= self.commit_every_s:
                last_commit = time.monotonic()
                self._commit()

    def _commit(self) -> None:
        try:
            done = self.consumer.commit(asynchronous=False)
        except KafkaException:
            return  # nothing to commit yet, or the coordinator is moving: next round
        for tp in done or []:
            if tp.error is None and tp.offset >= 0:
                self.committed[tp.partition] = max(self.committed.get(tp.partition, 0), tp.offset)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.consumer.close()
