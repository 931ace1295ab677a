"""The QueueLog: one topic partition's Kafka-layout log on the read directory.

``<queue_dir>/<topic>-<partition>/`` holds segments ``<base offset>.log`` with their ``.index``
and ``.timeindex``. Only the Splitter appends (batches that are already in the journal), so
everything in a QueueLog is split and may be served: its next offset is the high watermark.
A QueueLog holds a few small fields and its segment list; files are opened through the
:class:`OpenFiles` cache on use.

Appends come in three steps so that no write waits on the event loop (:class:`SplitWrite`):
``stage`` (loop) places batches after the log end, deciding rolls, and changes nothing a
reader sees; ``SplitWrite.write`` (the splitter's thread) writes them, one ``pwritev`` per
segment touched, plus index entries that are due; ``publish`` (loop) makes the written ones
visible: segment sizes, index entries, rolls, producer state and the log end. Only the
splitter stages, one step at a time, so a staged write always starts at the published end.
"""

from __future__ import annotations

import base64
import bisect
import contextlib
import logging
import operator
import os
import time
from typing import TYPE_CHECKING

from stonemq.protocol.record_batch import (
    LOG_OVERHEAD,
    TIMESTAMP_LOG_APPEND_TIME,
    BatchHeader,
    RecordBatchError,
    iter_records,
    parse_header,
)
from stonemq.storage import fileio
from stonemq.storage.checkpoint import QueueRecoveryPoint
from stonemq.storage.errors import StorageError
from stonemq.storage.file_range import FileRange
from stonemq.storage.index_file import IndexWrite
from stonemq.storage.offset_index import offset_lookup
from stonemq.storage.open_files import OpenFiles, Reads
from stonemq.storage.page_cache import WrittenPages
from stonemq.storage.producer_state import ProducerState, load_snapshot
from stonemq.storage.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    Segment,
    SegmentView,
    segment_file,
)
from stonemq.storage.time_index import time_lookup_before

if TYPE_CHECKING:
    from stonemq.storage.engine import LogConfig  # engine imports this module

log = logging.getLogger(__name__)

_base = operator.attrgetter("base_offset")
_MAX_RELATIVE_OFFSET = (1 << 31) - 1
MAX_SEGMENT_BYTES = 2**31 - 1
"""A segment never grows past this, whatever ``segment_bytes`` says: its offset index holds
4-byte positions (``offset_index.py``), as Kafka's, whose ``segment.bytes`` is an INT."""


