"""The bounded cache of open queue-log file descriptors (``queue.max.open.files``).

Queue-log segments and their indexes are opened on demand and kept in a least-recently-used
cache, so 100,000 partitions run under the default ``ulimit -n``: an idle partition holds no
open file. Descriptors are only used synchronously on the event-loop thread (pread/pwrite);
background threads that fsync open their own descriptors by path.
"""

from __future__ import annotations

import os
from collections import OrderedDict

_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)


class OpenFiles:
    """An LRU cache of file descriptors keyed by path, holding at most ``max_open_files``."""

    __slots__ = ("_fds", "max_open_files", "opens")

    def __init__(self, max_open_files: int) -> None:
        if max_open_files < 1:
            raise ValueError("max_open_files must be at least 1")
        self.max_open_files = max_open_files
        self._fds: OrderedDict[str, int] = OrderedDict()
        self.opens = 0  # files opened since start (a cache-miss counter for metrics/tests)

    def __len__(self) -> int:
        return len(self._fds)

    def get(self, path: str) -> int:
        """The descriptor of ``path`` (read/write, created if missing), opening it if needed."""
        fds = self._fds
        fd = fds.get(path)
        if fd is not None:
            fds.move_to_end(path)
            return fd
        while len(fds) >= self.max_open_files:
            _, old = fds.popitem(last=False)
            os.close(old)
        fd = os.open(path, _OPEN_FLAGS, 0o644)
        self.opens += 1
        fds[path] = fd
        return fd

    def close(self, path: str) -> None:
        """Close ``path`` if it is open (before deleting or renaming it)."""
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def close_under(self, directory: str) -> None:
        """Close every open file inside ``directory``."""
        prefix = directory.rstrip("/") + "/"
        for path in [p for p in self._fds if p.startswith(prefix)]:
            self.close(path)

    def close_all(self) -> None:
        while self._fds:
            _, fd = self._fds.popitem()
            os.close(fd)
