"""Shared fixtures: a real StoneMQ broker process per test (``broker``) or per module
(``module_broker``), and ``broker_factory`` for tests that need several or custom settings.

Settings reach the broker as ``STONEMQ_<NAME>`` environment variables. Give them with the
``broker_settings`` marker (``@pytest.mark.broker_settings(num_partitions=3)``) on a test or
module, or as keyword arguments to ``broker_factory(...)``. Names may be attribute style
(``num_partitions``) or Kafka style (``num.partitions``).

The broker's stdout and stderr go to ``broker.log`` under the test's tmp_path; when a test that
used a broker fails, the tail of that log is attached to the failure report.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from ports import free_port  # tests/ (on sys.path)

READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0
LOG_TAIL_LINES = 200

_READY = re.compile(r"\bready\b", re.IGNORECASE)


def settings_env(settings: Mapping[str, Any]) -> dict[str, str]:
    """``{"num.partitions": 3}`` -> ``{"STONEMQ_NUM_PARTITIONS": "3"}``."""
    env = {}
    for name, value in settings.items():
        key = "STONEMQ_" + name.replace(".", "_").replace("-", "_").upper()
        if isinstance(value, bool):
            value = "true" if value else "false"
        env[key] = str(value)
    return env


def _die_with_parent() -> None:
    # Linux: the broker gets SIGKILL if the test process dies, so no broker outlives a run.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class BrokerStartError(AssertionError):
    pass


class Broker:
    """One ``stonemq serve`` process on 127.0.0.1 with its own data dir and log file."""

    def __init__(
        self,
        data_dir: Path,
        log_path: Path,
        *,
        port: int | None = None,
        settings: Mapping[str, Any] | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.data_dir = Path(data_dir)
        self.log_path = Path(log_path)
        self.port = port or free_port()
        self.settings = dict(settings or {})
        self.extra_args = tuple(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0

    # -- addresses ---------------------------------------------------------------------------
    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    # -- process control ---------------------------------------------------------------------
    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "stonemq",
            "serve",
            "--listen",
            self.bootstrap,
            "--data-dir",
            str(self.data_dir),
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STONEMQ_")}
        env["PYTHONUNBUFFERED"] = "1"
        env.update(settings_env(self.settings))
        return env

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start the process (``self.proc``) without waiting for it (see :meth:`start`)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as fh:
            fh.write(f"---- {' '.join(self.command())}\n".encode())
            self._log_start = fh.tell()
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir.parent,
                env=self.environment(),
                preexec_fn=_die_with_parent,
            )
        return self.proc

    def start(self, timeout: float = READY_TIMEOUT_S) -> Broker:
        """Start the broker and wait for its ``ready`` line and an open port."""
        assert self.proc is None or self.proc.poll() is not None, "broker already running"
        self.spawn()
        return self.wait_ready(timeout)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> Broker:
        """Wait for a spawned broker's ``ready`` line (the word: "address already in use" is
        a broker that exited) and its port accepting, checking that it still runs once both
        are seen: a broker that could not bind may be given another's port, which accepts."""
        assert self.proc is not None, "broker was never spawned"
        deadline = time.monotonic() + timeout
        while True:
            if (
                _READY.search(self.log(since_start=True))
                and self._accepts_connections()
                and self.proc.poll() is None
            ):
                return self
            code = self.proc.poll()
            if code is not None:
                raise BrokerStartError(
                    f"broker exited with code {code} before it was ready\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise BrokerStartError(
                    f"broker not ready within {timeout:.0f}s (no 'ready' line or port closed)\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.05)

    def _accepts_connections(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, then assert the broker exits cleanly within ``timeout``."""
        assert self.proc is not None, "broker was never started"
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(
                    f"broker did not exit within {timeout:.0f}s of SIGTERM\n{self.log_tail()}"
                ) from None
        code = self.proc.returncode
        # A clean shutdown exits 0 and says so; anything else is a crash or an error exit.
        assert code == 0, f"broker exited with code {code} after SIGTERM\n{self.log_tail()}"
        assert "stopped cleanly" in self.log(since_start=True), (
            f"no clean shutdown logged\n{self.log_tail()}"
        )
        return code

    def kill(self) -> None:
        """SIGKILL (no clean shutdown) and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self, timeout: float = READY_TIMEOUT_S) -> Broker:
        """Clean stop, then start again on the same data dir and port."""
        self.stop()
        return self.start(timeout)

    # -- output ------------------------------------------------------------------------------
    def log(self, since_start: bool = False) -> str:
        """The broker's captured stdout+stderr (all starts, or only the current one)."""
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return ""
        if since_start:
            data = data[self._log_start :]
        return data.decode("utf-8", "replace")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        text = self.log().splitlines()[-lines:]
        return f"---- broker log ({self.log_path}), last {len(text)} lines:\n" + "\n".join(text)


class BrokerFactory:
    """Starts brokers under one directory and stops them all at teardown."""

    def __init__(self, base: Path, default_settings: Mapping[str, Any] | None = None) -> None:
        self.base = base
        self.default_settings = dict(default_settings or {})
        self.brokers: list[Broker] = []

    def __call__(
        self,
        *,
        data_dir: Path | None = None,
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
        start: bool = True,
        **settings: Any,
    ) -> Broker:
        n = len(self.brokers)
        broker = Broker(
            data_dir or self.base / f"data{n}",
            self.base / f"broker{n}.log",
            port=port,
            settings={**self.default_settings, **settings},
            extra_args=extra_args,
        )
        self.brokers.append(broker)
        if start:
            broker.start()
        return broker

    def close(self) -> None:
        """Stop every broker still running; a broker that will not stop cleanly fails."""
        errors = []
        for broker in self.brokers:
            if broker.alive:
                try:
                    broker.stop()
                except AssertionError as exc:
                    errors.append(str(exc))
        if errors:
            pytest.fail("broker shutdown at teardown failed:\n" + "\n".join(errors))


def _marker_settings(node: pytest.Item | pytest.Collector) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    # closest marker last so it wins
    for mark in reversed(list(node.iter_markers("broker_settings"))):
        settings.update(mark.kwargs)
    return settings


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "broker_settings(**settings): STONEMQ_<NAME> settings for the broker fixtures",
    )


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real ZooKeeper (Debian's package) for the session; tests use their own chroots."""
    import zkserver

    assert zkserver.available(), "ZooKeeper is not installed: run scripts/install-test-deps.sh"
    server = zkserver.ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"), free_port())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def broker_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerFactory]:
    factory = BrokerFactory(tmp_path, _marker_settings(request.node))
    yield factory
    factory.close()


@pytest.fixture
def broker(broker_factory: BrokerFactory) -> Broker:
    """A broker of this test's own, on a fresh data dir."""
    return broker_factory()


@pytest.fixture(scope="module")
def module_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Broker]:
    """A broker shared by the tests of one module (use unique topic names)."""
    factory = BrokerFactory(
        tmp_path_factory.mktemp("module_broker"), _marker_settings(request.node)
    )
    broker = factory()
    yield broker
    factory.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    if report.failed:
        seen: set[int] = set()
        for value in getattr(item, "funcargs", {}).values():
            brokers = value.brokers if isinstance(value, BrokerFactory) else [value]
            for b in brokers:
                if isinstance(b, Broker) and id(b) not in seen:
                    seen.add(id(b))
                    report.sections.append((f"broker {b.bootstrap} log", b.log_tail()))
    return report
