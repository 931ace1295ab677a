"""The storage facade: the only storage API the rest of the broker calls.

INTERFACE CONTRACT (implemented by the storage package; handlers code against exactly this):

Partitions are named by (topic, partition). Each is registered with :meth:`add_partition`
before use (the broker does this for every topic in the metadata store before
:meth:`recover`, and on topic creation). Offsets are assigned when a batch enters the journal.
What fetch may read (the high watermark) is what the splitter has split into the queue log.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import logging
import os
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from stonemq.protocol.record_batch import (
    BatchHeader,
    RecordBatchError,
    crc_ok,
    iter_batches,
    parse_header,
    recompress,
    set_base_offset,
)
from stonemq.server.threads import name_os_thread
from stonemq.storage import fileio
from stonemq.storage.checkpoint import (
    JOURNAL_RECOVERY_POINT_FILE,
    LOG_START_OFFSET_FILE,
    QUEUE_RECOVERY_POINT_FILE,
    SPLIT_POSITION_FILE,
    CheckpointFile,
    CheckpointNotDurableError,
    QueueRecoveryPoint,
    read_offsets,
    read_positions,
    read_queue_recovery_points,
    write_offsets,
    write_positions,
    write_queue_recovery_points,
)
from stonemq.storage.errors import (
    NotLeaderError,
    OffsetOutOfRangeError,
    StorageError,
    UnknownPartitionError,
    UnknownTopicsError,
)
from stonemq.storage.file_range import FileRange
from stonemq.storage.fileio import FsyncError, fsync_paths
from stonemq.storage.health import Event, Health, is_space_error
from stonemq.storage.index_file import IndexWrite
from stonemq.storage.journal import (
    ENTRY_PREFIX_BATCH_BYTES,
    ENTRY_PREFIX_COVERED_BYTES,
    FLUSH_POLICIES,
    CorruptEntryError,
    JournalEntry,
    JournalLog,
    JournalReader,
    decode_entries,
    encode_entry_prefix,
    encode_log_start_entry,
    list_segments,
    segment_name,
    unlink_segments,
)
from stonemq.storage.leader_epoch import LEADER_EPOCH_FILE, LeaderEpochCache
from stonemq.storage.open_files import CachedReads, DiskReads, NotCachedError, OpenFiles, Reads
from stonemq.storage.page_cache import (
    RECOVERY_READ_BYTES,
    Range,
    WrittenPages,
    drop_ranges,
    release_written,
)
from stonemq.storage.producer_state import BatchSeq, write_snapshot
from stonemq.storage.queue_log import (
    QueueLog,
    SplitWrite,
    create_queue_log_dir,
    epoch_at,
    epoch_search,
    max_time_search,
    queue_log_dir,
    queue_log_names,
    read_partition_metadata,
    read_range_views,
    read_views,
    time_search,
    topic_id_text,
)
from stonemq.storage.segment import Segment
from stonemq.storage.space import SplitHeadroom
from stonemq.storage.splitter import SplitError, Splitter

__all__ = [
    "AppendResult",
    "LogConfig",
    "NotLeaderError",
    "OffsetOutOfRangeError",
    "ReadResult",
    "RecoveryReport",
    "SplitListener",
    "StorageEngine",
    "StorageError",
    "UnknownPartitionError",
]

log = logging.getLogger(__name__)


_VALIDATED_BOUND = 2**31 - 1
"""Recompression's decompression bound: produced batches were checked against
``batch.max.uncompressed.bytes`` before they were acknowledged."""
PRODUCER_COMPRESSION = -1
"""compression.type=producer: batches are stored in the codec the producer chose."""
NO_FLUSH = 2**63 - 1
_EPOCH_FIELD = struct.Struct(">i")  # a RecordBatch's partition leader epoch, at byte 12
_MAX_TIMESTAMP = struct.Struct(">q")  # a RecordBatch's max timestamp, at byte MAX_TIMESTAMP_AT
MAX_TIMESTAMP_AT = 35
"""Kafka's default flush.messages and flush.ms (Long.MAX_VALUE): no fsync of their own."""


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Per-partition storage settings, Kafka names with their units."""

    segment_bytes: int = 1024 * 1024 * 1024
    segment_ms: int = 7 * 24 * 3600 * 1000
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    index_interval_bytes: int = 4096
    segment_index_bytes: int = 10 * 1024 * 1024
    # Kafka's flush.messages / flush.ms: an fsync of the partition's journal once this many
    # records are unflushed (the append's ack waits for it), and at most this long after an
    # append (0: before the ack); the default, Long.MAX_VALUE, leaves it to the flush policy
    flush_messages: int = NO_FLUSH
    flush_ms: int = NO_FLUSH
    # Kafka's compression.type: the codec batches are stored in (PRODUCER: as produced),
    # batches in another codec recompressed by the splitter; the codec's level (-1: default)
    compression: int = PRODUCER_COMPRESSION
    compression_level: int = -1
    # Kafka's max.message.bytes: a recompressed batch past it (or past segment_bytes) is
    # kept as produced (the produce path checked that one against both)
    max_message_bytes: int = 1_048_588


class AppendResult(NamedTuple):
    """Where an appended batch landed (a named tuple: one is made per batch). ``written``
    resolves (to None) once the bytes are in the journal file, and fsynced too when the flush
    policy is ``always``; it raises :class:`StorageError` when the write failed."""

    base_offset: int
    log_start_offset: int
    written: asyncio.Future[None]


_new_tuple = tuple.__new__


class LogStartAppend(NamedTuple):
    """A queued log-start entry (:meth:`StorageEngine.delete_records`): its journal
    partition, the journal position after it, and the future resolved once it is written."""

    journal: int
    end: int
    written: asyncio.Future[None]


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Whole record batches starting with the one that holds the requested offset."""

    # a view when a partial batch was left off the read; a FileRange (storage/file_range.py)
    # when the caller asked for one, to send with sendfile
    data: bytes | memoryview | FileRange
    high_watermark: int
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    duration_s: float
    journal_bytes_replayed: int
    journal_bytes_truncated: int
    queue_bytes_truncated: int


class _Flushing:
    """A queue log taken by a flush: its state at the start, to restore if the flush fails."""

    __slots__ = ("first_unflushed", "paths", "point", "queue", "unflushed")

    def __init__(
        self,
        queue: QueueLog,
        point: QueueRecoveryPoint,
        first_unflushed: int | None,
        unflushed: list[Segment] | tuple[()],
        paths: list[str],
    ) -> None:
        self.queue = queue
        self.point = point
        self.first_unflushed = first_unflushed
        self.unflushed = unflushed
        self.paths = paths

    def restore_dirty(self) -> None:
        """Make the queue log dirty again as it was, plus what was appended since."""
        queue = self.queue
        if self.first_unflushed is not None:
            current = queue.first_unflushed_journal_position
            queue.first_unflushed_journal_position = (
                self.first_unflushed if current is None else min(self.first_unflushed, current)
            )
        queue.unflushed = [*self.unflushed, *queue.unflushed]


DISK_READ_THREADS = 4
"""Fetch reads of bytes the page cache does not hold, at once (each waits for the disk)."""

READ_VIEW_SEGMENTS = 4
"""Segments a fetch read in a thread may look through from the one holding its offset (the
batch is in the first that is not empty)."""

VIEW_ATTEMPTS = 5
"""Reads in a thread taken again with new views when retention deleted a segment under them
(or moved the log start past a search's answer) before a read gives up (STORAGE_ERROR)."""

_T = TypeVar("_T")


def _with_disk_reads(fn: Callable[..., _T], args: tuple[Any, ...]) -> _T:
    """Disk-read thread: ``fn(*args, reads)`` on descriptors of this call's own."""
    reads = DiskReads()
    try:
        return fn(*args, reads)
    finally:
        reads.close()


CREATE_CHUNK = 256
"""Directories the directory thread creates ahead of new partitions' first batches before it
lets other directory work queued meanwhile go first."""

STEP_PARTITIONS = 2000
"""Partitions added or forgotten per event-loop turn when a topic of many is created or
deleted (about a millisecond of work)."""


def _remove_dirs(paths: list[str]) -> None:
    """Directory thread: delete deleted partitions' queue-log directories."""
    for path in paths:
        fileio.rmtree(path)


def _write_index_and_fsync(files: OpenFiles, jobs: list[IndexWrite], paths: list[str]) -> None:
    """Flush thread: write the index entries pending for the files, then fsync them."""
    for job in jobs:
        job.run(files)
    fsync_paths(paths)


