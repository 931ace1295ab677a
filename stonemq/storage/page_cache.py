"""Dropping file pages from the page cache: recovery's read-once reads, the journal's split
and durable pages, and queue-log pages older than the write-behind window.

The journal's split and durable ranges are dropped in normal operation (``pages_to_release``
in ``journal.py``). Recovery reads every journal byte past the journal's recovery point,
re-splits the journal from its split position and validates every queue-log byte past each
queue log's recovery point: gigabytes, each read once. Left in the page cache they would push
out what consumers read, and on a VM whose host takes back the memory the guest frees,
filling the cache with them costs more than reading them: reading 1 GiB of journal through
the cache ran at 303 MB/s with 3.3 s of system time here, and at 1,425 MB/s with 0.2 s when
each read's pages were dropped, the next read reusing them. Only the bytes used are dropped
(a read that ends inside an entry or batch is followed by one starting there), and only
clean pages are (a dirty page stays).

Queue-log writes go through :class:`WrittenPages` (``queue.cache.retain.bytes``): the most
recently written bytes stay cached for consumers at the tail, older ones are written back and
dropped (``release_written``), so the broker's page cache stays bounded and new writes reuse
pages it just freed instead of memory the guest has not touched: at one partition, 1 KiB
records, the broker's CPU per GB produced halved and its rate rose by half in paired runs.
"""

from __future__ import annotations

import collections
import contextlib
import mmap
import os
from collections.abc import Iterator
from typing import Any

from stonemq.storage import fileio

RECOVERY_READ_BYTES = 3 * 1024 * 1024
"""One recovery read: large enough for the disk's sequential rate, and under the broker's
malloc mmap threshold (``stonemq.server.malloc``): each read reuses the same heap memory,
where 8 MiB reads, each mapped fresh, ran at about half the rate."""

RANGE_MAX_BYTES = 4 * 1024 * 1024
"""Contiguous writes to one file merge into one tracked range up to this size (an eighth of
the window if that is less), so a busy partition is dropped in steps, not in one range that
also holds its newest bytes. A range also stops taking writes a quarter window after its
first, so a quiet partition's range does not hold back the ones behind it."""

RELEASE_MIN_BYTES = 8 * 1024 * 1024
"""Due ranges are handed out once this many bytes of them (an eighth of the window if that is
less), or ``MAX_RANGES // 8`` ranges, have gathered: one executor job per step of
megabytes, not one per split step, which held the event loop's GIL often enough to show in
the tail latency."""

FOLIO_MAX_BYTES = 2 * 1024 * 1024
"""The largest page-cache folio: a drop only takes folios wholly inside its range, so a range
is dropped from the folio boundary below its start (those bytes of the file are older, so
already past the window)."""

PAGE_BYTES = mmap.PAGESIZE
"""A range is written back and dropped up to the page boundary below its end: a drop that
reaches the end of the file takes the partly written last page too (Linux drops it there), and
the next append into that page then reads it back from disk first, on the event loop. With
10,000 partitions written in turn that was most appends: 85-236 MB of disk reads during a
20 s produce-only run, each a wait of the event loop on the disk (throughput rose by a
quarter to a half once they stopped). The page stays cached until a later range of the file
takes it; the last one of each file stays."""

MAX_RANGES = 32768
"""The most ranges tracked (about 8 MB at most), half of them at each stage: writes spread
over more files than that within one window are dropped sooner than the window says, rather
than tracked without bound. A range takes a file's appends until it is due, so this counts
files written within a window: with 4,096 (2,048 at each stage) a partition's range was handed
out before the partition's next append at 10,000 partitions written in turn, and each append
cost a range of its own, two opens, two closes and three system calls in the release thread
(a fifth of the broker's CPU at 10,000 partitions; 60 -> 47 µs of broker CPU per batch in
paired runs with the multi-partition generator)."""

_FADV_DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", None)

Range = tuple[str, int, int]
"""(path, offset, length)"""


def drop_pages(fd: int, offset: int, length: int) -> None:
    """Drop ``fd``'s clean pages in ``[offset, offset + length)`` from the page cache (dirty
    ones are queued for writeback instead)."""
    if _FADV_DONTNEED is not None and length > 0:
        with contextlib.suppress(OSError):  # a hint: nothing depends on it
            os.posix_fadvise(fd, offset, length, _FADV_DONTNEED)


def drop_consumed(fd: int, offset: int, length: int) -> None:
    """Drop the pages of ``[offset, offset + length)`` read once by a sequential reader, from
    the page boundary below ``offset``: the page holding ``offset`` was partly used by the
    previous read, which could not drop it (a drop only takes whole pages), and the reader
    never goes back to it. The page holding the end stays for the next read, which starts
    there (at the end of the file Linux drops the partial last page too)."""
    start = offset - offset % PAGE_BYTES
    drop_pages(fd, start, length + offset - start)


def write_back(fd: int, offset: int, length: int, wait: bool) -> None:
    """Start writing back ``fd``'s dirty pages in the range, and with ``wait`` also wait until
    every page in it is clean (Linux ``sync_file_range``: no fsync, no metadata; elsewhere
    ``POSIX_FADV_DONTNEED``, which starts writeback but cannot wait). With ``wait`` it
    raises the kernel's write-back error, which it reports once: whoever sees it must act on
    it, since a later fsync through another descriptor may succeed as if nothing was lost."""
    if not fileio.HAS_SYNC_FILE_RANGE:
        drop_pages(fd, offset, length)
        return
    flags = fileio.SYNC_FILE_RANGE_WRITE
    if wait:
        flags |= fileio.SYNC_FILE_RANGE_WAIT_BEFORE | fileio.SYNC_FILE_RANGE_WAIT_AFTER
        fileio.sync_file_range(fd, offset, length, flags)
        return
    with contextlib.suppress(OSError):  # starting write-back is a hint; waiting reports
        fileio.sync_file_range(fd, offset, length, flags)


