"""The storage's I/O boundary: every system call storage makes on its files goes through here.

Journal, queue-log, index and checkpoint code call ``fileio.pwrite(...)``,
``fileio.fsync(...)`` and so on (always through the module attribute, never a name imported
from it), so one place can replace them: :func:`install` swaps in a :class:`FileOps` whose
methods may fail on a schedule (``stonemq.storage.faults``), which is how the tests inject
ENOSPC, EIO, short writes and failed fsyncs, write-backs, renames and unlinks into a real
engine, and how they model what a power loss keeps (only what an fsync made durable).

The default operations are the plain ``os`` calls, plus two Linux calls through ctypes
(``sync_file_range``, ``syncfs``) that, unlike ``os`` functions, return an error code: here
they raise :class:`OSError` like the rest, so a write-back error is never lost on the way.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable, Sequence
from typing import Any

_libc_name: str | None = None
"""``dlopen(NULL)``: the process's own symbols, libc's among them. ``ctypes.util.find_library``
would run ``ldconfig`` and import 17 modules (about 1 MiB of the serving process)."""


def _libc_function(name: str, argtypes: list[Any]) -> Callable[..., int] | None:
    try:
        func = getattr(ctypes.CDLL(_libc_name, use_errno=True), name)
    except (OSError, AttributeError, TypeError):
        return None
    func.argtypes = argtypes
    func.restype = ctypes.c_int
    return func  # type: ignore[no-any-return]


def _sendfile_holding_gil() -> Callable[..., int] | None:
    """libc's ``sendfile`` called without releasing the GIL (``ctypes.PyDLL``), or None."""
    try:
        func = ctypes.PyDLL(_libc_name, use_errno=True).sendfile
    except (OSError, AttributeError, TypeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t]
    func.restype = ctypes.c_ssize_t
    return func  # type: ignore[no-any-return]


_sendfile = _sendfile_holding_gil()

_sync_file_range = _libc_function(
    "sync_file_range", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
)
_syncfs = _libc_function("syncfs", [ctypes.c_int])

SYNC_FILE_RANGE_WAIT_BEFORE = 1  # from linux/fs.h
SYNC_FILE_RANGE_WRITE = 2
SYNC_FILE_RANGE_WAIT_AFTER = 4

HAS_SYNC_FILE_RANGE = _sync_file_range is not None
_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", None)
HAS_SYNCFS = _syncfs is not None


def _raise_errno(what: str, target: object) -> None:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}", str(target))


class FileOps:
    """The real operations. A subclass (``faults.FaultyFileOps``) overrides what it injects."""

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags, mode)

    def close(self, fd: int) -> None:
        os.close(fd)

    def pread(self, fd: int, n: int, pos: int) -> bytes:
        return os.pread(fd, n, pos)

    def pread_into(self, fd: int, buf: Any, pos: int) -> int:
        """Read into ``buf`` (a writable buffer) from ``pos``; the bytes read (0 at the end)."""
        return os.preadv(fd, [buf], pos)

    def pwrite(self, fd: int, data: Any, pos: int) -> int:
        return os.pwrite(fd, data, pos)

    def pwritev(self, fd: int, buffers: Sequence[Any], pos: int) -> int:
        return os.pwritev(fd, buffers, pos)

    def write(self, fd: int, data: Any) -> int:
        return os.write(fd, data)

    def sendfile(self, out_fd: int, in_fd: int, offset: int, count: int) -> int:
        """``sendfile(2)``: up to ``count`` bytes of ``in_fd`` at ``offset`` to ``out_fd`` (a
        non-blocking socket: fetch responses, ``storage/file_range.py``), without copying
        them into user space. Called holding the GIL, as the event loop's socket writes are:
        ``os.sendfile`` releases it, and on a busy two-core machine the loop then waited up
        to a switch interval to get it back after every call (the file's pages are in the
        page cache: ``file_range.warm`` read them in first, so the call does not wait for
        the disk). A full socket raises BlockingIOError."""
        if _sendfile is None:
            return os.sendfile(out_fd, in_fd, offset, count)
        position = ctypes.c_int64(offset)
        while True:
            sent = _sendfile(out_fd, in_fd, ctypes.byref(position), count)
            if sent >= 0:
                return int(sent)
            err = ctypes.get_errno()
            if err != errno.EINTR:
                raise OSError(err, os.strerror(err))  # EAGAIN: BlockingIOError

    def pread_cached(self, fd: int, n: int, pos: int) -> bytes | None:
        """``n`` bytes at ``pos`` if the page cache holds all of them (``RWF_NOWAIT``: the
        read never waits for the disk), else None. Shorter only at the end of the file."""
        if _RWF_NOWAIT is None:
            return None
        buf = bytearray(n)
        try:
            got = os.preadv(fd, [buf], pos, _RWF_NOWAIT)
        except BlockingIOError:
            return None
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # not on this filesystem
                return None
            raise
        if got < n:
            if got == 0 or os.fstat(fd).st_size > pos + got:
                return None  # the rest is not cached
            del buf[got:]
        return bytes(buf) if len(buf) < 65536 else buf  # type: ignore[return-value]

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def truncate(self, path: str, size: int) -> None:
        os.truncate(path, size)

    def sync_file_range(self, fd: int, offset: int, length: int, flags: int) -> None:
        """Linux ``sync_file_range``; raises OSError on failure (a write-back error included:
        the kernel reports it once per descriptor, so it must not be dropped here)."""
        if _sync_file_range is None:
            raise OSError(38, "sync_file_range is not available")  # ENOSYS
        if _sync_file_range(fd, offset, length, flags) != 0:
            _raise_errno("sync_file_range", fd)

    def syncfs(self, fd: int) -> None:
        if _syncfs is None:
            raise OSError(38, "syncfs is not available")
        if _syncfs(fd) != 0:
            _raise_errno("syncfs", fd)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def rmtree(self, path: str) -> None:
        import shutil  # only here (deleting a topic's directory), off the serving process's size

        shutil.rmtree(path, ignore_errors=True)