def _remove_files(paths: Sequence[str], create: Sequence[str] = ()) -> None:
    """Directory thread: create the new empty segment files a roll left (they hold the log
    end across a restart, so they exist before anything older goes), then unlink dropped
    segments' files (a file that cannot be unlinked is logged: it holds nothing the log
    still counts)."""
    for path in create or ():
        try:
            fileio.close(fileio.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        except OSError as exc:  # the next write to the segment creates it
            log.warning("cannot create %s: %s", path, exc)
    for path in paths:
        try:
            fileio.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot delete %s: %s", path, exc)


def _write_snapshots(snapshots: list[tuple[str, int, bytes]]) -> list[str]:
    """Write producer snapshots (directory, offset, bytes) in an executor thread; a snapshot
    that cannot be written is only logged: recovery then replays from an older one."""
    written = []
    for directory, offset, data in snapshots:
        try:
            written.append(write_snapshot(directory, offset, data))
        except OSError as exc:
            log.warning("producer snapshot %s at %d not written: %s", directory, offset, exc)
    return written


SplitListener = Callable[[str, int, int], None]
"""Called as ``listener(topic, partition, new_high_watermark)`` after the splitter advances."""


def _nothing() -> None:
    pass


def _copy_outcome(source: asyncio.Future[None], target: asyncio.Future[None]) -> None:
    if source.cancelled():
        target.cancel()
    elif (exc := source.exception()) is not None:
        target.set_exception(exc)
    else:
        target.set_result(None)


def _ack_when_durable(task: asyncio.Future[bool], acked: asyncio.Future[None], index: int) -> None:
    """Resolve an ack that waits for its journal's fsync (a topic's flush.messages)."""
    if acked.done():
        return
    if task.cancelled():
        acked.cancel()
    elif task.exception() is not None or not task.result():
        acked.set_exception(StorageError(f"journal-{index}: fsync failed: partition offline"))
    else:
        acked.set_result(None)


class _Partition:
    """What the engine keeps per registered partition: a few small fields."""

    __slots__ = (
        "config",
        "journal",
        "next_offset",
        "partition",
        "queue",
        "recovery_point",
        "topic",
        "topic_id",
        "unflushed_messages",
    )

    def __init__(
        self, topic_id: bytes, topic: str, partition: int, journal: int, config: LogConfig
    ) -> None:
        self.topic_id = topic_id
        self.topic = topic
        self.partition = partition
        self.journal = journal
        self.config = config
        self.next_offset = 0  # next offset to assign (log end offset)
        self.queue: QueueLog | None = None  # opened on first use
        self.unflushed_messages = 0  # records appended since flush.messages last forced fsync
        # its queue log's state at the last flush (checkpointed); None: none flushed
        self.recovery_point: QueueRecoveryPoint | None = None


class _Registry:
    """The registered partitions, by (topic, partition) and by (topic id, partition): a dict
    of partitions per topic name and one per topic id. No tuple key per partition (two of
    them, 56 bytes each, and a third container entry cost about 200 bytes per partition)."""

    __slots__ = ("_ids", "_names")

    def __init__(self) -> None:
        self._names: dict[str, dict[int, _Partition]] = {}
        self._ids: dict[bytes, dict[int, _Partition]] = {}

    def get(self, key: tuple[str, int]) -> _Partition | None:
        parts = self._names.get(key[0])
        return None if parts is None else parts.get(key[1])

    def by_id(self, topic_id: bytes, partition: int) -> _Partition | None:
        parts = self._ids.get(topic_id)
        return None if parts is None else parts.get(partition)

    def __contains__(self, key: tuple[str, int]) -> bool:
        return self.get(key) is not None

    def __getitem__(self, key: tuple[str, int]) -> _Partition:
        state = self.get(key)
        if state is None:
            raise KeyError(key)
        return state

    def __iter__(self) -> Iterator[tuple[str, int]]:
        """The (topic, partition) keys."""
        for topic, parts in self._names.items():
            for partition in parts:
                yield topic, partition

    def __len__(self) -> int:
        return sum(len(parts) for parts in self._names.values())

    def values(self) -> Iterator[_Partition]:
        for parts in self._names.values():
            yield from parts.values()

    def topic(self, topic: str) -> list[_Partition]:
        parts = self._names.get(topic)
        return [] if parts is None else list(parts.values())

    def topic_id_of(self, topic: str) -> bytes | None:
        """The id of a registered partition of ``topic`` (shared: one bytes object per topic,
        not one per partition)."""
        parts = self._names.get(topic)
        return None if not parts else next(iter(parts.values())).topic_id

    def add(self, state: _Partition) -> None:
        self._names.setdefault(state.topic, {})[state.partition] = state
        self._ids.setdefault(state.topic_id, {})[state.partition] = state

    def remove(self, state: _Partition) -> None:
        if _drop(self._names.get(state.topic), state):
            del self._names[state.topic]
        if _drop(self._ids.get(state.topic_id), state):
            del self._ids[state.topic_id]


def _drop(parts: dict[int, _Partition] | None, state: _Partition) -> bool:
    """Take ``state`` out of ``parts`` (if there); True when ``parts`` is left empty."""
    if parts is None or parts.get(state.partition) is not state:
        return False
    del parts[state.partition]
    return not parts


STRAYS_LOGGED = 20
"""How many set-aside queue logs of no topic partition a start names in its log line."""


class StorageEngine:
    """JournalLog partitions on the write directory, QueueLogs on the read directory, and the
    Splitter between them. See docs/architecture.md."""

    def __init__(
        self,
        journal_dir: str,
        queue_dir: str,
        *,
        journal_partitions: int,
        journal_segment_bytes: int,
        flush_policy: str,  # "always" | "interval" | "never"
        flush_interval_ms: int,
        queue_checkpoint_interval_ms: int,
        max_open_files: int,
        splitter_batch_bytes: int,
        queue_cache_retain_bytes: int,
        log_retention_check_interval_ms: int = 300_000,
        producer_id_expiration_ms: int = 86_400_000,
        producer_id_expiration_check_interval_ms: int = 600_000,
        replicated: bool = False,
    ) -> None:
        if flush_policy not in FLUSH_POLICIES:
            raise ValueError(f"flush_policy must be one of {FLUSH_POLICIES}, not {flush_policy!r}")
        if journal_partitions < 1:
            raise ValueError("journal_partitions must be at least 1")
        self._journal_dir = str(journal_dir)
        self._append_loop: asyncio.AbstractEventLoop | None = None  # the loop appends run on
        self._queue_dir = str(queue_dir)
        fileio.makedirs_durable(self._journal_dir)
        fileio.makedirs_durable(self._queue_dir)
        finish_catch_ups(self._journal_dir)  # an install a crash cut short
        self._flush_policy = flush_policy
        self._flush_interval_ms = flush_interval_ms
        self._checkpoint_interval_ms = queue_checkpoint_interval_ms
        self._retention_check_interval_ms = log_retention_check_interval_ms
        self._producer_expiration_ms = producer_id_expiration_ms
        self._producer_expiration_check_ms = producer_id_expiration_check_interval_ms
        # tiered storage's local.retention.* cutoff (stonemq/tiering/service.py), if any
        self.local_retention: Callable[[QueueLog, int], int] | None = None
        # told (topic, partition, offset) of every log-start entry this broker's splitter
        # applies as a follower: the tiering service moves the partition's cold log start
        self.on_log_start: Callable[[str, int, int], None] | None = None
        self._splitter_batch_bytes = splitter_batch_bytes
        self._files = OpenFiles(max_open_files)
        self.max_open_files = max_open_files
        # queue-log pages older than the write-behind window leave the page cache
        self._written_pages = WrittenPages(queue_cache_retain_bytes)
        self._journals = [
            JournalLog(
                self._journal_partition_dir(j),
                j,
                segment_bytes=journal_segment_bytes,
                flush_policy=flush_policy,
                on_visible=self._on_journal_visible,
                on_failed=self._on_journal_failed,
            )
            for j in range(journal_partitions)
        ]
        # replication (a cluster broker): each journal partition's leader-epoch checkpoint
        # (invariant 3), the epoch its appends carry, and how far its splitter may go (the
        # journal high watermark: consumers never see what a failover could take back)
        self.replicated = replicated
        self._epoch_caches: list[LeaderEpochCache] = (
            [LeaderEpochCache(journal.directory) for journal in self._journals]
            if replicated
            else []
        )
        self._leader_epochs = [0] * journal_partitions
        # which journal partitions take this broker's own appends: all on a single node; in
        # a cluster only those it leads (become_leader, once ready, .. stop_leading), so a
        # follower's journal holds nothing but its leader's bytes (invariant 2)
        self._leading = [not replicated] * journal_partitions
        # journal partitions led (or becoming led) here: no replica append is taken for them;
        # and each journal partition's replica appends in flight (become_leader waits them)
        self._led_here: set[int] = set()
        # topic ids known to be deleted (removed here, or found in no topic of the cluster's
        # metadata: ``topics_gone``): a follower appends their entries, which the splitter
        # skips; entries of any other topic id not registered here are refused
        # (UnknownTopicsError) until the metadata catches up. Topic ids are never reused.
        self._gone_topic_ids: set[bytes] = set()
        # journal partitions whose catch-up install is under way (catch_up_install): no
        # replica append, truncation or other catch-up meanwhile
        self._installing: dict[int, asyncio.Future[None]] = {}  # done when it ends
        # journal partitions with a catch-up attempt under way, from catch_up_prepare to its
        # end (catch_up_end, or an install that finished): the copy is then the only writer
        # of their queue logs, so no replica append, split-limit move, truncation or second
        # attempt is taken meanwhile (the old attempt of a fetcher that dropped the journal
        # partition ends before another fetcher's appends are taken)
        self._catching_up: set[int] = set()
        self._replica_appends: dict[int, set[asyncio.Future[None]]] = {}
        self._split_limits: list[int] | None = [0] * journal_partitions if replicated else None
        # replication's hooks: entries of a journal partition were written; how far back a
        # journal partition's segments must stay (what followers still fetch)
        self.on_journal_written: Callable[[int], None] | None = None
        self.journal_retain_from: Callable[[int], int] | None = None
        # and the bytes of each group of entries written (JournalLog.on_written), with the
        # local journal partition first: the leader's in-memory tail (replication/tail.py)
        self.on_journal_bytes: Callable[[int, int, list[Any], list[int]], None] | None = None
        # and a journal partition went offline (fail-stop, health.py): called with its local
        # index, on the thread that saw the failure
        self.on_journal_offline: Callable[[int], None] | None = None
        # and one may have run out of space or have room again (``out_of_space`` says which):
        # called with its local index, on any thread
        self.on_journal_full: Callable[[int], None] | None = None
        for journal in self._journals:
            journal.health.on_offline = self._on_journal_offline
            journal.health.on_full = self._on_journal_full
        if replicated:
            for journal in self._journals:
                journal.on_visible = functools.partial(self._on_replicated_visible, journal.index)
                journal.on_written = functools.partial(self._on_journal_bytes, journal.index)
        # appends wait while the read directory lacks room to split what is acknowledged
        self._headroom = SplitHeadroom(self._queue_dir, self.unsplit_bytes)
        self._headroom.on_change = self._on_headroom
        self._recompressing = False  # a topic names a compression.type: see _note_codec
        # partitions with a batch kept as produced, recompressed too large (logged once)
        self._kept_as_produced: set[tuple[str, int]] = set()
        self._by_name = _Registry()
        # log start offsets that retention or DeleteRecords advanced (checkpointed)
        self._log_starts: dict[tuple[str, int], int] = {}
        self._log_starts_changed = False
        # (journal recovery points, replay positions) as last written to the checkpoints
        self._last_checkpoint: tuple[dict[int, int], dict[int, int]] | None = None
        self._rewrite_checkpoints = True  # every checkpoint file is written by the next round
        self._dirty: set[QueueLog] = set()
        self._splitter: Splitter | None = None
        self._recovered = False
        self._closed = False
        self._listener: SplitListener | None = None
        # called after every splitter step (the request budget re-checks the split lag)
        self.split_watchers: list[Callable[[], None]] = []
        # (journal partition, position, future) of split_past
        self._split_waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._split_wake: asyncio.Event | None = None
        self._checkpoint_wake: asyncio.Event | None = None
        self._checkpoint_lock: asyncio.Lock | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # queue-log directories of new partitions, created ahead of their first batch by one
        # background thread (see _precreate)
        self._to_create: collections.deque[tuple[str, bytes]] = collections.deque()
        self._create_pending: set[str] = set()
        self._create_lock = threading.Lock()
        self._creator: ThreadPoolExecutor | None = None
        self._disk_readers: ThreadPoolExecutor | None = None  # fetches of uncached bytes
        # fsyncs due to topics' flush.messages / flush.ms, and flush.ms timers per journal
        self._fsyncs: set[asyncio.Future[bool]] = set()
        self._fsync_timers: dict[int, asyncio.TimerHandle] = {}

    def add_journal_partition(self) -> int:
        """Open one more journal partition, empty, under the next local index (a replicated
        broker hosting a journal partition the controller placed after it started: a broker
        that joined the cluster). Its journal, leader-epoch checkpoint, split position and
        split limit start at 0 as at a first start; the checkpoint rounds include it from
        here on. A directory already holding journal bytes under that index is refused
        (StorageError): it would be taken for the new partition's history."""
        assert self.replicated, "only a cluster broker's journal partitions change"
        j = len(self._journals)
        journal = JournalLog(
            self._journal_partition_dir(j),
            j,
            segment_bytes=self._journals[0].segment_bytes,
            flush_policy=self._flush_policy,
            on_visible=functools.partial(self._on_replicated_visible, j),
            on_failed=self._on_journal_failed,
        )
        journal.on_written = functools.partial(self._on_journal_bytes, j)
        journal.health.on_offline = self._on_journal_offline
        journal.health.on_full = self._on_journal_full
        journal.recover(None)
        if journal.written_end > 0:
            journal.close()
            raise StorageError(
                f"{journal.directory} already holds {journal.written_end} journal bytes; "
                "a journal partition placed after the start must begin empty"
            )
        cache = LeaderEpochCache(journal.directory)
        cache.truncate_from_end(0)
        self._journals.append(journal)
        self._epoch_caches.append(cache)
        self._leader_epochs.append(0)
        self._leading.append(False)  # a cluster broker: led only once become_leader says so
        assert self._split_limits is not None
        self._split_limits.append(0)
        if self._splitter is not None:
            self._splitter.add_journal(journal.directory, journal.health)
        self._rewrite_checkpoints = True
        log.info("journal partition %d (local index) opened at %s", j, journal.directory)
        return j

    def _directory_thread(self) -> ThreadPoolExecutor:
        """The one thread that creates and deletes queue-log directories and files and writes
        producer snapshots, in the order they were asked for: a snapshot queued before its
        topic's deletion is written before the directory goes, never into a new topic's."""
        if self._creator is None:
            self._creator = ThreadPoolExecutor(
                1, thread_name_prefix="stonemq-create", initializer=name_os_thread
            )
        return self._creator

    def _journal_partition_dir(self, j: int) -> str:
        return os.path.join(self._journal_dir, f"journal-{j}")

    # -- lifecycle ----------------------------------------------------------------------------
    def add_partition(
        self,
        topic_id: uuid.UUID,
        topic: str,
        partition: int,
        journal_partition: int,
        config: LogConfig,
    ) -> None:
        """Register a partition (idempotent). Creates no file until data arrives."""
        if not 0 <= journal_partition < len(self._journals):
            raise ValueError(
                f"journal partition {journal_partition} outside 0..{len(self._journals) - 1}"
            )
        key = (topic, partition)
        tid = topic_id.bytes
        known = self._by_name.topic_id_of(topic)
        if known == tid:
            tid = known  # one bytes object per topic
        self._note_codec(config)
        state = self._by_name.get(key)
        if state is not None:
            if state.topic_id == tid:
                state.config = config
                self._headroom.note_config(config.segment_bytes, config.index_interval_bytes)
                if state.queue is not None:
                    state.queue.config = config
                return
            self._forget(state)  # the name now belongs to a new topic
        state = _Partition(tid, topic, partition, journal_partition, config)
        self._headroom.note_config(config.segment_bytes, config.index_interval_bytes)
        self._by_name.add(state)
        if self._recovered:
            # a partition added while serving is new: no directory of its name exists (a
            # deleted topic's name stays taken until its directories are gone, and recovery
            # sets aside those a crash left behind), so nothing is looked up on the loop
            self._precreate(self._queue_path(topic, partition), tid)

    def _precreate(self, directory: str, topic_id: bytes) -> None:
        """Create a new partition's directory and empty first segment files in a background
        thread, as Kafka does when a partition is created: directory and file creation waits
        on the filesystem's journal while fsyncs run, and must not stall the splitter on the
        event loop at the first batch of each of 10,000 new partitions. The splitter still
        creates whatever is missing when it gets there first (both sides are idempotent)."""
        with self._create_lock:
            self._create_pending.add(directory)
            self._to_create.append((directory, topic_id))
            if len(self._to_create) == 1:
                self._directory_thread().submit(self._create_queued)

    async def wait_precreated(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until the directories of every partition added so far
        exist, as a CreateTopics answer does in Kafka. True when they do."""
        creator = self._creator
        if creator is None:
            return True
        done = asyncio.get_running_loop().run_in_executor(creator, _nothing)
        try:
            await asyncio.wait_for(asyncio.shield(done), max(timeout_s, 0.0))
        except TimeoutError:
            return False
        return True

    def _create_queued(self) -> None:
        """Directory thread: create queued directories, ``CREATE_CHUNK`` of them, then queue
        itself again behind whatever else was asked of the thread meanwhile (a producer
        snapshot, a deletion, a retention unlink never waits for a 100,000-partition
        backlog)."""
        lock = self._create_lock
        for _ in range(CREATE_CHUNK):
            with lock:
                if not self._to_create:
                    return
                directory, topic_id = self._to_create.popleft()
                if directory not in self._create_pending:
                    continue  # its topic was deleted meanwhile
            try:  # not under the lock: the event loop must never wait for a mkdir
                create_queue_log_dir(directory, topic_id)
            except OSError as exc:  # the splitter retries and reports it at the first batch
                log.debug("could not create %s ahead of its first batch: %s", directory, exc)
            with lock:
                if directory in self._create_pending:
                    self._create_pending.discard(directory)
                    if not self._create_pending:
                        self._create_pending = set()  # a set never shrinks its table
                else:  # its topic was deleted while it was being made: no stray directory
                    fileio.rmtree(directory)
        with lock:
            if self._to_create and self._creator is not None:
                with contextlib.suppress(RuntimeError):  # the thread is being shut down
                    self._creator.submit(self._create_queued)

    def _note_codec(self, config: LogConfig) -> None:
        """A partition whose topic names a compression.type (not ``producer``) exists: from
        now on the splitter looks up each batch's topic codec (``_to_topic_codec``). Never
        reset while the broker runs (conservative; a deleted topic's codec keeps it on)."""
        if config.compression != PRODUCER_COMPRESSION:
            self._recompressing = True

    def update_config(self, topic: str, config: LogConfig) -> None:
        self._note_codec(config)
        self._headroom.note_config(config.segment_bytes, config.index_interval_bytes)
        for state in self._by_name.topic(topic):
            state.config = config
            if state.queue is not None:
                state.queue.config = config

    async def remove_topic(self, topic: str) -> None:
        """Forget the topic, ``STEP_PARTITIONS`` partitions at a time (the loop serves other
        clients between steps), then delete its queue-log directories in the directory
        thread, in order with the directories it was asked to create before; returns once
        they are gone. Journal entries still pending for it are dropped by the splitter."""
        states = self._by_name.topic(topic)
        paths = []
        for i, state in enumerate(states, 1):
            self._gone_topic_ids.add(state.topic_id)
            self._forget(state)
            paths.append(self._queue_path(topic, state.partition))
            if i % STEP_PARTITIONS == 0:
                await asyncio.sleep(0)
        if not paths:
            return
        with self._create_lock:
            self._create_pending.difference_update(paths)
        if self._splitter is not None:
            await self._splitter.idle()  # no split write left that could create a file there
        # nor a flush round in flight, whose index writes could put a file back in them (the
        # rounds after it do not know these queue logs: _forget took them off the dirty set)
        async with self._checkpoint_lock or asyncio.Lock():
            pass
        # a split write or flush in flight when _forget closed the files reopened them in
        # the shared cache: they would stay open, deleted, until evicted (helper-74's audit,
        # p7: 30-62 of 400 segment files, holding their disk space and descriptors)
        self._files.close_under(paths)
        # in chunks, the lock not held: a stop while a 100,000-partition topic is being
        # deleted waited for every directory (7 s and more, past the stop timeout of the
        # long fuzz run); a stop now waits for one chunk, and the next start sets the
        # directories left aside as strays (recovery)
        loop = asyncio.get_running_loop()
        for start in range(0, len(paths), CREATE_CHUNK):
            if self._closed:
                return
            try:
                await loop.run_in_executor(
                    self._directory_thread(), _remove_dirs, paths[start : start + CREATE_CHUNK]
                )
            except RuntimeError:  # the directory thread is shut down: the broker is stopping
                return

    def _forget(self, state: _Partition) -> None:
        """Drop a partition's state and close its files."""
        key = (state.topic, state.partition)
        self._by_name.remove(state)
        state.recovery_point = None
        if self._log_starts.pop(key, None) is not None:
            self._log_starts_changed = True
        if state.queue is not None:
            self._dirty.discard(state.queue)
            state.queue.close_files()
            state.queue = None

    def topic_id_of(self, topic: str) -> bytes | None:
        """The id of the topic whose partitions are registered under the name ``topic``
        (None: none is)."""
        return self._by_name.topic_id_of(topic)

    def _queue_path(self, topic: str, partition: int) -> str:
        return queue_log_dir(self._queue_dir, topic, partition)

    def _set_aside_strays(self) -> set[tuple[str, int]]:
        """Recovery: a queue-log directory of no registered partition (a topic whose deletion
        a crash interrupted), or of a registered name whose ``partition.metadata`` names
        another topic id (the topic was deleted and created again while this broker was
        down), is renamed ``<name>-<ms>.stray`` and logged, as Kafka sets stray logs aside,
        so that the topic holding the name now never finds the old one's segments. Returns
        the registered partitions whose directory went: their checkpointed recovery points
        and log starts were the old topic's."""
        known = {
            os.path.basename(self._queue_path(s.topic, s.partition)): s
            for s in self._by_name.values()
        }
        now_ms = int(time.time() * 1000)
        aside_keys: set[tuple[str, int]] = set()
        orphans: list[str] = []  # of no topic partition: logged together (a deletion of
        # 100,000 partitions cut short logged 87,000 lines, and the start took over 20 s)
        for name in queue_log_names(self._queue_dir):
            path = os.path.join(self._queue_dir, name)
            state = known.get(name)
            why = ""
            if state is not None:
                held = read_partition_metadata(path)
                if held is None or held == state.topic_id:
                    continue
                why = (
                    f"holds topic id {topic_id_text(held)}, not {topic_id_text(state.topic_id)} "
                    "of the topic of that name now (deleted and created again meanwhile)"
                )
                aside_keys.add((state.topic, state.partition))
            aside = f"{path}-{now_ms}.stray"
            try:
                fileio.replace(path, aside)
            except OSError as exc:
                raise StorageError(f"cannot set aside stray queue log {path}: {exc}") from exc
            if why:
                log.warning("queue log %s %s: set aside as %s", path, why, aside)
            else:
                orphans.append(name)
        if orphans:
            shown = ", ".join(orphans[:STRAYS_LOGGED])
            more = (
                f" and {len(orphans) - STRAYS_LOGGED:,} more"
                if len(orphans) > STRAYS_LOGGED
                else ""
            )
            log.warning(
                "%d queue log(s) in %s belong to no topic partition (a deletion cut short): set "
                "aside as <name>-%d.stray: %s%s",
                len(orphans),
                self._queue_dir,
                now_ms,
                shown,
                more,
            )
        return aside_keys

    def _open_queue(self, state: _Partition) -> QueueLog:
        queue = state.queue
        if queue is None:
            queue = state.queue = QueueLog(
                self._queue_dir,
                state.topic,
                state.partition,
                state.journal,
                state.config,
                self._files,
                self._written_pages,
                state.topic_id,
            )
        return queue

    def _to_topic_codec(self, entries: list[JournalEntry]) -> None:
        """In the splitter's thread, before the entries are staged: recompress each batch
        whose codec is not its topic's compression.type (Kafka's LogValidator recompresses
        a batch whose codec differs from the topic's unless that is ``producer``). The
        journal keeps the batch as produced; the queue log, which consumers read, gets the
        topic's codec. Deterministic, so a re-split after a crash writes the same bytes.
        Nothing to look up while every topic keeps its producers' codec (the default)."""
        if not self._recompressing:
            return
        for entry in entries:
            if entry.record_count < 0:
                continue  # a log-start entry: no batch
            state = self._by_name.by_id(entry.topic_id, entry.partition)
            if state is None:
                continue
            config = state.config
            codec = config.compression
            if codec == PRODUCER_COMPRESSION or entry.batch[22] & 0x07 == codec:
                continue
            try:
                # the produce path bounded what its records decompress to already
                recompressed = recompress(
                    entry.batch, codec, config.compression_level, _VALIDATED_BOUND
                )
            except RecordBatchError as exc:  # validated at produce: never expected
                log.error(
                    "%s-%d: batch at offset %d kept as produced, not recompressed: %s",
                    state.topic,
                    state.partition,
                    entry.base_offset,
                    exc,
                )
                continue
            # Kafka checks the sizes again after recompressing (UnifiedLog.append); here the
            # produce was answered already, so a batch that grew past max.message.bytes or
            # segment.bytes (a small zstd batch to an uncompressed topic: an independent
            # check stored 200 KB under limits of 20,000) stays as produced, within both
            if len(recompressed) > min(config.max_message_bytes, config.segment_bytes):
                if (state.topic, state.partition) in self._kept_as_produced:
                    continue  # said once per partition
                self._kept_as_produced.add((state.topic, state.partition))
                log.warning(
                    "%s-%d: batch at offset %d kept as produced: recompressed it would be %d "
                    "bytes, past max.message.bytes %d or segment.bytes %d (said once for "
                    "this partition)",
                    state.topic,
                    state.partition,
                    entry.base_offset,
                    len(recompressed),
                    config.max_message_bytes,
                    config.segment_bytes,
                )
                continue
            entry.batch = memoryview(recompressed)

    def _resolve(self, topic_id: bytes, partition: int) -> QueueLog | None:
        state = self._by_name.by_id(topic_id, partition)
        if state is None:
            return None
        return state.queue or self._open_queue(state)

    def recover(self) -> RecoveryReport:
        """Synchronous, before serving: truncate torn journal/queue tails, re-split the journal
        so every queue log holds everything the journal holds, recompute next offsets."""
        started = time.monotonic()
        journal_rps = read_positions(os.path.join(self._journal_dir, JOURNAL_RECOVERY_POINT_FILE))
        split_points = read_positions(os.path.join(self._journal_dir, SPLIT_POSITION_FILE))
        queue_rps = read_queue_recovery_points(
            os.path.join(self._queue_dir, QUEUE_RECOVERY_POINT_FILE)
        )
        self._log_starts = read_offsets(os.path.join(self._queue_dir, LOG_START_OFFSET_FILE))
        journal_cut = 0
        for j, journal in enumerate(self._journals):
            journal.close()
            _, cut = journal.recover(journal_rps.get(j))
            journal.fsync_now()  # what recovery kept is durable before a checkpoint says so
            journal_cut += cut
            if self._epoch_caches:  # epochs of a cut tail are gone with it
                cache = self._epoch_caches[j]
                cache.truncate_from_end(journal.written_end)
                cache.truncate_from_start(journal.start_position)
        for key in self._set_aside_strays():  # the old topic's, not this one's
            queue_rps.pop(key, None)
            if self._log_starts.pop(key, None) is not None:
                self._log_starts_changed = True
        queue_cut = 0
        for state in self._by_name.values():
            key = (state.topic, state.partition)
            state.queue = None
            state.recovery_point = queue_rps.get(key)
            if os.path.isdir(self._queue_path(*key)):
                queue_cut += self._open_queue(state).recover(
                    state.recovery_point, self._log_starts.get(key, 0)
                )
        starts = []
        for j, journal in enumerate(self._journals):
            start = split_points.get(j, journal.start_position)
            for rp in queue_rps.values():
                if rp.journal_partition == j and rp.journal_position >= 0:
                    start = min(start, rp.journal_position)
            starts.append(min(max(start, journal.start_position), journal.written_end))
        if self._splitter is not None:
            self._splitter.close()
        self._splitter = Splitter(
            [j.directory for j in self._journals],
            starts,
            self._resolve,
            self._splitter_batch_bytes,
            [j.health for j in self._journals],
            convert=self._to_topic_codec,
            on_log_start=self._apply_log_start,
        )
        replayed = 0
        limits = self._split_limits
        for j, journal in enumerate(self._journals):
            advanced: set[QueueLog] = set()
            limit = journal.written_end
            if limits is not None:  # replicated: no further than the last split below a HW
                limit = min(limit, max(split_points.get(j, 0), journal.start_position))
                limits[j] = limit
            replayed += self._splitter.recover_to(j, limit, advanced)
            self._dirty |= advanced
        for state in self._by_name.values():
            state.next_offset = state.queue.next_offset if state.queue is not None else 0
        if limits is not None:
            self._next_offsets_past(limits)
        self._checkpoint_recovered()
        self._recovered = True
        report = RecoveryReport(time.monotonic() - started, replayed, journal_cut, queue_cut)
        log.info(
            "storage recovered in %.3f s: %d journal bytes re-split, %d journal bytes and %d "
            "queue bytes truncated",
            report.duration_s,
            replayed,
            journal_cut,
            queue_cut,
        )
        return report

    def _next_offsets_past(self, limits: list[int]) -> None:
        """Replicated recovery: the journal past each split limit is kept but not split yet
        (it waits for a HW); the next offsets of its topic partitions follow its entries."""
        for j, journal in enumerate(self._journals):
            reader = JournalReader(journal.directory, read_once=True)
            pos = limits[j]
            try:
                while pos < journal.written_end:
                    entries, nxt = reader.read(pos, journal.written_end, RECOVERY_READ_BYTES, False)
                    if nxt == pos:
                        break
                    for entry in entries:
                        if entry.record_count < 0:
                            continue  # a log-start entry
                        state = self._by_name.by_id(entry.topic_id, entry.partition)
                        end = entry.base_offset + entry.record_count
                        if state is not None and end > state.next_offset:
                            state.next_offset = end
                    pos = nxt
            finally:
                reader.close()

    def _checkpoint_recovered(self) -> None:
        """Make what recovery kept or re-split durable and checkpoint it, before anything may
        trim the journal: a queue log holding batches past its recovery point (a valid tail
        kept from before the crash, or re-split entries) is fsynced from its recovery
        point's segment on, and its new recovery point written. Without this, the journal
        segments behind such a tail could go while the tail itself is not yet durable."""
        changed: list[tuple[QueueLog, QueueRecoveryPoint | None]] = []
        for state in self._by_name.values():
            queue = state.queue
            if queue is None or not queue.segments:
                continue
            rp = state.recovery_point
            now = queue.recovery_point()
            if (
                queue in self._dirty
                or rp is None
                or (rp.offset, rp.position)
                != (
                    now.offset,
                    now.position,
                )
            ):
                changed.append((queue, rp))
        paths: list[str] = []
        for queue, rp in changed:
            paths.extend(queue.paths_from(rp.segment_base if rp is not None else -1))
            # which names a crash left durable is unknown: the directory and its entry too
            paths.extend((queue.directory, os.path.dirname(queue.directory)))
        fsync_paths(sorted(set(paths), key=paths.index))
        for queue, _ in changed:
            queue.mark_flushing()
            self._set_recovery_point(queue, queue.recovery_point())
        self._dirty.clear()
        # the checkpoint says each queue log's log start as recovery found it: one that a
        # crash left behind its first segment's base (segments deleted, the checkpoint not
        # yet written; a log-start entry re-split then changes nothing) stayed stale for good
        for state in self._by_name.values():
            queue = state.queue
            key = (state.topic, state.partition)
            if queue is not None and queue.log_start_offset > self._log_starts.get(key, 0):
                self._log_starts[key] = queue.log_start_offset
        assert self._splitter is not None
        replay = dict(enumerate(self._splitter.positions))
        journal_rps = {j.index: j.durable_end for j in self._journals}
        self._write_checkpoints(journal_rps, replay, self._queue_rps(), dict(self._log_starts))
        self._last_checkpoint = (dict(journal_rps), dict(replay))
        self._rewrite_checkpoints = False
        if changed:
            log.info("recovery: %d queue logs fsynced and checkpointed", len(changed))

    def _set_recovery_point(self, queue: QueueLog, point: QueueRecoveryPoint) -> None:
        state = self._by_name.get((queue.topic, queue.partition))
        if state is not None and state.queue is queue:  # not a deleted partition's
            state.recovery_point = point

    def _queue_rps(self) -> dict[tuple[str, int], QueueRecoveryPoint]:
        """Every registered partition's recovery point, for the checkpoint file."""
        return {
            (state.topic, state.partition): state.recovery_point
            for state in self._by_name.values()
            if state.recovery_point is not None
        }

    def _ensure_recovered(self) -> None:
        if not self._recovered:
            self.recover()

    def start(self, listener: SplitListener) -> None:
        """Start the journal flusher and the splitter on the running event loop."""
        self._ensure_recovered()
        assert self._splitter is not None
        loop = asyncio.get_running_loop()
        self._listener = listener
        self._split_wake = asyncio.Event()
        self._checkpoint_wake = asyncio.Event()
        self._checkpoint_lock = asyncio.Lock()
        journals = self._journals
        limits = self._split_limits
        if limits is None:  # the single node: everything visible in the journal

            def limit(j: int) -> int:
                return journals[j].visible_end
        else:  # replicated: below the journal high watermark too (invariant 5)

            def limit(j: int) -> int:
                return min(journals[j].visible_end, limits[j])

        self._tasks = [
            loop.create_task(
                self._splitter.run(limit, self._split_wake, self._on_split),
                name="stonemq-splitter",
            ),
            loop.create_task(self._checkpoint_loop(), name="stonemq-checkpoint"),
            loop.create_task(self._retention_loop(), name="stonemq-retention"),
            loop.create_task(self._producer_expiration_loop(), name="stonemq-producer-expiry"),
        ]
        if self._flush_policy == "interval":
            self._tasks.append(
                loop.create_task(self._interval_fsync_loop(), name="stonemq-journal-fsync")
            )

    async def close(self) -> None:
        """Finish pending writes, split what is left, flush and write checkpoints."""
        if self._closed:
            return
        self._closed = True
        marks = [("start", time.monotonic())]
        with self._create_lock:  # nothing more to create ahead (the splitter makes its own)
            self._create_pending.clear()
            self._to_create.clear()
        # stop the background tasks only between checkpoint rounds: a round cancelled in the
        # middle has already taken its queues off the dirty set and its log starts off the
        # changed flag, while its write goes on in an executor thread (a clean stop right
        # after DeleteRecords came back with the old log start)
        lock = self._checkpoint_lock or asyncio.Lock()
        async with lock:
            for task in self._tasks:
                task.cancel()
            for task in self._tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._tasks = []
        for timer in self._fsync_timers.values():
            timer.cancel()
        self._fsync_timers.clear()
        marks.append(("background tasks", time.monotonic()))
        if self._recovered and self._splitter is not None:
            for journal in self._journals:
                await journal.drain()
            if self._fsyncs:  # acks waiting for their topic's fsync get it
                await asyncio.gather(*list(self._fsyncs), return_exceptions=True)
            marks.append(("journal writes", time.monotonic()))
            advanced: set[QueueLog] = set()
            for j, journal in enumerate(self._journals):
                if not journal.health.splits:
                    continue  # offline: the next start replays it
                limit = journal.visible_end
                if self._split_limits is not None:  # replicated: never past the HW
                    limit = min(limit, self._split_limits[j])
                try:
                    self._splitter.split_to(j, limit, advanced)
                except SplitError as exc:
                    self._splitter.failed(exc)
                    log.error("final split of journal-%d failed: %s", j, exc)
            self._on_split(advanced)
            marks.append(("final split", time.monotonic()))
            await self._snapshot_producers()
            marks.append(("producer snapshots", time.monotonic()))
            if self._checkpoint_lock is None:
                self._checkpoint_lock = asyncio.Lock()
            try:
                await self._flush_queues(list(self._dirty), journal_to_end=True)
            except (OSError, StorageError) as exc:
                # the journal still holds everything: the next start re-splits it
                log.error("final flush failed, recovery will re-split the journal: %s", exc)
            self._splitter.close()
            marks.append(("flush", time.monotonic()))
        for journal in self._journals:
            journal.close()
        self._files.close_all()
        if self._creator is not None:
            self._creator.shutdown(wait=True)
            self._creator = None
        if self._disk_readers is not None:
            self._disk_readers.shutdown(wait=True)
            self._disk_readers = None
        marks.append(("threads", time.monotonic()))
        log.info(
            "storage closed in %.2f s (%s)",
            marks[-1][1] - marks[0][1],
            ", ".join(f"{b[0]} {b[1] - a[1]:.2f} s" for a, b in itertools.pairwise(marks)),
        )

    async def _snapshot_producers(self) -> None:
        """At a clean stop: a producer snapshot of every queue log that took batches since its
        last one, so the next start loads them instead of replaying batch headers."""
        snapshots = []
        for state in self._by_name.values():
            queue = state.queue
            if queue is None or not queue.segments or queue.failed is not None:
                continue
            if queue.producers is None or queue.producers.snapshot_offset != queue.next_offset:
                snapshots.append((queue.directory, *queue.take_snapshot()))
        if not snapshots:
            return
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._directory_thread(), _write_snapshots, snapshots)
        try:
            await loop.run_in_executor(None, fsync_paths, sorted({d for d, _, _ in snapshots}))
        except OSError as exc:  # a lost snapshot costs a replay at the next start, no data
            log.warning("producer snapshot directories not synced: %s", exc)

    # -- write path ---------------------------------------------------------------------------
    def append(
        self,
        topic: str,
        partition: int,
        batch: bytes | bytearray,
        record_count: int,
        leader_epoch: int | None = None,
        producer: BatchHeader | None = None,
        crc_checked: bool = False,
    ) -> AppendResult:
        """Assign offsets to one validated RecordBatch v2 and queue it on its journal
        partition (group commit) with its base offset and partition leader epoch patched in:
        the batch's bytes are written as they are, without a copy (a ``bytearray`` has its
        base offset patched in place too). Neither field is covered by the batch's CRC.

        ``producer``: the batch's header when it comes from an idempotent producer; its
        sequence is checked against the partition's producer state first, which raises
        DuplicateSequenceError, OutOfOrderSequenceError or InvalidProducerEpochError
        (``producer_state.py``).
        ``crc_checked``: the batch's CRC field is known to match its bytes (the produce path
        checked it): the journal entry's CRC is derived from it, not read over the batch again.
        Raises StorageError / UnknownPartitionError synchronously when it cannot even be
        queued.

        ``batch`` is written by a later loop iteration: do not reuse it before ``written``."""
        state = self._by_name.get((topic, partition))
        if state is None:
            raise UnknownPartitionError(f"{topic}-{partition}")
        if self._closed:
            raise StorageError("storage is closed")
        self._ensure_recovered()
        journal = self._journals[state.journal]
        if not self._leading[state.journal]:
            raise NotLeaderError(f"{topic}-{partition}: journal-{state.journal} not led here")
        journal.health.check_append()  # offline, or its queue logs cannot be written
        producers = None
        if producer is not None and producer.producer_id >= 0 and producer.base_sequence >= 0:
            producers = self._open_queue(state).producer_state()
            producers.check(
                producer.producer_id,
                producer.producer_epoch,
                producer.base_sequence,
                producer.last_sequence,
            )
        base = state.next_offset
        if isinstance(batch, bytearray):
            set_base_offset(batch, 0, base)
        if leader_epoch is None:  # the journal partition's epoch (0 on a single node)
            leader_epoch = self._leader_epochs[state.journal]
        prefix = encode_entry_prefix(
            state.topic_id, partition, base, record_count, batch, leader_epoch, crc_checked
        )
        body = memoryview(batch)[ENTRY_PREFIX_COVERED_BYTES:]
        self._headroom.check(len(prefix) + len(body))
        loop = self._append_loop
        if loop is None:  # asking for the running loop costs a getpid() syscall: once
            loop = self._append_loop = asyncio.get_running_loop()
        written: asyncio.Future[None] = loop.create_future()
        journal.enqueue(prefix, body, (written, state, base, len(prefix) + len(body)))
        state.next_offset = base + record_count
        acked = self._topic_flush(journal, state, record_count, written)
        if producers is not None:
            assert producer is not None
            # as written: a LogAppendTime topic's batch carries its append time by now
            stored_ts = _MAX_TIMESTAMP.unpack_from(batch, MAX_TIMESTAMP_AT)[0]
            producers.appended(
                producer.producer_id,
                producer.producer_epoch,
                BatchSeq(
                    producer.base_sequence,
                    producer.last_sequence,
                    base,
                    base + record_count - 1,
                    acked,
                    stored_ts,
                ),
                stored_ts,
            )
        queue = state.queue
        if queue is None:
            log_start = 0
        elif queue.segments:  # QueueLog.log_start_offset, without its property's call
            log_start = min(max(queue.log_start, queue.segments[0].base_offset), queue.next_offset)
        else:
            log_start = queue.next_offset
        return _new_tuple(AppendResult, (base, log_start, acked))  # NamedTuple's __new__ is
        # a Python function (a frame per batch)

    def _topic_flush(
        self,
        journal: JournalLog,
        state: _Partition,
        record_count: int,
        written: asyncio.Future[None],
    ) -> asyncio.Future[None]:
        """The future an append's ack waits for under its topic's flush.messages / flush.ms
        (Kafka's per-log flush, done here as an fsync of the partition's journal partition,
        which holds the batch): ``written`` itself unless an fsync is due. Once
        ``flush.messages`` records are unflushed, or with ``flush.ms`` 0, the ack waits for
        the fsync covering the batch (as Kafka's append flushes before it returns); a
        positive ``flush.ms`` has the journal fsynced at most that long after the append,
        without holding the ack (Kafka's log flusher). Under ``always`` every ack already
        waits for its fsync."""
        config = state.config
        if journal.flush_policy == "always" or (
            config.flush_messages == NO_FLUSH and config.flush_ms == NO_FLUSH
        ):
            return written
        state.unflushed_messages += record_count
        if state.unflushed_messages < config.flush_messages and config.flush_ms != 0:
            if config.flush_ms != NO_FLUSH:
                self._fsync_within(journal, config.flush_ms)
            return written
        state.unflushed_messages = 0
        acked: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def then_fsync(done: asyncio.Future[None]) -> None:
            if acked.done():
                return
            if done.cancelled() or done.exception() is not None:
                _copy_outcome(done, acked)
                return
            task = asyncio.ensure_future(self._fsync_journal(journal, journal.written_end))
            self._fsyncs.add(task)
            task.add_done_callback(self._fsyncs.discard)
            task.add_done_callback(lambda t: _ack_when_durable(t, acked, journal.index))

        written.add_done_callback(then_fsync)
        return acked

    def _fsync_within(self, journal: JournalLog, delay_ms: int) -> None:
        """Have ``journal`` fsynced (up to what is written then) at most ``delay_ms`` from now:
        a topic's positive flush.ms; one timer per journal partition, the earliest kept."""
        loop = asyncio.get_running_loop()
        due = loop.time() + delay_ms / 1000
        timer = self._fsync_timers.get(journal.index)
        if timer is not None and timer.when() <= due:
            return

        def fire() -> None:
            self._fsync_timers.pop(journal.index, None)
            if self._closed:
                return
            task = asyncio.ensure_future(self._fsync_journal(journal, journal.written_end))
            self._fsyncs.add(task)
            task.add_done_callback(self._fsyncs.discard)

        if timer is not None:
            timer.cancel()
        self._fsync_timers[journal.index] = loop.call_at(due, fire)

    def _on_journal_failed(self, metas: list[tuple[Any, Any, int, int]], give_back: bool) -> None:
        """Journal entries failed (a failed write and every entry queued behind it): give
        their offsets back so no gap is left, unless the journal partition went offline
        (it takes no more appends in this process)."""
        lowest: dict[_Partition, int] = {}
        for _, state, base, _ in metas:
            if state is None:  # a replica's entry: the follower fetches it again
                continue
            if base < lowest.get(state, base + 1):
                lowest[state] = base
        for state, base in lowest.items():
            queue = state.queue
            if queue is not None and queue.producers is not None:
                queue.producers.failed(base)  # never a duplicate of what was not stored
            if give_back:
                state.next_offset = min(state.next_offset, base)

    def _on_journal_visible(self) -> None:
        if self._split_wake is not None:
            self._split_wake.set()

    def _epoch_write_failed(self, j: int, exc: OSError) -> StorageError:
        """A write of journal partition ``j``'s leader-epoch checkpoint failed. Before its
        rename, for lack of space, the old file stands and the history in memory is
        unchanged (LeaderEpochCache writes the file first): the partition is out of space
        (JOURNAL_FULL, as for a journal write), and the append that needed the new epoch is
        tried again. Anything else goes offline, as Kafka takes a log directory offline
        when its leader-epoch checkpoint cannot be written: the history is what replicas
        truncate by, and appending in an epoch it does not hold durably would leave a
        restart without it."""
        if is_space_error(exc) and not isinstance(exc, CheckpointNotDurableError):
            event = Event.JOURNAL_WRITE_FULL
        else:
            event = Event.CHECKPOINT_FAILED
        self._journals[j].health.on(event, f"leader-epoch checkpoint: {exc}")
        return StorageError(f"journal-{j}: leader-epoch checkpoint not written: {exc}")

    def _on_journal_offline(self, j: int) -> None:
        hook = self.on_journal_offline
        if hook is not None:
            hook(j)

    def _on_journal_full(self, j: int) -> None:
        hook = self.on_journal_full
        if hook is not None:
            hook(j)

    def _on_headroom(self) -> None:
        """The read directory's room for the splitter ran out or came back: every journal
        partition's appends are refused or taken again."""
        for journal in self._journals:
            self._on_journal_full(journal.index)

    def out_of_space(self, j: int) -> bool:
        """Whether journal partition ``j``'s appends fail or are refused for lack of space:
        its journal or the queue logs full (health.py), or too little room left for the
        splitter (space.py)."""
        state = self._journals[j].health.state
        return state in (Health.JOURNAL_FULL, Health.SPLIT_FULL) or self._headroom.refusing

    def _on_journal_bytes(self, j: int, position: int, pieces: list[Any], sizes: list[int]) -> None:
        hook = self.on_journal_bytes
        if hook is not None:
            hook(j, position, pieces, sizes)

    def _on_replicated_visible(self, j: int) -> None:
        # the splitter of a replicated journal stops at its HW (the split limit): a write
        # gives it work only when that limit was already past the old visible end
        wake, splitter, limits = self._split_wake, self._splitter, self._split_limits
        if (
            wake is not None
            and splitter is not None
            and limits is not None
            and min(self._journals[j].visible_end, limits[j]) > splitter.positions[j]
        ):
            wake.set()
        hook = self.on_journal_written
        if hook is not None:
            hook(j)  # the HW may move (the splitter's limit with it), followers wake

    def _on_split(self, advanced: set[QueueLog]) -> None:
        for watcher in self.split_watchers:
            watcher()
        if self._split_waiters:
            self._wake_split_waiters()
        self._release_pages()
        self._dirty |= advanced
        listener = self._listener
        rolled = False
        snapshots: list[tuple[str, int, bytes]] = []
        for queue in advanced:
            if queue.snapshot_due is not None:
                snapshots.append((queue.directory, *queue.snapshot_due))
                queue.snapshot_due = None
            if queue.unflushed:
                rolled = True
            if listener is not None:
                try:
                    listener(queue.topic, queue.partition, queue.next_offset)
                except Exception:
                    log.exception("split listener failed")
        if rolled and self._checkpoint_wake is not None:
            self._checkpoint_wake.set()
        if snapshots and not self._closed:
            asyncio.get_running_loop().run_in_executor(
                self._directory_thread(), _write_snapshots, snapshots
            )

    def _release_pages(self) -> None:
        """Drop the page cache of journal bytes that are split and durable and of queue-log
        bytes past the write-behind window (in an executor thread; see ``page_cache.py``)."""
        splitter = self._splitter
        if splitter is None or self._closed:
            return
        loop = asyncio.get_running_loop()
        ranges: list[Range] = []
        for j, journal in enumerate(self._journals):
            ranges.extend(journal.pages_to_release(splitter.positions[j]))
        if ranges:
            loop.run_in_executor(None, drop_ranges, ranges)
        hint, drop = self._written_pages.due()
        if hint or drop:
            loop.run_in_executor(None, release_written, hint, drop).add_done_callback(
                self._written_back
            )

    def _written_back(self, fut: asyncio.Future[dict[str, OSError]]) -> None:
        """A write-back wait failed for some queue-log files: the kernel reported the error
        once, to this wait, and a later fsync may succeed as if nothing was lost. Those queue
        logs fail and their journal partitions go offline before any checkpoint can count
        the lost bytes as durable."""
        if fut.cancelled():
            return
        exc = fut.exception()
        failed: dict[str, BaseException] = {"?": exc} if exc is not None else dict(fut.result())
        for path, error in failed.items():
            queue = self._queue_for_path(path)
            if queue is None:
                for journal in self._journals:  # cannot tell whose: trust none
                    journal.health.on(Event.QUEUE_WRITEBACK_FAILED, f"{path}: {error}")
                continue
            self._fail_queue(queue, Event.QUEUE_WRITEBACK_FAILED, f"{path}: {error}")

    def _queue_for_path(self, path: str) -> QueueLog | None:
        """The open queue log a file of ``<queue dir>/<topic>-<partition>/`` belongs to."""
        topic, _, partition = os.path.basename(os.path.dirname(path)).rpartition("-")
        state = self._by_name.get((topic, int(partition))) if partition.isdigit() else None
        return state.queue if state is not None else None

    def _fail_queue(self, queue: QueueLog, event: Event, detail: object) -> None:
        """A queue log's bytes are no longer known good: it answers reads with a storage
        error, and its journal partition goes offline (``health.py``)."""
        if queue.failed is None:
            queue.failed = StorageError(f"{queue.topic}-{queue.partition}: {event.value}: {detail}")
        self._journals[queue.journal_partition].health.on(event, detail)

    # -- flushing and checkpoints -------------------------------------------------------------
    async def _interval_fsync_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._flush_interval_ms / 1000)
            for journal in self._journals:
                await self._fsync_journal(journal, journal.written_end)
            self._release_pages()

    async def _fsync_journal(self, journal: JournalLog, end: int) -> bool:
        """fsync ``journal`` up to ``end`` (off the loop); False when it is or goes offline.
        A failed fsync is never retried: it takes the journal partition offline. Nor does an
        fsync that succeeds once another of the same journal has failed (the interval flush,
        a checkpoint round and a topic's flush.ms may overlap) make anything durable: the
        pages whose writeback failed may have been dropped, so its success proves nothing."""
        if journal.health.offline:
            return False
        paths = journal.sync_paths(end)
        if paths:
            try:
                await asyncio.get_running_loop().run_in_executor(None, fsync_paths, paths)
            except OSError as exc:
                journal.mark_fsync_failed(exc)
                return False
            if journal.health.offline:  # an overlapping fsync failed meanwhile
                return False
        journal.mark_durable(end)
        return True

    async def _checkpoint_loop(self) -> None:
        assert self._checkpoint_wake is not None
        interval_s = self._checkpoint_interval_ms / 1000
        deadline = time.monotonic() + interval_s
        while True:
            timeout = max(deadline - time.monotonic(), 0)
            # not wait_for: on 3.11 it can swallow a cancel that races with the event
            waiter = asyncio.ensure_future(self._checkpoint_wake.wait())
            try:
                await asyncio.wait([waiter], timeout=timeout)
            finally:
                waiter.cancel()
            if self._closed:
                return
            self._checkpoint_wake.clear()
            if time.monotonic() >= deadline:
                deadline = time.monotonic() + interval_s
                # only the dirty queue logs that pin a sealed journal segment: the others'
                # data is in the active journal segment, which no flush could delete yet
                queues = [q for q in self._dirty if self._pins_journal(q)]
            else:
                queues = [q for q in self._dirty if q.unflushed]  # the ones that rolled
            try:
                await self._flush_queues(queues)
            except Exception:
                log.exception("queue log flush failed")
                await asyncio.sleep(1.0)

    def _pins_journal(self, queue: QueueLog) -> bool:
        first = queue.first_unflushed_journal_position
        if queue.unflushed:
            return True
        return first is not None and first < self._journals[queue.journal_partition].segments[-1]

    async def flush(self) -> None:
        """Flush every dirty queue log and write the checkpoints now."""
        if self._checkpoint_lock is None:
            self._checkpoint_lock = asyncio.Lock()
        await self._flush_queues(list(self._dirty), journal_to_end=True)

    async def _flush_queues(self, queues: list[QueueLog], journal_to_end: bool = False) -> None:
        """Flush ``queues``: their journals first (single-node rule), then their files, then
        the checkpoints; then delete journal segments every queue log has flushed past.

        Failure rules (``health.py``): a journal partition that is offline, or goes offline
        because an fsync of its journal or of one of its queue logs fails here, is frozen:
        its queue logs' recovery points, its checkpointed positions and its journal segments
        stay as they were, so the next start replays everything it may have lost. The other
        journal partitions' checkpoints still move."""
        assert self._checkpoint_lock is not None and self._splitter is not None
        async with self._checkpoint_lock:
            loop = asyncio.get_running_loop()
            split_positions = list(self._splitter.positions)
            snapshot: list[_Flushing] = []
            index_jobs: list[IndexWrite] = []
            for queue in queues:
                if self._journals[queue.journal_partition].health.offline or queue.failed:
                    continue  # frozen until restart
                targets: list[str] = []
                if queue.segments:
                    targets, jobs = queue.flush_targets()
                    index_jobs.extend(jobs)
                snapshot.append(
                    _Flushing(
                        queue,
                        queue.recovery_point(),
                        queue.first_unflushed_journal_position,
                        queue.unflushed,
                        targets,
                    )
                )
                queue.mark_flushing()
                self._dirty.discard(queue)
            if len(snapshot) > len(self._dirty):
                # a set never shrinks its table: 100,000 queue logs dirty once kept theirs
                self._dirty = set(self._dirty)
            for journal, position in zip(self._journals, split_positions, strict=True):
                await self._fsync_journal(
                    journal, journal.written_end if journal_to_end else position
                )
            failed: dict[str, OSError] = {}
            try:
                paths = [path for item in snapshot for path in item.paths]
                await loop.run_in_executor(
                    None, _write_index_and_fsync, self._files, index_jobs, paths
                )
            except FsyncError as exc:
                failed = exc.failed
            finally:
                for job in index_jobs:
                    job.done()
            for item in snapshot:
                bad = [path for path in item.paths if path in failed]
                if bad:
                    self._fail_queue(item.queue, Event.QUEUE_FSYNC_FAILED, failed[bad[0]])
                if bad or self._journals[item.queue.journal_partition].health.offline:
                    item.restore_dirty()
                    self._dirty.add(item.queue)
                elif item.queue.segments or item.point.offset:
                    self._set_recovery_point(item.queue, item.point)
            replay = dict(enumerate(split_positions))
            for queue in self._dirty:
                first = queue.first_unflushed_journal_position
                if first is not None and first < replay[queue.journal_partition]:
                    replay[queue.journal_partition] = first
            journal_rps = {j.index: j.durable_end for j in self._journals}
            for journal in self._journals:  # an offline journal partition's positions stay
                if journal.health.offline and self._last_checkpoint is not None:
                    journal_rps[journal.index] = self._last_checkpoint[0][journal.index]
                    replay[journal.index] = self._last_checkpoint[1][journal.index]
            rewrite = self._rewrite_checkpoints
            queue_rps: dict[tuple[str, int], QueueRecoveryPoint] | None = None
            if snapshot or rewrite:
                queue_rps = self._queue_rps()
            log_starts = None
            if self._log_starts_changed or rewrite:
                self._log_starts_changed = False
                log_starts = dict(self._log_starts)
            positions = (dict(journal_rps), dict(replay))
            if (
                queue_rps is not None
                or log_starts is not None
                or positions != self._last_checkpoint
            ):
                try:
                    await loop.run_in_executor(
                        None, self._write_checkpoints, journal_rps, replay, queue_rps, log_starts
                    )
                except OSError as exc:
                    self._checkpoint_failed(exc)
                    raise
                self._last_checkpoint = positions
                self._rewrite_checkpoints = False
            retain = self.journal_retain_from
            for journal in self._journals:
                upto = min(replay[journal.index], journal.durable_end)
                if retain is not None:  # a follower still to fetch them
                    upto = min(upto, retain(journal.index))
                deleted = 0
                taken = journal.take_segments_before(upto)
                if taken:
                    kept = await loop.run_in_executor(None, unlink_segments, taken, journal.index)
                    journal.give_back_segments(kept)
                    deleted = len(taken) - len(kept)
                if deleted and self._epoch_caches:
                    # the epoch history starts where the journal now starts (Kafka's
                    # truncateFromStart); a failed write leaves the longer history, still true
                    try:
                        await loop.run_in_executor(
                            None,
                            self._epoch_caches[journal.index].truncate_from_start,
                            journal.start_position,
                        )
                    except OSError as exc:
                        log.warning(
                            "journal-%d: epoch checkpoint not trimmed: %s", journal.index, exc
                        )

    def _checkpoint_failed(self, exc: OSError) -> None:
        """A checkpoint write failed. Before its rename, for lack of space: the old file
        stands, the next round writes every file again. Anything else, or a rename whose
        directory fsync failed (the new file may or may not survive a power loss): no
        journal partition can trust a checkpoint any more, so all go offline."""
        if is_space_error(exc) and not isinstance(exc, CheckpointNotDurableError):
            self._rewrite_checkpoints = True
            return
        for journal in self._journals:
            journal.health.on(Event.CHECKPOINT_FAILED, exc)

    def _write_checkpoints(
        self,
        journal_rps: dict[int, int],
        split_positions: dict[int, int],
        queue_rps: dict[tuple[str, int], QueueRecoveryPoint] | None,
        log_starts: dict[tuple[str, int], int] | None,
    ) -> None:
        """Queue-side files first: the journal-side positions that let journal segments go
        are written only once the queue logs' recovery points that justify them are."""
        if log_starts is not None:
            write_offsets(os.path.join(self._queue_dir, LOG_START_OFFSET_FILE), log_starts)
        if queue_rps is not None:
            write_queue_recovery_points(
                os.path.join(self._queue_dir, QUEUE_RECOVERY_POINT_FILE), queue_rps
            )
        write_positions(os.path.join(self._journal_dir, SPLIT_POSITION_FILE), split_positions)
        write_positions(os.path.join(self._journal_dir, JOURNAL_RECOVERY_POINT_FILE), journal_rps)

    # -- retention and DeleteRecords -----------------------------------------------------------
    def delete_records(
        self, topic: str, partition: int, offset: int, archived: bool = False
    ) -> LogStartAppend | None:
        """DeleteRecords: queue a log-start entry moving the partition's log start offset to
        ``offset`` (-1: the high watermark) on its journal partition. Every replica's
        splitter applies it (``_apply_log_start``: the segments wholly below it are
        deleted), this broker's too, once it is below the journal's high watermark: the
        log start offset has moved here once :meth:`split_past` the returned ``end``
        resolves. None when the log start is already there (nothing is written), unless
        ``archived`` (a tiered partition: the entry moves every replica's cold log start too,
        also below the local log start: ``on_log_start``).

        Raises OffsetOutOfRangeError when ``offset`` is above the high watermark (what is
        split here) or below -1, UnknownPartitionError, NotLeaderError when the journal
        partition is not led here, StorageError when it takes no appends."""
        state = self._state(topic, partition)
        queue = state.queue
        hw = queue.next_offset if queue is not None else 0
        if offset == -1:
            offset = hw
        if offset < 0 or offset > hw:
            raise OffsetOutOfRangeError(
                f"{topic}-{partition}: delete-records offset {offset} outside [0, {hw}]"
            )
        if queue is None or offset <= (0 if archived else queue.log_start_offset):
            return None
        if self._closed:
            raise StorageError("storage is closed")
        j = state.journal
        if not self._leading[j]:
            raise NotLeaderError(f"{topic}-{partition}: journal-{j} not led here")
        journal = self._journals[j]
        journal.health.check_append()
        entry = encode_log_start_entry(state.topic_id, partition, offset, self._leader_epochs[j])
        self._headroom.check(len(entry))
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        journal.enqueue(entry, b"", (written, None, -1, len(entry)))  # no offsets to give back
        return LogStartAppend(j, self.journal_end(j), written)

    def _apply_log_start(self, queue: QueueLog, offset: int) -> None:
        """The splitter met a log-start entry of ``queue`` (this broker's DeleteRecords or its
        leader's, or a re-split at recovery: a log start only moves forward)."""
        try:
            self._advance_log_start(queue, offset, "DeleteRecords")
        except OSError as exc:  # the log start moved; a segment file may be left behind
            log.error("%s-%d: log start offset %d: %s", queue.topic, queue.partition, offset, exc)
        # every replica's, the leader's too: its DeleteRecords handler moves it again and
        # answers by that move, but a handler that ended early (NOT_LEADER, a crash after
        # the entry was written) left the leader's archive start behind for good
        if self.on_log_start is not None:
            try:
                self.on_log_start(queue.topic, queue.partition, offset)
            except Exception:
                log.exception("%s-%d: log start %d listener", queue.topic, queue.partition, offset)

    def split_past(self, j: int, position: int) -> asyncio.Future[None]:
        """A future resolved once the splitter's position in journal partition ``j`` is at or
        past ``position`` (what the journal holds below it is in the queue logs, log-start
        entries applied). It never fails: the caller bounds the wait."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        splitter = self._splitter
        if splitter is not None and splitter.positions[j] >= position:
            future.set_result(None)
        else:
            self._split_waiters.append((j, position, future))
        return future

    def _wake_split_waiters(self) -> None:
        splitter = self._splitter
        assert splitter is not None
        positions = splitter.positions
        waiting = []
        for j, position, future in self._split_waiters:
            if future.done():
                continue  # the caller gave up
            if positions[j] >= position:
                future.set_result(None)
            else:
                waiting.append((j, position, future))
        self._split_waiters = waiting

    def _advance_log_start(self, queue: QueueLog, offset: int, why: str) -> None:
        before = queue.log_start_offset
        if offset <= before:
            return
        deleted = queue.advance_log_start(offset)
        self._unlink_doomed(queue)
        if queue.dirty:
            self._dirty.add(queue)
        self._log_starts[(queue.topic, queue.partition)] = queue.log_start_offset
        self._log_starts_changed = True
        if self._checkpoint_wake is not None:
            self._checkpoint_wake.set()
        log.info(
            "%s-%d: log start offset %d -> %d (%s, %d segments deleted)",
            queue.topic,
            queue.partition,
            before,
            queue.log_start_offset,
            why,
            deleted,
        )

    def _unlink_doomed(self, queue: QueueLog) -> None:
        """Unlink the files of the segments ``queue`` dropped, in the directory thread (in
        order with its other work) when a loop runs, else at once."""
        paths, queue.doomed = queue.doomed, ()
        create, queue.to_create = queue.to_create, ()
        if not paths and not create:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            _remove_files(paths, create)
            return
        done = loop.run_in_executor(self._directory_thread(), _remove_files, paths, create)
        if create:
            # the empty segment's name is durable only once a flush fsyncs the directory
            # after the file exists: a flush between roll_empty and now cleared new_files
            # before it did, and later flushes fsynced the segment's contents but never its
            # name again (audit31 p1)
            def created(_: object) -> None:
                if not queue.removed:
                    queue.new_files = True
                    self._dirty.add(queue)

            done.add_done_callback(created)

    async def wait_directory_work(self, timeout_s: float = 60.0) -> bool:
        """Wait (at most ``timeout_s``) for the directory thread's work queued so far:
        directories created, segment files unlinked, deleted topics' directories removed."""
        return await self.wait_precreated(timeout_s)

    def apply_retention(self, now_ms: int | None = None) -> int:
        """Apply retention.ms and retention.bytes to every queue log with sealed data; returns
        how many queue logs had their log start advanced."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        advanced = 0
        for state in list(self._by_name.values()):
            queue = state.queue
            if queue is None or not queue.segments:
                continue
            cutoff = queue.retention_cutoff(now)
            if self.local_retention is not None:
                cutoff = max(cutoff, self.local_retention(queue, now))
            if cutoff > queue.log_start_offset:
                try:
                    self._advance_log_start(queue, cutoff, "retention")
                except OSError as exc:
                    log.error("%s-%d: retention failed: %s", queue.topic, queue.partition, exc)
                    continue
                advanced += 1
        return advanced

    def set_producer_expiration_ms(self, ms: int) -> None:
        """``producer.id.expiration.ms`` changed (a dynamic broker config): the next expiry
        check uses it."""
        self._producer_expiration_ms = ms

    def expire_producers(self, now_ms: int | None = None) -> int:
        """Forget idempotent producers idle for ``producer.id.expiration.ms``."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        expired = 0
        for state in self._by_name.values():
            queue = state.queue
            if queue is not None and queue.producers is not None:
                expired += queue.producers.expire(now, self._producer_expiration_ms)
        if expired:
            log.info("expired %d idle producer ids", expired)
        return expired

    async def _producer_expiration_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._producer_expiration_check_ms / 1000)
            self.expire_producers()

    async def _retention_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._retention_check_interval_ms / 1000)
            try:
                self.apply_retention()
            except Exception:
                log.exception("retention check failed")

    # -- read path ----------------------------------------------------------------------------
    def _state(self, topic: str, partition: int) -> _Partition:
        state = self._by_name.get((topic, partition))
        if state is None:
            raise UnknownPartitionError(f"{topic}-{partition}")
        return state

    def log_start_offset(self, topic: str, partition: int) -> int:
        queue = self._state(topic, partition).queue
        return queue.log_start_offset if queue is not None else 0

    def high_watermark(self, topic: str, partition: int) -> int:
        """Next offset past what has been split (what consumers may read)."""
        queue = self._state(topic, partition).queue
        return queue.next_offset if queue is not None else 0

    def log_end_offset(self, topic: str, partition: int) -> int:
        """Next offset to assign (journal side)."""
        return self._state(topic, partition).next_offset

    def read(
        self, topic: str, partition: int, offset: int, max_bytes: int, reads: Reads | None = None
    ) -> ReadResult:
        """Whole batches from the batch containing ``offset``, up to ``max_bytes`` but at least
        one batch. Empty data from the high watermark (what is split) up to the log end (what
        is acknowledged), as Kafka answers a fetch between its high watermark and log end;
        only an offset below the log start or above the log end raises
        OffsetOutOfRangeError. A queue log whose files failed raises StorageError."""
        state = self._state(topic, partition)
        queue = state.queue
        end = state.next_offset
        if queue is None:
            if not 0 <= offset <= end:
                raise OffsetOutOfRangeError(
                    f"{topic}-{partition} offset {offset} outside [0, {end}]"
                )
            return ReadResult(b"", 0, 0)
        if queue.failed is not None:
            raise StorageError(str(queue.failed))
        start, hw = queue.log_start_offset, queue.next_offset
        if offset < start or offset > max(end, hw):
            raise OffsetOutOfRangeError(
                f"{topic}-{partition} offset {offset} outside [{start}, {max(end, hw)}]"
            )
        data = queue.read(offset, max_bytes, reads) if offset < hw else b""
        return ReadResult(data, hw, start)

    async def read_async(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int,
        file_range: bool = False,
        every_batch: bool = False,
    ) -> ReadResult:
        """:meth:`read` that never waits for the disk on the event loop (fetches): up to
        ``LOOP_READ_MAX_BYTES`` that the page cache holds is read at once (``CachedReads``),
        anything else in a disk-read thread, from views of the segments taken on the loop
        (``read_views``). With ``file_range`` the thread's answer is a
        :class:`~stonemq.storage.file_range.FileRange` of the segment file (the bytes are not
        read into Python; the caller sends them with ``sendfile`` and closes it) when it is
        ``MIN_RANGE_BYTES`` or more; ``every_batch``: the range says whether any of its
        batches is zstd-compressed (``read_range_views``)."""
        for _ in range(VIEW_ATTEMPTS):
            try:
                return self.read(topic, partition, offset, max_bytes, CachedReads(self._files))
            except NotCachedError:
                pass
            queue = self._state(topic, partition).queue
            assert queue is not None  # read() answered from the state when there is none
            hw, start = queue.next_offset, queue.log_start_offset
            views = queue.views(offset, limit=READ_VIEW_SEGMENTS)
            data: bytes | memoryview | FileRange
            try:
                if file_range:
                    data = await self._disk_read(
                        read_range_views, views, offset, max_bytes, every_batch
                    )
                else:
                    data = await self._disk_read(read_views, views, offset, max_bytes)
            except FileNotFoundError:  # a segment went (retention) while it was read
                continue
            return ReadResult(data, hw, start)
        raise StorageError(f"{topic}-{partition}: segments kept going while read")

    async def _disk_read(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args, reads)`` in a disk-read thread, with descriptors of its own
        (``DiskReads``, closed by that thread); an I/O error other than a file that went
        raises StorageError (KAFKA_STORAGE_ERROR)."""
        if self._disk_readers is None:
            self._disk_readers = ThreadPoolExecutor(
                DISK_READ_THREADS,
                thread_name_prefix="stonemq-disk-read",
                initializer=name_os_thread,
            )
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._disk_readers, _with_disk_reads, fn, args
            )
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise StorageError(f"read failed: {exc}") from exc

    async def offset_for_timestamp(
        self, topic: str, partition: int, timestamp_ms: int
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after the log start with timestamp
        >= timestamp_ms; None when there is none. The whole search (time index, batch
        headers, records decoded with bounded decompression) runs in a disk-read thread
        over views of the segments; it is taken again when retention moved the log start
        past its answer or deleted a segment under it. StorageError when stored records
        cannot be decoded."""
        return await self._time_query(topic, partition, time_search, timestamp_ms)

    async def max_timestamp(self, topic: str, partition: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after the log start with the
        largest timestamp; None if empty (searched like :meth:`offset_for_timestamp`)."""
        return await self._time_query(topic, partition, max_time_search)

    async def epoch_end_offset(self, topic: str, partition: int, epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch for a topic partition from its batches' leader epochs
        (``queue_log.epoch_search``, in a disk-read thread): (epoch, end offset)."""
        for _ in range(VIEW_ATTEMPTS):
            state = self._state(topic, partition)
            queue = state.queue
            if queue is None:
                return epoch, state.next_offset
            if queue.failed is not None:
                raise StorageError(str(queue.failed))
            try:
                return await self._disk_read(
                    epoch_search, queue.views(), epoch, queue.next_offset, queue.log_start_offset
                )
            except FileNotFoundError:  # a segment went (retention) while it was read
                continue
        raise StorageError(f"{topic}-{partition}: segments kept going during the search")

    async def leader_epoch_at(self, topic: str, partition: int, offset: int) -> int:
        """The leader epoch of the batch holding ``offset`` (``queue_log.epoch_at``, in a
        disk-read thread): what ListOffsets answers beside an offset it found; -1 when no
        local batch holds it."""
        for _ in range(VIEW_ATTEMPTS):
            queue = self._state(topic, partition).queue
            if queue is None or not queue.log_start_offset <= offset < queue.next_offset:
                return -1
            if queue.failed is not None:
                raise StorageError(str(queue.failed))
            try:
                return await self._disk_read(epoch_at, queue.views(), offset)
            except FileNotFoundError:  # a segment went (retention) while it was read
                continue
        return -1

    async def _time_query(
        self,
        topic: str,
        partition: int,
        search: Callable[..., tuple[int, int] | None],
        *args: int,
    ) -> tuple[int, int] | None:
        for _ in range(VIEW_ATTEMPTS):
            queue = self._state(topic, partition).queue
            if queue is None:
                return None
            if queue.failed is not None:
                raise StorageError(str(queue.failed))
            log_start = queue.log_start_offset
            try:
                found = await self._disk_read(search, queue.views(), *args, log_start)
            except FileNotFoundError:  # a segment went (retention) while it was read
                continue
            queue = self._state(topic, partition).queue
            if found is None or queue is None or found[0] >= queue.log_start_offset:
                return found
        raise StorageError(f"{topic}-{partition}: the log start kept moving during the search")

    # -- replication (cluster brokers only; stonemq/replication/ drives these) -------------
    def journal_end(self, j: int) -> int:
        """Journal position the next entry of local journal partition ``j`` will start at
        (what is written plus what is queued: entries are written in order)."""
        journal = self._journals[j]
        return journal.written_end + journal.queued_bytes

    def journal_directory(self, j: int) -> str:
        return self._journals[j].directory

    def journal_start(self, j: int) -> int:
        return self._journals[j].start_position

    def journal_written_end(self, j: int) -> int:
        """What is in the files of ``j`` (its log end as replication reports it)."""
        return self._journals[j].written_end

    def leader_epoch(self, j: int) -> int:
        """The epoch appends to ``j`` carry (the one it leads in; 0 on a single node)."""
        return self._leader_epochs[j]

    def last_epoch(self, j: int) -> int:
        """The epoch of the latest entry of ``j``'s epoch history (-1: none)."""
        latest = self._epoch_caches[j].latest if self._epoch_caches else None
        return latest.epoch if latest is not None else -1

    def epoch_end(self, j: int, epoch: int) -> tuple[int, int]:
        """(largest epoch <= ``epoch``, its end journal position) from ``j``'s checkpoint, as
        OffsetForLeaderEpoch answers (storage/leader_epoch.py)."""
        if not self._epoch_caches:
            return -1, -1
        return self._epoch_caches[j].end_offset_for(epoch, self.journal_end(j))

    def epoch_entries(self, j: int) -> list[tuple[int, int]]:
        return [(e.epoch, e.start) for e in self._epoch_caches[j].entries]

    async def become_leader(self, j: int, epoch: int) -> None:
        """``j`` is led here from now in ``epoch``: the epoch starts at its journal end
        (checkpointed, in a thread, before any append carries it). The idempotent batches
        of the journal not split yet (appended as a follower, waiting for a HW) join their
        partitions' producer state as pending, so a producer's retry of one of them is
        answered as a duplicate, never appended twice. StorageError when the copy here is
        offline, or goes offline because the epoch checkpoint cannot be written."""
        journal = self._journals[j]
        if journal.health.offline:  # its leadership goes to another ISR member
            raise StorageError(f"journal-{j} is offline: {journal.health.error}")
        # no replica append from here on, and those in flight are written and their topic
        # partitions' next offsets applied first: an entry still being written would be
        # missed by the scan below and its offsets assigned again
        self._led_here.add(j)
        in_flight = list(self._replica_appends.get(j, ()))
        if j in self._installing:  # a catch-up's install (elected out of the ISR: an
            in_flight.append(self._installing[j])  # unclean election) ends first
        if in_flight:
            await asyncio.wait(in_flight)
        cache = self._epoch_caches[j]
        start = self.journal_end(j)
        assert self._splitter is not None
        split = self._splitter.positions[j]

        ends: dict[tuple[bytes, int], int] = {}

        def prepare() -> list[tuple[bytes, int, BatchHeader]]:
            found: list[tuple[bytes, int, BatchHeader]] = []
            for e in _journal_entries(journal.directory, split, start):
                if e.record_count < 0:
                    continue  # a log-start entry
                ends[(e.topic_id, e.partition)] = e.base_offset + e.record_count
                header = parse_header(e.batch, 0)
                if header.producer_id >= 0 and header.base_sequence >= 0:
                    found.append((e.topic_id, e.partition, header))
            return found

        # every entry below the epoch start is in the files before the scan reads them
        deadline = time.monotonic() + 30
        while journal.written_end < start and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, cache.assign, epoch, start)
        except OSError as exc:
            raise self._epoch_write_failed(j, exc) from exc
        found = await loop.run_in_executor(None, prepare)
        for key, end in ends.items():  # the next offsets follow every entry kept
            entry_state = self._by_name.by_id(*key)
            if entry_state is not None and end > entry_state.next_offset:
                entry_state.next_offset = end
        for topic_id, partition, header in found:
            state = self._by_name.by_id(topic_id, partition)
            if state is None:
                continue
            queue = self._open_queue(state)
            if header.base_offset < queue.next_offset:
                continue  # split meanwhile: the queue log's state has it
            queue.producer_state().appended(
                header.producer_id,
                header.producer_epoch,
                BatchSeq(
                    header.base_sequence,
                    header.last_sequence,
                    header.base_offset,
                    header.last_offset,
                ),
                header.max_timestamp,
            )
        self._leader_epochs[j] = epoch
        self._leading[j] = True

    def stop_leading(self, j: int) -> None:
        """``j`` is no longer led here (followed again, or never led here): this broker's own
        appends to it are refused (NotLeaderError) until it leads again, and its leader's
        bytes are taken through :meth:`append_replica`."""
        self._leading[j] = False
        self._led_here.discard(j)

    def set_split_limit(self, j: int, position: int) -> None:
        """The journal high watermark of ``j`` moved to ``position``: the splitter may split
        up to it (it never moves back)."""
        limits = self._split_limits
        if limits is None or position <= limits[j] or j in self._catching_up:
            return  # a catch-up is the only writer of its queue logs meanwhile
        limits[j] = position
        if self._split_wake is not None:
            self._split_wake.set()

    def split_limit(self, j: int) -> int:
        limits = self._split_limits
        return limits[j] if limits is not None else self._journals[j].visible_end

    async def _truncate_epochs(self, j: int, position: int) -> None:
        """Drop the epochs of journal partition ``j`` that start at or after ``position``
        (its epoch checkpoint, off the loop); a failed write fails the copy as a failed
        truncation does."""
        if not self._epoch_caches:
            return
        assert self._checkpoint_lock is not None
        async with self._checkpoint_lock:
            try:
                await asyncio.get_running_loop().run_in_executor(
                    None, self._epoch_caches[j].truncate_from_end, position
                )
            except OSError as exc:
                self._journals[j].health.on(Event.TRUNCATION_FAILED, exc)
                raise StorageError(f"journal-{j}: truncation to {position} failed: {exc}") from exc

    async def truncate_replica(self, j: int, position: int) -> int:
        """A follower whose history diverged from its leader's cuts journal partition ``j``
        back to ``position`` (cluster.md invariant 6): the journal files, its leader-epoch
        checkpoint, and the next offsets of the topic partitions whose entries went. Only
        journal bytes the splitter has not split can go (a follower splits below the HW,
        which a clean election never takes back): a cut below the split position raises
        StorageError and changes nothing. Returns the bytes cut."""
        if j in self._installing or j in self._catching_up:
            raise StorageError(f"journal-{j}: a catch-up is under way")
        journal = self._journals[j]
        await journal.drain()
        splitter = self._splitter
        assert splitter is not None
        if position < splitter.positions[j]:
            raise StorageError(
                f"journal-{j}: truncation to {position} is below the split position "
                f"{splitter.positions[j]} (queue logs hold batches from there: an unclean "
                "election); not truncated"
            )
        end = journal.written_end
        loop = asyncio.get_running_loop()
        if position >= end:
            # nothing to cut, but the history still ends at ``position``: an epoch this copy
            # began at its end without a batch in it (it led, or followed a leader, that
            # appended nothing before the next election) is dropped, as Kafka's
            # UnifiedLog.truncateTo always truncates its epoch cache. Kept, the copy's last
            # epoch stays one the leader never had, every fetch diverges again at the same
            # point, and the copy never catches up (a preferred election after a restart).
            await self._truncate_epochs(j, position)
            return 0

        split_from = splitter.positions[j]

        def scan(start: int, stop: int) -> dict[tuple[bytes, int], int]:
            """The next offset after each topic partition's last entry in [start, stop)."""
            return {
                (e.topic_id, e.partition): e.base_offset + e.record_count
                for e in _journal_entries(journal.directory, start, stop)
                if e.record_count >= 0  # not a log-start entry
            }

        def cut() -> tuple[set[tuple[bytes, int]], dict[tuple[bytes, int], int], int]:
            gone = set(scan(position, end))
            kept = scan(split_from, position) if gone else {}
            # the checkpointed recovery point first (Kafka checkpoints its recovery points
            # right after a truncation too): left past the cut, it would fall inside the
            # leader's entries appended next, and a crash's recovery would start scanning
            # mid-entry and cut everything from there as a torn tail
            path = os.path.join(self._journal_dir, JOURNAL_RECOVERY_POINT_FILE)
            points = read_positions(path)
            if points.get(j, -1) > position:
                points[j] = position
                write_positions(path, points)
            size = journal.truncate_to(position)
            if self._epoch_caches:
                self._epoch_caches[j].truncate_from_end(position)
            return gone, kept, size

        assert self._checkpoint_lock is not None  # no checkpoint round writes meanwhile
        async with self._checkpoint_lock:
            try:
                gone, kept, size = await loop.run_in_executor(None, cut)
            except OSError as exc:  # the journal's files, or its epochs, are not known
                journal.health.on(Event.TRUNCATION_FAILED, exc)
                raise StorageError(f"journal-{j}: truncation to {position} failed: {exc}") from exc
            if self._last_checkpoint is not None and self._last_checkpoint[0].get(j, -1) > position:
                self._last_checkpoint[0][j] = position
        # the partitions that lost entries: their queue log's end, or their last entry
        # still unsplit before ``position``
        for key in gone:
            state = self._by_name.by_id(*key)
            if state is not None:
                state.next_offset = state.queue.next_offset if state.queue is not None else 0
                state.next_offset = max(state.next_offset, kept.get(key, 0))
        log.warning(
            "journal-%d: truncated %d bytes from position %d (diverged from the leader)",
            j,
            size,
            position,
        )
        return size

    async def append_replica(self, j: int, position: int, data: memoryview) -> int:
        """A follower's append: the leader's whole journal entries in ``data``, starting at
        journal ``position`` (which must be this journal's end), checked (length, version,
        CRC) and written as they are: no offset is assigned (cluster.md invariant 2). A new
        leader epoch seen in a batch is checkpointed at its entry's position first. Once
        written, each topic partition's next offset follows its last entry. Returns the
        journal end after them. CorruptEntryError for a bad first entry; StorageError when
        the write fails (the next fetch starts again from the journal's end)."""
        if self._closed:
            raise StorageError("storage is closed")
        if j in self._led_here:
            raise StorageError(f"journal-{j} is led here: no replica append")
        if j in self._installing or j in self._catching_up:
            raise StorageError(f"journal-{j}: a catch-up is under way")
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        in_flight = self._replica_appends.setdefault(j, set())
        in_flight.add(done)
        try:
            return await self._append_replica(j, position, data)
        finally:
            in_flight.discard(done)
            done.set_result(None)

    async def _append_replica(self, j: int, position: int, data: memoryview) -> int:
        """The fetched run as one journal write with one completion (``JournalLog.enqueue_run``):
        the entries are checked first (each one's length, version and CRC), a new epoch is
        checkpointed at its first entry, and the topic partitions' next offsets follow the
        entries that reached the file, also when the write fails part way."""
        journal = self._journals[j]
        journal.health.check_append()
        if position != self.journal_end(j):
            raise StorageError(
                f"journal-{j}: replica data at {position}, journal end {self.journal_end(j)}"
            )
        entries, used = decode_entries(data, position, verify=True)
        if not entries:
            return position
        unknown = self.unknown_topic_ids(entries)
        if unknown:
            raise UnknownTopicsError(j, unknown)
        cache = self._epoch_caches[j]
        latest = cache.latest
        last = latest.epoch if latest is not None else -1
        new_epochs: list[tuple[int, int]] = []
        sizes: list[int] = []
        epoch_at = _EPOCH_FIELD.unpack_from
        for entry in entries:
            if len(entry.batch) < ENTRY_PREFIX_BATCH_BYTES:
                raise CorruptEntryError(f"journal-{j}: entry at {entry.position} has no batch")
            (epoch,) = epoch_at(entry.batch, 12)
            if epoch > last:
                new_epochs.append((epoch, entry.position))
                last = epoch
            sizes.append(entry.size)
        if new_epochs:

            def assign() -> None:
                for epoch, start in new_epochs:
                    cache.assign(epoch, start)

            try:
                await asyncio.get_running_loop().run_in_executor(None, assign)
            except OSError as exc:
                raise self._epoch_write_failed(j, exc) from exc
            if position != self.journal_end(j):
                raise StorageError(f"journal-{j}: appended to while its epochs were written")
        self._headroom.check(used)
        loop = self._append_loop
        if loop is None:
            loop = self._append_loop = asyncio.get_running_loop()
        written: asyncio.Future[None] = loop.create_future()
        journal.enqueue_run(data[:used], sizes, written, used)
        # the next offsets of what is in the file (all of it, or up to a failure), also when
        # the fetcher is cancelled meanwhile (the write goes on: shielded)
        written.add_done_callback(functools.partial(self._replica_written, entries, journal))
        await asyncio.shield(written)
        return position + used

    def unknown_topic_ids(self, entries: list[JournalEntry]) -> set[bytes]:
        """The topic ids of ``entries`` whose topic partition is not registered here and
        whose topic is not known to be deleted (a topic created, or grown, that this broker's
        metadata has not caught up with)."""
        by_id = self._by_name.by_id
        gone = self._gone_topic_ids
        return {
            e.topic_id
            for e in entries
            if e.topic_id not in gone and by_id(e.topic_id, e.partition) is None
        }

    def topics_gone(self, topic_ids: set[bytes]) -> None:
        """``topic_ids`` name no topic of the cluster's metadata (read after a sync): their
        topics were deleted, and their entries may be appended (the splitter skips them)."""
        self._gone_topic_ids.update(topic_ids)

    def _replica_written(
        self, entries: list[JournalEntry], journal: JournalLog, done: asyncio.Future[None]
    ) -> None:
        """A follower's run is written (or failed part way, or its fetcher was cancelled):
        each topic partition's next offset follows its last of ``entries`` in the file."""
        if not done.cancelled():
            done.exception()  # seen here, whether or not the fetcher still waits
        written_end = journal.written_end
        ends: dict[tuple[bytes, int], int] = {}
        for entry in entries:
            if entry.position + entry.size > written_end:
                break
            if entry.record_count >= 0:  # not a log-start entry
                ends[(entry.topic_id, entry.partition)] = entry.base_offset + entry.record_count
        by_id = self._by_name.by_id
        for key, end in ends.items():
            state = by_id(*key)
            if state is not None and end > state.next_offset:
                state.next_offset = end

    # -- catching up from a leader's state (replication/catchup.py drives these) -----------
    def catch_up_point(
        self, j: int
    ) -> tuple[int, list[tuple[int, int]], list[tuple[str, int, int, int]]]:
        """The leader's side of a catch-up (handlers/catchup.py), taken in one event-loop
        step so it is one consistent point: (P = the split position of local journal
        partition ``j``, its leader-epoch entries starting at or below P, and per topic
        partition routed to ``j`` (topic, partition, log start offset, end offset at P)).
        Every entry below P is split (the splitter publishes a step's queue-log ends and
        its new position together), so each queue log's end is its end at P."""
        assert self._splitter is not None
        point = self._splitter.positions[j]
        cache = self._epoch_caches[j] if self._epoch_caches else None
        epochs = [(e.epoch, e.start) for e in cache.entries if e.start <= point] if cache else []
        partitions = []
        for state in self._by_name.values():
            if state.journal != j:
                continue
            queue = state.queue
            if queue is None:
                partitions.append((state.topic, state.partition, 0, 0))
            else:
                partitions.append(
                    (state.topic, state.partition, queue.log_start_offset, queue.next_offset)
                )
        return point, epochs, partitions

    async def catch_up_prepare(self, j: int, timeout_s: float = 30.0) -> None:
        """A follower about to copy its leader's queue logs for local journal partition
        ``j`` (not fetched meanwhile, so its split limit stays): wait until its splitter
        has split everything up to that limit and has no write in flight, so the copy and
        the splitter never write the same queue log. StorageError when it does not get
        there (an offline journal partition). From here until :meth:`catch_up_end` (or an
        install that finishes) the attempt is the only writer of those queue logs: replica
        appends, split-limit moves, truncations and a second attempt are refused."""
        if j in self._led_here:
            raise StorageError(f"journal-{j} is led here: nothing to catch up")
        if j in self._installing or j in self._catching_up:
            raise StorageError(f"journal-{j}: a catch-up is under way")
        self._catching_up.add(j)
        try:
            await self._catch_up_ready(j, timeout_s)
        except BaseException:
            self._catching_up.discard(j)
            raise

    async def _catch_up_ready(self, j: int, timeout_s: float) -> None:
        splitter = self._splitter
        assert splitter is not None
        deadline = time.monotonic() + timeout_s
        while True:
            journal = self._journals[j]
            if journal.health.offline:
                raise StorageError(f"journal-{j} is offline")
            # split up to the limit: no split write of ``j`` is in flight (a step of ``j``
            # publishes its writes and its new position together)
            limit = min(journal.visible_end, self.split_limit(j))
            if splitter.positions[j] >= limit:
                return
            if time.monotonic() > deadline:
                raise StorageError(f"journal-{j}: the splitter did not reach {limit}")
            await asyncio.sleep(0.01)

    def catch_up_end(self, j: int) -> None:
        """The catch-up attempt of local journal partition ``j`` is over (its writes done):
        replica appends are taken again. Idempotent."""
        self._catching_up.discard(j)

    def catch_up_active(self, j: int) -> bool:
        """Whether a catch-up attempt of local journal partition ``j`` is under way (from
        :meth:`catch_up_prepare` to its end, its install included)."""
        return j in self._catching_up or j in self._installing

    def _check_catching_up(self, state: _Partition) -> None:
        if state.journal not in self._catching_up:
            raise StorageError(
                f"{state.topic}-{state.partition}: no catch-up of journal-{state.journal} "
                "prepared (catch_up_prepare)"
            )

    def catch_up_queue(self, j: int, topic: str, partition: int) -> tuple[int, int] | None:
        """(log end offset, log start offset) of a topic partition's queue log routed to
        local journal partition ``j``; None when it is not registered here (or routed
        elsewhere: the copy cannot go on)."""
        state = self._by_name.get((topic, partition))
        if state is None or state.journal != j:
            return None
        queue = self._open_queue(state)
        return queue.next_offset, queue.log_start_offset

    async def catch_up_last_batch(self, topic: str, partition: int) -> int | None:
        """The base offset of a queue log's last batch at or above its log start (None when
        it holds none): the copy fetches from there, so that batch is compared with the
        leader's (``catch_up_append``) before anything is appended after it."""
        queue = self._open_queue(self._state(topic, partition))
        if queue.next_offset <= queue.log_start_offset:
            return None
        data = (await self.read_async(topic, partition, queue.next_offset - 1, 1)).data
        base = parse_header(data).base_offset
        return base if base >= queue.log_start_offset else None

    async def catch_up_offset(self, topic: str, partition: int, leader_log_start: int) -> int:
        """Where a catch-up copies a queue log from, with its log start brought up to the
        leader's first: a queue log whose end the leader's log start passed starts again there
        (:meth:`catch_up_restart_queue`); one whose log start is below the leader's has it
        moved up (the leader's DeleteRecords and retention: their log-start entries lie below
        the catch-up point, never fetched here; Kafka's follower takes the leader's log start
        from its fetches the same way). The copy starts at this replica's last batch at or
        above the log start (compared with the leader's before anything is appended after
        it), else at its end."""
        state = self._state(topic, partition)
        queue = self._open_queue(state)
        if leader_log_start > queue.next_offset:
            await self.catch_up_restart_queue(topic, partition, leader_log_start)
            return leader_log_start
        last = await self.catch_up_last_batch(topic, partition)
        start = max(last, leader_log_start) if last is not None else queue.next_offset
        if leader_log_start > queue.log_start_offset:
            self._check_catching_up(state)
            self._advance_log_start(queue, leader_log_start, "the leader's, at a catch-up")
        return start

    async def catch_up_restart_queue(self, topic: str, partition: int, offset: int) -> None:
        """The leader's log start is past this queue log's end: empty it and start it at
        ``offset`` (Kafka's follower ``truncateFullyAndStartAt``), its producer state and
        snapshots gone with its batches: the files are unlinked and the directory fsynced in
        the directory thread (no other writer meanwhile). The log start is checkpointed by
        the install's flush; a crash before it leaves an older log start over an empty
        directory, which the next copy resets again. StorageError when the files cannot
        go (the memory already says empty at ``offset``; the next attempt copies from
        there)."""
        state = self._state(topic, partition)
        self._check_catching_up(state)
        queue = self._open_queue(state)
        if queue.writing:
            raise StorageError(f"{topic}-{partition}: a write is in flight")
        paths = [path for seg in queue.segments for path in seg.paths]
        for path in paths:
            queue.files.close(path)
        del queue.segments[:]
        queue.unflushed = ()
        queue.first_unflushed_journal_position = None
        queue.next_offset = queue.log_start = offset
        queue.producers = None
        queue.snapshot_due = None
        state.next_offset = offset
        self._log_starts[(topic, partition)] = offset
        self._log_starts_changed = True
        log.warning(
            "%s-%d: emptied (%d files) to start at offset %d (the leader's log start is past "
            "its end)",
            topic,
            partition,
            len(paths),
            offset,
        )
        queue.writing = True  # the unlinks are the only writer until they are done
        try:
            await asyncio.get_running_loop().run_in_executor(
                self._directory_thread(), _empty_directory, queue.directory, paths
            )
        except OSError as exc:
            raise StorageError(f"{topic}-{partition}: not emptied: {exc}") from exc
        finally:
            queue.writing = False

    async def catch_up_append(
        self, topic: str, partition: int, data: bytes | memoryview, end_offset: int, point: int
    ) -> int:
        """Append a leader's queue-log batches (a Fetch answer's records) to this follower's
        queue log verbatim, same offsets and leader epochs, up to ``end_offset`` (the
        leader's end at journal position ``point``): each batch's CRC is checked, batches
        the log holds already are skipped (as a re-split skips them) once found to be the
        same batch (:func:`same_batch`), offsets missing before a batch are accepted with a
        warning (Kafka's follower only requires increasing offsets), a batch overlapping the
        log's end or across ``end_offset`` is refused (StorageError) and nothing after it is
        taken. The producer state follows the batches as the splitter's appends do. Only
        within an attempt (:meth:`catch_up_prepare`). A cancel while the thread writes waits
        for it and publishes what it wrote before going on. Returns the new log end
        offset."""
        state = self._state(topic, partition)
        if state.journal in self._led_here:  # elected meanwhile (an unclean election)
            raise StorageError(f"{topic}-{partition}: its journal partition is led here")
        self._check_catching_up(state)
        queue = self._open_queue(state)
        if queue.writing:
            raise StorageError(f"{topic}-{partition}: a write is in flight")
        view = memoryview(data)
        write = queue.new_write()
        problem = None
        try:
            for at, header in iter_batches(view):
                if header.base_offset >= end_offset:
                    break
                if header.next_offset > end_offset:
                    problem = f"batch {header.base_offset}..{header.last_offset} past {end_offset}"
                    break
                if not crc_ok(view, at, header):
                    problem = f"batch at offset {header.base_offset} fails its CRC"
                    break
                batch = view[at : at + header.size]
                if (
                    not write.runs
                    and header.next_offset <= queue.next_offset
                    and header.next_offset > queue.log_start_offset
                ):  # held here already: the same batch, or the histories diverged (a log
                    # start inside it, the leader's, keeps the whole batch on both sides)
                    at_offset = max(header.base_offset, queue.log_start_offset)
                    own = (await self.read_async(topic, partition, at_offset, 1)).data
                    if not same_batch(parse_header(own), header):
                        problem = (
                            f"the batch at offset {header.base_offset} differs from the "
                            "leader's (diverged: an unclean election); not truncated"
                        )
                        break
                    continue
                if header.base_offset < write.next_offset and write.active is not None:
                    problem = (
                        f"batch {header.base_offset}..{header.last_offset} overlaps the log "
                        f"end {write.next_offset}"
                    )
                    break
                # offsets missing before it (compaction on the leader, or a gap the leader's
                # splitter accepted) are accepted, as Kafka's follower does: ``stage`` warns
                queue.stage(write, batch, max(point - 1, 0))
        except RecordBatchError as exc:
            problem = str(exc)
        if write.runs:
            write.take_index_writes()
            queue.writing = True
            written = asyncio.get_running_loop().run_in_executor(None, write.write)
            try:
                await asyncio.shield(written)
            except asyncio.CancelledError:
                # the thread still writes the files: published only once it is done (the
                # next writer starts at the published size), then the cancel goes on
                await asyncio.wait([written])
                self._catch_up_publish(state, queue, write)
                raise
            self._catch_up_publish(state, queue, write)
            if write.error is not None:
                self._fail_queue(queue, Event.QUEUE_WRITE_ERROR, write.error)
                raise StorageError(f"{topic}-{partition}: copy failed: {write.error}")
        if problem is not None:
            raise StorageError(f"{topic}-{partition}: copy refused: {problem}")
        return queue.next_offset

    def _catch_up_publish(self, state: _Partition, queue: QueueLog, write: SplitWrite) -> None:
        """What a copy's write wrote, visible (on the loop, once the thread is done)."""
        queue.publish(write)
        self._on_split({queue})
        state.next_offset = max(state.next_offset, queue.next_offset)

    async def catch_up_install(
        self, j: int, point: int, epochs: list[tuple[int, int]], keys: list[tuple[str, int]]
    ) -> None:
        """Make local journal partition ``j`` continue from ``point`` after its queue logs
        (``keys``) were copied up to the leader's ends there: the queue logs are flushed and
        checkpointed first; then a marker file ``catch-up-point`` (P and the leader's epochs)
        is written atomically in the journal partition's directory, and
        :func:`finish_catch_up` empties the journal to one empty segment at P, writes the
        epoch history at P and P as its split position and recovery point, and removes the
        marker. A crash before the marker leaves the old state (the copy resumes from the
        queue logs' ends); after it, the next start finishes the install
        (:meth:`__init__`). A failure after the marker takes the journal partition offline
        until a restart finishes it."""
        if j in self._led_here:
            raise StorageError(f"journal-{j} is led here: no catch-up")
        if j in self._installing:
            raise StorageError(f"journal-{j}: a catch-up is being installed")
        if j not in self._catching_up:
            raise StorageError(f"journal-{j}: no catch-up prepared (catch_up_prepare)")
        done = self._installing[j] = asyncio.get_running_loop().create_future()
        try:
            await self._catch_up_install(j, point, epochs, keys)
        finally:
            del self._installing[j]
            done.set_result(None)
        self._catching_up.discard(j)  # installed: the attempt is over

    async def _catch_up_install(
        self, j: int, point: int, epochs: list[tuple[int, int]], keys: list[tuple[str, int]]
    ) -> None:
        journal = self._journals[j]
        await journal.drain()
        queues = []
        for key in keys:
            state = self._by_name.get(key)
            if state is not None and state.journal == j:
                queues.append(self._open_queue(state))
        try:
            await self._flush_queues(queues)
        except OSError as exc:  # a checkpoint not written: the old state stands
            raise StorageError(f"journal-{j}: queue logs not checkpointed: {exc}") from exc
        if journal.health.offline or any(q.failed is not None for q in queues):
            raise StorageError(f"journal-{j}: queue logs not durable; not installed")
        assert self._checkpoint_lock is not None and self._splitter is not None
        loop = asyncio.get_running_loop()
        async with self._checkpoint_lock:
            if j in self._led_here:  # elected meanwhile (become_leader waits for this)
                raise StorageError(f"journal-{j}: led here now; catch-up not installed")
            try:  # before its rename: the old state stands
                await loop.run_in_executor(
                    None, write_catch_up_marker, journal.directory, point, epochs
                )
            except OSError as exc:
                raise StorageError(f"journal-{j}: catch-up marker not written: {exc}") from exc
            try:
                await loop.run_in_executor(
                    None, finish_catch_up, self._journal_dir, journal.directory, j
                )
                journal.close()
                journal.recover(None)
                journal.fsync_now()
                journal.released_end = point
                cache = LeaderEpochCache(journal.directory)
            except OSError as exc:
                journal.health.on(Event.CHECKPOINT_FAILED, exc)
                raise StorageError(f"journal-{j}: catch-up install failed: {exc}") from exc
            if self._epoch_caches:
                self._epoch_caches[j] = cache
            splitter = self._splitter
            splitter.readers[j].close()
            splitter.readers[j] = JournalReader(journal.directory)
            splitter.positions[j] = point
            if self._split_limits is not None:
                self._split_limits[j] = point
            if self._last_checkpoint is not None:
                self._last_checkpoint[0][j] = point
                self._last_checkpoint[1][j] = point
        for state in self._by_name.values():
            if state.journal == j:
                state.next_offset = state.queue.next_offset if state.queue is not None else 0
        log.warning(
            "journal-%d: caught up: journal now starts at %d (%d queue logs copied)",
            j,
            point,
            len(queues),
        )

    # -- introspection (admin APIs, tests, metrics) ---------------------------------------
    @property
    def journal_dir(self) -> str:
        return self._journal_dir

    @property
    def queue_dir(self) -> str:
        return self._queue_dir

    def partition_size_bytes(self, topic: str, partition: int) -> int:
        """Bytes of the partition's queue log (its segments), 0 before its first batch."""
        queue = self._state(topic, partition).queue
        return queue.size_bytes if queue is not None else 0

    def active_producers(self, topic: str, partition: int) -> list[tuple[int, int, int, int]]:
        """The partition's idempotent producers (``ProducerState.active``)."""
        queue = self._state(topic, partition).queue
        if queue is None or queue.producers is None:
            return []
        return queue.producers.active()

    # -- introspection (tests, metrics) -------------------------------------------------------
    @property
    def open_files(self) -> int:
        return len(self._files)

    def split_positions(self) -> list[int]:
        return list(self._splitter.positions) if self._splitter is not None else []

    def journal_ends(self) -> list[int]:
        return [j.written_end for j in self._journals]

    def split_lag_bytes(self) -> int:
        """Journal bytes written but not yet split, over the journals that take appends
        (produces to the others are refused; their lag would never shrink)."""
        splitter = self._splitter
        if splitter is None:
            return 0
        return sum(
            journal.written_end - position
            for journal, position in zip(self._journals, splitter.positions, strict=True)
            if journal.health.accepts_appends
        )

    def unsplit_bytes(self) -> int:
        """Journal bytes queued, written or being written that the splitter has not split."""
        positions = self._splitter.positions if self._splitter is not None else None
        total = 0
        for j, journal in enumerate(self._journals):
            total += journal.queued_bytes
            total += journal.written_end - (positions[j] if positions else journal.written_end)
        return total

    def journal_health(self) -> list[str]:
        """Each journal partition's state (``health.py``), for logs, metrics and tests."""
        return [journal.health.state.value for journal in self._journals]


