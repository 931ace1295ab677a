"""The time index of one queue-log segment (``<base offset>.timeindex``), Kafka's format.

Entries are 12 bytes, big-endian: a timestamp (i64) and an offset relative to the segment's
base offset (i32). An entry is added, at the offset index's cadence and when the segment is
sealed, only when the segment's max timestamp grew: timestamps and offsets both increase. The
offset is the base offset of the first batch that reached that timestamp, so every batch
before it has a smaller max timestamp. New entries are written in runs (:class:`IndexFile`).
"""

from __future__ import annotations

import struct

from stonemq.storage.index_file import IndexFile, IndexView
from stonemq.storage.open_files import OpenFiles, Reads

_ENTRY = struct.Struct(">qi")
ENTRY_SIZE = _ENTRY.size


class TimeIndex(IndexFile):
    """Time index of the segment with base offset ``base_offset`` at ``path``."""

    __slots__ = ("last_offset", "last_timestamp")

    def __init__(self, path: str, base_offset: int) -> None:
        super().__init__(path, base_offset, ENTRY_SIZE)
        self.last_timestamp = -1
        self.last_offset = -1

    def load(self, files: OpenFiles) -> None:
        self.load_file(files)
        self._reload_last(files)

    def _reload_last(self, files: OpenFiles) -> None:
        if self.entries:
            self.last_timestamp, self.last_offset = self.entry(files, self.entries - 1)
        else:
            self.last_timestamp, self.last_offset = -1, -1

    def entry(self, files: OpenFiles, i: int) -> tuple[int, int]:
        """(timestamp, absolute offset) of entry ``i``."""
        ts, rel = _ENTRY.unpack(self.raw_entry(files, i))
        return ts, self.base_offset + rel

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Add (timestamp, offset) if ``timestamp`` is larger than the last entry's."""
        if timestamp <= self.last_timestamp or offset < self.last_offset:
            return
        self.add(_ENTRY.pack(timestamp, offset - self.base_offset))
        self.last_timestamp, self.last_offset = timestamp, offset

    def lookup_before(self, files: Reads, target: int) -> int | None:
        """Offset of the last entry whose timestamp is < ``target``; None if none is."""
        return time_lookup_before(self, files, target)

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
            self.truncate_file(files, lo)
            self._reload_last(files)


def time_lookup_before(index: TimeIndex | IndexView, files: Reads, target: int) -> int | None:
    """Offset of the last entry of ``index`` (a time index or a view of one) whose timestamp
    is < ``target``; None if none is."""
    lo, hi = 0, index.entries
    found = None
    while lo < hi:
        mid = (lo + hi) // 2
        ts, rel = _ENTRY.unpack(index.raw_entry(files, mid))
        if ts < target:
            found = index.base_offset + rel
            lo = mid + 1
        else:
            hi = mid
    return found


def last_time_entry(index: TimeIndex | IndexView, files: Reads) -> tuple[int, int]:
    """(timestamp, offset) of the last entry; (-1, -1) when there is none."""
    if not index.entries:
        return -1, -1
    ts, rel = _ENTRY.unpack(index.raw_entry(files, index.entries - 1))
    return ts, index.base_offset + rel
