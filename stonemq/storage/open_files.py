"""The bounded cache of open queue-log file descriptors (``queue.max.open.files``).

Queue-log segments and their indexes are opened on demand and kept in a least-recently-used
cache, so 100,000 partitions run under the default ``ulimit -n``: an idle partition holds no
open file. The event loop (fetch reads that never wait for the disk) and the splitter's write
thread share it: every use pins its descriptor (:meth:`OpenFiles.acquire` /
:meth:`OpenFiles.release`, or the methods that do both around one call), and a pinned
descriptor is never closed under its user, whether the cache evicts it or its file is being
deleted: it is closed when the last pin goes. Opens and closes run outside the cache's lock,
so one thread's wait on the filesystem never holds up another's cache hit. Fsync and
page-cache threads open their own descriptors by path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Protocol

from stonemq.storage import fileio

log = logging.getLogger(__name__)

# descriptors kept free beyond the cache: client sockets, journal segments, checkpoint and
# fsync threads' files, the tier service; a quarter of the limit, at least this many
FD_RESERVE_MIN = 256

_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
_FADV_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)


class Reads(Protocol):
    """What the read path (index lookups, header scans, batch reads) reads through: the
    cache itself (blocking), :class:`CachedReads` or :class:`DiskReads`."""

    def pread(self, path: str, n: int, pos: int) -> bytes: ...

    def hint(self, path: str, pos: int, n: int) -> None: ...


LOOP_READ_MAX_BYTES = 64 * 1024
"""The largest read a fetch makes on the event loop (index lookups and header scans read at
most this much): records beyond it are copied in a disk-read thread, in parallel with the
loop, whether the page cache holds them or not (a consumer catching up reads MiBs per fetch,
and each MiB copied on the loop delayed every other client by that long)."""


class NotCachedError(Exception):
    """A read of :class:`CachedReads` that would have waited for the disk, or copied more
    than ``LOOP_READ_MAX_BYTES`` on the event loop."""


class CachedReads:
    """The event loop's reads for fetches: through the cache's descriptors, but never waiting
    for the disk (``fileio.pread_cached``) and never larger than ``max_read_bytes``. Any other
    read raises :class:`NotCachedError`, and the fetch reads in a thread (:class:`DiskReads`),
    which also asks the kernel to read ahead: ``posix_fadvise(WILLNEED)`` allocates pages and
    queues the reads before it returns, which waits while the disk is busy, so the loop never
    makes it."""

    __slots__ = ("files", "max_read_bytes")

    def __init__(self, files: OpenFiles, max_read_bytes: int = LOOP_READ_MAX_BYTES) -> None:
        self.files = files
        self.max_read_bytes = max_read_bytes

    def pread(self, path: str, n: int, pos: int) -> bytes:
        if n > self.max_read_bytes:
            raise NotCachedError(path)
        data = self.files.pread_cached(path, n, pos)
        if data is None:
            raise NotCachedError(path)
        return data

    def hint(self, path: str, pos: int, n: int) -> None:
        """Nothing on the loop (see the class): the next read past the cache goes to a
        thread, whose read asks for the read-ahead."""


class DiskReads:
    """Blocking reads on descriptors of its own, opened by path: for a thread (the event
    loop's cache and its descriptors are the loop's). ``close()`` when done."""

    __slots__ = ("_fds",)

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}

    def _fd(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = fileio.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        return fd

    def pread(self, path: str, n: int, pos: int) -> bytes:
        return fileio.pread(self._fd(path), n, pos)

    def hint(self, path: str, pos: int, n: int) -> None:
        if _FADV_WILLNEED is not None and n > 0:
            with contextlib.suppress(OSError):
                os.posix_fadvise(self._fd(path), pos, n, _FADV_WILLNEED)

    def close(self) -> None:
        for fd in self._fds.values():
            fileio.close(fd)
        self._fds.clear()


def _reserve(limit: int) -> int:
    return max(FD_RESERVE_MIN, limit // 4)


STORAGE_FDS = 128
"""Descriptors kept for the broker's own files besides the queue-log cache: journal
segments, indexes being written, checkpoint files, the opens of an fsync by path."""


def connection_room(cached_files: int) -> int:
    """How many connections fit under ``RLIMIT_NOFILE`` beside ``cached_files`` (the
    queue-log file cache) and ``STORAGE_FDS``, at two descriptors each (its socket, and the
    duplicate a zero-copy fetch sends through): connections past it would leave the storage
    unable to open a journal segment or a file to fsync (EMFILE), which takes journal
    partitions offline. Unbounded when the limit is."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 2**31 - 1
    return max(1, (soft - cached_files - STORAGE_FDS) // 2)


def fit_to_fd_limit(requested: int, explicit: bool = True) -> int:
    """The cache size to use for ``queue.max.open.files`` = ``requested`` under this
    process's ``RLIMIT_NOFILE``: the soft limit is raised toward the hard one when the cache
    and its reserve need more; if they still do not fit, the cache shrinks to what does (with
    a warning when the value was set ``explicit``-ly; the default is simply fitted), so a
    large setting can never leave the broker unable to accept a connection or open a journal
    segment (EMFILE)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinite = resource.RLIM_INFINITY
    need = requested + _reserve(requested)
    if soft != infinite and need > soft:
        target = need if hard == infinite else min(need, hard)
        if target > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (ValueError, OSError) as exc:
                log.warning("cannot raise the open-file limit to %d: %s", target, exc)
    if soft == infinite or need <= soft:
        return requested
    fitted = max(8, min(soft - FD_RESERVE_MIN, soft * 3 // 4))
    log.log(
        logging.WARNING if explicit else logging.INFO,
        "queue.max.open.files=%d does not fit under the open-file limit %d (ulimit -n) with "
        "room for sockets and journals: using %d",
        requested,
        soft,
        fitted,
    )
    return fitted


class OpenFiles:
    """An LRU cache of file descriptors keyed by path, holding at most ``max_open_files``
    unpinned ones (pinned descriptors may exceed it for as long as they are in use)."""

    __slots__ = ("_fds", "_lock", "_orphans", "_pins", "max_open_files", "opens")

    def __init__(self, max_open_files: int) -> None:
        if max_open_files < 1:
            raise ValueError("max_open_files must be at least 1")
        self.max_open_files = max_open_files
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._pins: dict[int, int] = {}  # fd -> uses in progress
        self._orphans: set[int] = set()  # pinned fds out of the cache: closed at last release
        self._lock = threading.Lock()
        self.opens = 0  # files opened since start (a cache-miss counter for metrics/tests)

    def __len__(self) -> int:
        return len(self._fds)

    def acquire(self, path: str) -> int:
        """The descriptor of ``path`` (read/write, created if missing), pinned until
        :meth:`release`; opens it (outside the lock) on a miss."""
        lock = self._lock
        with lock:
            fd = self._fds.get(path)
            if fd is not None:
                self._fds.move_to_end(path)
                self._pins[fd] = self._pins.get(fd, 0) + 1
                return fd
        opened = fileio.open(path, _OPEN_FLAGS, 0o644)
        to_close: list[int] = []
        with lock:
            fd = self._fds.get(path)
            if fd is None:  # else another thread opened it meanwhile: use that one
                fd = self._fds[path] = opened
                self.opens += 1
                opened = -1
                to_close = self._evict()
            else:
                self._fds.move_to_end(path)
            self._pins[fd] = self._pins.get(fd, 0) + 1
        if opened >= 0:
            to_close.append(opened)
        for old in to_close:
            fileio.close(old)
        return fd

    def _evict(self) -> list[int]:
        """Under the lock: take the oldest descriptors out while the cache is over its size;
        returns the unpinned ones to close (pinned ones become orphans)."""
        fds = self._fds
        out: list[int] = []
        while len(fds) > self.max_open_files:
            _, old = fds.popitem(last=False)
            if old in self._pins:
                self._orphans.add(old)
            else:
                out.append(old)
        return out

    def release(self, fd: int) -> None:
        with self._lock:
            left = self._pins[fd] - 1
            if left:
                self._pins[fd] = left
                return
            del self._pins[fd]
            if fd not in self._orphans:
                return
            self._orphans.discard(fd)
        fileio.close(fd)

    def get(self, path: str) -> int:
        """The descriptor of ``path``, unpinned: only for code that no other thread can race
        (recovery, before the splitter's thread starts, and tests)."""
        fd = self.acquire(path)
        self.release(fd)
        return fd

    def pread(self, path: str, n: int, pos: int) -> bytes:
        """Read through the cache's descriptor (may wait for the disk)."""
        fd = self.acquire(path)
        try:
            return fileio.pread(fd, n, pos)
        finally:
            self.release(fd)

    def pread_cached(self, path: str, n: int, pos: int) -> bytes | None:
        """``fileio.pread_cached`` through the cache's descriptor: None unless cached."""
        fd = self.acquire(path)
        try:
            return fileio.pread_cached(fd, n, pos)
        finally:
            self.release(fd)

    def pwrite_all(self, path: str, buffers: Sequence[object], pos: int) -> None:
        """``fileio.pwrite_all`` through the cache's descriptor (creates the file)."""
        fd = self.acquire(path)
        try:
            fileio.pwrite_all(fd, buffers, pos)
        finally:
            self.release(fd)

    def ftruncate(self, path: str, size: int) -> None:
        fd = self.acquire(path)
        try:
            fileio.ftruncate(fd, size)
        finally:
            self.release(fd)

    def size(self, path: str) -> int:
        fd = self.acquire(path)
        try:
            return os.fstat(fd).st_size
        finally:
            self.release(fd)

    def hint(self, path: str, pos: int, n: int) -> None:
        """Ask the kernel to start reading ``[pos, pos + n)`` ahead (asynchronously)."""
        if _FADV_WILLNEED is not None and n > 0:
            fd = self.acquire(path)
            try:
                with contextlib.suppress(OSError):
                    os.posix_fadvise(fd, pos, n, _FADV_WILLNEED)
            finally:
                self.release(fd)

    def close(self, path: str) -> None:
        """Close ``path`` if it is open (before deleting or renaming it); a descriptor in use
        is closed by its last user."""
        with self._lock:
            fd = self._fds.pop(path, None)
            if fd is None:
                return
            if fd in self._pins:
                self._orphans.add(fd)
                return
        fileio.close(fd)

    def close_under(self, directories: Iterable[str]) -> None:
        """Close every open file directly inside one of ``directories`` (one pass over the
        cache, however many directories)."""
        wanted = {d.rstrip("/") for d in directories}
        with self._lock:
            paths = [p for p in self._fds if os.path.dirname(p) in wanted]
        for path in paths:
            self.close(path)

    def close_all(self) -> None:
        with self._lock:
            paths = list(self._fds)
        for path in paths:
            self.close(path)
