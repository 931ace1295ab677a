"""Offline storage checks and dumps: what ``stonemq storage check`` and ``stonemq storage dump``
report about a data directory or one file, without a running broker and without changing any
file.

:func:`check_storage` walks every journal partition (entry checksums, entry framing, segments
that follow each other without a hole) and every queue log (batch checksums, offsets
contiguous within and across segments, each offset-index entry pointing at a batch boundary
whose last offset it names, time-index entries increasing and inside their segment, the
checkpoints not claiming more than the files hold). :func:`dump_file` decodes one journal
segment, queue-log segment or index file, like kafka-dump-log.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

from stonemq.protocol.record_batch import (
    COMPRESSION_NAMES,
    HEADER_SIZE,
    BatchHeader,
    RecordBatchError,
    crc_ok,
    iter_records,
    parse_header,
)
from stonemq.storage.checkpoint import (
    LOG_START_OFFSET_FILE,
    QUEUE_RECOVERY_POINT_FILE,
    CheckpointFile,
    read_offsets,
    read_queue_recovery_points,
)
from stonemq.storage.engine import CATCH_UP_FILE
from stonemq.storage.errors import StorageError
from stonemq.storage.journal import (
    SEGMENT_SUFFIX,
    CorruptEntryError,
    JournalReader,
    list_segments,
)
from stonemq.storage.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX

_INDEX_ENTRY = struct.Struct(">ii")
_TIME_INDEX_ENTRY = struct.Struct(">qi")
_READ_BYTES = 8 << 20


@dataclass(slots=True)
class JournalSummary:
    name: str
    segments: int = 0
    entries: int = 0
    bytes: int = 0
    start_position: int = 0
    end_position: int = 0
    pending: str | None = None  # an install the next start finishes (not damage)


@dataclass(slots=True)
class QueueLogSummary:
    name: str
    segments: int = 0
    batches: int = 0
    records: int = 0
    bytes: int = 0
    log_start_offset: int = 0
    next_offset: int = 0


@dataclass(slots=True)
class CheckReport:
    journals: list[JournalSummary] = field(default_factory=list)
    queue_logs: list[QueueLogSummary] = field(default_factory=list)
    defects: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # states a start finishes, not defects

    @property
    def ok(self) -> bool:
        return not self.defects


def check_storage(journal_dir: str, queue_dir: str) -> CheckReport:
    """Check every journal partition under ``journal_dir`` and queue log under ``queue_dir``."""
    report = CheckReport()
    if os.path.isdir(journal_dir):
        for name in sorted(os.listdir(journal_dir)):
            path = os.path.join(journal_dir, name)
            if name.startswith("journal-") and os.path.isdir(path):
                summary = check_journal(path, report.defects)
                report.journals.append(summary)
                if summary.pending is not None:
                    report.notes.append(f"{name}: {summary.pending}")
    if os.path.isdir(queue_dir):
        points = read_queue_recovery_points(os.path.join(queue_dir, QUEUE_RECOVERY_POINT_FILE))
        starts = read_offsets(os.path.join(queue_dir, LOG_START_OFFSET_FILE))
        for name in sorted(os.listdir(queue_dir)):
            path = os.path.join(queue_dir, name)
            if not os.path.isdir(path):
                continue
            summary = check_queue_log(path, report.defects)
            report.queue_logs.append(summary)
            topic, _, partition = name.rpartition("-")
            key = (topic, int(partition)) if partition.isdigit() else None
            start = starts.get(key) if key else None
            if start is not None:
                summary.log_start_offset = max(summary.log_start_offset, start)
                if summary.segments == 0:  # an empty log starts, and ends, at its log start
                    summary.next_offset = max(summary.next_offset, start)
                elif start > summary.next_offset:
                    report.defects.append(
                        f"{name}: log start offset {start} is past the log end "
                        f"{summary.next_offset}"
                    )
            rp = points.get(key) if key else None
            if rp is not None and rp.offset > summary.next_offset:
                report.defects.append(
                    f"{name}: recovery point offset {rp.offset} is past the log end "
                    f"{summary.next_offset} (flushed data missing)"
                )
    return report


def check_journal(directory: str, defects: list[str]) -> JournalSummary:
    """Every entry of one journal partition: framing and CRC; segments without holes. A
    follower's catch-up install in progress (its marker, engine.CATCH_UP_FILE: a crash cut
    ``finish_catch_up`` short) is reported as pending, not as damage: the next start
    leaves the journal as one empty segment at the marker's point, whatever the old
    segments hold; an unreadable marker is a defect (that start cannot finish it)."""
    name = os.path.basename(directory)
    summary = JournalSummary(name)
    marker = os.path.join(directory, CATCH_UP_FILE)
    if os.path.exists(marker):
        try:
            rows = CheckpointFile(marker, 2).read()
            point = int(rows[0][1]) if rows and rows[0][0] == "point" else None
        except (OSError, ValueError, IndexError, StorageError):
            point = None
        if point is None:
            defects.append(f"{name}: {CATCH_UP_FILE} cannot be read: its catch-up cannot finish")
            return summary
        summary.pending = (
            f"catch-up install to journal position {point} pending: a start finishes it"
        )
        summary.segments = len(list_segments(directory))
        summary.start_position = summary.end_position = point
        return summary
    bases = list_segments(directory)
    summary.segments = len(bases)
    if not bases:
        return summary
    sizes = [os.path.getsize(os.path.join(directory, f"{b:020d}{SEGMENT_SUFFIX}")) for b in bases]
    for i in range(1, len(bases)):
        if bases[i - 1] + sizes[i - 1] != bases[i]:
            defects.append(
                f"{name}: segment {bases[i - 1]} ends at {bases[i - 1] + sizes[i - 1]} but the "
                f"next one starts at {bases[i]}"
            )
    summary.start_position = bases[0]
    summary.end_position = bases[-1] + sizes[-1]
    reader = JournalReader(directory)
    try:
        for base, size in zip(bases, sizes, strict=True):
            pos, end = base, base + size
            while pos < end:
                try:
                    entries, nxt = reader.read(pos, end, _READ_BYTES, verify=True)
                except CorruptEntryError as exc:
                    defects.append(f"{name}: {exc}")
                    break
                if nxt == pos:
                    defects.append(f"{name}: {end - pos} bytes of a partial entry at {pos}")
                    break
                summary.entries += len(entries)
                pos = nxt
            summary.bytes += size
    finally:
        reader.close()
    return summary


def _batches(log_path: str, defects: list[str], label: str) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of each whole, CRC-valid batch; a defect for anything else."""
    size = os.path.getsize(log_path)
    with open(log_path, "rb") as f:
        pos = 0
        while pos < size:
            f.seek(pos)
            head = f.read(HEADER_SIZE)
            try:
                if len(head) < HEADER_SIZE:
                    raise RecordBatchError(f"{size - pos} bytes, less than a batch header")
                header = parse_header(head)
            except RecordBatchError as exc:
                defects.append(f"{label}: bad batch at position {pos}: {exc}")
                return
            if pos + header.size > size:
                defects.append(f"{label}: torn batch at position {pos} ({size - pos} bytes)")
                return
            f.seek(pos)
            data = f.read(header.size)
            if not crc_ok(data, 0, header):
                defects.append(f"{label}: CRC mismatch in the batch at position {pos}")
                return
            yield pos, header
            pos += header.size


