"""Broker CPU and memory for one load, for paired old-vs-new runs (issue 22, flat cost).

One broker, one topic of PARTITIONS partitions, 1 KiB records for SECONDS: ``multi`` is the
multi-partition generator (``bench/multiproduce.py``: one one-record batch per partition,
1,024 partitions per request), ``rdkafka`` the bench's librdkafka producer, ``single`` the
generator with librdkafka's request shape at 10,000 partitions at every partition count (one
partition per request, a 96 KiB batch, five requests in flight): its CPU per GB at 1 and at
10,000 partitions differs only by what the partition count costs the broker. Prints one JSON
line: MB/s, the broker's CPU (utime + stime of its process tree, which other load on the
machine does not add to) in all, per GB and per batch (``multi``), and its peak PSS; beside
them the broker's own counters (Produce requests, splitter steps, the splitter's thread and
loop time) and its CPU split into user and kernel time (``/proc/PID/stat``), so the cost can
be read per request, per batch and per split step.

The broker runs as users run it, without the metrics endpoint: serving it turns on each
request's loop timing (about 1.3 µs a request), a loop-lag probe 100 times a second and the
exporter's thread, which the figures would otherwise include. The counters come from the
line the broker logs as it stops (its whole life: nothing produces before the load, and the
splitter's steps after the load are the load's bytes). ``STONEMQ_BENCH_METRICS=1`` measures
as the passes before 2026-11-26 16:00 UTC did: the endpoint served, the counters read from it
before and after the load.
With a fourth argument, py-spy records the broker meanwhile (raw collapsed stacks to that
file); ``STONEMQ_BENCH_NATIVE=1`` adds ``--native`` (C frames: uvloop, the C record walk; it
pauses the broker per sample, so such a run's CPU figures are not comparable).

    python -m bench.broker_cpu 10000 20 multi [profile.txt]

Run it from each checkout in turn (old, new, old, new): throughput moves with the machine's
other load, CPU per batch much less.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import multiproduce, procs
from bench import run as bench_run
from bench.replication import scrape

SINGLE_BATCH_BYTES = 96 * 1024
"""``single``: one partition per request, a batch of this many record bytes, whatever the
partition count (about what librdkafka sends per request at 10,000 partitions here)."""

COUNTERS = (
    "produce_requests_started",
    "splitter_steps",
    "splitter_thread_seconds",
    "splitter_loop_seconds",
)
"""The broker's counters (stonemq/server/metrics.py), in the order its last line gives them."""

_COUNTERS_LINE = re.compile(
    rb"counters: (\d+) produce requests started; splitter: (\d+) steps, ([\d.]+) s in its "
    rb"thread, ([\d.]+) s on the loop"
)


def user_system_seconds(pid: int) -> tuple[float, float]:
    """utime and stime of ``pid`` (``/proc/PID/stat`` fields 14 and 15), in seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _counters(port: int) -> dict[str, float]:
    sample = scrape(port)
    return {name: sample.get(f"stonemq_{name}_total", 0.0) for name in COUNTERS}


def _logged_counters(log: bytes) -> dict[str, float]:
    """The counters the broker logged as it stopped (zeros if it did not get that far)."""
    found = _COUNTERS_LINE.findall(log)
    values = found[-1] if found else (b"0",) * len(COUNTERS)
    return {name: float(value) for name, value in zip(COUNTERS, values, strict=True)}


def main(argv: list[str]) -> int:
    partitions, seconds, mode = int(argv[0]), float(argv[1]), argv[2]
    if mode not in ("multi", "rdkafka", "single"):
        raise SystemExit(f"mode {mode!r}: multi, rdkafka or single")
    profile = argv[3] if len(argv) > 3 else ""
    native = os.environ.get("STONEMQ_BENCH_NATIVE") == "1"
    run = bench_run.Run(bench_run.FULL, Path(tempfile.mkdtemp(prefix="stonemq-broker-cpu-")))
    served = os.environ.get("STONEMQ_BENCH_METRICS") == "1"
    metrics_port = procs.free_port()
    broker = run.broker(**({"metrics.listen": f"127.0.0.1:{metrics_port}"} if served else {}))
    try:
        bench_run.create_topics(broker.bootstrap, {"scale": partitions})
        procs.wait_quiet(broker.pid, timeout=60)
        spy = None
        if profile:
            spy = subprocess.Popen(
                [
                    str(Path(sys.executable).with_name("py-spy")),
                    *("record", "--pid", str(broker.pid), "--rate", "200"),
                    *("--format", "raw", "--duration", str(int(seconds)), "--output", profile),
                    # native stacks need the process paused per sample (py-spy refuses
                    # --nonblocking with --native), which adds to the CPU measured
                    *(["--native"] if native else ["--nonblocking"]),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        counted = _counters(metrics_port) if served else dict.fromkeys(COUNTERS, 0.0)
        user0, system0 = user_system_seconds(broker.pid)
        if mode in ("multi", "single"):
            shape = (multiproduce.ACKS, 1, SINGLE_BATCH_BYTES) if mode == "single" else ()
            result, mon = bench_run.measured(
                broker.pid,
                multiproduce.entry,
                "multi_produce",
                broker.port,
                "scale",
                partitions,
                bench_run.KIB,
                seconds,
                bench_run.UNCAPPED_BYTES,
                *shape,
            )
            batches = result["batches"]
        else:  # rdkafka
            keys = max(4 * partitions, 1000)
            result, mon = bench_run.produce(
                broker, "scale", bench_run.KIB, seconds, bench_run.UNCAPPED_BYTES, keys
            )
            batches = 0
        user1, system1 = user_system_seconds(broker.pid)
        if served:
            after = _counters(metrics_port)
        else:
            broker.stop()
            after = _logged_counters(broker.log())
        moved = {name: after[name] - counted[name] for name in COUNTERS}
        requests = max(moved["produce_requests_started"], 1)
        steps = max(moved["splitter_steps"], 1)
        if spy is not None:
            spy.wait(timeout=120)
        gigabytes = max(result["bytes"], 1) / 1e9
        print(
            json.dumps(
                {
                    "mode": mode,
                    "metrics_served": served,
                    "partitions": partitions,
                    "mb_s": round(result["bytes"] / result["seconds"] / 1e6, 1),
                    "cpu_s": round(mon.cpu, 2),
                    "cpu_s_per_gb": round(mon.cpu / gigabytes, 3),
                    "cpu_us_per_batch": round(mon.cpu / batches * 1e6, 1) if batches else None,
                    "batches": batches,
                    "pss_peak_mb": round(mon.peak / 1e6, 1),
                    "user_s": round(user1 - user0, 2),
                    "system_s": round(system1 - system0, 2),
                    "requests": int(moved["produce_requests_started"]),
                    "cpu_us_per_request": round(mon.cpu / requests * 1e6, 1),
                    "split_steps": int(moved["splitter_steps"]),
                    "split_thread_us_per_step": round(
                        moved["splitter_thread_seconds"] / steps * 1e6, 1
                    ),
                    "split_loop_us_per_step": round(
                        moved["splitter_loop_seconds"] / steps * 1e6, 1
                    ),
                }
            ),
            flush=True,
        )
    finally:
        run.done_with(broker)
        shutil.rmtree(run.tmp, ignore_errors=True)
        shutil.rmtree(run.out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
