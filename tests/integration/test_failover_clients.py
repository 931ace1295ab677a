"""Unmodified clients across a leader SIGKILL: kafka-python, aiokafka and kafkajs, each with
its default settings and acks=all, keep producing and consuming (a consumer group) while the
leader of the journal partition their topic follows is SIGKILLed; every acknowledged record
is consumed, at its acknowledged offset. Three brokers and a real ZooKeeper
(``zookeeper.session.timeout.ms`` 6000, so the controller moves leadership within seconds)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from .test_replication import _isrs, _start_cluster, _wait

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

JS_DIR = Path(__file__).resolve().parents[1] / "js"


class ClientRun:
    """What one client did: acknowledged (offset, value), failed sends, consumed records."""

    def __init__(self) -> None:
        self.acked: list[tuple[int, str]] = []
        self.failed: list[str] = []
        self.consumed: list[tuple[int, str]] = []
        self.stop = threading.Event()
        self.done = threading.Event()
        self.crashed: list[BaseException] = []
        self.events: list[str] = []

    def summary(self) -> str:
        """What the client did so far, for a failure's message."""
        seen = {v for _, v in self.consumed}
        unconsumed = [(o, v) for o, v in list(self.acked) if v not in seen]
        return (
            f"{len(self.acked)} acknowledged, {len(self.consumed)} consumed,"
            f" {len(unconsumed)} acknowledged but not consumed (first {unconsumed[:3]}),"
            f" {len(self.failed)} failed sends {self.failed[:3]}, events {self.events[-8:]}"
        )

    def all_consumed(self, acked: list[tuple[int, str]] | None = None) -> bool:
        """Whether every acknowledged value (of ``acked``, all by default) was consumed."""
        seen = {v for _, v in list(self.consumed)}
        return all(v in seen for _, v in list(self.acked if acked is None else acked))


def _cluster(broker_factory: Any, zookeeper: Any, topic: str) -> tuple[list[Any], str, Any]:
    """Three brokers, ``topic`` (1 partition, RF 3) with a full ISR; the broker leading it."""
    brokers, chroot = _start_cluster(broker_factory, zookeeper, zookeeper_session_timeout_ms=6000)
    admin = AdminClient({"bootstrap.servers": brokers[0].bootstrap})
    admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(30)
    _wait(lambda: all(set(isr) == {1, 2, 3} for isr in _isrs(chroot).values()), 30, "ISR")
    leader = _leader(brokers[0].bootstrap, topic)
    assert leader in (1, 2, 3)
    return brokers, ",".join(b.bootstrap for b in brokers), brokers[leader - 1]


def _leader(bootstrap: str, topic: str) -> int:
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return meta.topics[topic].partitions[0].leader


def _broker_listed(bootstrap: str, broker_id: int) -> bool:
    """Whether the metadata from ``bootstrap`` lists ``broker_id`` (True when it cannot tell)."""
    try:
        meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    except Exception:
        return True
    return broker_id in meta.brokers