def check_queue_log(directory: str, defects: list[str]) -> QueueLogSummary:
    """Every batch of one queue log, its offsets and its indexes."""
    name = os.path.basename(directory)
    summary = QueueLogSummary(name)
    bases = sorted(
        int(f[: -len(LOG_SUFFIX)])
        for f in os.listdir(directory)
        if f.endswith(LOG_SUFFIX) and f[: -len(LOG_SUFFIX)].isdigit()
    )
    summary.segments = len(bases)
    expected: int | None = None
    for base in bases:
        label = f"{name}/{base:020d}{LOG_SUFFIX}"
        log_path = os.path.join(directory, f"{base:020d}{LOG_SUFFIX}")
        if expected is not None and base != expected:
            defects.append(f"{label}: segment base {base} but the previous one ends at {expected}")
        if expected is None:
            summary.log_start_offset = base
        expected = base
        boundaries: dict[int, int] = {}  # position -> last offset
        for pos, header in _batches(log_path, defects, label):
            if header.base_offset != expected:
                defects.append(
                    f"{label}: batch at position {pos} has base offset {header.base_offset}, "
                    f"expected {expected}"
                )
            boundaries[pos] = header.last_offset
            expected = header.next_offset
            summary.batches += 1
            summary.records += header.record_count
        summary.bytes += os.path.getsize(log_path)
        _check_indexes(directory, base, expected, boundaries, defects, name)
    summary.next_offset = expected if expected is not None else 0
    return summary


