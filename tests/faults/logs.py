"""Reading a broker's data directory for the fault suite's checker: the records of each queue
log (tolerant of a batch still being written at the tail of a live file), each hosted journal
partition's bytes, and which local journal directory holds which journal partition."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from stonemq.protocol.record_batch import iter_records
from stonemq.storage.checkpoint import JOURNAL_RECOVERY_POINT_FILE, CheckpointFile, read_positions

HOSTED_FILE = "hosted-journal-partitions"


def hosted_journals(data_dir: Path) -> dict[int, Path]:
    """Global journal partition id -> its directory under ``data_dir/journal``."""
    journal_dir = data_dir / "journal"
    rows = CheckpointFile(str(journal_dir / HOSTED_FILE), 1).read() or []
    return {int(row[0]): journal_dir / f"journal-{local}" for local, row in enumerate(rows)}


def journal_bytes(directory: Path) -> bytes:
    """A journal partition's bytes from its first segment on (segments named by position)."""
    names = sorted(n for n in os.listdir(directory) if n.endswith(".journal"))
    return b"".join((directory / n).read_bytes() for n in names)


def journal_start(directory: Path) -> int:
    names = sorted(n for n in os.listdir(directory) if n.endswith(".journal"))
    return int(names[0].split(".")[0]) if names else 0


def active_segment(directory: Path) -> Path:
    names = sorted(n for n in os.listdir(directory) if n.endswith(".journal"))
    return directory / names[-1]


def queue_log_bytes(data_dir: Path, topic: str, partition: int) -> bytes:
    d = data_dir / "queues" / f"{topic}-{partition}"
    if not d.is_dir():
        return b""
    names = sorted(n for n in os.listdir(d) if n.endswith(".log"))
    return b"".join((d / n).read_bytes() for n in names)


def records(log: bytes) -> list[tuple[int, bytes]]:
    """(offset, value) of every record of the whole batches of a queue log's bytes; a batch
    cut short at the end (a live file being appended) is left out."""
    out: list[tuple[int, bytes]] = []
    at = 0
    while at + 61 <= len(log):
        (length,) = struct.unpack_from(">i", log, at + 8)
        end = at + 12 + length
        if end > len(log):
            break
        for record in iter_records(log[at:end]):
            out.append((record.offset, record.value))
        at = end
    return out


def recovery_point(data_dir: Path, directory: Path) -> int:
    """The journal position up to which ``directory``'s journal partition was checkpointed as
    durable (0 when no checkpoint names it)."""
    local = int(directory.name.split("-")[1])
    points = read_positions(str(data_dir / "journal" / JOURNAL_RECOVERY_POINT_FILE))
    return points.get(local, 0)