def first_record_at(
    batch: bytes, timestamp_ms: int, log_start: int, exact: bool = False
) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record of ``batch`` at or after ``log_start`` whose
    timestamp is >= ``timestamp_ms`` (== with ``exact``); decodes the records (bounded
    decompression), so it runs in a thread. A LogAppendTime batch's records all carry its
    max timestamp. Raises StorageError for records that cannot be decoded."""
    header = parse_header(batch)
    if header.timestamp_type == TIMESTAMP_LOG_APPEND_TIME:
        return max(header.base_offset, log_start), header.max_timestamp
    try:
        for record in iter_records(batch):
            if record.offset < log_start:
                continue
            if record.timestamp == timestamp_ms or (not exact and record.timestamp > timestamp_ms):
                return record.offset, record.timestamp
    except RecordBatchError as exc:
        raise StorageError(f"batch at {header.base_offset} cannot be decoded: {exc}") from exc
    return None


def read_views(
    views: list[SegmentView], offset: int, max_bytes: int, files: Reads
) -> bytes | memoryview:
    """:meth:`QueueLog.read` over views (in a thread; a deleted segment raises
    FileNotFoundError and the caller takes new views)."""
    for view in views:
        found = view.find_batch(files, offset)
        if found is not None:
            return view.read_batches(files, found[0], max_bytes)
    return b""


def read_range_views(
    views: list[SegmentView], offset: int, max_bytes: int, every_batch: bool, files: Reads
) -> bytes | memoryview | FileRange:
    """:func:`read_views` as a :class:`FileRange` to send with ``sendfile`` where it can be
    (``SegmentView.read_range``), in a thread."""
    for view in views:
        found = view.find_batch(files, offset)
        if found is not None:
            return view.read_range(files, found[0], found[1], max_bytes, every_batch)
    return b""


def epoch_search(
    views: list[SegmentView], epoch: int, log_end: int, log_start: int, files: Reads
) -> tuple[int, int]:
    """OffsetForLeaderEpoch over one topic partition's batches from ``log_start`` (in a
    thread): the largest partition leader epoch <= ``epoch`` among them and where it ends
    (the base offset of the first batch of a higher epoch, else ``log_end``), as Kafka's
    follower-built ``LeaderEpochFileCache`` answers; ``epoch`` below every batch's answers
    itself with where the first one starts (never below ``log_start``: Kafka's cache drops
    what DeleteRecords and retention removed and starts its first epoch at the log start);
    no batch at all, ``(epoch, log_end)``. Batch epochs never fall along a log, so segments
    are scanned newest first, back to the first whose first live batch is of an epoch <=
    ``epoch``."""
    following = log_end  # where the earliest batch known with an epoch above starts
    for view in reversed(views):
        headers = (h for _, h in view.iter_headers(files) if h.last_offset >= log_start)
        first = next(headers, None)
        if first is None:
            continue
        if first.partition_leader_epoch > epoch:
            following = max(first.base_offset, log_start)
            continue
        found = first.partition_leader_epoch
        for header in headers:
            if header.partition_leader_epoch > epoch:
                return found, header.base_offset
            found = header.partition_leader_epoch
        return found, following
    return epoch, following


def epoch_at(views: list[SegmentView], offset: int, files: Reads) -> int:
    """The partition leader epoch of the batch holding ``offset`` (in a thread); -1 when no
    batch holds it or the batch has none (Kafka's ``epochForOffset`` finding no entry)."""
    for view in views:
        found = view.find_batch(files, offset)
        if found is not None:
            header = found[1]
            if header.base_offset > offset or header.partition_leader_epoch < 0:
                return -1
            return header.partition_leader_epoch
    return -1


def time_search(
    views: list[SegmentView], timestamp_ms: int, log_start: int, files: Reads
) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record at or after ``log_start`` whose timestamp is
    >= ``timestamp_ms`` (ListOffsets by time), in a thread: segments whose max timestamp is
    below it are skipped, the time and offset indexes place the scan, and the candidate
    batches' records are decoded (bounded). None when there is none."""
    for view in views:
        max_ts, _ = view.max_time(files)
        if max_ts < timestamp_ms:
            continue
        before = time_lookup_before(view.time_index, files, timestamp_ms)
        _, start = offset_lookup(
            view.offset_index, files, view.base_offset - 1 if before is None else before - 1
        )
        for pos, header in view.iter_headers(files, start):
            if header.max_timestamp < timestamp_ms or header.last_offset < log_start:
                continue
            found = first_record_at(view.read(files, pos, header.size), timestamp_ms, log_start)
            if found is not None:
                return found
    return None


def max_time_search(
    views: list[SegmentView], log_start: int, files: Reads
) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record at or after ``log_start`` with the largest
    timestamp (ListOffsets MAX_TIMESTAMP), in a thread; None when the log is empty. Always a
    pair some live record holds: the batch the log start cuts counts only its records from
    there (Kafka, which ignores the log start here, may answer a deleted record)."""
    best: tuple[int, int, SegmentView] | None = None
    for i, view in enumerate(views):
        if i == 0 and log_start > view.base_offset:  # only its batches from the log start
            ts, offset = _max_batch_from(view, log_start, files)
        else:
            ts, offset = view.max_time(files)
        if ts >= 0 and (best is None or ts > best[0]):
            best = (ts, offset, view)
    if best is None:
        return None
    ts, offset, view = best
    found = view.find_batch(files, offset)
    if found is None:
        return None
    pos, header = found
    record = first_record_at(view.read(files, pos, header.size), ts, log_start, True)
    return record if record is not None else (max(header.base_offset, log_start), ts)


def _max_batch_from(view: SegmentView, offset: int, files: Reads) -> tuple[int, int]:
    """(max timestamp, its batch's base offset) over ``view``'s records at or after
    ``offset``; (-1, -1) when there are none. The batch that ``offset`` cuts is decoded for
    its live records' largest timestamp (its header's may be a deleted record's)."""
    best = (-1, -1)
    _, start = offset_lookup(view.offset_index, files, offset)
    for pos, header in view.iter_headers(files, start):
        if header.last_offset < offset or header.max_timestamp <= best[0]:
            continue
        ts = header.max_timestamp
        if header.base_offset < offset and header.timestamp_type != TIMESTAMP_LOG_APPEND_TIME:
            ts = _live_max_timestamp(view.read(files, pos, header.size), offset)
        if ts > best[0]:
            best = (ts, header.base_offset)
    return best


def _live_max_timestamp(batch: bytes, log_start: int) -> int:
    """The largest timestamp among ``batch``'s records at or after ``log_start`` (-1: none);
    decodes the records (bounded decompression), so it runs in a thread."""
    try:
        return max(
            (record.timestamp for record in iter_records(batch) if record.offset >= log_start),
            default=-1,
        )
    except RecordBatchError as exc:
        header = parse_header(batch)
        raise StorageError(f"batch at {header.base_offset} cannot be decoded: {exc}") from exc


class _Run:
    """Batches staged back to back in one segment (one ``pwritev``)."""

    __slots__ = ("batches", "buffers", "created_ms", "new_segment", "pos", "segment")

    def __init__(self, segment: Segment, pos: int, new_segment: bool) -> None:
        self.segment = segment
        self.pos = pos
        self.new_segment = new_segment  # the run starts the segment (a roll, or the first)
        self.created_ms = int(time.time() * 1000) if new_segment else 0
        self.buffers: list[memoryview] = []
        self.batches: list[tuple[BatchHeader, int]] = []  # (header, journal position)


class SplitWrite:
    """One queue log's share of a split step: staged on the loop (``QueueLog.stage``),
    written by :meth:`write` in the splitter's thread, published on the loop
    (``QueueLog.publish``). Runs are written in order and stop at the first failure: the
    runs before it are published, the rest are staged again by the next attempt."""

    __slots__ = (
        "active",
        "created_ms",
        "done_runs",
        "error",
        "first_timestamp",
        "index_jobs",
        "make_dir",
        "next_offset",
        "queue",
        "runs",
        "size",
        "staged_in_active",
    )

    def __init__(self, queue: QueueLog) -> None:
        self.queue = queue
        segments = queue.segments
        self.active: Segment | None = segments[-1] if segments else None
        self.size = self.active.size if self.active is not None else 0
        self.next_offset = queue.next_offset
        self.first_timestamp = self.active.first_timestamp if self.active is not None else None
        self.created_ms = queue.created_ms
        self.staged_in_active = 0
        self.runs: list[_Run] = []
        # the due index entries (``take_index_writes``); almost always none: a shared tuple
        self.index_jobs: list[IndexWrite] | tuple[()] = ()
        self.make_dir = not segments
        self.done_runs = 0
        self.error: OSError | None = None

    def start_segment(self, segment: Segment) -> None:
        run = _Run(segment, 0, True)
        self.runs.append(run)
        self.active = segment
        self.size = 0
        self.first_timestamp = None
        self.created_ms = run.created_ms
        self.staged_in_active = 0

    def add(self, batch: memoryview, header: BatchHeader, journal_position: int) -> None:
        runs = self.runs
        if not runs or runs[-1].segment is not self.active:
            assert self.active is not None
            runs.append(_Run(self.active, self.size, False))
        run = runs[-1]
        run.buffers.append(batch)
        run.batches.append((header, journal_position))
        self.size += header.batch_length + LOG_OVERHEAD  # header.size, without its property
        self.next_offset = header.base_offset + header.last_offset_delta + 1
        self.staged_in_active += 1
        if self.first_timestamp is None:
            self.first_timestamp = header.max_timestamp

    def take_index_writes(self) -> None:
        """Before the write leaves the loop: the active segment's index entries that are due
        go with it (written in the same thread visit)."""
        segments = self.queue.segments
        if segments:
            jobs = segments[-1].index_writes(due_only=True)
            if jobs:
                self.index_jobs = jobs

    def write(self) -> None:
        """Thread side: the directory if new, the runs in order, the index entries. Never
        raises: a failed run's error is kept in ``error``, the runs before it count."""
        files = self.queue.files
        try:
            if self.make_dir and not os.path.isdir(self.queue.directory):
                fileio.makedirs(self.queue.directory)
                if self.queue.topic_id is not None:
                    write_partition_metadata(self.queue.directory, self.queue.topic_id)
            for run in self.runs:
                run.segment.write(files, run.buffers, run.pos)
                self.done_runs += 1
        except OSError as exc:
            self.error = exc
        for job in self.index_jobs:
            job.run(files)


def queue_log_dir(queue_dir: str, topic: str, partition: int) -> str:
    return os.path.join(queue_dir, f"{topic}-{partition}")


def queue_log_names(queue_dir: str) -> list[str]:
    """The queue-log directories (``<topic>-<partition>``) under ``queue_dir``, sorted; none
    when it does not exist."""
    try:
        names = os.listdir(queue_dir)
    except FileNotFoundError:
        return []
    return sorted(
        name
        for name in names
        if "-" in name
        and name.rpartition("-")[2].isdigit()  # a partition number after the last dash
        and os.path.isdir(os.path.join(queue_dir, name))
    )


_CREATE_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)

_METADATA_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
PARTITION_METADATA_FILE = "partition.metadata"
"""Kafka's file of that name: the id of the topic whose data the directory holds, written when
the directory is made. A topic deleted and created again under the same name while a broker
was down has a new id: that broker's recovery then sets the old data aside instead of taking
it for the new topic's (``StorageEngine._set_aside_strays``)."""


def topic_id_text(topic_id: bytes) -> str:
    """A topic id as Kafka writes it (``Uuid.toString``: URL-safe base64, no padding)."""
    return base64.urlsafe_b64encode(topic_id).rstrip(b"=").decode()


def write_partition_metadata(directory: str, topic_id: bytes) -> None:
    """Write ``partition.metadata`` in a directory just made (not fsynced: lost to a crash,
    the directory reads as one made before the file existed, which is kept)."""
    text = f"version: 0\ntopic_id: {topic_id_text(topic_id)}\n".encode()
    path = os.path.join(directory, PARTITION_METADATA_FILE)
    fd = fileio.open(path, _METADATA_FLAGS, 0o644)
    try:
        fileio.pwrite_all(fd, [text], 0)
    finally:
        fileio.close(fd)


def read_partition_metadata(directory: str) -> bytes | None:
    """The topic id a directory's ``partition.metadata`` names; None when it has none (made
    by a StoneMQ before this file, or cut short by a crash) or it cannot be read as one."""
    try:
        with open(os.path.join(directory, PARTITION_METADATA_FILE), "rb") as f:
            text = f.read(256)
    except FileNotFoundError:
        return None
    for line in text.decode(errors="replace").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "topic_id":
            value = value.strip()
            try:
                raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
            except ValueError:
                return None
            return raw if len(raw) == 16 else None
    return None


def create_queue_log_dir(directory: str, topic_id: bytes) -> None:
    """Make a new partition's directory, its ``partition.metadata`` and an empty first
    segment file (base offset 0) ahead of the first batch; its indexes come with their first
    entry. Idempotent; never truncates. Not fsynced: an empty directory lost to a crash costs
    nothing, and the first flush after the first batch fsyncs the directory entries
    (``QueueLog.new_files``)."""
    if not os.path.isdir(directory):
        fileio.makedirs(directory)
        write_partition_metadata(directory, topic_id)
    fileio.close(fileio.open(segment_file(directory, 0, LOG_SUFFIX), _CREATE_FLAGS, 0o644))


class QueueLog:
    """Segments of one topic partition, appended by the Splitter, read by fetches."""

    __slots__ = (
        "config",
        "created_ms",
        "doomed",
        "failed",
        "files",
        "first_unflushed_journal_position",
        "journal_partition",
        "last_journal_position",
        "log_start",
        "new_files",
        "next_offset",
        "pages",
        "partition",
        "producers",
        "removed",
        "root",
        "segments",
        "snapshot_due",
        "to_create",
        "topic",
        "topic_id",
        "unflushed",
        "writing",
    )

    def __init__(
        self,
        queue_dir: str,
        topic: str,
        partition: int,
        journal_partition: int,
        config: LogConfig,
        files: OpenFiles,
        pages: WrittenPages | None = None,
        topic_id: bytes | None = None,
    ) -> None:
        # the read directory (one string shared by every queue log): its own directory's
        # path is made when needed (``directory``), not held by each of 100,000 queue logs
        self.root = queue_dir
        self.topic = topic
        # written in partition.metadata when its directory is made (None: no such file)
        self.topic_id = topic_id
        self.partition = partition
        self.journal_partition = journal_partition
        self.config = config  # a LogConfig: segment_bytes, segment_ms, index_interval_bytes...
        self.files = files
        self.pages = pages  # the write-behind window appends are noted in (page_cache.py)
        self.segments: list[Segment] = []
        self.next_offset = 0
        self.log_start = 0  # raised by retention and DeleteRecords; see log_start_offset
        self.created_ms = 0  # when the active segment was created (segment.ms fallback)
        self.last_journal_position = -1  # journal position of the last entry split in
        # journal position of the first entry split in since the last flush; None when clean
        self.first_unflushed_journal_position: int | None = None
        # segments sealed since the last flush; the three lists below are almost always
        # empty, and share one empty tuple then (a list each cost 56 bytes per partition)
        self.unflushed: list[Segment] | tuple[()] = ()
        self.new_files = False  # a segment was created since the last flush: fsync the dir
        # set when a write, fsync or write-back of its files failed (health.py): its bytes
        # are no longer known good, so reads answer with this error until a restart
        self.failed: Exception | None = None
        self.doomed: list[str] | tuple[()] = ()  # files of dropped segments, to unlink
        # a new empty segment's file, created before the unlinks
        self.to_create: list[str] | tuple[()] = ()
        # idempotent producers of the batches held here, and pending ones (producer_state.py)
        self.producers: ProducerState | None = None
        self.snapshot_due: tuple[int, bytes] | None = None  # (offset, bytes) taken at a roll
        self.writing = False  # a staged write is in flight: retention does not roll it
        self.removed = False  # its partition was deleted: a late write's error is moot

    # -- state ----------------------------------------------------------------------------
    @property
    def directory(self) -> str:
        """``<queue dir>/<topic>-<partition>``."""
        return queue_log_dir(self.root, self.topic, self.partition)

    @property
    def dirty(self) -> bool:
        return self.first_unflushed_journal_position is not None or bool(self.unflushed)

    @property
    def log_start_offset(self) -> int:
        """The first offset a fetch may ask for: the stored log start, never below the first
        segment's base offset nor above the log end."""
        if not self.segments:
            return self.next_offset
        return min(max(self.log_start, self.segments[0].base_offset), self.next_offset)

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def recovery_point(self) -> QueueRecoveryPoint:
        active = self.segments[-1] if self.segments else None
        return QueueRecoveryPoint(
            self.next_offset,
            active.base_offset if active else self.next_offset,
            active.size if active else 0,
            self.journal_partition,
            self.last_journal_position,
        )

    def flush_targets(self) -> tuple[list[str], list[IndexWrite]]:
        """Files to fsync for a flush (sealed-since-last-flush segments' and the active
        segment's) and the index entries pending in memory for them, which the flush thread
        writes before it fsyncs, so the fsync covers them."""
        paths = [path for seg in self.unflushed for path in seg.paths]
        jobs = [job for seg in self.unflushed for job in seg.index_writes()]
        if self.segments:
            active = self.segments[-1]
            jobs.extend(active.index_writes())
            paths.extend(active.paths)
        if self.new_files:
            # the new segments' directory entries (and this directory's own, once)
            paths.append(self.directory)
            if len(self.segments) == 1:
                paths.append(self.root)
        return paths, jobs

    def paths_from(self, segment_base: int) -> list[str]:
        """Files of the segments from the one at ``segment_base`` on (all if it is gone)."""
        if not any(seg.base_offset == segment_base for seg in self.segments):
            segment_base = -1
        return [p for seg in self.segments if seg.base_offset >= segment_base for p in seg.paths]

    def mark_flushing(self) -> None:
        """A flush has taken the current state; later appends make the log dirty again."""
        self.first_unflushed_journal_position = None
        self.unflushed = ()
        self.new_files = False

    # -- write ----------------------------------------------------------------------------
    def stage(self, write: SplitWrite, batch: memoryview, journal_position: int) -> bool:
        """Place one batch from the journal entry at ``journal_position`` in ``write`` (on
        the loop; nothing a reader sees changes). Returns False when the log already holds
        its offsets: re-splitting is a no-op."""
        header = parse_header(batch)
        end = write.next_offset
        if header.base_offset < end and (write.active is not None or header.next_offset <= end):
            return False  # held already (an empty log takes a batch holding its log start)
        if header.base_offset > end and write.active is not None:
            log.warning(
                "%s-%d: offsets %d..%d missing before split batch at %d",
                self.topic,
                self.partition,
                end,
                header.base_offset - 1,
                header.base_offset,
            )
        if write.active is None or self._should_roll(write, header):
            write.start_segment(Segment(self.directory, header.base_offset))
        write.add(batch, header, journal_position)
        return True

    def _should_roll(self, write: SplitWrite, header: BatchHeader) -> bool:
        size = write.size
        if size == 0:
            return False
        seg = write.active
        assert seg is not None
        config = self.config
        if size + header.size > min(config.segment_bytes, MAX_SEGMENT_BYTES):
            return True
        if header.last_offset - seg.base_offset > _MAX_RELATIVE_OFFSET:
            return True
        # each batch staged since may add one entry to each index when published
        index_bytes = config.segment_index_bytes
        staged = write.staged_in_active
        if (seg.offset_index_entries + staged + 1) * 8 > index_bytes:
            return True
        if (seg.time_index_entries + staged + 1) * 12 > index_bytes:
            return True
        first = write.first_timestamp
        if first is not None and first >= 0:
            waited = header.max_timestamp - first
        else:
            waited = int(time.time() * 1000) - write.created_ms
        return waited > config.segment_ms

    def new_write(self) -> SplitWrite:
        """An empty write placed at the published log end."""
        return SplitWrite(self)

    def publish(self, write: SplitWrite) -> bool:
        """Make what ``write`` wrote visible (on the loop): rolls, segment sizes, index
        entries, the log end, producer state. Returns whether anything was appended."""
        self.writing = False
        for job in write.index_jobs:
            job.done()
        interval = self.config.index_interval_bytes
        pages = self.pages
        appended = False
        for run in write.runs[: write.done_runs]:
            seg = run.segment
            if run.new_segment:
                if self.segments:
                    self._seal_active()
                self.segments.append(seg)
                self.new_files = True
                self.created_ms = run.created_ms
            pos = run.pos
            start = pos
            for header, journal_position in run.batches:
                seg.size = end = pos + header.batch_length + LOG_OVERHEAD  # header.size
                seg.track(header, pos, interval)
                pos = end
                self.next_offset = header.base_offset + header.last_offset_delta + 1
                self.last_journal_position = journal_position
                if self.first_unflushed_journal_position is None:
                    self.first_unflushed_journal_position = journal_position
                if header.producer_id >= 0 and header.base_sequence >= 0:
                    self._apply_producer(header)
            if pages is not None:
                pages.note(seg.log_path, start, pos)
            appended = True
        return appended

    def append(self, batch: memoryview, journal_position: int) -> bool:
        """Stage, write and publish one batch in this thread (recovery and tests). Returns
        False (and changes nothing) when the log already holds its offsets."""
        write = self.new_write()
        if not self.stage(write, batch, journal_position):
            return False
        write.write()
        self.publish(write)
        if write.error is not None:
            raise write.error
        return True

    def producer_state(self) -> ProducerState:
        """The partition's producer state (created empty on first use)."""
        state = self.producers
        if state is None:
            state = self.producers = ProducerState()
        return state

    def _apply_producer(self, header: BatchHeader) -> None:
        self.producer_state().applied(
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            header.last_sequence,
            header.base_offset,
            header.last_offset,
            header.max_timestamp,
        )

    def take_snapshot(self) -> tuple[int, bytes]:
        """The producer state of every batch held (below the log end), as a snapshot."""
        state = self.producer_state()
        state.snapshot_offset = self.next_offset
        return self.next_offset, state.encode()

    def _seal_active(self) -> None:
        """The active segment stops being active: the producer state as of now is taken as
        a snapshot for the engine to write (off the event loop), as Kafka does at each roll;
        its files are fsynced, and its pending index entries written, by the next flush."""
        self.snapshot_due = self.take_snapshot()
        active = self.segments[-1]
        active.seal()
        self.unflushed = [*self.unflushed, active]
        for path in active.paths:
            self.files.close(path)

    def roll_empty(self, base_offset: int) -> str:
        """Seal the active segment and start an empty one at ``base_offset`` (on the loop,
        with no write in flight). Returns the new segment's log file, which the caller
        creates (it holds the log end across a restart) before anything older goes."""
        self._seal_active()
        seg = Segment(self.directory, base_offset)
        self.segments.append(seg)
        self.new_files = True
        self.created_ms = int(time.time() * 1000)
        return seg.log_path

    # -- retention ------------------------------------------------------------------------
    def advance_log_start(self, offset: int) -> int:
        """Raise the log start to ``offset`` (at most the log end) and delete the segments
        wholly below it. Returns the number of segments deleted."""
        offset = min(offset, self.next_offset)
        if offset <= self.log_start_offset:
            return 0
        self.log_start = offset
        count = 0
        for seg in self.segments[1:]:
            if seg.base_offset > offset:
                break
            count += 1
        whole = count == len(self.segments) - 1 and offset >= self.next_offset
        if whole and self.segments[-1].size and not self.writing:
            # the active segment is wholly below: seal it too (not while a split write is in
            # flight into it: the next retention round does)
            self.to_create = [*self.to_create, self.roll_empty(self.next_offset)]
            count += 1
        return self._delete_oldest(count, "below the log start offset")

    def retention_cutoff(self, now_ms: int) -> int:
        """The offset retention.ms and retention.bytes let the log start advance to (Kafka's
        rules: whole segments, oldest first; a segment expires when its largest timestamp is
        older than retention.ms; size counts every segment)."""
        config = self.config
        segments = self.segments
        if not segments or (segments[-1].size == 0 and len(segments) == 1):
            return self.log_start_offset
        keep_from = 0
        retention_ms = config.retention_ms
        if retention_ms >= 0:
            for i, seg in enumerate(segments):
                if seg.size == 0:
                    break
                max_ts, _ = seg.ensure_max_timestamp(self.files)
                if max_ts < 0:  # no record of it has a timestamp (-1): Kafka ages such a
                    # segment by its file's last change (LogSegment.largestTimestamp); -1
                    # itself made every such segment, the active one too, expire at once
                    max_ts = _last_modified_ms(seg.log_path, now_ms)
                if now_ms - max_ts <= retention_ms:
                    break
                keep_from = i + 1
        retention_bytes = config.retention_bytes
        if retention_bytes >= 0:
            excess = self.size_bytes - retention_bytes
            i = 0
            while i < len(segments) and excess - segments[i].size >= 0 and segments[i].size:
                excess -= segments[i].size
                i += 1
            keep_from = max(keep_from, i)
        if keep_from == 0:
            return self.log_start_offset
        if keep_from >= len(segments):
            return self.next_offset
        return segments[keep_from].base_offset

    def _delete_oldest(self, count: int, why: str) -> int:
        """Drop the ``count`` oldest segments (never the active one): out of the log at once,
        their files into ``doomed`` for the engine to unlink off the event loop (unlinking a
        large file waits on the filesystem)."""
        count = min(count, len(self.segments) - 1)
        if count <= 0:
            return 0
        gone = self.segments[:count]
        del self.segments[:count]
        doomed = list(self.doomed)
        for seg in gone:
            for path in seg.paths:
                self.files.close(path)
                doomed.append(path)
            log.info(
                "%s-%d: deleted segment %d (%s)", self.topic, self.partition, seg.base_offset, why
            )
        self.doomed = doomed
        if self.unflushed:
            self.unflushed = [seg for seg in self.unflushed if seg not in gone]
        return count

    # -- read -----------------------------------------------------------------------------
    def _segment_index(self, offset: int) -> int:
        return max(bisect.bisect_right(self.segments, offset, key=_base) - 1, 0)

    def read(self, offset: int, max_bytes: int, reads: Reads | None = None) -> bytes | memoryview:
        """Whole batches from the one holding ``offset``, up to ``max_bytes`` (at least one),
        all from one segment as Kafka does; read through ``reads`` (default the open-file
        cache: ``CachedReads`` never waits for the disk, ``DiskReads`` serves a thread)."""
        if offset >= self.next_offset:
            return b""
        files = self.files if reads is None else reads
        for seg in self.segments[self._segment_index(offset) :]:
            found = seg.find_batch(files, offset)
            if found is not None:
                return seg.read_batches(files, found[0], max_bytes)
        return b""

    def views(self, offset: int | None = None, limit: int | None = None) -> list[SegmentView]:
        """The segments from the one holding ``offset`` (all without it; at most ``limit``)
        as they are now, for a read in a thread (:func:`read_views`, :func:`time_search`,
        :func:`max_time_search`)."""
        first = 0 if offset is None else self._segment_index(offset)
        last = len(self.segments) if limit is None else first + limit
        return [seg.view() for seg in self.segments[first:last]]

    # -- recovery and removal -------------------------------------------------------------
    def recover(self, recovery_point: QueueRecoveryPoint | None, log_start: int = 0) -> int:
        """Load the segments; keep the flushed part (up to ``recovery_point``), validate the
        batches after it by CRC and truncate at the first bad one; rebuild the indexes past
        it. Returns the bytes truncated."""
        files = self.files
        bases = _list_bases(self.directory)
        self.segments = [Segment(self.directory, base) for base in bases]
        for seg in self.segments:
            seg.size = os.path.getsize(seg.log_path)
        self.log_start = log_start
        if not self.segments:
            flushed = recovery_point.offset if recovery_point else 0
            self.next_offset = max(flushed, log_start)
            if flushed > log_start:
                log.warning(
                    "%s-%d: no segments although flushed up to offset %d",
                    self.topic,
                    self.partition,
                    flushed,
                )
            return 0
        # segments wholly below the log start are gone: a power loss brings back those whose
        # unlink (DeleteRecords, retention) its directory had not made durable, some of them
        # emptied; nothing in them is readable, and kept they showed as gaps (audit31's
        # power-loss fuzzer: "segment base 140 but the previous one ends at 135")
        below = 0
        while below + 1 < len(self.segments) and self.segments[below + 1].base_offset <= log_start:
            below += 1
        if below:
            self._drop_range(0, below, "wholly below the log start offset")
        start_index = 0
        start_pos = 0
        expected = self.segments[0].base_offset
        if recovery_point is not None and recovery_point.segment_base >= expected:
            for i, seg in enumerate(self.segments):
                if seg.base_offset == recovery_point.segment_base:
                    if seg.size >= recovery_point.position:
                        start_index = i
                        start_pos = recovery_point.position
                        expected = recovery_point.offset
                    break
            else:
                log.warning(
                    "%s-%d: recovery point segment %d missing; validating every segment",
                    self.topic,
                    self.partition,
                    recovery_point.segment_base,
                )
        for seg in self.segments[:start_index]:
            seg.load_counts()
        truncated = 0
        interval = self.config.index_interval_bytes
        for i in range(start_index, len(self.segments)):
            seg = self.segments[i]
            if i > start_index:
                if seg.base_offset != expected:
                    # overlapping, or a gap: a power loss during a flush round leaves the
                    # segments rolled meanwhile as empty files with durable names; the log
                    # kept past such a hole skipped its offsets for good, as the re-split
                    # from the journal only appends past the log end (audit31 p3)
                    why = "overlapping offsets" if seg.base_offset < expected else "a gap"
                    truncated += self._drop_from(i, why)
                    break
                expected = seg.base_offset
                start_pos = 0
            seg.restore(files, start_pos, expected)
            expected, cut = seg.recover_tail(files, start_pos, expected, interval)
            if cut:
                truncated += cut
                log.warning(
                    "%s-%d: truncated %d bytes of %s at position %d (torn or corrupt batch)",
                    self.topic,
                    self.partition,
                    cut,
                    os.path.basename(seg.log_path),
                    seg.size,
                )
                truncated += self._drop_from(i + 1, "after a truncation")
                break
        if self.segments and self.segments[-1].size == 0 and len(self.segments) > 1:
            self._drop_from(len(self.segments) - 1, "empty")
        if expected < log_start:
            # a crash took back batches the log start had already moved past (its checkpoint
            # was durable, they were not): the log restarts at the log start, as Kafka's does,
            # so no offset below it is handed out again; a batch in the journal that holds the
            # log start is split in again (``append``)
            truncated += self._drop_from(0, "wholly below the log start offset")
            expected = log_start
        self.next_offset = expected
        for seg in self.segments[start_index:]:
            seg.write_index_entries(files)  # re-indexed above; fsynced with the recovery checkpoint
        for seg in self.segments[:-1]:
            for path in seg.paths:
                files.close(path)
        if self.segments:
            self.created_ms = int(time.time() * 1000)
            # the names of files made before a crash may not be durable: the first flush
            # fsyncs the directory (and its entry in the parent) again
            self.new_files = True
        self._recover_producers()
        return truncated

    def _recover_producers(self) -> None:
        """Load the newest producer snapshot at or below the log end and replay the batch
        headers after it (at most what was appended since the last roll or clean stop)."""
        state, offset = load_snapshot(self.directory, self.next_offset, self.log_start_offset)
        self.producers = state
        start = max(offset, self.log_start_offset)
        if start >= self.next_offset or not self.segments:
            return
        files = self.files
        for seg in self.segments[self._segment_index(start) :]:
            _, pos = seg.offset_index.lookup(files, start)
            for _, header in seg.iter_headers(files, pos, read_once=True):
                idempotent = header.producer_id >= 0 and header.base_sequence >= 0
                if idempotent and header.base_offset >= start:
                    self._apply_producer(header)

    def _drop_from(self, index: int, why: str) -> int:
        return self._drop_range(index, len(self.segments), why)

    def _drop_range(self, start: int, end: int, why: str) -> int:
        """Delete segments ``start`` to ``end`` (excluded) and their files at once (recovery);
        the bytes they held."""
        dropped = 0
        for seg in self.segments[start:end]:
            dropped += seg.size
            for path in seg.paths:
                self.files.close(path)
                with contextlib.suppress(FileNotFoundError):
                    fileio.unlink(path)
            log.warning(
                "%s-%d: deleted segment %d (%s)", self.topic, self.partition, seg.base_offset, why
            )
        del self.segments[start:end]
        return dropped

    def close_files(self) -> None:
        """Close every file of its segments (before its directory is deleted)."""
        self.removed = True
        for seg in self.segments:
            for path in seg.paths:
                self.files.close(path)
        self.segments = []


def _list_bases(directory: str) -> list[int]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    bases = []
    for name in names:
        stem, ext = os.path.splitext(name)
        if ext == LOG_SUFFIX and stem.isdigit():
            bases.append(int(stem))
        elif (
            ext in (INDEX_SUFFIX, TIME_INDEX_SUFFIX)
            and stem.isdigit()
            and not os.path.exists(segment_file(directory, int(stem), LOG_SUFFIX))
        ):
            fileio.unlink(os.path.join(directory, name))  # an index without its log
    bases.sort()
    return bases


def _last_modified_ms(path: str, now_ms: int) -> int:
    """The file's last change, in ms since the epoch; ``now_ms`` (kept, not expired) when it
    cannot be read."""
    try:
        return os.stat(path).st_mtime_ns // 1_000_000
    except OSError as exc:
        log.warning("%s: cannot read its last change (%s); kept by retention.ms", path, exc)
        return now_ms
