"""One queue-log segment: the ``<base offset>.log`` file of RecordBatch v2 batches, as Kafka
stores them, with its offset index and time index.

Batches are opaque bytes here: appends parse only the 61-byte header, reads walk the batch
length fields. Files are reached through the :class:`OpenFiles` cache and never held open.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterator

from stonemq.protocol.record_batch import (
    COMPRESSION_ZSTD,
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    RecordBatchError,
    crc_ok,
    parse_header,
)
from stonemq.storage import fileio
from stonemq.storage.errors import CutBackError
from stonemq.storage.file_range import MIN_RANGE_BYTES, FileRange, open_range, warm
from stonemq.storage.index_file import IndexView, IndexWrite
from stonemq.storage.offset_index import OffsetIndex, offset_lookup, position_lookup
from stonemq.storage.open_files import OpenFiles, Reads
from stonemq.storage.page_cache import RECOVERY_READ_BYTES, drop_consumed
from stonemq.storage.time_index import TimeIndex, last_time_entry

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"

_LENGTH = struct.Struct(">i")
_SCAN_CHUNK_BYTES = 64 * 1024
READ_AHEAD_BYTES = 4 * 1024 * 1024  # asked of the kernel after each fetch read


def segment_file(directory: str, base_offset: int, suffix: str) -> str:
    return os.path.join(directory, f"{base_offset:020d}{suffix}")


class _BatchReads:
    """The reads a segment and a view of one share: batches of ``log_path`` up to ``size``,
    found through ``offset_index``."""

    __slots__ = ()
    log_path: str
    size: int
    offset_index: OffsetIndex | IndexView

    def read(self, files: Reads, pos: int, n: int) -> bytes:
        return files.pread(self.log_path, n, pos)

    def iter_headers(
        self, files: Reads, start: int = 0, end: int | None = None, read_once: bool = False
    ) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of each batch from ``start`` (a batch boundary) to ``end``;
        ``read_once`` drops the pages read from the page cache behind it (recovery)."""
        stop = self.size if end is None else min(end, self.size)
        pos = start
        while stop - pos >= HEADER_SIZE:
            chunk = files.pread(self.log_path, min(_SCAN_CHUNK_BYTES, stop - pos), pos)
            at = 0
            while len(chunk) - at >= HEADER_SIZE:
                header = parse_header(chunk, at)
                yield pos + at, header
                at += header.size
            if read_once and at:
                drop_consumed(files.get(self.log_path), pos, at)  # recovery: one thread
            if at == 0:
                return
            pos += at

    def find_batch(self, files: Reads, offset: int) -> tuple[int, BatchHeader] | None:
        """(position, header) of the first batch whose last offset is >= ``offset``; None if
        the segment holds none whole (the read goes on in the next segment, as Kafka's
        ``LocalLog.read``: a sealed segment that lost its tail on disk skips the offsets it
        lost instead of answering the torn batch's first bytes, for ever)."""
        _, start = offset_lookup(self.offset_index, files, offset)
        for pos, header in self.iter_headers(files, start):
            if header.last_offset >= offset:
                return (pos, header) if pos + header.size <= self.size else None
        return None

    def read_batches(self, files: Reads, pos: int, max_bytes: int) -> bytes | memoryview:
        """Whole batches from ``pos`` up to ``max_bytes``, at least one batch (a view of the
        read, not a copy, when a partial batch at its end is left out). A consumer
        catching up reads on from where this read ends: the kernel is asked to start reading
        the next ``READ_AHEAD_BYTES`` now (asynchronously), so the next fetch finds them in
        the page cache instead of waiting for the disk on the event loop."""
        data = files.pread(self.log_path, min(max(max_bytes, HEADER_SIZE), self.size - pos), pos)
        n = len(data)
        files.hint(self.log_path, pos + n, min(READ_AHEAD_BYTES, self.size - pos - n))
        at = 0
        while n - at >= LOG_OVERHEAD:
            size = _LENGTH.unpack_from(data, at + 8)[0] + LOG_OVERHEAD
            if at + size > n:
                break
            at += size
        if at == 0 and n >= LOG_OVERHEAD:  # the first batch alone is bigger than max_bytes
            size = _LENGTH.unpack_from(data, 8)[0] + LOG_OVERHEAD
            return files.pread(self.log_path, size, pos)
        return data if at == n else memoryview(data)[:at]

    def read_range(
        self, files: Reads, pos: int, first: BatchHeader, max_bytes: int, every_batch: bool
    ) -> bytes | memoryview | FileRange:
        """:meth:`read_batches` as a :class:`FileRange` to send with ``sendfile`` (in a disk-
        read thread; the range is read into the page cache first): the same whole batches
        from ``pos`` (the batch ``first``), found without reading them into Python: the
        offset index gives the last batch start within ``max_bytes`` and only the headers
        from there are read. ``every_batch`` reads every header instead, so the range knows
        whether any batch is zstd-compressed (a fetch before v10). A range shorter than
        ``MIN_RANGE_BYTES``, or one past ``MAX_OPEN_RANGES``, is read as bytes."""
        limit = min(pos + max(max_bytes, first.size), self.size)
        end = pos + first.size
        zstd = first.compression == COMPRESSION_ZSTD
        if end < limit:
            start = end
            if not every_batch:
                start = end = max(end, position_lookup(self.offset_index, files, limit))
            for at, header in self.iter_headers(files, start, limit):
                if at + header.size > limit:
                    break
                end = at + header.size
                zstd = zstd or header.compression == COMPRESSION_ZSTD
        length = end - pos
        if length < MIN_RANGE_BYTES:
            return files.pread(self.log_path, length, pos)
        found = open_range(self.log_path, pos, length, zstd)
        if found is None:
            return self.read_batches(files, pos, max_bytes)
        warm(found)
        files.hint(self.log_path, end, min(READ_AHEAD_BYTES, self.size - end))
        return found


