"""The ``stonemq`` PySpark data source's workload (issue 21): a batch read of 1 KiB JSON
records, half archived (Parquet in the cold store) and half local, against one
confluent-kafka consumer's catch-up read of the same offsets; and a streaming query topic ->
topic fed at half the measured produce rate, with its lag sampled every second.

Targets: the whole read at >= 1x the consumer's rate, the archived half at >= 2x; the
streaming query's lag bounded (it ends near zero instead of growing). Spark runs local[2] in
this process (the machine's cores); ``--quick`` reads 96 MiB instead of 1 GiB.

What is measured is the steady state of a session, not its start: a warm-up read of a tenth
of the data around the archive's seam (both paths) starts Spark's Python workers and warms
the JVM's JIT first, and the streaming query's first micro-batch (its Python workers
starting) completes before the feeder starts; both start-ups are recorded. The batch reads
run in :data:`ROUNDS` interleaved rounds (Spark whole, Spark archived, consumer whole,
consumer archived), each round's ratios paired within it, the median reported and every
round kept: on a machine shared with other work one round moves by half. Owns only this
workload; :mod:`bench.run` registers it.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from typing import TYPE_CHECKING, Any

from bench import archive

if TYPE_CHECKING:
    from bench.run import Run

TOPIC = "spark-source-bench"
OUT_TOPIC = "spark-source-bench-out"
IN_TOPIC = "spark-stream-bench-in"
PARTITIONS = 2
STREAM_QUICK_S = 30.0
STREAM_FULL_S = 90.0
ROUNDS = 3
PRIME_RECORDS = 2000  # the streaming query's first micro-batch, before the feeder starts
PRIME_TIMEOUT_S = 300.0


class _Queue:
    """Stands in for the multiprocessing queue the archive workers report on."""

    def put(self, _item: Any) -> None:
        pass


def _consume(bootstrap: str, topic: str, starts: list[int], ends: list[int]) -> dict[str, Any]:
    """One confluent-kafka consumer reads ``[starts[p], ends[p])`` of every partition."""
    from confluent_kafka import Consumer, TopicPartition

    from bench import clients

    consumer = Consumer(clients.consumer_conf(bootstrap))
    try:
        consumer.list_topics(topic, timeout=30)
        started = time.monotonic()
        consumer.assign([TopicPartition(topic, p, starts[p]) for p in range(len(ends))])
        done = [ends[p] <= starts[p] for p in range(len(ends))]
        msgs = nbytes = 0
        deadline = started + 1200
        while not all(done) and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=10_000, timeout=0.5):
                if m.error() is not None:
                    continue
                p = m.partition()
                if m.offset() >= ends[p]:
                    done[p] = True
                    continue
                msgs += 1
                nbytes += len(m.value())
                if m.offset() == ends[p] - 1:
                    done[p] = True
        return {"msgs": msgs, "bytes": nbytes, "seconds": time.monotonic() - started}
    finally:
        consumer.close()


def _spark_read(spark: Any, options: dict[str, str]) -> dict[str, Any]:
    reader = spark.read.format("stonemq")
    for k, v in options.items():
        reader = reader.option(k, v)
    started = time.monotonic()
    row = reader.load().selectExpr("count(*) AS n", "sum(length(value)) AS b").collect()[0]
    return {"msgs": row.n, "bytes": int(row.b or 0), "seconds": time.monotonic() - started}


def _rate(r: dict[str, Any]) -> dict[str, Any]:
    return {**r, "mb_s": round(r["bytes"] / max(r["seconds"], 1e-9) / 1e6, 2)}


def run_spark_source(run: Run) -> None:
    from bench.run import log
    from stonemq.spark import register
    from stonemq.tiering import manifest as mf
    from stonemq.tiering.archive_job import spark_session
    from stonemq.tiering.cold_store import StoreSpec

    quick = run.scale.name == "quick"
    total = archive.QUICK_BYTES if quick else archive.FULL_BYTES
    half = total // 2
    log(f"spark-source: {total // (1024 * 1024)} MiB of 1 KiB JSON, half archived")
    broker = run.broker(
        **{"log.retention.check.interval.ms": 500, "queue.checkpoint.interval.ms": 500}
    )
    spark = None
    try:
        archive._create(
            broker.bootstrap,
            TOPIC,
            PARTITIONS,
            {"remote.storage.enable": "true", "segment.bytes": str(archive.SEGMENT_BYTES)},
        )
        conf = {"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "acks": "1"}
        first = archive.produce_json(_Queue(), conf, TOPIC, PARTITIONS, half, 600)  # type: ignore[arg-type]
        store = StoreSpec((broker.data_dir / "tier").resolve().as_uri()).open()
        queue_dir = broker.data_dir / "queues"
        sealed = {p: archive._sealed_local(queue_dir, TOPIC, p) for p in range(PARTITIONS)}
        archive._wait(
            "uploads",
            lambda: all(
                len(mf.list_segments(store, TOPIC, p)) >= len(sealed[p]) for p in range(PARTITIONS)
            ),
            archive.UPLOAD_TIMEOUT_S,
            broker.tail,
        )
        archive._tier_run_once(
            broker.data_dir, broker.environment(), run.tmp / "spark-tier-run.log", 1200
        )
        archived = [mf.load(store, TOPIC, p).next_offset for p in range(PARTITIONS)]
        archive._alter(broker.bootstrap, TOPIC, {"local.retention.ms": "0"})

        def local_start(p: int) -> int:
            logs = sorted((queue_dir / f"{TOPIC}-{p}").glob("*.log"))
            return int(logs[0].stem) if logs else 0

        archive._wait(
            "local deletion of archived segments",
            lambda: all(local_start(p) >= archived[p] for p in range(PARTITIONS)),
            archive.LOCAL_DELETE_TIMEOUT_S,
            broker.tail,
        )
        second = archive.produce_json(_Queue(), conf, TOPIC, PARTITIONS, total - half, 600)  # type: ignore[arg-type]
        # the broker's ingest: both halves' bytes over both produces' seconds (flush included)
        ingest_mb_s = (
            (first["bytes"] + second["bytes"]) / (first["seconds"] + second["seconds"]) / 1e6
        )
        log(f"  produce: {ingest_mb_s:.1f} MB/s")
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "x"})
        ends = [c.get_watermark_offsets(TopicPartition(TOPIC, p), 10)[1] for p in range(2)]
        c.close()
        zeros = [0] * PARTITIONS

        spark = spark_session("local[2]", str(run.tmp / "spark-source.log"), "stonemq-bench")
        register(spark)
        options = {
            "kafka.bootstrap.servers": broker.bootstrap,
            "subscribe": TOPIC,
            "stonemq.tier.store.url": store.spec.url,
            "minPartitions": "4",
        }
        # warm-up: a tenth of the data around the seam, both paths (workers start, JIT warms)
        span = [max(1, min(archived[p], ends[p] - archived[p]) // 10) for p in range(PARTITIONS)]
        warm_started = time.monotonic()
        _spark_read(
            spark,
            {
                **options,
                "startingOffsets": json.dumps(
                    {TOPIC: {str(p): archived[p] - span[p] for p in range(PARTITIONS)}}
                ),
                "endingOffsets": json.dumps(
                    {TOPIC: {str(p): archived[p] + span[p] for p in range(PARTITIONS)}}
                ),
            },
        )
        warm_s = time.monotonic() - warm_started
        ending = json.dumps({TOPIC: {str(p): archived[p] for p in range(PARTITIONS)}})
        rounds = []
        for i in range(ROUNDS):
            load = os.getloadavg()[0]
            spark_all = _rate(_spark_read(spark, options))
            spark_cold = _rate(_spark_read(spark, {**options, "endingOffsets": ending}))
            consumer_all = _rate(_consume(broker.bootstrap, TOPIC, zeros, ends))
            consumer_cold = _rate(_consume(broker.bootstrap, TOPIC, zeros, archived))
            if (spark_all["msgs"], spark_cold["msgs"]) != (
                consumer_all["msgs"],
                consumer_cold["msgs"],
            ):
                raise RuntimeError(
                    f"spark-source: counts differ: spark {spark_all['msgs']}/"
                    f"{spark_cold['msgs']}, consumer {consumer_all['msgs']}/"
                    f"{consumer_cold['msgs']}"
                )
            one = {
                "loadavg_1m": round(load, 2),
                "spark_all": spark_all,
                "spark_archived": spark_cold,
                "consumer_all": consumer_all,
                "consumer_archived": consumer_cold,
                "ratio_all": round(spark_all["mb_s"] / max(consumer_all["mb_s"], 1e-9), 2),
                "ratio_archived": round(spark_cold["mb_s"] / max(consumer_cold["mb_s"], 1e-9), 2),
            }
            rounds.append(one)
            log(
                f"  round {i + 1} (load {load:.1f}): spark {spark_all['mb_s']} vs consumer "
                f"{consumer_all['mb_s']} MB/s ({one['ratio_all']}x); archived half "
                f"{spark_cold['mb_s']} vs {consumer_cold['mb_s']} MB/s "
                f"({one['ratio_archived']}x)"
            )

        def median_round(ratio: str) -> dict[str, Any]:
            """The round whose ``ratio`` is the median (the middle of an odd count)."""
            return sorted(rounds, key=lambda r: r[ratio])[len(rounds) // 2]

        whole, cold = median_round("ratio_all"), median_round("ratio_archived")
        batch = {
            "records": rounds[0]["spark_all"]["msgs"],
            "archived_records": rounds[0]["spark_archived"]["msgs"],
            "warmup_s": round(warm_s, 2),
            # the figures of the round with the median ratio (paired within that round)
            "spark_all": whole["spark_all"],
            "consumer_all": whole["consumer_all"],
            "ratio_all": whole["ratio_all"],
            "spark_archived": cold["spark_archived"],
            "consumer_archived": cold["consumer_archived"],
            "ratio_archived": cold["ratio_archived"],
            "rounds": rounds,
        }
        log(
            f"  batch (median of {ROUNDS} rounds): whole {batch['ratio_all']}x, archived "
            f"half {batch['ratio_archived']}x"
        )
        stream = _stream(run, spark, broker.bootstrap, ingest_mb_s / 2, quick, broker.pid)
        log(f"  streaming at {stream['target_mb_s']} MB/s: lag {stream['lag_samples'][-5:]}")
        run.results["spark_source"] = {
            "batch": batch,
            "stream": stream,
            "ingest_mb_s": round(ingest_mb_s, 2),
            "bytes": total,
        }
    finally:
        if spark is not None:
            spark.stop()
        run.done_with(broker)


def _stream(
    run: Run, spark: Any, bootstrap: str, mb_s: float, quick: bool, broker_pid: int
) -> dict[str, Any]:
    """A topic -> topic query while a producer writes at ``mb_s``; the lag (records produced
    but not yet read by the query) sampled every second. The query's first micro-batch
    (:data:`PRIME_RECORDS` records: its Python workers start) completes before the feeder
    starts. CPU shares over the fed window: the broker's process tree, the feeder's thread,
    and the rest of this process tree (Spark: the JVM and its Python workers)."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from bench import procs

    for topic in (IN_TOPIC, OUT_TOPIC):
        archive._create(bootstrap, topic, PARTITIONS, {})
    seconds = STREAM_QUICK_S if quick else STREAM_FULL_S
    rate = mb_s * 1e6 / archive.RECORD_BYTES  # records per second
    stop = threading.Event()
    produced = [0]
    feeder_cpu = [0.0]

    def feed() -> None:
        rng = random.Random(7)
        bodies = [archive.payload(i, rng) for i in range(1024)]
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        started = time.monotonic()
        while not stop.is_set():
            due = int((time.monotonic() - started) * rate)
            while produced[0] < due:
                try:
                    p.produce(IN_TOPIC, bodies[produced[0] % 1024], partition=produced[0] % 2)
                except BufferError:
                    p.poll(0.01)
                    continue
                produced[0] += 1
            p.poll(0)
            feeder_cpu[0] = time.thread_time()
            time.sleep(0.005)
        p.flush(60)

    prime = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    body = archive.payload(0, random.Random(7))
    for i in range(PRIME_RECORDS):
        prime.produce(IN_TOPIC, body, partition=i % PARTITIONS)
    prime.flush(60)
    reader = (
        spark.readStream.format("stonemq")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", IN_TOPIC)
        .option("startingOffsets", "earliest")
        .load()
    )
    query = (
        reader.select("key", "value")
        .writeStream.format("stonemq")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", OUT_TOPIC)
        .option("checkpointLocation", str(run.tmp / "spark-stream-checkpoint"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "lag"})
    samples: list[int] = []
    feeder = threading.Thread(target=feed, daemon=True)
    try:
        prime_started = time.monotonic()
        while not (query.lastProgress and query.lastProgress["numInputRows"] > 0):
            if query.exception() is not None or not query.isActive:
                raise RuntimeError(
                    f"spark-source: the streaming query stopped: {query.exception()}"
                )
            if time.monotonic() - prime_started > PRIME_TIMEOUT_S:
                raise RuntimeError(
                    "spark-source: the streaming query's first micro-batch "
                    f"did not complete within {PRIME_TIMEOUT_S:.0f} s"
                )
            time.sleep(0.2)
        prime_s = time.monotonic() - prime_started
        load_start = os.getloadavg()[0]
        cpu_all, cpu_broker = procs.cpu_seconds(os.getpid()), procs.cpu_seconds(broker_pid)
        feeder.start()
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            time.sleep(1)
            progress = query.lastProgress
            read = 0
            if progress and progress.get("sources"):
                end = progress["sources"][0].get("endOffset") or {}
                if isinstance(end, str):
                    end = json.loads(end)
                read = sum(int(o) for o in end.get(IN_TOPIC, {}).values())
            high = sum(
                c.get_watermark_offsets(TopicPartition(IN_TOPIC, p), 10)[1]
                for p in range(PARTITIONS)
            )
            samples.append(high - read)
        window = time.monotonic() - started
        broker_s = procs.cpu_seconds(broker_pid) - cpu_broker
        spark_s = procs.cpu_seconds(os.getpid()) - cpu_all - broker_s - feeder_cpu[0]
        batches = [
            {"rows": p["numInputRows"], "ms": p["durationMs"].get("triggerExecution")}
            for p in query.recentProgress
        ]
    finally:
        stop.set()
        if feeder.is_alive():
            feeder.join(60)
        query.stop()
        c.close()
    tail = samples[len(samples) // 2 :]
    return {
        "target_mb_s": round(mb_s, 2),
        "seconds": seconds,
        "produced": produced[0],
        "prime_s": round(prime_s, 1),
        "loadavg_1m": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        # CPU in the fed window, in cores (1.0 = one core all along)
        "cpu_cores": {
            "broker": round(broker_s / window, 2),
            "feeder": round(feeder_cpu[0] / window, 2),
            "spark": round(spark_s / window, 2),
        },
        "micro_batches": batches,
        "lag_samples": samples,
        "lag_max": max(samples) if samples else None,
        "lag_max_second_half": max(tail) if tail else None,
        "lag_end": samples[-1] if samples else None,
        # bounded: the second half's worst lag is no larger than the first half's worst plus
        # one second of records (a lag that grows with time fails this)
        "bounded": bool(samples) and max(tail) <= max(samples[: len(samples) // 2] or [0]) + rate,
        # what the feeder handed to its producer: a feeder short of CPU writes less than it is
        # asked, and a bounded lag then says nothing about the asked rate (kept_up)
        "fed_mb_s": round(produced[0] * archive.RECORD_BYTES / seconds / 1e6, 2),
    }


FED_SHARE_MIN = 0.95
"""The share of the asked rate the feeder must reach for a bounded lag to show that the query
keeps up with that rate."""


def kept_up(stream: dict[str, Any]) -> bool:
    """The query kept up with a producer at the asked rate: its lag bounded while the feeder
    wrote at least :data:`FED_SHARE_MIN` of that rate (older results lack ``fed_mb_s``: their
    ``produced`` count over the window gives it)."""
    fed = stream.get("fed_mb_s")
    if fed is None:
        fed = stream["produced"] * archive.RECORD_BYTES / stream["seconds"] / 1e6
    return bool(stream["bounded"]) and fed >= FED_SHARE_MIN * stream["target_mb_s"]


def table(res: dict[str, Any]) -> list[str]:
    s = res.get("spark_source")
    if not s:
        return []
    b, st = s["batch"], s["stream"]
    rounds = b.get("rounds") or []
    lines = [
        "",
        '### Spark data source (`format("stonemq")`, issue 21)',
        "",
        "| read | records | Spark MB/s | one consumer MB/s | ratio | target |",
        "|---|---|---|---|---|---|",
        f"| half archived, half local | {b['records']:,} | {b['spark_all']['mb_s']} | "
        f"{b['consumer_all']['mb_s']} | {b['ratio_all']}x | ≥ 1x: "
        f"{'reached' if b['ratio_all'] >= 1 else 'not reached'} |",
        f"| archived half | {b['archived_records']:,} | {b['spark_archived']['mb_s']} | "
        f"{b['consumer_archived']['mb_s']} | {b['ratio_archived']}x | ≥ 2x: "
        f"{'reached' if b['ratio_archived'] >= 2 else 'not reached'} |",
        "",
    ]
    if rounds:
        lines += [
            f"The round with the median ratio of {len(rounds)} interleaved rounds (each ratio "
            "paired within its round) after a warm-up read of a tenth of the data "
            f"({b.get('warmup_s')} s: Python workers started, JIT warm); the rounds' ratios, "
            "whole / archived: "
            + ", ".join(
                f"{r['ratio_all']}x / {r['ratio_archived']}x (load {r['loadavg_1m']})"
                for r in rounds
            )
            + ".",
            "",
        ]
    moved = (st["produced"] - (st["lag_end"] or 0)) * archive.RECORD_BYTES / st["seconds"] / 1e6
    fed = st["produced"] * archive.RECORD_BYTES / st["seconds"] / 1e6
    cpu = st.get("cpu_cores")
    lines += [
        f"Streaming topic -> topic at {st['target_mb_s']} MB/s (half the measured produce rate "
        f"{s['ingest_mb_s']} MB/s) for {st['seconds']:.0f} s: lag max {st['lag_max']}, max in "
        f"the second half {st['lag_max_second_half']}, at the end {st['lag_end']} records "
        f"({'bounded' if st['bounded'] else 'growing'}); the feeder wrote {fed:.1f} MB/s "
        f"({fed / st['target_mb_s']:.0%} of the asked rate; the target needs "
        f"{FED_SHARE_MIN:.0%}: {'kept up' if kept_up(st) else 'not shown'}); the query moved "
        f"{moved:.1f} MB/s topic -> topic."
        + (
            f" The query's first micro-batch (Python workers starting) took {st['prime_s']} s "
            "before the feeder started; CPU over the fed window, in cores: broker "
            f"{cpu['broker']}, feeder {cpu['feeder']}, Spark {cpu['spark']} (load "
            f"{st['loadavg_1m'][0]} -> {st['loadavg_1m'][1]})."
            if cpu
            else ""
        )
        + " Spark local[2] in the bench process, minPartitions=4; the consumer is "
        "one confluent-kafka consumer reading by assignment; MB/s are value bytes."
        + (f" Run: {s['run']['note']} (started {s['run']['started']})." if s.get("run") else ""),
        "",
    ]
    return lines
