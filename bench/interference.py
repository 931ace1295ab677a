"""The interference workload (the hostile-input issue's benchmark): does a consumer catching
up from disk, plus a client pipelining Metadata requests, slow down producers and other
clients?

Steps, on one broker:

1. *Fill*: one confluent-kafka producer writes ``fill`` bytes of 1 KiB records to ``bulk`` as
   fast as it goes; its rate is the measured maximum.
2. *Alone*: a paced producer at 70% of that maximum (acks=1, one record in ``SAMPLE_EVERY``
   stamped with ``CLOCK_MONOTONIC`` at hand-over; its ack latency taken in its delivery
   callback) writes to ``paced`` for ``alone_s`` while a prober sends ApiVersions every
   10 ms on its own connection.
3. *Together*: the page cache is dropped, then the same paced producer and prober run while
   a consumer catches ``bulk`` up from offset 0 and a client pipelines Metadata requests
   (``PIPELINE_DEPTH`` at a time, none read until all are sent). The phase ends when the
   consumer has read everything.

Each phase also takes the broker's own accounting of where produce time went (its Prometheus
counters on ``metrics.listen``, read at the phase's start and end: time produces waited in
their connection's queue and were held for split lag, time to handle them and, of that,
their steps on the event loop and their wait to start; the splitter's time in its thread, on
the loop, waiting for the loop and idle; the fetched bytes it sent with ``sendfile``; the
loop-lag probe's runs and lateness; the loop time and the requests answered per api key).

Targets: producer p99 together ≤ twice alone; ApiVersions p99 together ≤ 50 ms. Owns only this
workload; :mod:`bench.run` registers it and :mod:`bench.report` prints its table.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import statistics
import struct
import time
import traceback
import urllib.request
from multiprocessing.queues import Queue
from typing import TYPE_CHECKING, Any

from bench import clients, procs

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event

    from bench.run import Run

RECORD_BYTES = 1024
PARTITIONS = 4
PACED_FRACTION = 0.7
# the quick fill must last long enough for its rate to be a sustained maximum: 256 MiB took
# 0.4 s (librdkafka filling its buffer), and the paced producer could not reach 70% of that
QUICK_FILL = 1024 * 1024 * 1024
FULL_FILL = 8 * 1024 * 1024 * 1024
QUICK_ALONE_S = 10.0
FULL_ALONE_S = 20.0
PROBE_INTERVAL_S = 0.01
WARMUP_S = 1.0  # the paced producer's first second (connections, metadata) is not measured
SAMPLE_EVERY = 8  # one paced record in 8 carries its hand-over time and is timed
MAX_BURST = 4096  # records handed over between two polls of the paced producer at most
PIPELINE_DEPTH = 200
CATCH_UP_TIMEOUT_S = 1800.0
_TS = struct.Struct(">q")
_API_VERSIONS = 18
_METADATA = 3
# the broker's counters read per phase (stonemq/server/metrics.py), by Prometheus name
ACCOUNTING = (
    "produce_requests_started",
    "produce_queued_seconds",
    "produce_handled_seconds",
    "split_lag_holds",
    "split_lag_held_seconds",
    "splitter_steps",
    "splitter_thread_seconds",
    "splitter_loop_seconds",
    "splitter_loop_wait_seconds",
    "splitter_idle_seconds",
    "fetch_bytes_sent_zero_copy",
    "produce_loop_seconds",
    "produce_start_wait_seconds",
    "produce_steps",
    "loop_lag_probes",
    "loop_lag_seconds",
)
# the labelled families read per phase, by api key: time on the event loop and requests
LABELLED = ("request_loop_seconds", "request_count")


def entry(q: Queue[Any], name: str, *args: Any) -> None:
    """Process target: run this module's worker ``name``; its result goes to ``q``, with the
    CPU seconds this client process used (all threads, librdkafka's included)."""
    try:
        result = globals()[name](q, *args)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        result["client_cpu_s"] = round(usage.ru_utime + usage.ru_stime, 3)
        q.put(("done", result))
    except BaseException:
        q.put(("error", traceback.format_exc()))


def _request(api_key: int, version: int, correlation_id: int, body: bytes = b"") -> bytes:
    """A request frame with a v1 (non-flexible) header and client id ``bench``."""
    header = struct.pack(">hhih", api_key, version, correlation_id, 5) + b"bench"
    return struct.pack(">i", len(header) + len(body)) + header + body


def _read_frame(sock: socket.socket) -> bytes:
    size = struct.unpack(">i", _read_exact(sock, 4))[0]
    return _read_exact(sock, size)


def _read_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        out += chunk
    return bytes(out)


def percentiles(values_ms: list[float]) -> dict[str, float]:
    if not values_ms:
        return {"n": 0, "p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    ordered = sorted(values_ms)
    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2),
        "max_ms": round(ordered[-1], 2),
    }


# -- workers (each in its own process) ------------------------------------------------------


