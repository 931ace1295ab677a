"""The baselines measured next to StoneMQ in the same run.

Owns (a) the ingest ceiling: a bare uvloop server (``python -m bench.baselines ceiling-server``)
that receives length-prefixed 1 MiB frames into a preallocated buffer and appends each frame to
a file with ``os.write`` (no fsync; a zero-length frame asks for a reply), and the client that
feeds it; with ``--retain-bytes`` the same server keeps only that window of what it wrote in
the page cache, through StoneMQ's own ``WrittenPages`` (the ceiling for a writer that, like
StoneMQ's queue logs, recycles its pages); (b) Redis Streams: starting Debian's
``redis-server`` (appendonly yes, appendfsync everysec) in a temp dir on a free loopback port,
and redis-py workers for pipelined XADD and XREAD; (c) starting the storage-free broker of
:mod:`bench.sink`. Workers report over a ``multiprocessing`` queue like :mod:`bench.clients`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import struct
import subprocess
import time
import traceback
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

from bench import procs
from stonemq.storage.page_cache import WrittenPages, release_written

FRAME = 1024 * 1024
_LEN = struct.Struct(">I")


# -- (a) the ceiling ------------------------------------------------------------------------


class _Ingest(asyncio.BufferedProtocol):
    """Frames into one preallocated buffer; each complete frame is appended with os.write."""

    def __init__(self, fd: int, path: str, retain_bytes: int) -> None:
        self.fd = fd
        self.path = path
        self.pages = WrittenPages(retain_bytes)
        self.buf = bytearray(8 * FRAME)
        self.view = memoryview(self.buf)
        self.filled = 0
        self.total = 0
        self.transport: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # uvloop's transports do not subclass asyncio.Transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        view = self.view
        pos = 0
        while self.filled - pos >= 4:
            (length,) = _LEN.unpack_from(view, pos)
            if length > len(self.buf) - 4:
                raise ValueError(f"frame of {length} bytes is too large")
            end = pos + 4 + length
            if end > self.filled:
                break
            if length == 0:
                assert self.transport is not None
                self.transport.write(struct.pack(">q", self.total))
            else:
                chunk = view[pos + 4 : end]
                while chunk:
                    chunk = chunk[os.write(self.fd, chunk) :]
                self.pages.note(self.path, self.total, self.total + length)
                self.total += length
                hint, drop = self.pages.due()
                if hint or drop:
                    asyncio.get_running_loop().run_in_executor(None, release_written, hint, drop)
            pos = end
        if pos:
            rest = self.filled - pos
            view[:rest] = view[pos : self.filled]
            self.filled = rest


async def _serve_ceiling(port: int, path: str, retain_bytes: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Ingest(fd, path, retain_bytes), "127.0.0.1", port)
    print("ceiling server ready", flush=True)
    async with server:
        await server.serve_forever()


def ceiling_client(q: Queue[Any], port: int, duration: float, max_bytes: int) -> None:
    """Send 1 MiB frames for ``duration`` s (or ``max_bytes``), then wait for the server's
    reply to an empty frame, so the time covers everything written to the file."""
    try:
        frame = _LEN.pack(FRAME) + os.urandom(FRAME)
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * FRAME)
            q.put(("start", None))
            started = time.monotonic()
            deadline = started + duration
            sent = 0
            while sent < max_bytes and time.monotonic() < deadline:
                sock.sendall(frame)
                sent += FRAME
            sock.sendall(_LEN.pack(0))
            reply = b""
            while len(reply) < 8:
                chunk = sock.recv(8 - len(reply))
                if not chunk:
                    raise ConnectionError("ceiling server closed the connection")
                reply += chunk
            elapsed = time.monotonic() - started
        (written,) = struct.unpack(">q", reply)
        q.put(("done", {"msgs": sent // FRAME, "bytes": written, "seconds": elapsed}))
    except BaseException:
        q.put(("error", traceback.format_exc()))


class CeilingServer:
    """The ceiling server as a child process, appending to ``workdir/ceiling.data``; with
    ``retain_bytes`` >= 0, dropping what it wrote behind that window."""

    def __init__(self, workdir: Path, retain_bytes: int = -1) -> None:
        self.workdir = workdir
        self.retain_bytes = retain_bytes
        self.port = procs.free_port()
        self.path = workdir / "ceiling.data"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        import sys

        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "bench.baselines", "ceiling-server"]
        cmd += ["--port", str(self.port), "--file", str(self.path)]
        cmd += ["--retain-bytes", str(self.retain_bytes)]
        self.proc = procs.spawn(cmd, self.workdir / "ceiling.log")
        for _ in range(500):
            if procs.accepts_connections(self.port):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError("ceiling server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc)
        self.path.unlink(missing_ok=True)


# -- (b) Redis Streams -----------------------------------------------------------------------


class Redis:
    """Debian's redis-server with appendonly yes, appendfsync everysec, in ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = procs.free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def binary() -> str:
        path = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not os.path.exists(path):
            raise RuntimeError("redis-server not found (apt-get install redis-server)")
        return path

    def start(self) -> None:
        import redis

        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [self.binary(), "--port", str(self.port), "--bind", "127.0.0.1"]
        cmd += ["--dir", str(self.workdir), "--appendonly", "yes", "--appendfsync", "everysec"]
        cmd += ["--save", "", "--daemonize", "no", "--protected-mode", "yes"]
        self.proc = procs.spawn(cmd, self.workdir / "redis.log")
        client = redis.Redis(host="127.0.0.1", port=self.port)
        for _ in range(500):
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def delete(self, key: str) -> None:
        import redis

        redis.Redis(host="127.0.0.1", port=self.port).delete(key)

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc)


