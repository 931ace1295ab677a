"""Broker CPU per GB of a cold catch-up, with and without zero-copy fetch responses (issue 17).

``python -m bench.cold_fetch GIB ROUNDS``: one broker fills a 4-partition topic with GIB GiB
of 1 KiB records (confluent-kafka, as the bench's consume workload), then ROUNDS times for
each of ``fetch.zero.copy`` false and true, alternating: stop the broker, drop the page
cache, start it with that setting, and catch the topic up from offset 0 with one
confluent-kafka consumer (``clients.consume``), measuring the broker's CPU (utime + stime of
its process tree, which other load on the machine does not add to) per GB of payload, the
catch-up's MB/s and the broker's counter of bytes sent with ``sendfile``. The same data is
read each time, so the pairs differ only in the setting. Prints one line per catch-up and
JSON at the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from bench import clients, procs
from bench.run import create_topics, drop_caches, measured, produce, row

KIB = 1024


def _zero_copy_bytes(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("stonemq_fetch_bytes_sent_zero_copy_total "):
                return float(line.split()[1])
    return 0.0


def _cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of the broker process (its threads included)."""
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user, times.system


def _profile(pid: int, name: str) -> subprocess.Popen[bytes] | None:
    """With ``COLD_FETCH_PYSPY=DIR``: py-spy (raw folded stacks, 200 Hz, idle excluded) of the
    broker during the catch-up, to DIR/NAME.txt."""
    out = os.environ.get("COLD_FETCH_PYSPY")
    if not out:
        return None
    return subprocess.Popen(
        [
            "py-spy",
            "record",
            "-p",
            str(pid),
            "-r",
            "200",
            "-f",
            "raw",
            "--threads",
            "-o",
            os.path.join(out, f"{name}.txt"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main(argv: list[str]) -> int:
    gib = float(argv[0]) if argv else 1.0
    rounds = int(argv[1]) if len(argv) > 1 else 2
    with tempfile.TemporaryDirectory(prefix="stonemq-cold-fetch-") as tmp:
        metrics_port = procs.free_port()
        broker = procs.Broker(Path(tmp) / "data", {"metrics.listen": f"127.0.0.1:{metrics_port}"})
        broker.start()
        try:
            create_topics(broker.bootstrap, {"catchup": 4})
            produced, _ = produce(broker, "catchup", KIB, 3600.0, int(gib * (1 << 30)), 0)
            broker.stop()
            out = []
            for i in range(rounds):
                for zero_copy in (False, True):
                    broker.settings["fetch.zero.copy"] = zero_copy
                    dropped = drop_caches()
                    broker.start()
                    load = os.getloadavg()[0]
                    times_before = _cpu_times(broker.pid)
                    spy = _profile(broker.pid, f"{i}-{'zero' if zero_copy else 'copy'}")
                    result, mon = measured(
                        broker.pid,
                        clients.entry,
                        "consume",
                        broker.bootstrap,
                        "catchup",
                        4,
                        produced["msgs"],
                        600.0,
                    )
                    if spy is not None:
                        spy.send_signal(signal.SIGINT)
                        spy.wait(30)
                    user, system = (
                        after - before
                        for after, before in zip(_cpu_times(broker.pid), times_before, strict=True)
                    )
                    r = row(result, mon, zero_copy=zero_copy, cache_dropped=dropped)
                    gb = result["bytes"] / 1e9
                    r["user_s_per_gb"] = round(user / gb, 3)
                    r["system_s_per_gb"] = round(system / gb, 3)
                    r["sent_zero_copy_mb"] = round(_zero_copy_bytes(metrics_port) / 1e6, 1)
                    r["load_before"] = round(load, 2)
                    r["load_after"] = round(os.getloadavg()[0], 2)
                    r["round"] = i
                    broker.stop()
                    out.append(r)
                    print(
                        f"round {i} zero_copy={zero_copy}: {r['mb_s']} MB/s, broker CPU "
                        f"{r['cpu_s_per_gb']} s/GB (user {r['user_s_per_gb']}, system "
                        f"{r['system_s_per_gb']}), sent zero-copy {r['sent_zero_copy_mb']} MB, "
                        f"load {r['load_before']} -> {r['load_after']}",
                        flush=True,
                    )
            print(json.dumps(out, indent=1))
        finally:
            procs.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
