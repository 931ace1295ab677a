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
from ports import free_port as _free_port  # tests/ (on sys.path: root conftest)

from stonemq.config import field_specs, load_settings
from stonemq.config_values import encode_handover

pytestmark = [pytest.mark.timeout(120)]

IDLE_ANON_PSS_BYTES = 23 * 1024 * 1024 + 512 * 1024
"""21.4 MiB measured after start in a fresh clone, where every module is compiled from source
(Python 3.11, glibc, this repository's pins; 18.6 with bytecode caches), and a margin of a
tenth: 23.9 MiB before the crc32c package's ``__init__`` and ``ctypes.util`` were left out
(stonemq/protocol/checksum.py), 29.2 before ``stonemq serve`` handed its validated settings
to a serving process without pydantic, 32.2 before the broker stopped importing kazoo, Typer
and the compression codecs; pyarrow alone adds about 14 MB."""


NEVER_LOADED = (
    "pyarrow",
    "numpy",
    "pyspark",
    "fsspec",
    "pandas",
    "confluent_kafka",
    "pydantic_core",
)
"""Packages with native libraries a serving broker never needs (tiering, Spark, the admin
commands' client; pydantic validates the settings before the serving process starts): their
shared objects must not be mapped."""


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
    "pydantic",  # the settings are validated by ``stonemq serve`` before it execs the server
    "pydantic_core",
    "pydantic_settings",
    "stonemq.config",  # the pydantic model; the server holds stonemq.config_values
    "stonemq.cli",
    "crc32c._cli",  # the crc32c package's __init__: its command line and importlib.metadata
    "importlib.metadata",  # (stonemq/protocol/checksum.py loads the C function alone)
    "argparse",
    "email",
    "ctypes.util",  # libc's functions come from dlopen(NULL) (stonemq/storage/fileio.py)
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
fd = os.open(sys.argv[2], os.O_RDONLY)
from stonemq.server.run import main
main(["--settings-fd", str(fd)])
"""


def _handover(tmp_path: Path, port: int) -> Path:
    """The settings ``stonemq serve --listen 127.0.0.1:PORT --data-dir ...`` hands over."""
    settings = load_settings(listen=f"127.0.0.1:{port}", data_dir=tmp_path / "data")
    path = tmp_path / "handover.json"
    path.write_bytes(encode_handover(field_specs(), dict(settings), settings.model_fields_set))
    return path


def test_single_node_broker_imports_no_cluster_or_tool_modules(tmp_path: Path) -> None:
    """The serving process's program (``stonemq.server.run``, what ``stonemq serve`` execs),
    in a child process with the settings ``stonemq serve`` hands over, reports its own
    ``sys.modules``."""
    port = _free_port()
    out = subprocess.run(
        [sys.executable, "-c", _REPORT_MODULES, str(port), str(_handover(tmp_path, port))],
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


def test_stonemq_serve_becomes_the_serving_process_without_pydantic(tmp_path: Path) -> None:
    """``stonemq serve`` validates its settings, then execs the server on the same pid: the
    process that serves has no pydantic shared object mapped."""
    port = _free_port()
    serve = ["serve", "--listen", f"127.0.0.1:{port}", "--data-dir", "data"]  # data: in cwd
    proc = subprocess.Popen(
        [sys.executable, "-m", "stonemq", *serve],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
                assert time.monotonic() < deadline, "the broker did not listen within 60 s"
                time.sleep(0.05)
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            cmdline = f.read().split(b"\0")
        assert b"stonemq.server.run" in cmdline, cmdline
        loaded = mapped_packages(proc.pid)
        assert "pydantic_core" not in loaded, sorted(loaded)
        assert "uvloop" in loaded, sorted(loaded)  # the maps are read: its loop's library is
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
