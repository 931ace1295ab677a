"""Dropping file pages from the page cache: recovery's read-once reads, the journal's releases.

The journal's split and durable ranges are dropped in normal operation (``release_pages`` in
``journal.py``). Recovery reads every journal byte past the journal's recovery point,
re-splits the journal from its split position and validates every queue-log byte past each
queue log's recovery point: gigabytes, each read once. Left in the page cache they would push
out what consumers read, and on a VM whose host takes back the memory the guest frees,
filling the cache with them costs more than reading them: reading 1 GiB of journal through
the cache ran at 303 MB/s with 3.3 s of system time here, and at 1,425 MB/s with 0.2 s when
each read's pages were dropped, the next read reusing them. Only the bytes used are dropped
(a read that ends inside an entry or batch is followed by one starting there), and only
clean pages are (a dirty page stays).
"""

from __future__ import annotations

import contextlib
import os

RECOVERY_READ_BYTES = 3 * 1024 * 1024
"""One recovery read: large enough for the disk's sequential rate, and under the broker's
malloc mmap threshold (``stonemq.server.malloc``): each read reuses the same heap memory,
where 8 MiB reads, each mapped fresh, ran at about half the rate."""

_FADV_DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", None)


def drop_pages(fd: int, offset: int, length: int) -> None:
    """Drop ``fd``'s clean pages in ``[offset, offset + length)`` from the page cache."""
    if _FADV_DONTNEED is not None and length > 0:
        with contextlib.suppress(OSError):  # a hint: nothing depends on it
            os.posix_fadvise(fd, offset, length, _FADV_DONTNEED)
