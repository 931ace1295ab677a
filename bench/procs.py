"""Processes the bench starts (broker, Redis, helpers) and what it measures of them.

Owns: starting and always stopping child processes (a registry that :func:`stop_all` empties
on exit, Ctrl-C or failure), a free loopback port, and per-process-tree measurement read from
``/proc``: CPU seconds (``utime+stime`` of the process and its live descendants, plus what
reaped children left in ``cutime+cstime``), memory as the sum of PSS from ``smaps_rollup``, and
open file descriptors.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_READY = re.compile(rb"\bready\b", re.IGNORECASE)
_RUNNING: list[subprocess.Popen[bytes]] = []


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    # Linux: the child gets SIGKILL if the bench dies, so nothing outlives a run.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def spawn(
    cmd: list[str], log_path: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` with stdout+stderr appended to ``log_path``; registered for cleanup."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as fh:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            preexec_fn=_die_with_parent,
        )
    _RUNNING.append(proc)
    return proc


def stop(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int | None:
    """SIGTERM, then SIGKILL after ``timeout``; reaps and unregisters."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    if proc in _RUNNING:
        _RUNNING.remove(proc)
    return proc.returncode


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL and reap (a crash, for the recovery workload)."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    if proc in _RUNNING:
        _RUNNING.remove(proc)


def stop_all() -> None:
    """Stop every process still registered (newest first)."""
    for proc in reversed(list(_RUNNING)):
        with contextlib.suppress(Exception):
            stop(proc, timeout=10.0)


def accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class Broker:
    """One ``python -m stonemq serve`` on 127.0.0.1 with its own data dir and settings."""

    module = "stonemq"  # what ``python -m`` runs; it takes ``stonemq serve``'s arguments

    def __init__(self, data_dir: Path, settings: Mapping[str, Any] | None = None) -> None:
        self.data_dir = data_dir
        self.settings = dict(settings or {})
        self.port = free_port()
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STONEMQ_")}
        env["PYTHONUNBUFFERED"] = "1"
        for name, value in self.settings.items():
            key = "STONEMQ_" + name.replace(".", "_").upper()
            env[key] = str(value).lower() if isinstance(value, bool) else str(value)
        return env

    def start(self, timeout: float = 120.0) -> float:
        """Start and wait for the ``ready`` line and an open port; returns seconds taken."""
        started = self.spawn()
        return self.wait_ready(started, timeout)

    def spawn(self) -> float:
        """Start the process without waiting (brokers of a cluster start together: placement
        waits for all of them); returns the monotonic start time for :meth:`wait_ready`."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        cmd = [sys.executable, "-m", self.module, "serve", "--listen", self.bootstrap]
        cmd += ["--data-dir", str(self.data_dir)]
        started = time.monotonic()
        self.proc = spawn(cmd, self.log_path, self.environment())
        return started

    def wait_ready(self, started: float, timeout: float = 120.0) -> float:
        """Wait for the ``ready`` line and an open port; returns seconds since ``started``."""
        assert self.proc is not None
        deadline = started + timeout
        while time.monotonic() < deadline:
            if _READY.search(self.log()) and accepts_connections(self.port):
                return time.monotonic() - started
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.tail()}")
            time.sleep(0.01)
        raise RuntimeError(f"broker not ready within {timeout:.0f} s:\n{self.tail()}")

    def log(self) -> bytes:
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(self._log_start)
                return fh.read()
        except FileNotFoundError:
            return b""

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().decode("utf-8", "replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)

    def kill(self) -> None:
        if self.proc is not None:
            kill(self.proc)


# -- /proc measurement ----------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """``pid`` and every live descendant (via ``/proc/<pid>/task/*/children``)."""
    out: list[int] = []
    todo = [pid]
    while todo and len(out) < 10_000:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{p}/task/{task}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
    return out


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as fh:
        text = fh.read()
    return text[text.rindex(")") + 2 :].split()  # fields from "state" (field 3) on


def cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid``'s tree: utime+stime of each live process, plus the root's
    cutime+cstime (children it already reaped)."""
    ticks = 0
    for i, p in enumerate(descendants(pid)):
        try:
            f = _stat_fields(p)
        except OSError:
            continue
        ticks += int(f[11]) + int(f[12])  # utime, stime (fields 14, 15)
        if i == 0:
            ticks += int(f[13]) + int(f[14])  # cutime, cstime (fields 16, 17)
    return ticks / _CLK_TCK


def pss_bytes(pid: int) -> int:
    """Sum of PSS (``/proc/<pid>/smaps_rollup``) over ``pid`` and its descendants."""
    total = 0
    for p in descendants(pid):
        with contextlib.suppress(OSError), open(f"/proc/{p}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
    return total


def open_files(pid: int) -> int:
    """Open file descriptors of ``pid`` and its descendants (entries of ``/proc/<pid>/fd``)."""
    total = 0
    for p in descendants(pid):
        with contextlib.suppress(OSError):
            total += len(os.listdir(f"/proc/{p}/fd"))
    return total


class Monitor:
    """Samples a process tree's PSS in a thread while a workload runs; CPU at the edges.

    ``peak`` is the largest sample; ``steady`` the median of the samples in the second half of
    the window (the workload's settled state)."""

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cpu_start = 0.0
        self.cpu_end = 0.0

    def __enter__(self) -> Monitor:
        self.cpu_start = cpu_seconds(self.pid)
        self._thread = threading.Thread(target=self._run, name="bench-monitor", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(pss_bytes(self.pid))
            self._stop.wait(self.interval)

    def __exit__(self, *exc: object) -> None:
        self.cpu_end = cpu_seconds(self.pid)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.samples.append(pss_bytes(self.pid))

    @property
    def cpu(self) -> float:
        return self.cpu_end - self.cpu_start

    @property
    def peak(self) -> int:
        return max(self.samples, default=0)

    @property
    def steady(self) -> int:
        half = self.samples[len(self.samples) // 2 :]
        return int(statistics.median(half)) if half else 0

    def summary(self, payload_bytes: int) -> dict[str, float]:
        gb = payload_bytes / 1e9
        return {
            "cpu_s": round(self.cpu, 3),
            "cpu_s_per_gb": round(self.cpu / gb, 2) if gb > 0 else float("nan"),
            "pss_peak_mb": round(self.peak / 1e6, 1),
            "pss_steady_mb": round(self.steady / 1e6, 1),
        }


def wait_quiet(
    pid: int, threshold: float = 0.05, window: float = 1.0, timeout: float = 120.0
) -> float:
    """Wait until ``pid``'s tree uses under ``threshold`` CPU seconds in ``window``; returns
    the seconds waited (bounded by ``timeout``)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        before = cpu_seconds(pid)
        time.sleep(window)
        if cpu_seconds(pid) - before < threshold:
            break
    return time.monotonic() - started
