"""The storage facade: the only storage API the rest of the broker calls.

INTERFACE CONTRACT (implemented by the storage package; handlers code against exactly this):

Partitions are named by (topic, partition). Each is registered with :meth:`add_partition`
before use (the broker does this for every topic in the metadata store before
:meth:`recover`, and on topic creation). Offsets are assigned when a batch enters the journal.
What fetch may read (the high watermark) is what the splitter has split into the queue log.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Per-partition storage settings, Kafka names with their units."""

    segment_bytes: int = 1024 * 1024 * 1024
    segment_ms: int = 7 * 24 * 3600 * 1000
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    index_interval_bytes: int = 4096
    segment_index_bytes: int = 10 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where an appended batch landed. ``written`` resolves (to None) once the bytes are in
    the journal file, and fsynced too when the flush policy is ``always``; it raises
    :class:`StorageError` when the write failed."""

    base_offset: int
    log_start_offset: int
    written: asyncio.Future[None]


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Whole record batches starting with the one that holds the requested offset."""

    data: bytes
    high_watermark: int
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class BatchHeaderInfo:
    """What producer-state rebuild needs from one stored batch."""

    base_offset: int
    last_offset: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    duration_s: float
    journal_bytes_replayed: int
    journal_bytes_truncated: int
    queue_bytes_truncated: int


class StorageError(Exception):
    """An I/O failure (ENOSPC, EIO...) on the journal or a queue log: KAFKA_STORAGE_ERROR."""


class OffsetOutOfRangeError(Exception):
    """Requested offset is below the log start or above the high watermark."""


class UnknownPartitionError(Exception):
    """(topic, partition) was never registered, or its topic was removed."""


SplitListener = Callable[[str, int, int], None]
"""Called as ``listener(topic, partition, new_high_watermark)`` after the splitter advances."""


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
    ) -> None:
        raise NotImplementedError

    # -- lifecycle ----------------------------------------------------------------------------
    def add_partition(
        self, topic_id: uuid.UUID, topic: str, partition: int, journal_partition: int,
        config: LogConfig,
    ) -> None:
        """Register a partition (idempotent). Creates no file until data arrives."""
        raise NotImplementedError

    def update_config(self, topic: str, config: LogConfig) -> None:
        raise NotImplementedError

    def remove_topic(self, topic: str) -> None:
        """Forget the topic and delete its queue-log directories; journal entries still
        pending for it are dropped by the splitter."""
        raise NotImplementedError

    def recover(self) -> RecoveryReport:
        """Synchronous, before serving: truncate torn journal/queue tails, re-split the journal
        so every queue log holds everything the journal holds, recompute next offsets."""
        raise NotImplementedError

    def start(self, listener: SplitListener) -> None:
        """Start the journal flusher and the splitter on the running event loop."""
        raise NotImplementedError

    async def close(self) -> None:
        """Finish pending writes, split what is left, flush and write checkpoints."""
        raise NotImplementedError

    # -- write path ---------------------------------------------------------------------------
    def append(
        self, topic: str, partition: int, batch: bytearray, record_count: int
    ) -> AppendResult:
        """Assign offsets to one validated RecordBatch v2, patch its base offset in place and
        queue it on its journal partition (group commit). Raises StorageError /
        UnknownPartitionError synchronously when it cannot even be queued."""
        raise NotImplementedError

    # -- read path ----------------------------------------------------------------------------
    def log_start_offset(self, topic: str, partition: int) -> int:
        raise NotImplementedError

    def high_watermark(self, topic: str, partition: int) -> int:
        """Next offset past what has been split (what consumers may read)."""
        raise NotImplementedError

    def log_end_offset(self, topic: str, partition: int) -> int:
        """Next offset to assign (journal side)."""
        raise NotImplementedError

    def read(self, topic: str, partition: int, offset: int, max_bytes: int) -> ReadResult:
        """Whole batches from the batch containing ``offset``, up to ``max_bytes`` but at least
        one batch; empty data when offset == high watermark. Raises OffsetOutOfRangeError."""
        raise NotImplementedError

    def offset_for_timestamp(
        self, topic: str, partition: int, timestamp_ms: int
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= timestamp_ms, via the
        time index; None when there is none."""
        raise NotImplementedError

    def max_timestamp(self, topic: str, partition: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp; None if empty."""
        raise NotImplementedError

    def batch_headers(self, topic: str, partition: int) -> list[BatchHeaderInfo]:
        """Headers of the stored batches that carry a producer id (newest last)."""
        raise NotImplementedError
