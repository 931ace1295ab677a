"""The archive workload (issue 6's benchmark): a tiered topic's produce rate, the PySpark
archive job's rate (``stonemq tier run --once``, with and without the JVM/Spark start), cold
bytes ÷ local bytes, and the cold-fetch rate once local segments are gone.

Records are 1 KiB of compressible, message-like JSON (click events: ids, a URL, a user agent,
counters and a free-text review from a small vocabulary; every record different), produced
uncompressed by confluent-kafka, so the local bytes are what a producer without compression
stores and the Parquet (zstd) bytes show what the columnar archive saves. Owns only this
workload; :mod:`bench.run` registers it.

Every wait has a deadline (``*_TIMEOUT_S``) and fails the workload with what it saw (the
uploads, the local log start, the tier run's output, the broker log's tail); the workers
report through :func:`entry`, so a worker that returns or raises ends the parent's wait at
once. (The first version's workers returned their result without putting it on the queue, so
the parent waited out its 30-minute timeout after the produce had finished.)
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
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
# every wait of the workload has a deadline (a hung step fails the workload, not the suite)
PRODUCE_TIMEOUT_S = 600.0
UPLOAD_TIMEOUT_S = 300.0
TIER_RUN_TIMEOUT_S = 1200.0
LOCAL_DELETE_TIMEOUT_S = 120.0
COLD_FETCH_TIMEOUT_S = 600.0

_PAGES = ["/", "/search", "/cart", "/checkout", "/product/{}", "/category/{}", "/help/{}"]
_AGENTS = [
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_5) AppleWebKit/605.1.15 Version/17.5 Safari",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 Mobile/15E148",
]


_VOCABULARY = (
    "the a to and of in for on with is it this that was great good fast slow size fit colour "
    "price order delivery arrived late early box broken perfect again would buy recommend "
    "quality cheap expensive battery screen sound light heavy small large return refund "
    "support friendly helpful shoes shirt phone cable charger lamp chair desk bag watch "
    "gift daughter son wife husband work home travel summer winter daily week month year "
    "not very really too much more less than but only just still also even never always"
)
_WORDS = _VOCABULARY.split()


def payload(i: int, rng: random.Random) -> bytes:
    """One 1 KiB JSON click event with a free-text review: ids, a URL, a user agent,
    counters and words drawn from a small vocabulary (every record different; what a
    message-like payload compresses to, not a padding of one repeated byte)."""
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
        "review": "",
    }
    room = RECORD_BYTES - len(json.dumps(event, separators=(",", ":")))
    words: list[str] = []
    while sum(len(w) + 1 for w in words) <= room:
        words.append(rng.choice(_WORDS))
    event["review"] = " ".join(words)[:room]
    return json.dumps(event, separators=(",", ":")).encode()


def entry(q: Queue[Any], name: str, *args: Any) -> None:
    """Process target (as :func:`bench.clients.entry`): run this module's worker ``name`` and
    report ``("done", result)`` or ``("error", traceback)`` on ``q``, so the parent's wait for
    a result ends as soon as the worker does."""
    try:
        q.put(("done", _WORKERS[name](q, *args)))
    except BaseException:
        q.put(("error", traceback.format_exc()))


def produce_json(
    q: Queue[Any],
    conf: dict[str, Any],
    topic: str,
    partitions: int,
    total_bytes: int,
    timeout: float,
) -> dict[str, Any]:
    """Produce ``total_bytes`` of 1 KiB JSON records round-robin over the partitions (at
    most ``timeout`` seconds, flush included)."""
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
    deadline = started + timeout
    sent = 0
    while sent < total:
        if sent % 1024 == 0 and time.monotonic() > deadline:
            raise RuntimeError(f"produced {sent} of {total} records in {timeout:.0f} s")
        try:
            producer.produce(topic, bodies[sent % len(bodies)], partition=sent % partitions)
        except BufferError:
            producer.poll(0.005)
            continue
        sent += 1
        if sent % 1024 == 0:
            producer.poll(0)
    left = producer.flush(max(deadline - time.monotonic(), 1.0))
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
        position = [0] * len(ends)
        msgs = nbytes = errors = 0
        deadline = started + timeout
        while not all(done) and time.monotonic() < deadline:
            # at most the offsets left (records, bar gaps): consume(n) waits for n or timeout
            left = sum(max(0, end - at) for end, at in zip(ends, position, strict=True))
            for m in consumer.consume(num_messages=max(1, min(10_000, left)), timeout=0.5):
                if m.error() is not None:
                    errors += 1
                    continue
                p = m.partition()
                if m.offset() >= ends[p]:
                    done[p] = True
                    continue
                msgs += 1
                nbytes += len(m.value())
                position[p] = m.offset() + 1
                if m.offset() == ends[p] - 1:
                    done[p] = True
        elapsed = time.monotonic() - started
    finally:
        consumer.close()
    return {"msgs": msgs, "bytes": nbytes, "seconds": elapsed, "errors": errors}


_WORKERS: dict[str, Callable[..., dict[str, Any]]] = {
    "produce_json": produce_json,
    "consume_cold": consume_cold,
}


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


def _wait(what: str, check: Callable[[], bool], timeout: float, state: Callable[[], str]) -> None:
    """Poll ``check`` until it holds; after ``timeout`` seconds fail with ``state()``."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"archive: timed out after {timeout:.0f} s waiting for {what}: {state()}"
            )
        time.sleep(0.2)