_IDENTITY_ATTRIBUTES = 0x30  # the transactional and control bits


def same_batch(own: BatchHeader, leader: BatchHeader) -> bool:
    """Whether a follower's batch is the leader's batch at the same offsets: what identifies
    a batch (its offsets, partition leader epoch, producer id, epoch and base sequence,
    record count, transactional and control bits), not its bytes, which differ when a
    replica recompressed it to the topic's codec another way (another compression.type
    then, another codec library version)."""
    return (
        own.base_offset == leader.base_offset
        and own.last_offset_delta == leader.last_offset_delta
        and own.partition_leader_epoch == leader.partition_leader_epoch
        and own.producer_id == leader.producer_id
        and own.producer_epoch == leader.producer_epoch
        and own.base_sequence == leader.base_sequence
        and own.record_count == leader.record_count
        and own.attributes & _IDENTITY_ATTRIBUTES == leader.attributes & _IDENTITY_ATTRIBUTES
    )


def _empty_directory(directory: str, paths: list[str]) -> None:
    """A queue log's segment files ``paths`` and its producer snapshots unlinked, then the
    directory fsynced (blocking: the directory thread)."""
    if not os.path.isdir(directory):
        return
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            fileio.unlink(path)
    for name in os.listdir(directory):
        if name.endswith(".snapshot"):
            with contextlib.suppress(FileNotFoundError):
                fileio.unlink(os.path.join(directory, name))
    fileio.fsync_dir(directory)


