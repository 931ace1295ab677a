"""Idempotent producers' state per partition: epochs and sequences, checked on append, in
layers that follow the data, with Kafka's ``.snapshot`` files.

Kafka's rules (``ProducerStateManager``, ``ProducerAppendInfo``): an older epoch is fenced
(INVALID_PRODUCER_EPOCH); a newer epoch must start at sequence 0; within an epoch a batch whose
sequence range equals one of the producer's last five batches is a duplicate, answered as
success with the offset it got the first time; any other batch must start right after the
last sequence (OUT_OF_ORDER_SEQUENCE_NUMBER). A producer the partition does not know is
accepted at any sequence.

Two layers per partition, so that what is checked is always what the log will hold:

* ``producers``: the state of the batches the queue log holds (applied by
  :meth:`ProducerState.applied` as the splitter appends them). This is what a snapshot
  records and what recovery rebuilds.
* ``pending``: batches accepted since (queued on or written to the journal, not split yet),
  in offset order. A check looks at them first. A journal write that fails drops the
  failed batches and everything after them (:meth:`failed`), so a retry is never taken
  for a duplicate of a batch that was not stored; a duplicate of a pending batch carries
  its write's future, and is answered only once that write is known to have succeeded.

Snapshots (``<offset>.snapshot`` in the partition's queue-log directory, the state of every
batch below ``offset``) are written when a segment rolls and at a clean stop; recovery loads
the newest one at or below the log end, deletes any beyond it, and replays the batch headers
after it, so a start never scans a whole partition.

Snapshot format, version 2 (big-endian)::

    0  version   u16     2  crc u32 (CRC-32C of the rest)     6  count i32
    then per producer: id i64, epoch i16, last timestamp i64, batch count u8,
    and per batch (oldest first): first sequence i32, last sequence i32, base offset i64,
    last offset i64, max timestamp i64 (what a duplicate of it is answered with)

Version 1, still read, had no per-batch timestamp: its batches but the last answer a
duplicate with -1.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import struct
from collections.abc import Iterator

from stonemq.protocol.checksum import crc32c
from stonemq.storage import fileio
from stonemq.storage.errors import (
    DuplicateSequenceError,
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
)

log = logging.getLogger("stonemq.storage.producer_state")

BATCHES_KEPT = 5
SEQUENCE_MODULUS = 1 << 31
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_VERSION = 2
SNAPSHOTS_KEPT = 2  # the newest ones; older snapshot files are deleted when one is written

_HEAD = struct.Struct(">HIi")
_PRODUCER = struct.Struct(">qhqB")
_BATCH = struct.Struct(">iiqqq")
_BATCH_V1 = struct.Struct(">iiqq")


class BatchSeq:
    """One batch of a producer: its sequence range and offsets."""

    __slots__ = (
        "base_offset",
        "first_sequence",
        "last_offset",
        "last_sequence",
        "timestamp",
        "written",
    )

    def __init__(
        self,
        first_sequence: int,
        last_sequence: int,
        base_offset: int,
        last_offset: int,
        written: asyncio.Future[None] | None = None,
        timestamp: int = -1,
    ) -> None:
        self.first_sequence = first_sequence
        self.last_sequence = last_sequence
        self.base_offset = base_offset
        self.last_offset = last_offset
        self.written = written  # the journal write of a pending batch
        # the batch's max timestamp as stored (a LogAppendTime topic's: its append time),
        # what a duplicate is answered with, as Kafka's BatchMetadata; -1 when unknown (a
        # batch loaded from a version 1 snapshot, which kept only the last timestamp)
        self.timestamp = timestamp


class ProducerEntry:
    """A producer's epoch, its last batches (newest last) and its last batch's timestamp."""

    __slots__ = ("batches", "epoch", "last_timestamp")

    def __init__(self, epoch: int, last_timestamp: int = -1) -> None:
        self.epoch = epoch
        self.last_timestamp = last_timestamp
        self.batches: collections.deque[BatchSeq] = collections.deque(maxlen=BATCHES_KEPT)

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else -1

    def add(self, epoch: int, batch: BatchSeq, timestamp: int) -> ProducerEntry:
        """This entry with ``batch`` appended (a new entry when the epoch moved on)."""
        entry = self if epoch == self.epoch else ProducerEntry(epoch)
        entry.batches.append(batch)
        entry.last_timestamp = max(entry.last_timestamp, timestamp)
        return entry


class _Pending:
    __slots__ = ("batch", "epoch", "producer_id", "timestamp")

    def __init__(self, producer_id: int, epoch: int, batch: BatchSeq, timestamp: int) -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        self.batch = batch
        self.timestamp = timestamp


class ProducerState:
    """One partition's idempotent producers (see the module doc)."""

    __slots__ = ("_by_producer", "pending", "producers", "snapshot_offset")

    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        self.pending: collections.deque[_Pending] = collections.deque()
        self._by_producer: dict[int, list[_Pending]] = {}
        self.snapshot_offset = -1  # the offset of the newest snapshot file (-1: none)

    # -- the produce path -------------------------------------------------------------------
    def check(self, producer_id: int, epoch: int, first_sequence: int, last_sequence: int) -> None:
        """Raise if a batch with this producer id, epoch and sequence range may not be
        appended: :class:`DuplicateSequenceError` (with the original's offset and, while it is
        pending, its write's future), :class:`InvalidProducerEpochError`,
        :class:`OutOfOrderSequenceError`."""
        pending = self._by_producer.get(producer_id)
        entry = self.producers.get(producer_id)
        if pending:
            current_epoch = pending[-1].epoch
            last = pending[-1].batch.last_sequence
        elif entry is not None:
            current_epoch, last = entry.epoch, entry.last_sequence
        else:
            return  # an unknown producer is accepted at any sequence
        if epoch < current_epoch:
            raise InvalidProducerEpochError(
                f"producer {producer_id} epoch {epoch} is older than {current_epoch}"
            )
        if epoch > current_epoch:
            if first_sequence != 0:
                raise OutOfOrderSequenceError(
                    f"producer {producer_id}: new epoch {epoch} must start at sequence 0, "
                    f"not {first_sequence}"
                )
            return
        for batch in self._recent(producer_id, epoch, entry, pending):
            if batch.first_sequence == first_sequence and batch.last_sequence == last_sequence:
                raise DuplicateSequenceError(batch.base_offset, batch.written, batch.timestamp)
        if first_sequence != (last + 1) % SEQUENCE_MODULUS:
            raise OutOfOrderSequenceError(
                f"producer {producer_id} epoch {epoch}: sequence {first_sequence} does not "
                f"follow {last}"
            )

    @staticmethod
    def _recent(
        producer_id: int, epoch: int, entry: ProducerEntry | None, pending: list[_Pending] | None
    ) -> Iterator[BatchSeq]:
        """The producer's last batches of ``epoch``, newest first (pending ones first)."""
        for item in reversed(pending or ()):
            if item.epoch == epoch:
                yield item.batch
        if entry is not None and entry.epoch == epoch:
            yield from reversed(entry.batches)

    def appended(
        self,
        producer_id: int,
        epoch: int,
        batch: BatchSeq,
        timestamp: int,
    ) -> None:
        """A checked batch was queued on the journal at ``batch.base_offset``."""
        item = _Pending(producer_id, epoch, batch, timestamp)
        self.pending.append(item)
        self._by_producer.setdefault(producer_id, []).append(item)

    def failed(self, offset: int) -> None:
        """The journal write of the batch at ``offset`` failed, and so did every batch queued
        after it: forget the pending batches from ``offset`` on."""
        pending = self.pending
        while pending and pending[-1].batch.base_offset >= offset:
            item = pending.pop()
            mine = self._by_producer[item.producer_id]
            mine.pop()
            if not mine:
                del self._by_producer[item.producer_id]

    # -- the log ----------------------------------------------------------------------------
    def applied(
        self,
        producer_id: int,
        epoch: int,
        first_sequence: int,
        last_sequence: int,
        base_offset: int,
        last_offset: int,
        timestamp: int,
    ) -> None:
        """The queue log now holds this batch (split, or replayed at recovery): apply it to
        the log-side state and retire the pending batches up to it."""
        pending = self.pending
        while pending and pending[0].batch.base_offset <= base_offset:
            item = pending.popleft()
            mine = self._by_producer[item.producer_id]
            del mine[0]
            if not mine:
                del self._by_producer[item.producer_id]
        entry = self.producers.get(producer_id)
        if entry is not None and epoch < entry.epoch:
            return  # a fenced producer's batch (a replica's copy): the state stays
        batch = BatchSeq(first_sequence, last_sequence, base_offset, last_offset, None, timestamp)
        if entry is None:
            entry = ProducerEntry(epoch)
        self.producers[producer_id] = entry.add(epoch, batch, timestamp)

    def expire(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers whose last batch is older than ``expiration_ms``
        (``producer.id.expiration.ms``) and that have nothing pending; returns how many."""
        expired = [
            pid
            for pid, entry in self.producers.items()
            if now_ms - entry.last_timestamp >= expiration_ms and pid not in self._by_producer
        ]
        for pid in expired:
            del self.producers[pid]
        return len(expired)

    @property
    def empty(self) -> bool:
        return not self.producers and not self.pending

    def active(self) -> list[tuple[int, int, int, int]]:
        """Every producer the partition knows, with what it has acknowledged (pending batches
        included, as Kafka's state covers its whole log): ``(producer id, epoch, last
        sequence, last timestamp)``, for DescribeProducers."""
        known = {
            pid: (entry.epoch, entry.last_sequence, entry.last_timestamp)
            for pid, entry in self.producers.items()
        }
        for item in self.pending:  # offset order: the newest batch of a producer wins
            epoch, _, timestamp = known.get(item.producer_id, (item.epoch, -1, -1))
            if item.epoch < epoch:
                continue  # a fenced producer's batch leaves the state as it was
            if item.epoch > epoch:
                timestamp = -1
            known[item.producer_id] = (
                item.epoch,
                item.batch.last_sequence,
                max(timestamp, item.timestamp),
            )
        return [(pid, *state) for pid, state in known.items()]

    # -- snapshots --------------------------------------------------------------------------
    def encode(self) -> bytes:
        """The log-side state as a snapshot file's bytes."""
        body = bytearray(struct.pack(">i", len(self.producers)))
        for pid, entry in self.producers.items():
            body += _PRODUCER.pack(pid, entry.epoch, entry.last_timestamp, len(entry.batches))
            for b in entry.batches:
                body += _BATCH.pack(
                    b.first_sequence, b.last_sequence, b.base_offset, b.last_offset, b.timestamp
                )
        return struct.pack(">HI", SNAPSHOT_VERSION, crc32c(body)) + bytes(body)

    @classmethod
    def decode(cls, data: bytes) -> ProducerState:
        """A state from a snapshot file's bytes; raises ValueError when they are not one."""
        if len(data) < _HEAD.size:
            raise ValueError("snapshot truncated")
        version, crc, count = _HEAD.unpack_from(data, 0)
        if version not in (1, SNAPSHOT_VERSION):
            raise ValueError(f"snapshot version {version}")
        batch_format = _BATCH if version == SNAPSHOT_VERSION else _BATCH_V1
        if crc32c(memoryview(data)[6:]) != crc:
            raise ValueError("snapshot CRC mismatch")
        state = cls()
        pos = _HEAD.size
        try:
            for _ in range(count):
                pid, epoch, last_ts, n = _PRODUCER.unpack_from(data, pos)
                pos += _PRODUCER.size
                entry = ProducerEntry(epoch, last_ts)
                for _ in range(n):
                    first, last, base, end, *stamp = batch_format.unpack_from(data, pos)
                    batch = BatchSeq(first, last, base, end, None, stamp[0] if stamp else -1)
                    entry.batches.append(batch)
                    pos += batch_format.size
                if entry.batches and version == 1:  # it kept the last batch's timestamp only
                    entry.batches[-1].timestamp = last_ts
                state.producers[pid] = entry
        except struct.error as exc:
            raise ValueError(f"snapshot truncated: {exc}") from None
        if pos != len(data):
            raise ValueError("snapshot has trailing bytes")
        return state


def snapshot_path(directory: str, offset: int) -> str:
    return os.path.join(directory, f"{offset:020d}{SNAPSHOT_SUFFIX}")


def list_snapshots(directory: str) -> list[int]:
    """Offsets of the snapshot files in ``directory``, oldest first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    offsets = []
    for name in names:
        stem = name[: -len(SNAPSHOT_SUFFIX)]
        if name.endswith(SNAPSHOT_SUFFIX) and stem.isdigit():
            offsets.append(int(stem))
    offsets.sort()
    return offsets


def write_snapshot(directory: str, offset: int, data: bytes) -> str:
    """Write a snapshot file atomically (temporary file, fsync, rename; blocking) and delete
    the older ones beyond :data:`SNAPSHOTS_KEPT`. Returns its path; the caller makes the
    directory entry durable (a lost snapshot only costs a longer replay)."""
    path = snapshot_path(directory, offset)
    tmp = path + ".tmp"
    fd = fileio.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            done = fileio.write(fd, view)
            if done <= 0:
                raise OSError(28, f"{tmp}: write made no progress")
            view = view[done:]
        fileio.fsync(fd)
    finally:
        fileio.close(fd)
    fileio.replace(tmp, path)
    for old in list_snapshots(directory)[:-SNAPSHOTS_KEPT]:
        with contextlib.suppress(FileNotFoundError):
            fileio.unlink(snapshot_path(directory, old))
    return path


def load_snapshot(directory: str, log_end: int, log_start: int = 0) -> tuple[ProducerState, int]:
    """The newest readable snapshot from ``log_start`` to ``log_end`` and its offset (a
    fresh state and -1 when there is none). Snapshots beyond the log end describe batches a
    crash took back, and unreadable ones are garbage: both are deleted. Snapshots below the
    log start are not used (as Kafka's ``truncateAndReload``: they may describe a log that
    was emptied to start later, a follower's catch-up)."""
    for offset in reversed(list_snapshots(directory)):
        path = snapshot_path(directory, offset)
        if offset < log_start:
            break  # older ones are lower still
        if offset <= log_end:
            try:
                with open(path, "rb") as f:
                    state = ProducerState.decode(f.read())
            except (OSError, ValueError) as exc:  # as Kafka, which deletes it and rebuilds
                log.warning(
                    "producer snapshot %s cannot be read (%s): deleted, the producers' state "
                    "is rebuilt from the batches after an older one",
                    path,
                    exc,
                )
            else:
                state.snapshot_offset = offset
                return state, offset
        with contextlib.suppress(FileNotFoundError):
            fileio.unlink(path)
    return ProducerState(), -1