def _check_indexes(
    directory: str,
    base: int,
    next_offset: int,
    boundaries: dict[int, int],
    defects: list[str],
    name: str,
) -> None:
    index_path = os.path.join(directory, f"{base:020d}{INDEX_SUFFIX}")
    label = f"{name}/{base:020d}{INDEX_SUFFIX}"
    data = _read(index_path)
    if len(data) % _INDEX_ENTRY.size:
        defects.append(f"{label}: {len(data)} bytes is not a whole number of entries")
    last = -1
    for i in range(len(data) // _INDEX_ENTRY.size):
        rel, pos = _INDEX_ENTRY.unpack_from(data, i * _INDEX_ENTRY.size)
        offset = base + rel
        if offset <= last:
            defects.append(f"{label}: entry {i} offset {offset} does not increase")
        elif boundaries.get(pos) != offset:
            defects.append(
                f"{label}: entry {i} ({offset} at {pos}) does not name the batch at that position"
            )
        last = offset
    time_path = os.path.join(directory, f"{base:020d}{TIME_INDEX_SUFFIX}")
    label = f"{name}/{base:020d}{TIME_INDEX_SUFFIX}"
    data = _read(time_path)
    if len(data) % _TIME_INDEX_ENTRY.size:
        defects.append(f"{label}: {len(data)} bytes is not a whole number of entries")
    last_ts, last_offset = -1, -1
    for i in range(len(data) // _TIME_INDEX_ENTRY.size):
        ts, rel = _TIME_INDEX_ENTRY.unpack_from(data, i * _TIME_INDEX_ENTRY.size)
        offset = base + rel
        if ts < last_ts or offset < last_offset:
            defects.append(f"{label}: entry {i} ({ts}, {offset}) goes backwards")
        if not base <= offset < max(next_offset, base + 1):
            defects.append(f"{label}: entry {i} offset {offset} outside the segment")
        last_ts, last_offset = ts, offset


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""


def _read_whole(path: str) -> bytes:
    """The file's bytes; a missing one raises (``dump`` names it, as for a ``.log``)."""
    with open(path, "rb") as f:
        return f.read()


# -- dump ---------------------------------------------------------------------------------------
def dump_file(path: str, records: bool = False) -> Iterator[str]:
    """Lines describing every entry of a journal segment, batch of a queue-log segment, or
    entry of an index file (chosen by the file's suffix)."""
    if path.endswith(SEGMENT_SUFFIX):
        yield from _dump_journal(path, records)
    elif path.endswith(LOG_SUFFIX):
        yield from _dump_log(path, records)
    elif path.endswith(INDEX_SUFFIX):
        base = int(os.path.basename(path)[: -len(INDEX_SUFFIX)])
        data = _read_whole(path)
        for i in range(len(data) // _INDEX_ENTRY.size):
            rel, pos = _INDEX_ENTRY.unpack_from(data, i * _INDEX_ENTRY.size)
            yield f"offset: {base + rel} position: {pos}"
    elif path.endswith(TIME_INDEX_SUFFIX):
        base = int(os.path.basename(path)[: -len(TIME_INDEX_SUFFIX)])
        data = _read_whole(path)
        for i in range(len(data) // _TIME_INDEX_ENTRY.size):
            ts, rel = _TIME_INDEX_ENTRY.unpack_from(data, i * _TIME_INDEX_ENTRY.size)
            yield f"timestamp: {ts} offset: {base + rel}"
    else:
        raise ValueError(
            f"{path}: not a journal segment ({SEGMENT_SUFFIX}) or queue-log file "
            f"({LOG_SUFFIX}, {INDEX_SUFFIX}, {TIME_INDEX_SUFFIX})"
        )


def _describe(pos: int, header: BatchHeader, valid: bool) -> str:
    return (
        f"baseOffset: {header.base_offset} lastOffset: {header.last_offset} "
        f"count: {header.record_count} position: {pos} size: {header.size} "
        f"producerId: {header.producer_id} producerEpoch: {header.producer_epoch} "
        f"baseSequence: {header.base_sequence} maxTimestamp: {header.max_timestamp} "
        f"compression: {COMPRESSION_NAMES.get(header.attributes & 7, '?')} "
        f"crc: {header.crc} isValid: {str(valid).lower()}"
    )


def _record_lines(batch: bytes | memoryview) -> Iterator[str]:
    try:
        for r in iter_records(batch, check_crc=False):  # the batch line says isValid
            yield (
                f"| offset: {r.offset} timestamp: {r.timestamp} "
                f"keySize: {-1 if r.key is None else len(r.key)} "
                f"valueSize: {-1 if r.value is None else len(r.value)} "
                f"key: {r.key!r} value: {_short(r.value)} headers: {list(r.headers)}"
            )
    except (RecordBatchError, ValueError, OSError) as exc:
        yield f"| records not decodable: {exc}"


def _short(value: bytes | None, limit: int = 80) -> str:
    if value is None:
        return "None"
    return repr(value[:limit]) + ("..." if len(value) > limit else "")


def _dump_log(path: str, records: bool) -> Iterator[str]:
    defects: list[str] = []
    with open(path, "rb") as f:
        for pos, header in _batches(path, defects, os.path.basename(path)):
            yield _describe(pos, header, True)
            if records:
                f.seek(pos)
                yield from _record_lines(f.read(header.size))
    yield from (f"DEFECT {d}" for d in defects)


def _dump_journal(path: str, records: bool) -> Iterator[str]:
    base = int(os.path.basename(path)[: -len(SEGMENT_SUFFIX)])
    size = os.path.getsize(path)
    reader = JournalReader(os.path.dirname(path) or ".")
    try:
        pos, end = base, base + size
        while pos < end:
            try:
                entries, nxt = reader.read(pos, end, _READ_BYTES, verify=True)
            except CorruptEntryError as exc:
                yield f"DEFECT {exc}"
                return
            if nxt == pos:
                yield f"DEFECT {end - pos} bytes of a partial entry at {pos}"
                return
            for e in entries:
                if e.is_log_start:
                    yield (
                        f"position: {e.position} size: {e.size} topicId: {e.topic_id.hex()} "
                        f"partition: {e.partition} logStartOffset: {e.base_offset}"
                    )
                    continue
                header = parse_header(e.batch)
                yield (
                    f"position: {e.position} size: {e.size} topicId: {e.topic_id.hex()} "
                    f"partition: {e.partition} baseOffset: {e.base_offset} "
                    f"records: {e.record_count} | batch " + _describe(0, header, True)
                )
                if records:
                    yield from _record_lines(e.batch)
            pos = nxt
    finally:
        reader.close()
