"""Whole record batches of a segment file as a byte range to send with ``sendfile``: a fetch's
records that never pass through Python.

A :class:`FileRange` holds its own descriptor of the segment file, opened in the disk-read
thread that found the range, so a segment deleted by retention (or a queue log cut back by a
follower) before the range is sent stays readable through it: the file's bytes below the size
the read saw never change while the file exists, and the open descriptor keeps the file's
inode after its name is gone. Whoever ends up with a range closes it: the connection once it
is sent or the connection is gone, the fetch when it leaves the range out of its answer. A
range dropped unclosed (an error path) closes its descriptor when it is garbage collected.

The number of ranges open at once is bounded (``MAX_OPEN_RANGES``): past it a fetch reads its
records into memory as before, so a fetch of thousands of partitions cannot run the process
out of descriptors.

Before a range is handed to the event loop, :func:`warm` makes sure the page cache holds it
(``sendfile`` to ``/dev/null`` reads the pages in without copying them): the loop's
``sendfile`` then copies from the page cache to the socket and never waits for the disk.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading

from stonemq.server.metrics import METRICS
from stonemq.storage import fileio

MAX_OPEN_RANGES = 1024
"""Ranges open at once in the process, each holding a descriptor until sent."""

MIN_RANGE_BYTES = 16 * 1024
"""A read shorter than this is copied (its descriptor and ``sendfile`` cost more than the
copy); the codec keeps values of this size or more by reference (``BY_REFERENCE_BYTES``)."""

_lock = threading.Lock()
_open = 0


def open_ranges() -> int:
    """Ranges open now (tests, metrics)."""
    return _open


class FileRange:
    """``length`` bytes of ``path`` at ``position``, through a descriptor of its own;
    ``len()`` is the length, as the response codec and the dispatcher's accounting ask."""

    __slots__ = ("fd", "has_zstd", "length", "path", "position", "sent")

    def __init__(self, path: str, fd: int, position: int, length: int, has_zstd: bool) -> None:
        self.path = path
        self.fd = fd
        self.position = position
        self.length = length
        self.has_zstd = has_zstd  # a batch in it is zstd-compressed (fetch before v10)
        self.sent = 0  # bytes of it already sent

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"FileRange({self.path!r}, {self.position}, {self.length}, sent={self.sent})"

    @property
    def closed(self) -> bool:
        return self.fd < 0

    def send(self, socket_fd: int, max_bytes: int | None = None) -> bool:
        """Send as much of what is left as the socket takes now (``sendfile``, no copy into
        Python), at most ``max_bytes`` in this call; True when all of it was sent. A full
        socket raises BlockingIOError; any other OSError is the caller's (the connection
        closes: part of the response went out)."""
        stop = self.length if max_bytes is None else min(self.length, self.sent + max_bytes)
        while self.sent < stop:
            n = fileio.sendfile(socket_fd, self.fd, self.position + self.sent, stop - self.sent)
            if n == 0:  # the file ended before the range did: it was cut under us
                raise OSError(f"{self.path} ended {self.length - self.sent} bytes early")
            self.sent += n
        return self.sent == self.length

    def read_rest(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` of what is left, copied (the fallback when ``sendfile`` cannot
        be used on the socket); marks them sent."""
        n = min(max_bytes, self.length - self.sent)
        data = fileio.pread(self.fd, n, self.position + self.sent)
        if len(data) < n:
            raise OSError(f"{self.path} ended {n - len(data)} bytes early")
        self.sent += n
        return data

    def read_all(self) -> bytes:
        """All of it, copied (tests; a path that needs the bytes)."""
        data = fileio.pread(self.fd, self.length, self.position)
        if len(data) < self.length:
            raise OSError(f"{self.path} ended {self.length - len(data)} bytes early")
        return data

    def close(self) -> None:
        global _open
        fd = self.fd
        if fd < 0:
            return
        self.fd = -1
        with _lock:
            _open -= 1
            METRICS.file_ranges_closed += 1
        with contextlib.suppress(OSError):
            fileio.close(fd)

    def __del__(self) -> None:
        self.close()


def open_range(path: str, position: int, length: int, has_zstd: bool) -> FileRange | None:
    """A range of ``path`` through a new descriptor (in the disk-read thread), or None when
    ``MAX_OPEN_RANGES`` are open or the process is out of descriptors (the caller copies the
    bytes instead). Another error opening the file (a segment deleted meanwhile:
    FileNotFoundError) is raised."""
    global _open
    with _lock:
        if _open >= MAX_OPEN_RANGES:
            return None
        _open += 1
        METRICS.file_ranges_opened += 1
    try:
        fd = fileio.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except BaseException as exc:
        with _lock:
            _open -= 1
            METRICS.file_ranges_opened -= 1
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
            return None  # out of descriptors: copy the bytes instead
        raise
    return FileRange(path, fd, position, length, has_zstd)


_devnull = -1


def warm(file_range: FileRange) -> None:
    """Read the range into the page cache without copying it (``sendfile`` to ``/dev/null``;
    in the disk-read thread): the loop's ``sendfile`` of it then does not wait for the disk
    (unless memory pressure evicts the pages in between: that send then reads them, holding
    the GIL, ``fileio.sendfile``). An error here is only a missed warm-up."""
    global _devnull
    pos, end = file_range.position, file_range.position + file_range.length
    with contextlib.suppress(OSError):
        if _devnull < 0:
            with _lock:
                if _devnull < 0:
                    _devnull = os.open(os.devnull, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        while pos < end:
            n = os.sendfile(_devnull, file_range.fd, pos, end - pos)
            if n == 0:
                return
            pos += n
