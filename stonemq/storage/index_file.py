"""The append-only file of fixed-size entries under both segment indexes, with its write buffer.

New entries are kept in memory and written to the file in one ``pwrite`` once
``PENDING_BYTES`` of them gather, when the segment is sealed, and before every flush (the
flush fsyncs what this wrote, so a checkpoint never covers an entry that is only in memory).
Kafka keeps its index files mapped; this buffer plays that part: at 10,000 partitions an
unbuffered entry cost an open and a close of the index file through the open-file cache
(a quarter of the broker's CPU). Reads see written and pending entries alike. Entries lost
to a crash lie past the recovery point, where recovery re-indexes the log.
"""

from __future__ import annotations

import logging
import os

from stonemq.storage import fileio
from stonemq.storage.open_files import OpenFiles, Reads

log = logging.getLogger(__name__)

PENDING_BYTES = 256  # entries gathered in memory before a write (bounded per segment)


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
        fd = files.get(self.path)
        size = os.fstat(fd).st_size
        torn = size % self.entry_size
        if torn:
            fileio.ftruncate(fd, size - torn)
        self.entries = self.written = size // self.entry_size
        self._pending = None

    def raw_entry(self, files: Reads, i: int) -> bytes:
        size = self.entry_size
        if i >= self.written:
            assert self._pending is not None
            at = (i - self.written) * size
            return bytes(self._pending[at : at + size])
        return files.pread(self.path, size, i * size)

    def add(self, files: OpenFiles, data: bytes) -> None:
        pending = self._pending
        if pending is None:
            pending = self._pending = bytearray()
        pending += data
        self.entries += 1
        if len(pending) >= PENDING_BYTES:
            self.write_pending(files)

    def write_pending(self, files: OpenFiles) -> None:
        """Write the pending entries after the written ones. On a failed write they are
        dropped, never left as a hole: a sparse index missing entries only costs a longer
        scan (later entries still increase), while zeros in the middle would break lookups."""
        pending = self._pending
        if not pending:
            return
        self._pending = None
        at = self.written * self.entry_size
        done = 0
        try:
            fd = files.get(self.path)
            while done < len(pending):
                done += fileio.pwrite(fd, memoryview(pending)[done:], at + done)
        except OSError as exc:
            log.warning("%s: %d index entries dropped: %s", self.path, self.pending_entries, exc)
            self.entries = self.written = (at + done) // self.entry_size
            return
        self.written = self.entries

    def truncate_file(self, files: OpenFiles, count: int) -> None:
        """Keep the first ``count`` entries."""
        if count >= self.entries:
            return
        if count >= self.written:
            assert self._pending is not None
            del self._pending[(count - self.written) * self.entry_size :]
        else:
            self._pending = None
            fileio.ftruncate(files.get(self.path), count * self.entry_size)
            self.written = count
        self.entries = count
