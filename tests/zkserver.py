"""A real ZooKeeper for tests: Debian's ``zookeeper`` package, standalone, on a free port with
its own data directory (scripts/install-test-deps.sh installs the package)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"


def available() -> bool:
    return os.path.exists(ZOOKEEPER_JAR) and shutil.which("java") is not None


class ZooKeeperServer:
    """``start()`` / ``stop()`` / ``restart()`` (same port and data: sessions may survive)."""

    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        (root / "data").mkdir(parents=True, exist_ok=True)
        (root / "zoo.cfg").write_text(
            f"tickTime=500\ndataDir={root / 'data'}\nclientPort={port}\n"
            "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
            "minSessionTimeout=1000\nmaxSessionTimeout=60000\n"
            "4lw.commands.whitelist=ruok,srvr\n"
        )

    @property
    def connect(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        log = open(self.root / "zookeeper.log", "ab")  # noqa: SIM115 (the process keeps it)
        self.proc = subprocess.Popen(
            ["java", "-Xmx256m", "-cp", ZOOKEEPER_JAR, MAIN, str(self.root / "zoo.cfg")],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not self._ok():
            if self.proc.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"ZooKeeper not serving after {timeout} s: {self.log_tail()}")
            time.sleep(0.1)

    def _ok(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"ruok")
                return sock.recv(4) == b"imok"
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 30) -> str:
        path = self.root / "zookeeper.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])
