"""The archive workload (issue 6's benchmark): a tiered topic's produce rate, the PySpark
archive job's rate (``stonemq tier run --once``, with and without the JVM/Spark start), cold
bytes ÷ local bytes, and the cold-fetch rate once local segments are gone.

Records are 1 KiB of compressible, message-like JSON (click events: ids, a URL, a user agent,
counters; every record different), produced uncompressed by confluent-kafka, so the local
bytes are what a producer without compression stores and the Parquet (zstd) bytes show what
the columnar archive saves. Owns only this workload; :mod:`bench.run` registers it.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
import time
from multiprocessing.queues import Queue
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import clients

if TYPE_CHECKING:
    from bench.run import Run

RECORD_BYTES = 1024
PARTITIONS = 2
SEGMENT_BYTES = 4 * 1024 * 1024
QUICK_BYTES = 96 * 1024 * 1024
FULL_BYTES = 1024 * 1024 * 1024
TOPIC = "archive-bench"

_PAGES = ["/", "/search", "/cart", "/checkout", "/product/{}", "/category/{}", "/help/{}"]
_AGENTS = [
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_5) AppleWebKit/605.1.15 Version/17.5 Safari",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 Mobile/15E148",
]


def payload(i: int, rng: random.Random) -> bytes:
    """One 1 KiB JSON click event (padded to exactly ``RECORD_BYTES``)."""
    event = {
        "event_id": f"{rng.getrandbits(64):016x}-{i:010d}",
        "user_id": f"user-{rng.randrange(100_000):06d}",
        "session": f"{rng.getrandbits(48):012x}",
        "ts": 1_760_000_000_000 + i * 3,
        "type": rng.choice(["view", "click", "add_to_cart", "purchase", "scroll"]),
        "url": "https://shop.example.com" + rng.choice(_PAGES).format(rng.randrange(5000)),
        "referrer": rng.choice(["", "https://www.google.com/", "https://news.example.org/"]),
        "agent": rng.choice(_AGENTS),
        "country": rng.choice(["DE", "FR", "US", "GB", "JP", "BR", "IN"]),
        "price_cents": rng.randrange(100, 100_000),
        "items": [rng.randrange(10_000) for _ in range(rng.randrange(1, 6))],
        "scroll_depth": round(rng.random(), 3),
        "experiment": {"id": f"exp-{rng.randrange(40)}", "arm": rng.choice(["a", "b"])},
    }
    raw = json.dumps(event, separators=(",", ":"))
    pad = RECORD_BYTES - len(raw) - len(',"pad":""}') + 1
    return (raw[:-1] + ',"pad":"' + "x" * max(pad, 0) + '"}').encode()[:RECORD_BYTES]


def produce_json(
    q: Queue[Any], conf: dict[str, Any], topic: str, partitions: int, total_bytes: int
) -> dict[str, Any]:
    """Produce ``total_bytes`` of 1 KiB JSON records round-robin over the partitions."""
    from confluent_kafka import Producer

    errors = [0]

    def on_error(err: Any, _msg: Any) -> None:
        if err is not None:
            errors[0] += 1

    rng = random.Random(42)
    bodies = [payload(i, rng) for i in range(4096)]  # distinct records, made before timing
    producer = Producer({**conf, "delivery.report.only.error": True, "on_delivery": on_error})
    producer.list_topics(topic, timeout=30)
    total = total_bytes // RECORD_BYTES
    q.put(("start", None))
    started = time.monotonic()
    sent = 0
    while sent < total:
        try:
            producer.produce(topic, bodies[sent % len(bodies)], partition=sent % partitions)
        except BufferError:
            producer.poll(0.005)
            continue
        sent += 1
        if sent % 1024 == 0:
            producer.poll(0)
    left = producer.flush(120)
    failed = errors[0] + left
    return {
        "msgs": sent - failed,
        "bytes": (sent - failed) * RECORD_BYTES,
        "seconds": time.monotonic() - started,
        "errors": failed,
    }


def consume_cold(
    q: Queue[Any], bootstrap: str, topic: str, ends: list[int], timeout: float
) -> dict[str, Any]:
    """Read every partition from offset 0 up to ``ends[p]`` (the archived end): all of it is
    served from the cold tier, local segments being gone."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(clients.consumer_conf(bootstrap))
    try:
        consumer.list_topics(topic, timeout=30)
        q.put(("start", None))
        started = time.monotonic()
        consumer.assign([TopicPartition(topic, p, 0) for p in range(len(ends))])
        done = [end <= 0 for end in ends]
        msgs = nbytes = errors = 0
        deadline = started + timeout
        while not all(done) and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=10_000, timeout=0.5):
                if m.error() is not None:
                    errors += 1
                    continue
                p = m.partition()
                if m.offset() >= ends[p]:
                    done[p] = True
                    continue
                msgs += 1
                nbytes += len(m.value())
                if m.offset() == ends[p] - 1:
                    done[p] = True
        elapsed = time.monotonic() - started
    finally:
        consumer.close()
    return {"msgs": msgs, "bytes": nbytes, "seconds": elapsed, "errors": errors}