def _across_the_kill(
    brokers: list[Any],
    victim: Any,
    topic: str,
    run: ClientRun,
    *,
    idempotent: bool,
    failed_sends: int = 0,
) -> None:
    """With the client running: wait for acknowledged records, SIGKILL the leader, wait for a
    new leader and for more acknowledged records, stop producing and wait until every
    acknowledged record was consumed; then check offsets and values. A producer that is not
    idempotent (kafkajs' and aiokafka's default, as Kafka's before 3.0) may store a value twice
    when it retries a send whose answer the kill took; an idempotent one never. At most
    ``failed_sends`` sends may fail (their client gave up before the new leader was known)."""
    try:
        _wait(lambda: len(run.acked) >= 100 or run.crashed, 60, "acks before the kill")
        assert not run.crashed, run.crashed
        victim.kill()
        survivor = next(b for b in brokers if b is not victim)
        old = int(victim.settings["broker_id"])

        def moved() -> bool:
            try:
                return _leader(survivor.bootstrap, topic) not in (old, -1)
            except Exception:
                return False

        _wait(moved, 60, "a new leader")
        before = len(run.acked)
        _wait(lambda: len(run.acked) >= before + 100 or run.crashed, 90, "acks after the kill")
        assert not run.crashed, run.crashed
        # the client runs on until the killed broker has left the metadata (its ZooKeeper
        # session expired, about 6 s after the kill) and acknowledges more after that: the
        # change of broker list is then seen by a running client, never by one that is
        # disconnecting (kafkajs 2.2.4's consumer.disconnect() never returns when its fetchers
        # see the broker list change while they stop: FetchManager.start restarts them on
        # KafkaJSFetcherRebalanceError after stop() and the runner waits for them forever)
        _wait(lambda: not _broker_listed(survivor.bootstrap, old), 60, "the killed broker gone")
        before = len(run.acked)
        _wait(lambda: len(run.acked) >= before + 20 or run.crashed, 60, "acks after it left")
        assert not run.crashed, run.crashed
        # and until its consumer has caught up: a client may take long to get past a dead
        # broker it still has in its metadata (kafkajs 2.2.4 keeps its metadata, fetches from
        # every broker listed there and so fails on the dead one until its retries run out,
        # about 40 s, then restarts the consumer and joins the group again, up to 100 s in
        # all); stopping it before would stop it mid-recovery
        acked_so_far = list(run.acked)

        def caught_up() -> bool:
            return run.all_consumed(acked_so_far) or bool(run.crashed)

        _wait(caught_up, 180, "the consumer to catch up")
        assert not run.crashed, run.crashed
    finally:
        run.stop.set()
    try:
        _wait(lambda: run.done.is_set(), 120, "the client to finish")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {run.summary()}") from None
    assert not run.crashed, run.crashed
    assert len(run.failed) <= failed_sends, run.failed[:5]
    consumed = dict(run.consumed)
    missing = [(o, v) for o, v in run.acked if consumed.get(o) != v]
    assert not missing, (len(missing), missing[:5], len(run.acked))
    # one value per offset: a consumer never saw a record that was later truncated (another
    # one would have taken its offset), and no value was stored at two offsets
    assert len(set(run.consumed)) == len(consumed), "an offset consumed with two values"
    if idempotent:
        assert len(set(consumed.values())) == len(consumed), "a value stored at two offsets"
    offsets = [o for o, _ in run.acked]
    assert len(offsets) == len(set(offsets)), "two records acknowledged at one offset"


def test_kafka_python_across_a_leader_kill(broker_factory, zookeeper) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    topic = "kp-fo"
    brokers, bootstrap, victim = _cluster(broker_factory, zookeeper, topic)
    run = ClientRun()

    def produce() -> None:
        producer = KafkaProducer(bootstrap_servers=bootstrap.split(","), acks="all")
        try:
            i = 0
            while not run.stop.is_set():
                value = f"kp{i:06d}"
                future = producer.send(topic, value.encode())
                future.add_callback(lambda md, v=value: run.acked.append((md.offset, v)))
                future.add_errback(lambda exc, v=value: run.failed.append(f"{v}: {exc!r}"))
                i += 1
                time.sleep(0.005)
            producer.flush(120)
        finally:
            producer.close(10)

    def consume() -> None:
        consumer = KafkaConsumer(
            topic,
            bootstrap_servers=bootstrap.split(","),
            group_id=f"kp-{uuid.uuid4().hex[:6]}",
            auto_offset_reset="earliest",
        )
        try:
            deadline = None
            while True:
                for records in consumer.poll(200).values():
                    run.consumed.extend((r.offset, r.value.decode()) for r in records)
                if run.stop.is_set() and not producer_thread.is_alive():
                    deadline = deadline or time.monotonic() + 60
                    if run.all_consumed() or time.monotonic() > deadline:
                        return
        finally:
            consumer.close()

    _threads(run, produce, consume)
    producer_thread = run.threads[0]  # type: ignore[attr-defined]
    _across_the_kill(brokers, victim, topic, run, idempotent=True)


