"""The sparse offset index of one queue-log segment (``<base offset>.index``), Kafka's format.

Entries are 8 bytes, big-endian: the offset relative to the segment's base offset (i32) and
the file position (i32) of a batch in the ``.log`` file. As in Kafka the offset is the last
offset of the batch(es) appended at that position; an entry is added once more than
``index.interval.bytes`` were appended since the previous one. Offsets and positions both
increase, so lookups bisect with a few 8-byte preads through the open-file cache. New entries
are written in runs (:class:`IndexFile`).
"""

from __future__ import annotations

import struct

from stonemq.storage.index_file import IndexFile, IndexView
from stonemq.storage.open_files import OpenFiles, Reads

_ENTRY = struct.Struct(">ii")
ENTRY_SIZE = _ENTRY.size


class OffsetIndex(IndexFile):
    """Offset index of the segment with base offset ``base_offset`` at ``path``."""

    __slots__ = ("last_offset",)

    def __init__(self, path: str, base_offset: int) -> None:
        super().__init__(path, base_offset, ENTRY_SIZE)
        self.last_offset = -1

    @property
    def size_bytes(self) -> int:
        return self.entries * ENTRY_SIZE

    def load(self, files: OpenFiles) -> None:
        """Read the entry count and the last entry; drop a torn partial entry."""
        self.load_file(files)
        self.last_offset = self.entry(files, self.entries - 1)[0] if self.entries else -1

    def entry(self, files: Reads, i: int) -> tuple[int, int]:
        """(absolute offset, position) of entry ``i``."""
        rel, pos = _ENTRY.unpack(self.raw_entry(files, i))
        return self.base_offset + rel, pos

    def append(self, offset: int, position: int) -> None:
        if offset <= self.last_offset:
            return
        self.add(_ENTRY.pack(offset - self.base_offset, position))
        self.last_offset = offset

    def lookup(self, files: Reads, target: int) -> tuple[int, int]:
        """(offset, position) of the last entry with offset <= ``target``; (base, 0) if none."""
        return offset_lookup(self, files, target)

    def truncate_to_position(self, files: OpenFiles, position: int) -> None:
        """Drop the entries that point at ``position`` or beyond."""
        lo, hi = 0, self.entries
        while lo < hi:
            mid = (lo + hi) // 2
            if self.entry(files, mid)[1] < position:
                lo = mid + 1
            else:
                hi = mid
        self.truncate_entries(files, lo)

    def truncate_entries(self, files: OpenFiles, count: int) -> None:
        if count < self.entries:
            self.truncate_file(files, count)
            self.last_offset = self.entry(files, count - 1)[0] if count else -1


def offset_lookup(index: OffsetIndex | IndexView, files: Reads, target: int) -> tuple[int, int]:
    """(offset, position) of the last entry of ``index`` (an offset index or a view of one)
    with offset <= ``target``; (base, 0) if none."""
    lo, hi = 0, index.entries  # invariant: entries [0, lo) are <= target
    base = index.base_offset
    found = (base, 0)
    while lo < hi:
        mid = (lo + hi) // 2
        rel, position = _ENTRY.unpack(index.raw_entry(files, mid))
        if base + rel <= target:
            found = (base + rel, position)
            lo = mid + 1
        else:
            hi = mid
    return found


def position_lookup(index: OffsetIndex | IndexView, files: Reads, position: int) -> int:
    """The position of the last entry of ``index`` at or before file position ``position``
    (a batch start, since entries point at batches); 0 if none."""
    lo, hi = 0, index.entries  # invariant: entries [0, lo) are at or before position
    found = 0
    while lo < hi:
        mid = (lo + hi) // 2
        _, at = _ENTRY.unpack(index.raw_entry(files, mid))
        if at <= position:
            found = at
            lo = mid + 1
        else:
            hi = mid
    return found