_REAL = FileOps()
_active: FileOps = _REAL

# The module-level names the storage calls; :func:`install` rebinds them.
open = _REAL.open
close = _REAL.close
pread = _REAL.pread
pread_into = _REAL.pread_into
pread_cached = _REAL.pread_cached
pwrite = _REAL.pwrite
pwritev = _REAL.pwritev
write = _REAL.write
sendfile = _REAL.sendfile
fsync = _REAL.fsync
ftruncate = _REAL.ftruncate
truncate = _REAL.truncate
sync_file_range = _REAL.sync_file_range
syncfs = _REAL.syncfs
replace = _REAL.replace
unlink = _REAL.unlink
makedirs = _REAL.makedirs
rmtree = _REAL.rmtree

_NAMES = (
    "open",
    "close",
    "pread",
    "pread_into",
    "pread_cached",
    "pwrite",
    "pwritev",
    "write",
    "sendfile",
    "fsync",
    "ftruncate",
    "truncate",
    "sync_file_range",
    "syncfs",
    "replace",
    "unlink",
    "makedirs",
    "rmtree",
)


def install(ops: FileOps | None) -> FileOps:
    """Route every storage system call through ``ops`` (None: the real ones again); returns
    the operations that were active before."""
    global _active
    previous = _active
    _active = ops if ops is not None else _REAL
    module = globals()
    for name in _NAMES:
        module[name] = getattr(_active, name)
    return previous


def active() -> FileOps:
    return _active


IOV_MAX = 1024
"""Buffers one ``pwritev`` takes at most (Linux's ``IOV_MAX``)."""


def pwrite_all(fd: int, buffers: Sequence[Any], pos: int) -> None:
    """Write ``buffers`` back to back at ``pos`` with pwritev (no joining copy), finishing
    short writes; a write that makes no progress raises ENOSPC instead of looping."""
    views = list(buffers)
    start = 0
    while start < len(views):
        chunk = views[start : start + IOV_MAX]
        done = pwritev(fd, chunk, pos)
        if done <= 0:
            raise OSError(errno.ENOSPC, "write made no progress")
        pos += done
        for view in chunk:
            if done >= len(view):
                done -= len(view)
                start += 1
            else:  # a short write ended inside this buffer
                views[start] = memoryview(view)[done:]
                break


def makedirs_durable(path: str) -> None:
    """Create ``path`` and any missing parents, each made durable in its parent (a new
    directory's name is only durable once its parent is fsynced)."""
    missing = []
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        missing.append(current)
        current = os.path.dirname(current)
    for directory in reversed(missing):
        makedirs(directory)
        fsync_dir(os.path.dirname(directory))


def fsync_dir(directory: str) -> None:
    """fsync a directory: its entries (files created, renamed or deleted in it) durable."""
    fd = open(directory, os.O_RDONLY)
    try:
        fsync(fd)
    finally:
        close(fd)


# From this many paths on, one syncfs(2) per filesystem is cheaper than an fsync per file
# (a flush of 100,000 idle queue logs, a clean stop): both leave every named file durable.
SYNCFS_MIN_PATHS = 256


class FsyncError(OSError):
    """Some paths of an :func:`fsync_paths` call could not be made durable: ``failed`` names
    them (with syncfs, every path of the failed filesystem)."""

    def __init__(self, failed: dict[str, OSError]) -> None:
        first = next(iter(failed.values()))
        super().__init__(first.errno, f"fsync failed for {len(failed)} path(s): {first}")
        self.failed = failed


def _syncfs_paths(paths: list[str], failed: dict[str, OSError]) -> bool:
    """syncfs the filesystem of each of ``paths``, once per device; a failure counts against
    every path of that device. False when syncfs is unavailable."""
    if not HAS_SYNCFS:
        return False
    devices: dict[int, list[str]] = {}
    for path in paths:
        try:
            dev = os.stat(path).st_dev
        except FileNotFoundError:
            continue
        devices.setdefault(dev, []).append(path)
    for group in devices.values():
        for path in group:  # any path of the device will do; a deleted one will not
            try:
                fd = open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                syncfs(fd)
            except OSError as exc:
                failed.update(dict.fromkeys(group, exc))
            finally:
                close(fd)
            break
    return True


def fsync_paths(paths: list[str]) -> None:
    """fsync files and directories by path (thread-safe: own descriptors); a deleted file
    needs no sync. Many paths: one syncfs per filesystem instead (Linux reports writeback
    errors to it too). Every path is tried; raises :class:`FsyncError` naming each one that
    failed, so the caller can take exactly what they belong to offline."""
    failed: dict[str, OSError] = {}
    if not (len(paths) >= SYNCFS_MIN_PATHS and _syncfs_paths(paths, failed)):
        for path in paths:
            try:
                fd = open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            except OSError as exc:
                failed[path] = exc
                continue
            try:
                fsync(fd)
            except OSError as exc:
                failed[path] = exc
            finally:
                close(fd)
    if failed:
        raise FsyncError(failed)