def _alter(bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    entries = [
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()
    ]
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
    admin.incremental_alter_configs([resource])[resource].result(timeout=60)


def _create(bootstrap: str, topic: str, partitions: int, configs: dict[str, str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, num_partitions=partitions, replication_factor=1, config=configs)
    admin.create_topics([new], operation_timeout=60)[topic].result(timeout=60)


def _sealed_local(queue_dir: Path, topic: str, partition: int) -> list[tuple[int, int]]:
    """(base offset, bytes) of the sealed local segments, oldest first."""
    logs = sorted((queue_dir / f"{topic}-{partition}").glob("*.log"))
    return [(int(p.stem), p.stat().st_size) for p in logs[:-1]]


def _wait(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


def run_archive(run: Run) -> None:
    from bench.run import log, measured, row
    from stonemq.tiering import manifest as mf
    from stonemq.tiering import status
    from stonemq.tiering.cold_store import StoreSpec

    total_bytes = QUICK_BYTES if run.scale.name == "quick" else FULL_BYTES
    log(f"archive: {total_bytes // (1024 * 1024)} MiB of 1 KiB JSON into a tiered topic")
    broker = run.broker(
        **{"log.retention.check.interval.ms": 500, "queue.checkpoint.interval.ms": 500}
    )
    try:
        _create(
            broker.bootstrap,
            TOPIC,
            PARTITIONS,
            {"remote.storage.enable": "true", "segment.bytes": str(SEGMENT_BYTES)},
        )
        conf = clients.producer_conf(broker.bootstrap, "1")
        produced, mon = measured(
            broker.pid, produce_json, conf, TOPIC, PARTITIONS, total_bytes, timeout=1800
        )
        produce = row(produced, mon, size=RECORD_BYTES)
        log(f"  produce into the tiered topic: {produce['mb_s']} MB/s")

        queue_dir = broker.data_dir / "queues"
        store = StoreSpec((broker.data_dir / "tier").resolve().as_uri()).open()
        sealed = {p: _sealed_local(queue_dir, TOPIC, p) for p in range(PARTITIONS)}
        # the broker uploads sealed segments as they seal; the run below starts from them
        _wait(
            "the broker's uploads",
            lambda: all(
                len(mf.list_segments(store, TOPIC, p)) >= len(sealed[p]) for p in range(PARTITIONS)
            ),
            300,
        )
        env = broker.environment()
        started = time.monotonic()
        data_dir = str(broker.data_dir)
        proc = subprocess.run(
            [sys.executable, "-m", "stonemq", "tier", "run", "--once", "--data-dir", data_dir],
            env=env,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        wall = time.monotonic() - started
        if proc.returncode != 0:
            raise RuntimeError(f"tier run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        last = status.last_run(store) or {}
        manifests = [mf.load(store, TOPIC, p) for p in range(PARTITIONS)]
        ends = [m.next_offset for m in manifests]
        cold_bytes = sum(m.bytes for m in manifests)
        records = sum(f.records for m in manifests for f in m.files)
        local_bytes = 0
        for p in range(PARTITIONS):
            logs = sorted((queue_dir / f"{TOPIC}-{p}").glob("*.log"))
            segs = [(int(x.stem), x.stat().st_size) for x in logs]
            # a segment is wholly archived when the next one starts at or below the end
            local_bytes += sum(a[1] for a, b in itertools.pairwise(segs) if b[0] <= ends[p])
        payload_bytes = records * RECORD_BYTES
        jobs_s = float(last.get("jobs_s", 0.0))
        spark_s = float(last.get("spark_start_s", 0.0))
        archive = {
            "records": records,
            "payload_bytes": payload_bytes,
            "local_bytes": local_bytes,
            "cold_bytes": cold_bytes,
            "cold_ratio": round(cold_bytes / max(local_bytes, 1), 3),
            "wall_s": round(wall, 2),
            "cycle_s": last.get("duration_s"),
            "spark_start_s": spark_s,
            "jobs_s": jobs_s,
            "mb_s_with_start": round(local_bytes / wall / 1e6, 2),
            "mb_s_without_start": round(local_bytes / max(jobs_s, 1e-9) / 1e6, 2),
            "zstd_level": 1,
            "spark_master": "local[*]",
            "cores": os.cpu_count(),
        }
        log(
            f"  tier run --once: {archive['mb_s_with_start']} MB/s with start "
            f"({wall:.1f} s), {archive['mb_s_without_start']} MB/s jobs only ({jobs_s:.1f} s); "
            f"cold/local {archive['cold_ratio']}"
        )

        # local segments go (local.retention.ms=0: archived ones only), then read from 0
        _alter(broker.bootstrap, TOPIC, {"local.retention.ms": "0"})
        _wait(
            "local segments deleted",
            lambda: all(
                (_sealed_local(queue_dir, TOPIC, p) or [(ends[p], 0)])[0][0] >= ends[p]
                or not _sealed_local(queue_dir, TOPIC, p)
                for p in range(PARTITIONS)
            ),
            120,
        )
        time.sleep(3)  # the broker's cached manifests (refreshed every 2 s)
        fetched, fmon = measured(broker.pid, consume_cold, broker.bootstrap, TOPIC, ends, 1800.0)
        cold = row(fetched, fmon, size=RECORD_BYTES)
        if fetched["msgs"] != records:
            raise RuntimeError(f"cold fetch read {fetched['msgs']} of {records} records")
        log(f"  cold fetch from offset 0: {cold['mb_s']} MB/s")
        run.results["archive"] = {"produce": produce, "archive": archive, "cold_fetch": cold}
    finally:
        run.done_with(broker)