def paced(q: Queue[Any], bootstrap: str, topic: str, rate: int, stop: Event, cap_s: float) -> Any:
    """Produce ``rate`` 1 KiB records/s until ``stop`` (at most ``cap_s``); the ack latency of
    one record in ``SAMPLE_EVERY`` (delivery callback time minus hand-over time), after the
    first ``WARMUP_S``.

    Records are handed over in bursts of those due (a Python call each, as the fill's
    producer does); only the sampled ones carry a time stamp and a delivery callback. With a
    stamp and a Python callback on every record this producer took 1.14 cores alone and
    reached about 2/3 of its asked rate (docs/benchmarks/analysis.md), so the client, not
    the broker, set the load. Every record is counted all the same: the topic's end offsets
    once the flush is done, less those before, are the records the broker appended."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    latencies: list[float] = []
    errors = [0]
    now = time.monotonic_ns
    measured_from = [2**63 - 1]  # records handed over before this (the warm-up) not counted

    def sampled(err: Any, msg: Any) -> None:
        if err is not None:
            errors[0] += 1
        elif (sent_ns := _TS.unpack_from(msg.value())[0]) >= measured_from[0]:
            latencies.append((now() - sent_ns) / 1e6)

    producer = Producer(clients.producer_conf(bootstrap, "1"))
    partitions = list(producer.list_topics(topic, timeout=30).topics[topic].partitions)
    ends = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-paced-ends"})

    def end_offsets() -> int:
        return sum(
            ends.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions
        )

    ends_before = end_offsets()
    payload = os.urandom(RECORD_BYTES)
    stamped = bytearray(payload)
    produce, poll = producer.produce, producer.poll
    q.put(("start", os.getpid()))
    started = time.monotonic()
    measured_from[0] = now() + int(WARMUP_S * 1e9)
    sent = 0
    while not stop.is_set():
        elapsed = time.monotonic() - started
        if elapsed >= cap_s:
            break
        due = min(int(elapsed * rate) - sent, MAX_BURST)
        if due <= 0:  # 1 ms ticks: a shorter timeout rounds down to 0 ms and spins
            poll(0.001)
            continue
        try:
            for _ in range(due):
                if sent % SAMPLE_EVERY == 0:
                    _TS.pack_into(stamped, 0, now())
                    produce(topic, bytes(stamped), callback=sampled)
                else:
                    produce(topic, payload)
                sent += 1
        except BufferError:
            poll(0.001)
            continue
        poll(0)
    elapsed = time.monotonic() - started
    left = producer.flush(120)
    settle = time.monotonic() + 30  # the end offsets follow the splitter, a little later
    while (acked := end_offsets() - ends_before) < sent and time.monotonic() < settle:
        time.sleep(0.05)
    ends.close()
    return {
        **percentiles(latencies),
        "rate_asked": rate,
        "rate_msg_s": round(acked / max(elapsed, 1e-9), 1),
        "sent": sent,
        "acked": acked,
        "errors": max(errors[0] + left, sent - acked),  # fewer appended than sent
        "duplicates": max(acked - sent, 0),  # more appended than sent (retries)
        "seconds": round(elapsed, 2),
    }


def prober(q: Queue[Any], port: int, stop: Event, cap_s: float) -> Any:
    """ApiVersions v0 every ``PROBE_INTERVAL_S`` on one connection; answer times."""
    times: list[float] = []
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        q.put(("start", None))
        started = time.monotonic()
        cid = 0
        while not stop.is_set() and time.monotonic() - started < cap_s:
            cid += 1
            t0 = time.perf_counter()
            sock.sendall(_request(_API_VERSIONS, 0, cid))
            _read_frame(sock)
            times.append((time.perf_counter() - t0) * 1000)
            time.sleep(PROBE_INTERVAL_S)
    return percentiles(times)


def pipeliner(q: Queue[Any], port: int, stop: Event, cap_s: float) -> Any:
    """Metadata v1 for every topic, ``PIPELINE_DEPTH`` requests sent before any answer is
    read, over and over; the requests answered."""
    answered = 0
    burst = b"".join(
        _request(_METADATA, 1, i, struct.pack(">i", -1)) for i in range(PIPELINE_DEPTH)
    )
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        q.put(("start", None))
        started = time.monotonic()
        while not stop.is_set() and time.monotonic() - started < cap_s:
            sock.sendall(burst)
            for _ in range(PIPELINE_DEPTH):
                _read_frame(sock)
            answered += PIPELINE_DEPTH
        elapsed = time.monotonic() - started
    return {"requests": answered, "req_s": round(answered / max(elapsed, 1e-9), 1)}


def cores(wall_s: float, broker_cpu_s: float, phase: dict[str, Any]) -> dict[str, float]:
    """A phase's CPU in cores (CPU seconds over the phase's wall time): the broker's, and each
    client process's over its life (started just before the phase, ended with it). On this
    2-core machine the clients share the CPUs with the broker, so this says how much of the
    machine the load generators themselves took."""
    wall = max(wall_s, 1e-9)
    out = {
        "seconds": round(wall_s, 2),
        "cpus": os.cpu_count() or 0,
        "broker": round(broker_cpu_s / wall, 2),
    }
    clients = 0.0
    for name in ("producer", "api_versions", "metadata", "catch_up"):
        used = phase.get(name, {}).get("client_cpu_s")
        if used is not None:
            out[name] = round(used / wall, 2)
            clients += used / wall
    out["clients"] = round(clients, 2)
    return out


def scrape(port: int) -> dict[str, float]:
    """Every sample of the broker's Prometheus endpoint, labelled ones under their full
    ``name{labels}`` key."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            out[name] = float(value)
    return out


