"""The data-directory lock: one broker per data directory, refused loudly otherwise."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class DirectoryInUseError(Exception):
    pass


class DirectoryLock:
    """An exclusive ``flock`` on ``<dir>/.lock``, held for the broker's lifetime.

    The kernel drops the lock when the process dies, so a SIGKILLed broker never leaves a
    stale lock behind.
    """

    def __init__(self, directory: Path) -> None:
        self.path = directory / ".lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise DirectoryInUseError(
                f"data directory {self.path.parent} is locked by pid {holder}: another broker "
                f"is using it (lock file {self.path})"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def lock_holder(directory: Path) -> str | None:
    """Who holds ``directory``'s lock (the pid a broker wrote, else "another process"), or
    None when no process does; the lock is taken and let go at once, the file neither made
    nor written (offline tools: ``stonemq storage check``)."""
    try:
        fd = os.open(directory / ".lock", os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(fd)
    finally:
        os.close(fd)
    return None


def _holder(fd: int) -> str:
    """The pid a broker wrote into the lock file open as ``fd``, else "another process"."""
    return os.read(fd, 64).decode(errors="replace").strip() or "another process"
