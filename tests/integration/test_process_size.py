"""The idle single-node broker's own memory after start: what its imports and startup cost,
bounded so a module a single node never uses cannot creep back into ``stonemq serve`` (the
process size is most of the seed's 44 MB under load: docs/benchmarks/analysis.md).

Measured as the process's anonymous PSS (its heap, the interpreter's objects, thread stacks
touched): the file-backed part is shared with every other Python process on the machine, so
its share moves with what else runs; the anonymous part does not."""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

IDLE_ANON_PSS_BYTES = 36 * 1024 * 1024
"""32.7 MB measured after start (Python 3.11, glibc, this repository's pins), and a margin of
a tenth: pyarrow alone adds about 14 MB."""

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