def accounting(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What each of :data:`ACCOUNTING`'s counters, and of :data:`LABELLED`'s per api key,
    moved between two scrapes."""
    moved = {
        name: round(
            after.get(f"stonemq_{name}_total", 0.0) - before.get(f"stonemq_{name}_total", 0.0), 3
        )
        for name in ACCOUNTING
    }
    for name in LABELLED:
        prefix = f'stonemq_{name}_total{{api_key="'
        for key, value in after.items():
            if key.startswith(prefix):
                api = key[len(prefix) : -2]
                moved[f"{name}[{api}]"] = round(value - before.get(key, 0.0), 3)
    return moved


# -- the workload ---------------------------------------------------------------------------


def run_interference(run: Run) -> None:
    from bench.run import _CTX, create_topics, drop_caches, expect, log, produce, row, worker

    quick = run.scale.name == "quick"
    fill = QUICK_FILL if quick else FULL_FILL
    alone_s = QUICK_ALONE_S if quick else FULL_ALONE_S
    metrics_port = procs.free_port()
    broker = run.broker(**{"metrics.listen": f"127.0.0.1:{metrics_port}"})
    try:
        create_topics(broker.bootstrap, {"bulk": PARTITIONS, "paced": PARTITIONS})
        log(f"interference: fill {fill >> 20} MiB of 1 KiB records at full speed")
        filled, mon = produce(broker, "bulk", RECORD_BYTES, 3600.0, fill, 0)
        fill_row = row(filled, mon, size=RECORD_BYTES)
        if filled["errors"]:
            raise RuntimeError(f"interference: {filled['errors']} fill records not delivered")
        rate = int(fill_row["msg_s"] * PACED_FRACTION)
        log(f"  maximum {fill_row['msg_s']:.0f} msg/s; paced producers at {rate} msg/s")
        procs.wait_quiet(broker.pid, timeout=300)

        def phase(together: bool) -> dict[str, Any]:
            stop = _CTX.Event()
            cap = CATCH_UP_TIMEOUT_S if together else alone_s
            with contextlib.ExitStack() as stack:
                qp = stack.enter_context(
                    worker(entry, "paced", broker.bootstrap, "paced", rate, stop, cap)
                )
                qa = stack.enter_context(worker(entry, "prober", broker.port, stop, cap))
                expect(qp, "start", 120)
                expect(qa, "start", 120)
                counted = scrape(metrics_port)
                broker_cpu = procs.cpu_seconds(broker.pid)
                began = time.monotonic()
                out: dict[str, Any] = {}
                if together:
                    qm = stack.enter_context(worker(entry, "pipeliner", broker.port, stop, cap))
                    expect(qm, "start", 120)
                    with (
                        worker(
                            clients.entry,
                            "consume",
                            broker.bootstrap,
                            "bulk",
                            PARTITIONS,
                            filled["msgs"],
                            CATCH_UP_TIMEOUT_S,
                        ) as qc,
                        procs.Monitor(broker.pid) as monitor,
                    ):
                        expect(qc, "start", 120)
                        caught = expect(qc, "done", CATCH_UP_TIMEOUT_S + 60)
                    stop.set()
                    out["catch_up"] = row(caught, monitor, size=RECORD_BYTES)
                    out["metadata"] = expect(qm, "done", 300)
                else:
                    time.sleep(alone_s)
                    stop.set()
                out["broker"] = accounting(counted, scrape(metrics_port))
                wall = time.monotonic() - began
                broker_cpu = procs.cpu_seconds(broker.pid) - broker_cpu
                out["producer"] = expect(qp, "done", 300)
                out["api_versions"] = expect(qa, "done", 300)
                out["cpu"] = cores(wall, broker_cpu, out)
            return out

        log(f"  alone: paced producer and ApiVersions prober for {alone_s:.0f} s")
        alone = phase(together=False)
        log(
            f"  alone: producer p99 {alone['producer']['p99_ms']} ms, "
            f"ApiVersions p99 {alone['api_versions']['p99_ms']} ms; broker {alone['broker']}"
        )
        dropped = drop_caches()
        log(f"  together (page cache {'dropped' if dropped else 'NOT dropped: not root'})")
        together = phase(together=True)
        log(
            f"  together: producer p99 {together['producer']['p99_ms']} ms, "
            f"ApiVersions p99 {together['api_versions']['p99_ms']} ms, catch-up "
            f"{together['catch_up']['mb_s']} MB/s, {together['metadata']['req_s']} Metadata/s; "
            f"broker {together['broker']}"
        )
        run.results["interference"] = {
            "fill": fill_row,
            "rate_msg_s": rate,
            "cache_dropped": dropped,
            "alone": alone,
            "together": together,
        }
    finally:
        run.done_with(broker)