@pytest.mark.slow
def test_aiokafka_across_a_leader_kill(broker_factory, zookeeper) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    topic = "aio-fo"
    brokers, bootstrap, victim = _cluster(broker_factory, zookeeper, topic)
    run = ClientRun()

    async def main() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=f"aio-{uuid.uuid4().hex[:6]}",
            auto_offset_reset="earliest",
        )
        await producer.start()
        await consumer.start()
        try:

            async def produce() -> None:
                i = 0
                while not run.stop.is_set():
                    value = f"aio{i:06d}"
                    i += 1
                    try:
                        md = await producer.send_and_wait(topic, value.encode())
                    except Exception as exc:
                        run.failed.append(f"{value}: {exc!r}")
                    else:
                        run.acked.append((md.offset, value))
                    await asyncio.sleep(0.005)

            async def consume() -> None:
                while True:
                    batches = await consumer.getmany(timeout_ms=200)
                    for records in batches.values():
                        run.consumed.extend((r.offset, r.value.decode()) for r in records)
                    if produced.done() and run.all_consumed():
                        return

            # the consumer runs beside the producer, across the kill, as the other clients'
            produced = asyncio.ensure_future(produce())
            consuming = asyncio.ensure_future(consume())
            await produced
            await asyncio.wait_for(consuming, 60)
            # commit before stop: aiokafka's stop() retries its last auto-commit forever
            # when the coordinator is unknown at that moment (it no longer looks one up
            # once closing; aio-libs/aiokafka#659's kind), which a stop within a second or
            # two of the coordinator's broker dying hits; commit() looks the new one up
            end = max(o for o, _ in run.consumed) + 1
            await asyncio.wait_for(consumer.commit(), 60)
            tp = TopicPartition(topic, 0)
            assert await consumer.committed(tp) == end, "the committed offset"
        finally:
            await producer.stop()
            await consumer.stop()

    def go() -> None:
        asyncio.run(main())

    _threads(run, go)
    _across_the_kill(brokers, victim, topic, run, idempotent=False)


@pytest.mark.slow
@pytest.mark.timeout(420)  # kafkajs' recovery past a dead broker can take 100 s (see below)
@pytest.mark.skipif(shutil.which("node") is None, reason="node not installed")
def test_kafkajs_across_a_leader_kill(broker_factory, zookeeper, tmp_path) -> None:
    assert (JS_DIR / "node_modules" / "kafkajs").is_dir(), "run scripts/install-test-deps.sh"
    topic = "js-fo"
    brokers, bootstrap, victim = _cluster(broker_factory, zookeeper, topic)
    run = ClientRun()
    stop_file = tmp_path / "stop"
    spec = {
        "brokers": bootstrap.split(","),
        "topic": topic,
        "groupId": f"js-{uuid.uuid4().hex[:6]}",
        "stopFile": str(stop_file),
        "timeoutMs": 60000,
    }
    # stderr to a file, read when the script fails: a pipe read only at the end could fill
    # and block the script (kafkajs logs there when KAFKAJS_LOG_LEVEL is set)
    stderr_path = tmp_path / "kafkajs.stderr"
    stderr_file = stderr_path.open("wb")
    stdout_copy = (tmp_path / "kafkajs.stdout").open("wb", buffering=0)
    proc = subprocess.Popen(
        ["node", str(JS_DIR / "kafkajs_failover.js"), json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=stderr_file,
        cwd=JS_DIR,
        env={**os.environ, "KAFKAJS_NO_PARTITIONER_WARNING": "1"},
    )

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            stdout_copy.write(raw)
            kind, _, rest = raw.decode().rstrip("\n").partition(" ")
            if kind == "acked":
                offset, value = rest.split(" ")
                run.acked.append((int(offset), value))
            elif kind == "consumed":
                offset, value = rest.split(" ")
                run.consumed.append((int(offset), value))
            elif kind == "failed":
                run.failed.append(rest)
            elif kind == "event":
                run.events.append(rest)
        if proc.wait() != 0:
            tail = stderr_path.read_bytes()[-4000:].decode(errors="replace")
            run.crashed.append(RuntimeError(tail))

    def stopper() -> None:
        run.stop.wait()
        stop_file.write_text("stop")

    _threads(run, read, stopper)
    try:
        # kafkajs' default retry budget (5 retries from 300 ms, about 9 s at most) ends
        # before a SIGKILLed leader's ZooKeeper session (6 s) expires and the new leader is
        # known (as against Kafka): the one send in flight then may fail, a few at most, and
        # the producer goes on with the next
        _across_the_kill(brokers, victim, topic, run, idempotent=False, failed_sends=3)
    finally:
        stop_file.write_text("stop")
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        stderr_file.close()
        stdout_copy.close()


def _threads(run: ClientRun, *targets: Any) -> None:
    """Run ``targets`` in daemon threads; ``run.done`` is set once all returned."""

    def wrap(target: Any) -> Any:
        def body() -> None:
            try:
                target()
            except BaseException as exc:
                run.crashed.append(exc)

        return body

    threads = [threading.Thread(target=wrap(t), daemon=True) for t in targets]
    run.threads = threads  # type: ignore[attr-defined]
    for t in threads:
        t.start()

    def waiter() -> None:
        for t in threads:
            t.join()
        run.done.set()

    threading.Thread(target=waiter, daemon=True).start()