def _tier_run_once(data_dir: Path, env: dict[str, str], log_path: Path, timeout: float) -> float:
    """``stonemq tier run --once`` in its own session (the JVM with it), killed as a group
    after ``timeout`` seconds; returns the wall seconds, raises on failure or timeout."""
    cmd = [sys.executable, "-m", "stonemq", "tier", "run", "--once", "--data-dir", str(data_dir)]
    started = time.monotonic()
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    wall = time.monotonic() - started
    tail = log_path.read_text(errors="replace")[-3000:]
    if code is None:
        raise RuntimeError(f"archive: tier run --once still running after {timeout:.0f} s:\n{tail}")
    if code != 0:
        raise RuntimeError(f"archive: tier run --once exited {code}:\n{tail}")
    return wall


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
            broker.pid,
            entry,
            "produce_json",
            conf,
            TOPIC,
            PARTITIONS,
            total_bytes,
            PRODUCE_TIMEOUT_S,
            timeout=PRODUCE_TIMEOUT_S + 30,
        )
        produce = row(produced, mon, size=RECORD_BYTES)
        log(f"  produce into the tiered topic: {produce['mb_s']} MB/s")
        if produced["errors"]:
            raise RuntimeError(f"archive: {produced['errors']} records not delivered")

        queue_dir = broker.data_dir / "queues"
        store = StoreSpec((broker.data_dir / "tier").resolve().as_uri()).open()
        sealed = {p: _sealed_local(queue_dir, TOPIC, p) for p in range(PARTITIONS)}
        # the broker uploads sealed segments as they seal; the run below starts from them
        _wait(
            "the broker's uploads of sealed segments",
            lambda: all(
                len(mf.list_segments(store, TOPIC, p)) >= len(sealed[p]) for p in range(PARTITIONS)
            ),
            UPLOAD_TIMEOUT_S,
            lambda: (
                ", ".join(
                    f"p{p}: {len(mf.list_segments(store, TOPIC, p))} of {len(sealed[p])} uploaded"
                    for p in range(PARTITIONS)
                )
                + f"; broker log:\n{broker.tail()}"
            ),
        )
        wall = _tier_run_once(
            broker.data_dir,
            broker.environment(),
            run.tmp / "archive-tier-run.log",
            TIER_RUN_TIMEOUT_S,
        )
        last = status.last_run(store) or {}
        manifests = [mf.load(store, TOPIC, p) for p in range(PARTITIONS)]
        ends = [m.next_offset for m in manifests]
        cold_bytes = sum(m.bytes for m in manifests)
        records = sum(f.records for m in manifests for f in m.files)
        if records == 0:
            raise RuntimeError(f"archive: tier run --once archived nothing (last run: {last})")
        local_bytes = 0
        for p in range(PARTITIONS):
            logs = sorted((queue_dir / f"{TOPIC}-{p}").glob("*.log"))
            segs = [(int(x.stem), x.stat().st_size) for x in logs]
            # a segment is wholly archived when the next one starts at or below the end
            local_bytes += sum(a[1] for a, b in itertools.pairwise(segs) if b[0] <= ends[p])
        payload_bytes = records * RECORD_BYTES
        jobs_s = float(last.get("jobs_s", 0.0))
        spark_s = float(last.get("spark_start_s", 0.0))
        # jobs after the first: the first also starts Spark's Python workers (a fixed cost
        # per run); these are the rate a longer archive, or `tier run` looping, runs at
        first_s = float(last.get("first_job_s", 0.0))
        later_bytes = int(last.get("staged_bytes", 0)) - int(last.get("first_job_bytes", 0))
        later_s = jobs_s - first_s
        steady = round(later_bytes / later_s / 1e6, 2) if later_bytes > 0 and later_s > 0 else None
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
            "first_job_s": first_s,
            "mb_s_after_first_job": steady,
            "zstd_level": 1,
            "spark_master": "local[*]",
            "cores": os.cpu_count(),
        }
        log(
            f"  tier run --once: {archive['mb_s_with_start']} MB/s with start "
            f"({wall:.1f} s), {archive['mb_s_without_start']} MB/s jobs only ({jobs_s:.1f} s), "
            f"{steady} MB/s after the first job; cold/local {archive['cold_ratio']}"
        )

        # local segments go (local.retention.ms=0: archived ones only), then read from 0
        _alter(broker.bootstrap, TOPIC, {"local.retention.ms": "0"})

        def local_start(p: int) -> int:
            logs = sorted((queue_dir / f"{TOPIC}-{p}").glob("*.log"))
            return int(logs[0].stem) if logs else 0

        _wait(
            "the broker to delete the archived local segments",
            lambda: all(local_start(p) >= ends[p] for p in range(PARTITIONS)),
            LOCAL_DELETE_TIMEOUT_S,
            lambda: (
                ", ".join(
                    f"p{p}: local start {local_start(p)}, archived end {ends[p]}"
                    for p in range(PARTITIONS)
                )
                + f"; broker log:\n{broker.tail()}"
            ),
        )
        time.sleep(3)  # the broker's cached manifests (refreshed every 2 s)
        fetched, fmon = measured(
            broker.pid,
            entry,
            "consume_cold",
            broker.bootstrap,
            TOPIC,
            ends,
            COLD_FETCH_TIMEOUT_S,
            timeout=COLD_FETCH_TIMEOUT_S + 30,
        )
        cold = row(fetched, fmon, size=RECORD_BYTES)
        if fetched["msgs"] != records:
            raise RuntimeError(
                f"archive: cold fetch read {fetched['msgs']} of {records} records "
                f"({fetched['errors']} errors) in {fetched['seconds']:.0f} s"
            )
        log(f"  cold fetch from offset 0: {cold['mb_s']} MB/s")
        run.results["archive"] = {"produce": produce, "archive": archive, "cold_fetch": cold}
    finally:
        run.done_with(broker)