def _each_open(ranges: list[Range]) -> Iterator[tuple[str, int, int, int]]:
    """(path, fd, offset, length) for each range whose file can be opened, by path: executor
    threads do not share the event loop's descriptors; a file that is gone is skipped."""
    for path, offset, length in ranges:
        try:
            fd = fileio.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            continue
        try:
            yield path, fd, offset, length
        finally:
            fileio.close(fd)


def release_written(hint: list[Range], drop: list[Range]) -> dict[str, OSError]:
    """:class:`WrittenPages`' two stages: start the writeback of ``hint``; wait for that of
    ``drop`` (usually done since its hint) and drop its pages. Returns the files whose
    write-back failed (their pages are kept): the caller takes what they hold offline."""
    failed: dict[str, OSError] = {}
    for _, fd, offset, length in _each_open(hint):
        write_back(fd, offset, length, wait=False)
    for path, fd, offset, length in _each_open(drop):
        try:
            write_back(fd, offset, length, wait=True)
        except OSError as exc:
            failed[path] = exc
            continue
        drop_pages(fd, offset, length)
    return failed


def drop_ranges(ranges: list[Range]) -> None:
    """``drop_pages`` on each (path, offset, length) of clean pages (in an executor thread)."""
    for _, fd, offset, length in _each_open(ranges):
        drop_pages(fd, offset, length)


class WrittenPages:
    """Queue-log byte ranges in write order, and when each is due to leave the page cache.

    ``retain_bytes`` is the window: a range's writeback starts when half a window has been
    written after it, and its pages are dropped when a whole window has (waiting for that
    writeback first, which has usually finished). -1 tracks nothing: the kernel alone
    decides, as with Kafka. Nothing depends on it for correctness; the ranges only say which
    pages consumers at the tail no longer need.
    """

    __slots__ = (
        "_drop",
        "_due_bytes",
        "_fresh",
        "_hint",
        "_hinted",
        "_open",
        "_range_max_bytes",
        "_release_min_bytes",
        "_written",
        "retain_bytes",
    )

    def __init__(self, retain_bytes: int) -> None:
        self.retain_bytes = retain_bytes
        self._range_max_bytes = max(min(RANGE_MAX_BYTES, retain_bytes // 8), 1)
        self._release_min_bytes = min(RELEASE_MIN_BYTES, retain_bytes // 8)
        self._written = 0  # bytes noted so far: a range's age is this minus its end mark
        # [path, start, end, written mark at its end, written mark at its first write], in
        # the order of their first write: not hinted yet, then hinted once
        self._fresh: collections.deque[list[Any]] = collections.deque()
        self._hinted: collections.deque[list[Any]] = collections.deque()
        self._open: dict[str, list[Any]] = {}  # each file's range still taking writes
        self._hint: list[Range] = []  # due, not handed out yet
        self._drop: list[Range] = []
        self._due_bytes = 0

    def __len__(self) -> int:
        return len(self._fresh) + len(self._hinted)

    def note(self, path: str, start: int, end: int) -> None:
        """``[start, end)`` of ``path`` was just written."""
        if self.retain_bytes < 0 or end <= start:
            return
        first = self._written
        self._written = written = first + end - start
        item = self._open.get(path)
        if (
            item is not None
            and item[2] == start
            and end - item[1] <= self._range_max_bytes
            and first - item[4] < self.retain_bytes // 4
        ):
            item[2] = end
            item[3] = written
            return
        if start // PAGE_BYTES == end // PAGE_BYTES:
            # it ends in the page it starts in: no page of it could be dropped (the partly
            # written last page stays), and the file's next range starts from this page's
            # boundary, so it is covered then. A partition written once (100,000 idle ones)
            # or in small batches costs no range.
            return
        item = [path, start, end, written, first]
        self._fresh.append(item)
        self._open[path] = item

    def due(self) -> tuple[list[Range], list[Range]]:
        """The ranges whose writeback is to start now, and those to drop now, oldest first
        (for ``release_written``); empty until enough are due (``RELEASE_MIN_BYTES``)."""
        fresh, hinted = self._fresh, self._hinted
        written, retain = self._written, self.retain_bytes
        while fresh and (written - fresh[0][3] >= retain // 2 or len(fresh) > MAX_RANGES // 2):
            item = fresh.popleft()
            path, start, end = item[0], item[1], item[2]
            if self._open.get(path) is item:
                del self._open[path]
            hinted.append(item)
            start -= start % PAGE_BYTES  # whole pages (PAGE_BYTES): the partly written
            end -= end % PAGE_BYTES  # last one stays
            if end > start:
                self._hint.append((path, start, end - start))
                self._due_bytes += end - start
        while hinted and (written - hinted[0][3] >= retain or len(hinted) > MAX_RANGES // 2):
            path, start, end = hinted.popleft()[:3]
            start -= start % FOLIO_MAX_BYTES
            end -= end % PAGE_BYTES
            if end > start:
                self._drop.append((path, start, end - start))
                self._due_bytes += end - start
        if (
            self._due_bytes < self._release_min_bytes
            and len(self._hint) + len(self._drop) < MAX_RANGES // 8
        ):
            return [], []
        hint, drop = self._hint, self._drop
        self._hint, self._drop, self._due_bytes = [], [], 0
        return hint, drop
