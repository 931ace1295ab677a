"""Broker CPU and memory for one load, for paired old-vs-new runs (issue 22, flat cost).

One broker, one topic of PARTITIONS partitions, 1 KiB records for SECONDS: ``multi`` is the
multi-partition generator (``bench/multiproduce.py``: one one-record batch per partition,
1,024 partitions per request), ``rdkafka`` the bench's librdkafka producer. Prints one JSON
line: MB/s, the broker's CPU (utime + stime of its process tree, which other load on the
machine does not add to) in all, per GB and per batch (``multi``), and its peak PSS. With a
fourth argument, py-spy records the broker meanwhile (raw collapsed stacks to that file).

    python -m bench.broker_cpu 10000 20 multi [profile.txt]

Run it from each checkout in turn (old, new, old, new): throughput moves with the machine's
other load, CPU per batch much less.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import multiproduce, procs
from bench import run as bench_run


def main(argv: list[str]) -> int:
    partitions, seconds, mode = int(argv[0]), float(argv[1]), argv[2]
    if mode not in ("multi", "rdkafka"):
        raise SystemExit(f"mode {mode!r}: multi or rdkafka")
    profile = argv[3] if len(argv) > 3 else ""
    run = bench_run.Run(bench_run.FULL, Path(tempfile.mkdtemp(prefix="stonemq-broker-cpu-")))
    broker = run.broker()
    try:
        bench_run.create_topics(broker.bootstrap, {"scale": partitions})
        procs.wait_quiet(broker.pid, timeout=60)
        spy = None
        if profile:
            spy = subprocess.Popen(
                [
                    str(Path(sys.executable).with_name("py-spy")),
                    *("record", "--pid", str(broker.pid), "--rate", "200", "--nonblocking"),
                    *("--format", "raw", "--duration", str(int(seconds)), "--output", profile),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        if mode == "multi":
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
            )
            batches = result["batches"]
        else:
            keys = max(4 * partitions, 1000)
            result, mon = bench_run.produce(
                broker, "scale", bench_run.KIB, seconds, bench_run.UNCAPPED_BYTES, keys
            )
            batches = 0
        if spy is not None:
            spy.wait(timeout=120)
        gigabytes = max(result["bytes"], 1) / 1e9
        print(
            json.dumps(
                {
                    "mode": mode,
                    "partitions": partitions,
                    "mb_s": round(result["bytes"] / result["seconds"] / 1e6, 1),
                    "cpu_s": round(mon.cpu, 2),
                    "cpu_s_per_gb": round(mon.cpu / gigabytes, 3),
                    "cpu_us_per_batch": round(mon.cpu / batches * 1e6, 1) if batches else None,
                    "batches": batches,
                    "pss_peak_mb": round(mon.peak / 1e6, 1),
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
