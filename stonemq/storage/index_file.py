"""The append-only file of fixed-size entries under both segment indexes, with its write buffer.

New entries are kept in memory and written to the file in one ``pwrite`` by the splitter's
write thread once ``PENDING_BYTES`` of them gather, and by the flush thread before it fsyncs
(so a checkpoint never covers an entry that is only in memory). Kafka keeps its index files
mapped; this buffer plays that part: at 10,000 partitions an unbuffered entry cost an open and
a close of the index file through the open-file cache (a quarter of the broker's CPU). Reads
see written and pending entries alike. Entries lost to a crash lie past the recovery point,
where recovery re-indexes the log.

A write has two halves (:class:`IndexWrite`): :meth:`IndexFile.take_pending` snapshots the
pending bytes on the event loop, ``run`` writes them in a thread, ``done`` (on the loop again)
moves them from pending to written. Only the loop changes the entries, so a reader on the
loop always sees a consistent index while a write is in flight; two writes of the same
entries (the splitter's and a flush's) write the same bytes at the same place.
"""

from __future__ import annotations

import logging
import os

from stonemq.storage.open_files import OpenFiles, Reads

log = logging.getLogger(__name__)

PENDING_BYTES = 256  # entries gathered in memory before a write (bounded per segment)


class IndexWrite:
    """Pending entries of one index, taken for a write in a thread."""

    __slots__ = ("at", "data", "error", "index", "upto")

    def __init__(self, index: IndexFile, at: int, data: bytes, upto: int) -> None:
        self.index = index
        self.at = at  # first entry written
        self.data = data
        self.upto = upto  # entries on disk once written
        self.error: OSError | None = None

    def run(self, files: OpenFiles) -> None:
        """Thread side: write the bytes (a failure is kept for ``done``, never raised)."""
        try:
            files.pwrite_all(self.index.path, [self.data], self.at * self.index.entry_size)
        except OSError as exc:
            self.error = exc

    def done(self) -> None:
        """Loop side: the entries are on disk, or, after a failed write, every entry not on
        disk is dropped: never left as a hole, since a sparse index missing entries only
        costs a longer scan (later entries still increase), while zeros in the middle would
        break lookups."""
        index = self.index
        if self.error is not None:
            if index.written < index.entries:
                log.warning(
                    "%s: %d index entries dropped: %s",
                    index.path,
                    index.entries - index.written,
                    self.error,
                )
                index.drop_pending()
            return
        index.wrote(self.upto)


class IndexView:
    """An index as it was when taken (:meth:`IndexFile.view`), for a thread: the entries on
    disk then (never rewritten while the segment exists) and a copy of those pending."""

    __slots__ = ("base_offset", "entries", "entry_size", "path", "pending", "written")

    def __init__(
        self, path: str, base_offset: int, entry_size: int, written: int, pending: bytes
    ) -> None:
        self.path = path
        self.base_offset = base_offset
        self.entry_size = entry_size
        self.written = written
        self.pending = pending
        self.entries = written + len(pending) // entry_size

    def raw_entry(self, files: Reads, i: int) -> bytes:
        size = self.entry_size
        if i >= self.written:
            at = (i - self.written) * size
            return self.pending[at : at + size]
        return files.pread(self.path, size, i * size)


class IndexFile:
    """Entries of ``entry_size`` bytes in the file at ``path``: ``written`` of them on disk
    (in the page cache), the rest of ``entries`` pending in memory."""

    __slots__ = ("_pending", "base_offset", "entries", "entry_size", "path", "written")

    def __init__(self, path: str, base_offset: int, entry_size: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.entry_size = entry_size
        self.entries = 0
        self.written = 0
        self._pending: bytearray | None = None  # entries [written, entries)

    @property
    def pending_entries(self) -> int:
        return self.entries - self.written

    def count_from_file(self) -> None:
        """Entry count from the file size (no open); for trusted, sealed segments."""
        try:
            size = os.path.getsize(self.path)
        except FileNotFoundError:
            size = 0
        self.entries = self.written = size // self.entry_size
        self._pending = None

    def load_file(self, files: OpenFiles) -> None:
        """Count the entries on disk and drop a torn partial entry at the end."""
        size = files.size(self.path)
        torn = size % self.entry_size
        if torn:
            files.ftruncate(self.path, size - torn)
        self.entries = self.written = size // self.entry_size
        self._pending = None

    def view(self) -> IndexView:
        """The entries as of now, safe to read from another thread."""
        pending = bytes(self._pending) if self._pending else b""
        return IndexView(self.path, self.base_offset, self.entry_size, self.written, pending)

    def raw_entry(self, files: Reads, i: int) -> bytes:
        size = self.entry_size
        if i >= self.written:
            assert self._pending is not None
            at = (i - self.written) * size
            return bytes(self._pending[at : at + size])
        return files.pread(self.path, size, i * size)

    def add(self, data: bytes) -> None:
        """A new entry, pending in memory until a write takes it."""
        pending = self._pending
        if pending is None:
            pending = self._pending = bytearray()
        pending += data
        self.entries += 1

    @property
    def write_due(self) -> bool:
        return self._pending is not None and len(self._pending) >= PENDING_BYTES

    def take_pending(self) -> IndexWrite | None:
        """The pending entries as a write to run in a thread (None: nothing pending)."""
        pending = self._pending
        if not pending:
            return None
        return IndexWrite(self, self.written, bytes(pending), self.entries)

    def wrote(self, upto: int) -> None:
        """Entries below ``upto`` are on disk."""
        if upto <= self.written:
            return
        upto = min(upto, self.entries)
        assert self._pending is not None
        del self._pending[: (upto - self.written) * self.entry_size]
        self.written = upto
        if not self._pending:
            self._pending = None

    def drop_pending(self) -> None:
        """Forget the entries not on disk (after a failed write)."""
        self._pending = None
        self.entries = self.written

    def write_pending(self, files: OpenFiles) -> None:
        """Write the pending entries now, in this thread (recovery, a clean stop, tests)."""
        job = self.take_pending()
        if job is not None:
            job.run(files)
            job.done()

    def truncate_file(self, files: OpenFiles, count: int) -> None:
        """Keep the first ``count`` entries."""
        if count >= self.entries:
            return
        if count >= self.written:
            assert self._pending is not None
            del self._pending[(count - self.written) * self.entry_size :]
        else:
            self._pending = None
            files.ftruncate(self.path, count * self.entry_size)
            self.written = count
        self.entries = count
