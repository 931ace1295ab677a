"""The time index of one queue-log segment (``<base offset>.timeindex``), Kafka's format.

Entries are 12 bytes, big-endian: a timestamp (i64) and an offset relative to the segment's
base offset (i32). An entry is added, at the offset index's cadence and when the segment is
sealed, only when the segment's max timestamp grew: timestamps and offsets both increase. The
offset is the base offset of the first batch that reached that timestamp, so every batch
before it has a smaller max timestamp.
"""

from __future__ import annotations

import os
import struct

from stonemq.storage.open_files import OpenFiles

_ENTRY = struct.Struct(">qi")
ENTRY_SIZE = _ENTRY.size


class TimeIndex:
    """Time index of the segment with base offset ``base_offset`` at ``path``."""

    __slots__ = ("base_offset", "entries", "last_offset", "last_timestamp", "path")

    def __init__(self, path: str, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.entries = 0
        self.last_timestamp = -1
        self.last_offset = -1

    def load(self, files: OpenFiles) -> None:
        fd = files.get(self.path)
        size = os.fstat(fd).st_size
        if size % ENTRY_SIZE:
            os.ftruncate(fd, size - size % ENTRY_SIZE)
        self.entries = size // ENTRY_SIZE
        self._reload_last(files)

    def _reload_last(self, files: OpenFiles) -> None:
        if self.entries:
            self.last_timestamp, self.last_offset = self.entry(files, self.entries - 1)
        else:
            self.last_timestamp, self.last_offset = -1, -1

    def entry(self, files: OpenFiles, i: int) -> tuple[int, int]:
        """(timestamp, absolute offset) of entry ``i``."""
        ts, rel = _ENTRY.unpack(os.pread(files.get(self.path), ENTRY_SIZE, i * ENTRY_SIZE))
        return ts, self.base_offset + rel

    def maybe_append(self, files: OpenFiles, timestamp: int, offset: int) -> None:
        """Add (timestamp, offset) if ``timestamp`` is larger than the last entry's."""
        if timestamp <= self.last_timestamp or offset < self.last_offset:
            return
        data = _ENTRY.pack(timestamp, offset - self.base_offset)
        os.pwrite(files.get(self.path), data, self.entries * ENTRY_SIZE)
        self.entries += 1
        self.last_timestamp, self.last_offset = timestamp, offset

    def lookup_before(self, files: OpenFiles, target: int) -> int | None:
        """Offset of the last entry whose timestamp is < ``target``; None if none is."""
        lo, hi = 0, self.entries
        found = None
        while lo < hi:
            mid = (lo + hi) // 2
            ts, offset = self.entry(files, mid)
            if ts < target:
                found = offset
                lo = mid + 1
            else:
                hi = mid
        return found

    def truncate_to_offset(self, files: OpenFiles, offset: int) -> None:
        """Drop the entries for ``offset`` and beyond."""
        lo, hi = 0, self.entries
        while lo < hi:
            mid = (lo + hi) // 2
            if self.entry(files, mid)[1] < offset:
                lo = mid + 1
            else:
                hi = mid
        if lo < self.entries:
            os.ftruncate(files.get(self.path), lo * ENTRY_SIZE)
            self.entries = lo
            self._reload_last(files)
