"""Checkpoint files: recovery points and split positions, written atomically.

Text like Kafka's checkpoint files: a format version line, an entry count line, then one entry
per line of space-separated fields. A write goes to ``<name>.tmp``, is fsynced, renamed over
the file and the directory is fsynced, so a reader sees the old file or the new one, never a
mix; a leftover ``.tmp`` (a crash mid-write) is ignored and overwritten by the next write.

Three kinds are kept (see :mod:`stonemq.storage.engine`):

* ``journal-recovery-point-checkpoint`` in the journal directory: ``<journal partition>
  <journal position>``, how far each JournalLog is known durable;
* ``split-position-checkpoint`` in the journal directory: ``<journal partition> <journal
  position>``, where a re-split must start so every queue log gets what it has not flushed;
* ``log-start-offset-checkpoint`` in the queue directory: ``<topic> <partition> <offset>``, the
  log start offset of each queue log that retention or DeleteRecords advanced (Kafka's file);
* ``recovery-point-offset-checkpoint`` in the queue directory: ``<topic> <partition> <offset>
  <segment base offset> <file position> <journal partition> <journal position>``, each queue
  log's state at its last flush (the journal position is that of the last entry included).
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

from stonemq.storage import fileio

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 0

JOURNAL_RECOVERY_POINT_FILE = "journal-recovery-point-checkpoint"
SPLIT_POSITION_FILE = "split-position-checkpoint"
QUEUE_RECOVERY_POINT_FILE = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_FILE = "log-start-offset-checkpoint"


class CheckpointNotDurableError(OSError):
    """The new checkpoint replaced the old one, but the directory fsync that makes the rename
    durable failed: after a power loss either file may be there."""


class CheckpointFile:
    """One checkpoint file: lines of space-separated fields under a version and a count."""

    def __init__(self, path: str, fields: int) -> None:
        self.path = path
        self.fields = fields

    def write(self, entries: Iterable[tuple[object, ...]]) -> None:
        """Replace the file atomically with ``entries`` (blocking: fsyncs twice)."""
        lines = [" ".join(str(f) for f in entry) for entry in entries]
        text = f"{CHECKPOINT_VERSION}\n{len(lines)}\n" + "".join(line + "\n" for line in lines)
        tmp = self.path + ".tmp"
        fd = fileio.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            data = memoryview(text.encode())
            while data:
                done = fileio.write(fd, data)
                if done <= 0:
                    raise OSError(errno.ENOSPC, f"{tmp}: write made no progress")
                data = data[done:]
            fileio.fsync(fd)
        finally:
            fileio.close(fd)
        fileio.replace(tmp, self.path)
        try:
            fileio.fsync_dir(os.path.dirname(self.path) or ".")
        except OSError as exc:
            raise CheckpointNotDurableError(exc.errno, f"{self.path}: {exc}") from exc

    def read(self) -> list[list[str]] | None:
        """The entries, or None when the file is missing or malformed (logged)."""
        try:
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return None
        lines = text.splitlines()
        try:
            version = int(lines[0])
            if version != CHECKPOINT_VERSION:
                raise ValueError(f"unsupported version {version}")
            count = int(lines[1])
            entries = [line.split() for line in lines[2 : 2 + count]]
            if len(entries) != count or any(len(e) != self.fields for e in entries):
                raise ValueError("entry count or field count does not match")
        except (IndexError, ValueError) as exc:
            log.warning("ignoring malformed checkpoint %s: %s", self.path, exc)
            return None
        return entries


@dataclass(frozen=True, slots=True)
class QueueRecoveryPoint:
    """A queue log's state at its last flush."""

    offset: int  # next offset of the queue log
    segment_base: int  # base offset of the segment the file position is in
    position: int  # bytes of that segment that were flushed
    journal_partition: int
    journal_position: int  # journal position of the last entry included (-1: none)


def read_positions(path: str) -> dict[int, int]:
    """A ``<journal partition> <journal position>`` checkpoint as a dict (empty if none)."""
    entries = CheckpointFile(path, 2).read() or []
    try:
        return {int(j): int(p) for j, p in entries}
    except ValueError:
        log.warning("ignoring malformed checkpoint %s", path)
        return {}


def write_positions(path: str, positions: dict[int, int]) -> None:
    CheckpointFile(path, 2).write(sorted(positions.items()))


def read_queue_recovery_points(path: str) -> dict[tuple[str, int], QueueRecoveryPoint]:
    entries = CheckpointFile(path, 7).read() or []
    points: dict[tuple[str, int], QueueRecoveryPoint] = {}
    try:
        for topic, partition, *numbers in entries:
            points[(topic, int(partition))] = QueueRecoveryPoint(*(int(n) for n in numbers))
    except ValueError:
        log.warning("ignoring malformed checkpoint %s", path)
        return {}
    return points


def write_queue_recovery_points(
    path: str, points: dict[tuple[str, int], QueueRecoveryPoint]
) -> None:
    CheckpointFile(path, 7).write(
        (
            topic,
            partition,
            p.offset,
            p.segment_base,
            p.position,
            p.journal_partition,
            p.journal_position,
        )
        for (topic, partition), p in sorted(points.items())
    )


def read_offsets(path: str) -> dict[tuple[str, int], int]:
    """A ``<topic> <partition> <offset>`` checkpoint as a dict (empty if none)."""
    entries = CheckpointFile(path, 3).read() or []
    try:
        return {(topic, int(partition)): int(offset) for topic, partition, offset in entries}
    except ValueError:
        log.warning("ignoring malformed checkpoint %s", path)
        return {}


def write_offsets(path: str, offsets: dict[tuple[str, int], int]) -> None:
    CheckpointFile(path, 3).write(
        (topic, partition, offset) for (topic, partition), offset in sorted(offsets.items())
    )
