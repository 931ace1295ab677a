"""The leader-epoch checkpoint of a journal partition: which leader epoch wrote from which
journal position on (../shared/design/cluster.md, invariant 3), as Kafka's
``leader-epoch-checkpoint``.

Entries ``(epoch, start)`` rise strictly in both fields. The rules are Kafka's
(``LeaderEpochFileCache``, KIP-101/KIP-279):

- :meth:`LeaderEpochCache.assign` records that ``epoch`` starts at ``start``; an entry with the
  same epoch and a start not lower changes nothing, and entries that would break monotonicity
  (an epoch not lower, or a start not lower, than the new one) are removed first.
- :meth:`LeaderEpochCache.end_offset_for` answers OffsetForLeaderEpoch: the largest epoch
  ``<=`` the one asked and where it ended (the next epoch's start, or the log end for the
  latest); an epoch below every entry answers itself with the first later start; an
  undefined one (-1), or one above the latest, ``(-1, -1)``.
- :meth:`LeaderEpochCache.truncate_from_end` (a replica that truncates its journal) drops the
  entries starting at or after the new end; :meth:`LeaderEpochCache.truncate_from_start` (the
  journal's start moved) drops the entries wholly before it and moves the last of them to it.

Every change is written at once (``CheckpointFile``: a temporary file, fsync, rename,
directory fsync) before memory takes it: blocking I/O, for a thread off the event loop. A
write that fails raises and changes nothing in memory; the storage takes its journal
partition offline (Kafka's log directory failure), since the epoch history is what a replica
truncates by. A file that does not parse is refused (:class:`LeaderEpochFileError`), never
taken for an empty history.
"""

from __future__ import annotations

import bisect
import itertools
import os
import threading
from dataclasses import dataclass

from stonemq.storage.checkpoint import CheckpointFile

LEADER_EPOCH_FILE = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class LeaderEpochFileError(ValueError):
    """The checkpoint exists but its entries are not a valid epoch history."""


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start: int


class LeaderEpochCache:
    """A journal partition's epoch history, kept in ``<directory>/leader-epoch-checkpoint``."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, LEADER_EPOCH_FILE)
        self._file = CheckpointFile(self.path, 2)
        self._entries: list[EpochEntry] = []
        # one change at a time: each computes the new history from the current one and its
        # callers run in executor threads (a leader's or follower's new epoch beside the
        # checkpoint round's trim); unserialized, the later write dropped the other's change
        self._lock = threading.Lock()
        rows = self._file.read() if os.path.exists(self.path) else []
        if rows is None:
            raise LeaderEpochFileError(f"{self.path} cannot be read as a checkpoint")
        entries = [EpochEntry(int(epoch), int(start)) for epoch, start in rows]
        for before, after in itertools.pairwise(entries):
            if not (before.epoch < after.epoch and before.start < after.start):
                raise LeaderEpochFileError(f"{self.path}: {before} then {after} is not rising")
        if any(e.epoch < 0 or e.start < 0 for e in entries):
            raise LeaderEpochFileError(f"{self.path}: a negative epoch or start")
        self._entries = entries

    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def latest(self) -> EpochEntry | None:
        return self._entries[-1] if self._entries else None

    def assign(self, epoch: int, start: int) -> bool:
        """Record that ``epoch`` writes from ``start`` on; True (and written) when it changed
        the history."""
        with self._lock:
            if epoch < 0 or start < 0:
                raise ValueError(f"invalid leader epoch entry ({epoch}, {start})")
            latest = self.latest
            if latest is not None and latest.epoch == epoch and start >= latest.start:
                return False
            entries = list(self._entries)
            while entries and (entries[-1].epoch >= epoch or entries[-1].start >= start):
                entries.pop()
            entries.append(EpochEntry(epoch, start))
            self._write(entries)
            return True

    def end_offset_for(self, epoch: int, log_end: int) -> tuple[int, int]:
        """(the largest epoch <= ``epoch``, its end offset), as OffsetForLeaderEpoch answers."""
        latest = self.latest
        if epoch == UNDEFINED_EPOCH or latest is None:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if epoch == latest.epoch:
            return epoch, log_end
        epochs = [e.epoch for e in self._entries]
        higher = bisect.bisect_right(epochs, epoch)  # first entry with an epoch above
        if higher == len(epochs):
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if higher == 0:
            return epoch, self._entries[0].start
        return self._entries[higher - 1].epoch, self._entries[higher].start

    def epoch_for(self, offset: int) -> int:
        """The epoch that wrote ``offset`` (-1 before the first entry)."""
        starts = [e.start for e in self._entries]
        at = bisect.bisect_right(starts, offset)
        return self._entries[at - 1].epoch if at else UNDEFINED_EPOCH

    def truncate_from_end(self, end: int) -> bool:
        """The journal now ends at ``end``: drop the entries starting at or after it."""
        with self._lock:
            entries = list(self._entries)
            while entries and entries[-1].start >= end:
                entries.pop()
            if len(entries) == len(self._entries):
                return False
            self._write(entries)
            return True

    def truncate_from_start(self, start: int) -> bool:
        """The journal now starts at ``start``: entries wholly before it go, and the last of
        the entries at or before it is kept, moved to ``start``."""
        with self._lock:
            starts = [e.start for e in self._entries]
            at = bisect.bisect_right(starts, start)  # entries[:at] start at or before it
            if at == 0:
                return False
            kept = EpochEntry(self._entries[at - 1].epoch, start)
            if at == 1 and self._entries[0] == kept:
                return False
            self._write([kept, *self._entries[at:]])
            return True

    def _write(self, entries: list[EpochEntry]) -> None:
        """Make ``entries`` the history: the file first, then memory, so a failed write
        (OSError) leaves both as they were and the history in memory is never one the
        file lacks (a later call comparing with it would skip the write)."""
        self._file.write((e.epoch, e.start) for e in entries)
        self._entries = entries