CATCH_UP_FILE = "catch-up-point"
"""A follower's install of a leader's point in progress (``catch_up_install``): the journal
partition's directory holds it from the moment its queue logs are durable until its journal,
epochs and checkpoints say P."""


def catch_up_epochs(epochs: list[tuple[int, int]], point: int) -> list[tuple[int, int]]:
    """The epoch history of a journal that starts (empty) at ``point``, from the leader's
    entries: the last entry at or below ``point`` moved to it (Kafka's
    ``truncateFromStart``); empty when none is."""
    below = [(epoch, start) for epoch, start in epochs if start <= point]
    return [(below[-1][0], point)] if below else []


def write_catch_up_marker(directory: str, point: int, epochs: list[tuple[int, int]]) -> None:
    """The install's commit point (blocking): ``point`` and the epoch history at it."""
    rows = [("point", point), *((str(e), s) for e, s in catch_up_epochs(epochs, point))]
    CheckpointFile(os.path.join(directory, CATCH_UP_FILE), 2).write(rows)


def finish_catch_up(journal_dir: str, directory: str, j: int) -> bool:
    """Finish an install whose marker is in ``directory`` (local journal partition ``j``),
    idempotently (blocking; at an install and at a start): one empty segment at P and no
    other, the epoch history at P, P as the split position and journal recovery point, then
    the marker goes. False when there is no marker; an unreadable one raises StorageError."""
    path = os.path.join(directory, CATCH_UP_FILE)
    if not os.path.exists(path):
        return False
    rows = CheckpointFile(path, 2).read()
    if not rows or rows[0][0] != "point":
        raise StorageError(f"{path} cannot be read; the catch-up it records cannot finish")
    point = int(rows[0][1])
    epochs = [(int(e), int(s)) for e, s in rows[1:]]
    keep = os.path.join(directory, segment_name(point))
    fd = fileio.open(keep, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fileio.ftruncate(fd, 0)
        fileio.fsync(fd)
    finally:
        fileio.close(fd)
    for base in list_segments(directory):
        if base != point:
            fileio.unlink(os.path.join(directory, segment_name(base)))
    fileio.fsync_dir(directory)
    CheckpointFile(os.path.join(directory, LEADER_EPOCH_FILE), 2).write(epochs)
    for name in (SPLIT_POSITION_FILE, JOURNAL_RECOVERY_POINT_FILE):
        positions = read_positions(os.path.join(journal_dir, name))
        positions[j] = point
        write_positions(os.path.join(journal_dir, name), positions)
    fileio.unlink(path)
    fileio.fsync_dir(directory)
    log.warning("journal-%d: catch-up to position %d finished", j, point)
    return True


def finish_catch_ups(journal_dir: str) -> None:
    """At a start, before any journal partition is opened: finish the installs a crash cut
    short (``journal-<j>`` directories holding a catch-up marker)."""
    try:
        names = os.listdir(journal_dir)
    except FileNotFoundError:
        return
    for name in names:
        prefix, _, index = name.partition("-")
        if prefix == "journal" and index.isdigit():
            directory = os.path.join(journal_dir, name)
            try:
                finish_catch_up(journal_dir, directory, int(index))
            except OSError as exc:
                raise StorageError(f"{directory}: catch-up cannot finish: {exc}") from exc


def _journal_entries(directory: str, start: int, stop: int) -> Iterator[JournalEntry]:
    """The entries of a journal partition's directory from ``start`` to ``stop`` (blocking
    reads: for a thread)."""
    reader = JournalReader(directory)
    try:
        pos = start
        while pos < stop:
            entries, nxt = reader.read(pos, stop, RECOVERY_READ_BYTES, verify=False)
            if nxt == pos:
                break
            yield from entries
            pos = nxt
    finally:
        reader.close()
