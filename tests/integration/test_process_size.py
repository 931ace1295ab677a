"""The idle single-node broker's own memory after start: what its imports and startup cost,
bounded so a module a single node never uses cannot creep back into ``stonemq serve`` (the
process size is most of the seed's 44 MB under load: docs/benchmarks/analysis.md).

Measured as the process's anonymous PSS (its heap, the interpreter's objects, thread stacks
touched): the file-backed part is shared with every other Python process on the machine, so
its share moves with what else runs; the anonymous part does not."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(120)]

IDLE_ANON_PSS_BYTES = 32 * 1024 * 1024
"""29.0-29.2 MiB measured after start (Python 3.11, glibc, this repository's pins), and a
margin of a tenth: 32.2 MiB before the broker stopped importing kazoo, Typer and the
compression codecs; pyarrow alone adds about 14 MB."""

NEVER_LOADED = ("pyarrow", "numpy", "pyspark", "fsspec", "pandas", "confluent_kafka")
"""Packages with native libraries a single node never needs (tiering, Spark, the admin
commands' client): their shared objects must not be mapped."""


def smaps_rollup(pid: int) -> dict[str, int]:
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return fields


def mapped_packages(pid: int) -> set[str]:
    found = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "site-packages/" in path:
                found.add(path.split("site-packages/", 1)[1].split("/", 1)[0])
    return found


@pytest.mark.slow
def test_idle_broker_process_size(broker):
    pid = broker.proc.pid
    time.sleep(2)  # past the ready line: the collector tuned, the first timers run
    samples = []
    for _ in range(3):
        samples.append(smaps_rollup(pid)["Pss_Anon"])
        time.sleep(0.5)
    anon = min(samples)
    assert anon <= IDLE_ANON_PSS_BYTES, f"{anon / 1e6:.1f} MB of anonymous PSS when idle"
    loaded = mapped_packages(pid)
    assert not loaded & set(NEVER_LOADED), sorted(loaded)


NEVER_IMPORTED = (
    "kazoo",  # ZooKeeper: only with zookeeper.connect
    "stonemq.cluster.controller",
    "stonemq.cluster.membership",
    "stonemq.metadata.zookeeper",
    "stonemq.replication",
    "typer",  # the command line's other commands: ``serve`` parses with argparse
    "click",
    "rich",
    "prometheus_client",  # only with metrics.listen
    "cramjam",  # compression codecs: only for a compressed batch
    "lz4",
    "zstandard",
    "pyarrow",  # tiering's archive and cold reads
    "fsspec",
    "numpy",
    "pandas",
    "pyspark",
    "confluent_kafka",
    "hypothesis",
)
"""Modules (and their submodules) a serving single-node broker never needs."""

_REPORT_MODULES = """
import os, socket, sys, threading, time

def report(port):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    time.sleep(1.0)  # past the ready line: the first timers and the splitter ran
    sys.stdout.write("\\n".join(sorted(m for m, v in list(sys.modules.items()) if v)) + "\\n")
    sys.stdout.flush()
    os._exit(0)

port = int(sys.argv[1])
threading.Thread(target=report, args=(port,), daemon=True).start()
sys.argv = ["stonemq", "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", sys.argv[2]]
from stonemq.cli import main
main()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_single_node_broker_imports_no_cluster_or_tool_modules(tmp_path: Path) -> None:
    """The broker, serving in a child process, reports its own ``sys.modules``."""
    port = _free_port()
    out = subprocess.run(
        [sys.executable, "-c", _REPORT_MODULES, str(port), str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    modules = set(out.stdout.split())
    assert "stonemq.server.listener" in modules, (out.returncode, out.stderr[-2000:])
    assert "stonemq.storage.engine" in modules
    loaded = sorted(
        m for m in modules for never in NEVER_IMPORTED if m == never or m.startswith(never + ".")
    )
    assert not loaded, json.dumps(loaded)