def redis_produce(
    q: Queue[Any], port: int, key: str, size: int, duration: float, max_bytes: int
) -> None:
    """Pipelined XADD of ``size``-byte records (one field) for ``duration`` s or ``max_bytes``."""
    try:
        import redis

        client = redis.Redis(host="127.0.0.1", port=port)
        client.ping()
        payload = os.urandom(size)
        batch = max(16, min(1000, FRAME // size))
        max_msgs = max(1, max_bytes // size)
        q.put(("start", None))
        started = time.monotonic()
        deadline = started + duration
        sent = 0
        while sent < max_msgs and time.monotonic() < deadline:
            pipe = client.pipeline(transaction=False)
            n = min(batch, max_msgs - sent)
            for _ in range(n):
                pipe.xadd(key, {"v": payload})
            pipe.execute()
            sent += n
        elapsed = time.monotonic() - started
        q.put(("done", {"msgs": sent, "bytes": sent * size, "seconds": elapsed, "errors": 0}))
    except BaseException:
        q.put(("error", traceback.format_exc()))


def redis_consume(q: Queue[Any], port: int, key: str, expected: int, timeout: float) -> None:
    """XREAD COUNT 10000 from the start of the stream until ``expected`` records arrived."""
    try:
        import redis

        client = redis.Redis(host="127.0.0.1", port=port)
        client.ping()
        q.put(("start", None))
        started = time.monotonic()
        deadline = started + timeout
        last = b"0-0"
        msgs = 0
        nbytes = 0
        while msgs < expected and time.monotonic() < deadline:
            reply = client.xread({key: last}, count=10_000)
            if not reply:
                break
            for _stream, entries in reply:
                for entry_id, fields in entries:
                    msgs += 1
                    nbytes += len(fields[b"v"])
                    last = entry_id
        elapsed = time.monotonic() - started
        q.put(("done", {"msgs": msgs, "bytes": nbytes, "seconds": elapsed, "errors": 0}))
    except BaseException:
        q.put(("error", traceback.format_exc()))


# -- (c) the storage-free broker ------------------------------------------------------------


class StorageFreeBroker(procs.Broker):
    """``python -m bench.sink serve``: StoneMQ answering every Produce without storing it."""

    module = "bench.sink"

    def environment(self) -> dict[str, str]:
        env = super().environment()
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        return env


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.baselines")
    sub = parser.add_subparsers(dest="command", required=True)
    ceiling = sub.add_parser("ceiling-server", help="the bare uvloop ingest server")
    ceiling.add_argument("--port", type=int, required=True)
    ceiling.add_argument("--file", required=True)
    ceiling.add_argument(
        "--retain-bytes", type=int, default=-1, help="page-cache window (-1: keep all)"
    )
    args = parser.parse_args()
    import uvloop

    uvloop.run(_serve_ceiling(args.port, args.file, args.retain_bytes))


if __name__ == "__main__":
    main()
