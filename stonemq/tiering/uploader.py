"""The uploader: copies sealed queue-log segments of tiered topics to the cold store, so the
archive job's executors read only the cold store, never the broker's disk.

A segment is sealed once a newer one exists in its partition's directory: the broker never
appends to it again (Kafka's rule, and the QueueLog's). Only its whole batches are copied,
under ``segments/<topic>/<partition>/<base>-<last>.log`` (the offset range in the name), as
one object that becomes visible only when complete, and only after the segment file is
fsynced (the bytes uploaded are durable locally, whatever the queue log's flush state).
Idempotent: a segment already uploaded with the same size, or wholly archived, is skipped; a
segment deleted locally while being read is skipped too. Uploaded segments leave the store
once the manifest covers them.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass

from stonemq.protocol.record_batch import RecordBatchError, iter_batches
from stonemq.tiering.cold_store import COPY_CHUNK_BYTES, ColdStore
from stonemq.tiering.manifest import list_segments, segment_key

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"


def local_partition_dir(queue_dir: str, topic: str, partition: int) -> str:
    """The queue log's folder, Kafka's ``<topic>-<partition>`` layout."""
    return os.path.join(queue_dir, f"{topic}-{partition}")


@dataclass(frozen=True, slots=True)
class LocalSegment:
    base: int
    path: str
    size: int
    sealed: bool


def local_segments(queue_dir: str, topic: str, partition: int) -> list[LocalSegment]:
    """The partition's ``.log`` segments, oldest first; all but the newest are sealed."""
    directory = local_partition_dir(queue_dir, topic, partition)
    try:
        names = [n for n in os.listdir(directory) if n.endswith(LOG_SUFFIX)]
    except FileNotFoundError:
        return []
    bases = sorted(int(n[: -len(LOG_SUFFIX)]) for n in names if n[: -len(LOG_SUFFIX)].isdigit())
    out = []
    for i, base in enumerate(bases):
        path = os.path.join(directory, f"{base:020d}{LOG_SUFFIX}")
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            continue
        out.append(LocalSegment(base, path, size, sealed=i < len(bases) - 1))
    return out


@dataclass(slots=True)
class UploadReport:
    uploaded: int = 0
    uploaded_bytes: int = 0
    skipped: int = 0


def upload_sealed(
    store: ColdStore, queue_dir: str, topic: str, partition: int, archived_next: int
) -> UploadReport:
    """Upload every sealed segment holding offsets at or after ``archived_next`` that is not
    in the store yet."""
    report = UploadReport()
    present = {(s.base, s.size) for s in list_segments(store, topic, partition)}
    for seg in local_segments(queue_dir, topic, partition):
        if not seg.sealed:
            continue
        try:
            with open(seg.path, "rb") as fh, _map(fh) as view:
                end, last = _whole_batches(view)
                if end == 0 or last < archived_next or (seg.base, end) in present:
                    report.skipped += 1
                    continue
                # never upload bytes a crash could take back: the queue log may not have
                # flushed this segment yet (its checkpoint round runs later)
                os.fsync(fh.fileno())
                key = segment_key(topic, partition, seg.base, last)
                report.uploaded_bytes += store.put_atomic(key, _chunks(view, end))
                report.uploaded += 1
                log.info("uploaded %s (%d bytes)", key, end)
        except FileNotFoundError:  # deleted by retention meanwhile
            report.skipped += 1
    return report


def delete_archived(store: ColdStore, topic: str, partition: int, archived_next: int) -> int:
    """Remove uploaded segments wholly below ``archived_next`` (the Parquet holds them)."""
    count = 0
    for seg in list_segments(store, topic, partition):
        if seg.last < archived_next:
            store.delete(seg.key)
            count += 1
    return count


def waiting_bytes(queue_dir: str, topic: str, partition: int, archived_next: int) -> int:
    """Local bytes of segments not yet wholly archived (the active one included)."""
    segs = local_segments(queue_dir, topic, partition)
    total = 0
    for i, seg in enumerate(segs):
        end = segs[i + 1].base if i + 1 < len(segs) else None
        if end is None or end > archived_next:
            total += seg.size
    return total


@contextlib.contextmanager
def _map(fh: object) -> Iterator[memoryview]:
    fileno = fh.fileno()  # type: ignore[attr-defined]
    if os.fstat(fileno).st_size == 0:
        yield memoryview(b"")
        return
    mm = mmap.mmap(fileno, 0, access=mmap.ACCESS_READ)
    view = memoryview(mm)
    try:
        yield view
    finally:
        view.release()
        mm.close()


def _whole_batches(view: memoryview) -> tuple[int, int]:
    """(bytes of whole batches from the start, last offset); stops at a bad header."""
    end = 0
    last = -1
    with contextlib.suppress(RecordBatchError):
        for pos, header in iter_batches(view):
            end = pos + header.size
            last = header.last_offset
    return end, last


def _chunks(view: memoryview, end: int) -> Iterator[bytes]:
    for pos in range(0, end, COPY_CHUNK_BYTES):
        yield bytes(view[pos : min(pos + COPY_CHUNK_BYTES, end)])