class SegmentView(_BatchReads):
    """A segment as it was when taken (:meth:`Segment.view`, on the event loop), for reads
    in a thread: its size and index entries then. The loop goes on appending, indexing and
    deleting; bytes below a published size never change, and a deleted file makes a read
    raise FileNotFoundError (the caller takes a new view)."""

    __slots__ = (
        "base_offset",
        "log_path",
        "max_timestamp",
        "max_timestamp_offset",
        "offset_index",
        "size",
        "time_index",
    )

    def __init__(self, seg: Segment) -> None:
        self.base_offset = seg.base_offset
        self.log_path = seg.log_path
        self.size = seg.size
        self.offset_index = seg.offset_index.view()
        self.time_index = seg.time_index.view()
        self.max_timestamp = seg.max_timestamp
        self.max_timestamp_offset = seg.max_timestamp_offset

    def max_time(self, files: Reads) -> tuple[int, int]:
        """(max timestamp, its batch's base offset): known, or the time index's last entry
        (written when a segment loaded from disk was sealed)."""
        if self.max_timestamp is None:
            return last_time_entry(self.time_index, files)
        return self.max_timestamp, self.max_timestamp_offset


class Segment(_BatchReads):
    """A ``.log`` file plus its indexes; ``size`` is the bytes of whole batches in it."""

    __slots__ = (
        "_offset_index",
        "_time_index",
        "base_offset",
        "bytes_since_index",
        "first_timestamp",
        "log_path",
        "max_timestamp",
        "max_timestamp_offset",
        "size",
    )

    def __init__(self, directory: str, base_offset: int) -> None:
        self.base_offset = base_offset
        self.log_path = segment_file(directory, base_offset, LOG_SUFFIX)
        # the index objects come with their first use: a partition written once and left
        # idle (100,000 of them) never needs them in memory
        self._offset_index: OffsetIndex | None = None
        self._time_index: TimeIndex | None = None
        self.size = 0
        self.bytes_since_index = 0
        # (max timestamp, base offset of the first batch with it); None until computed for a
        # segment loaded from disk
        self.max_timestamp: int | None = -1
        self.max_timestamp_offset = -1
        self.first_timestamp: int | None = None  # max timestamp of the first batch (segment.ms)

    def _sibling(self, suffix: str) -> str:
        return self.log_path[: -len(LOG_SUFFIX)] + suffix

    @property
    def offset_index(self) -> OffsetIndex:
        index = self._offset_index
        if index is None:
            index = self._offset_index = OffsetIndex(self._sibling(INDEX_SUFFIX), self.base_offset)
        return index

    @property
    def time_index(self) -> TimeIndex:
        index = self._time_index
        if index is None:
            index = self._time_index = TimeIndex(self._sibling(TIME_INDEX_SUFFIX), self.base_offset)
        return index

    @property
    def offset_index_entries(self) -> int:
        return self._offset_index.entries if self._offset_index is not None else 0

    @property
    def time_index_entries(self) -> int:
        return self._time_index.entries if self._time_index is not None else 0

    @property
    def paths(self) -> tuple[str, str, str]:
        return self.log_path, self._sibling(INDEX_SUFFIX), self._sibling(TIME_INDEX_SUFFIX)

    # -- write ----------------------------------------------------------------------------
    def write(self, files: OpenFiles, buffers: list[memoryview], pos: int) -> None:
        """Write ``buffers`` (whole batches) back to back at ``pos``, in whatever thread
        calls it; on a failure the file is cut back to ``pos`` (no partial batch left
        behind: ENOSPC, EIO) and the error raised (:class:`CutBackError` if the cut failed).
        Changes no field: the caller publishes the batches (``track``) once written."""
        try:
            files.pwrite_all(self.log_path, buffers, pos)
        except OSError as exc:
            try:
                files.ftruncate(self.log_path, pos)
            except OSError as cut:
                raise CutBackError(cut.errno, f"{self.log_path}: {exc}; cut back: {cut}") from exc
            raise

    def append(
        self, files: OpenFiles, batch: memoryview, header: BatchHeader, index_interval_bytes: int
    ) -> None:
        """Write one whole batch at the end and track it, in this thread (a failed write
        leaves ``size`` unchanged)."""
        pos = self.size
        self.write(files, [batch], pos)
        self.size = pos + len(batch)
        self.track(header, pos, index_interval_bytes)

    def track(self, header: BatchHeader, pos: int, index_interval_bytes: int) -> None:
        """Index bookkeeping for the batch at ``pos`` (appends and recovery); entries are
        pending in memory until a write takes them (``index_writes``)."""
        if self.first_timestamp is None:
            self.first_timestamp = header.max_timestamp
        if self.max_timestamp is not None and header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
            self.max_timestamp_offset = header.base_offset
        if self.bytes_since_index > index_interval_bytes:
            self.offset_index.append(header.last_offset, pos)
            if self.max_timestamp is not None:
                self.time_index.maybe_append(self.max_timestamp, self.max_timestamp_offset)
            self.bytes_since_index = 0
        self.bytes_since_index += header.size

    def seal(self) -> None:
        """The segment stops being active: record its max timestamp in the time index (the
        entries still pending are written by the next flush, before it fsyncs the files)."""
        if self.max_timestamp is not None and self.max_timestamp >= 0:
            self.time_index.maybe_append(self.max_timestamp, self.max_timestamp_offset)

    def index_writes(self, due_only: bool = False) -> list[IndexWrite]:
        """The pending index entries as writes for a thread (``due_only``: only an index
        whose pending entries reached ``PENDING_BYTES``)."""
        jobs = []
        for index in (self._offset_index, self._time_index):
            if index is not None and (index.write_due or not due_only):
                job = index.take_pending()
                if job is not None:
                    jobs.append(job)
        return jobs

    def write_index_entries(self, files: OpenFiles) -> None:
        """Write the index entries gathered in memory, in this thread (recovery, a clean
        stop and tests; the running broker uses ``index_writes``)."""
        if self._offset_index is not None:
            self._offset_index.write_pending(files)
        if self._time_index is not None:
            self._time_index.write_pending(files)

    def view(self) -> SegmentView:
        """This segment as of now, for a read in a thread."""
        return SegmentView(self)

    def ensure_max_timestamp(self, files: OpenFiles) -> tuple[int, int]:
        """(max timestamp, its batch's base offset); from the time index for a sealed segment
        loaded from disk (its last entry was written when it was sealed)."""
        if self.max_timestamp is None:
            self.time_index.load(files)
            self.max_timestamp = self.time_index.last_timestamp
            self.max_timestamp_offset = self.time_index.last_offset
        return self.max_timestamp, self.max_timestamp_offset

    # -- recovery -------------------------------------------------------------------------
    def load_counts(self) -> None:
        """Index entry counts from the file sizes (no open); for trusted, sealed segments."""
        self.offset_index.count_from_file()
        self.time_index.count_from_file()
        self.max_timestamp = None  # computed on demand

    def restore(self, files: OpenFiles, trusted: int, next_offset: int) -> None:
        """Trust the first ``trusted`` bytes: cut index entries past them and recompute the
        in-memory stats from the indexes and the batches after the last index entry."""
        self.offset_index.load(files)
        self.time_index.load(files)
        self.offset_index.truncate_to_position(files, trusted)
        self.time_index.truncate_to_offset(files, next_offset)
        self.max_timestamp = self.time_index.last_timestamp
        self.max_timestamp_offset = self.time_index.last_offset
        start = 0
        if self.offset_index.entries:
            start = self.offset_index.entry(files, self.offset_index.entries - 1)[1]
        self.size = trusted
        self.first_timestamp = None
        if trusted >= HEADER_SIZE:
            self.first_timestamp = parse_header(self.read(files, 0, HEADER_SIZE)).max_timestamp
        for _, header in self.iter_headers(files, start, trusted):
            if header.max_timestamp > self.max_timestamp:
                self.max_timestamp = header.max_timestamp
                self.max_timestamp_offset = header.base_offset
        self.bytes_since_index = trusted - start

    def recover_tail(
        self, files: OpenFiles, start: int, next_offset: int, index_interval_bytes: int
    ) -> tuple[int, int]:
        """Validate the batches from ``start`` (CRC, magic, offsets not going backwards),
        re-index them and cut the file at the first bad one. Returns (next offset, bytes cut)."""
        fd = files.get(self.log_path)  # recovery: one thread
        file_size = os.fstat(fd).st_size
        pos = start
        while pos < file_size:
            chunk = fileio.pread(fd, min(RECOVERY_READ_BYTES, file_size - pos), pos)
            at = 0
            while len(chunk) - at >= HEADER_SIZE:
                try:
                    header = parse_header(chunk, at)
                except RecordBatchError:
                    break
                if at + header.size > len(chunk):
                    if at == 0 and pos + header.size <= file_size:
                        chunk = fileio.pread(fd, header.size, pos)  # one batch bigger than a chunk
                        continue
                    break
                if header.base_offset < next_offset or not crc_ok(chunk, at, header):
                    break
                self.size = pos + at + header.size
                self.track(header, pos + at, index_interval_bytes)
                next_offset = header.next_offset
                at += header.size
            drop_consumed(fd, pos, at)  # validated: read once (page_cache.py)
            if pos + at == self.size and at > 0 and pos + at < file_size:
                pos += at
                continue
            break
        cut = file_size - self.size
        if cut:
            fileio.ftruncate(fd, self.size)
        return next_offset, cut
