"""The archive manifest: per topic partition, the committed Parquet files and the offset range
each covers; the single source of truth for what is archived.

A Parquet file counts only once a manifest version lists it. Versions are whole JSON
documents under ``manifests/<topic>/<partition>/<version>.json``; a commit creates version
N+1 exclusively (:meth:`ColdStore.create_exclusive`: a hard link on file://, a conditional PUT
on s3), so two writers cannot both win and a reader always sees a complete version. Ranges are
sorted, never overlap, and a commit drops whatever the current version already covers:
exactly once by offset range, whatever was killed and rerun before.

Also here: the store's key layout (:func:`parquet_key`, :func:`segment_key`, ...) and the
pure planning of what to archive next (:func:`plan_ranges`).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace

from stonemq.tiering.cold_store import AlreadyExistsError, ColdStore

KEEP_VERSIONS = 3
_RANGE = re.compile(r"^(\d+)-(\d+)\.(log|parquet)$")


# -- layout ---------------------------------------------------------------------------------
def partition_dir(topic: str, partition: int) -> str:
    return f"topics/{topic}/partition={partition}"


def parquet_key(topic: str, partition: int, first: int, last: int) -> str:
    return f"{partition_dir(topic, partition)}/{first:020d}-{last:020d}.parquet"


def segments_dir(topic: str, partition: int) -> str:
    return f"segments/{topic}/{partition}"


def segment_key(topic: str, partition: int, base: int, last: int) -> str:
    return f"{segments_dir(topic, partition)}/{base:020d}-{last:020d}.log"


def staging_dir(topic: str, partition: int) -> str:
    return f"_staging/{topic}/{partition}"


def manifest_dir(topic: str, partition: int) -> str:
    return f"manifests/{topic}/{partition}"


def topic_dirs(topic: str) -> list[str]:
    """Every folder holding a topic's cold data, the manifests first (deleted first)."""
    return [f"manifests/{topic}", f"topics/{topic}", f"segments/{topic}", f"_staging/{topic}"]


def tombstone_key(topic: str) -> str:
    """Marks a deleted topic whose cold data is being removed (resumed after a crash)."""
    return f"deleting/{topic}.json"


def parse_range(key: str) -> tuple[int, int] | None:
    """(first, last) from a key named ``<first>-<last>.log|.parquet``; None for others."""
    m = _RANGE.match(key.rsplit("/", 1)[-1])
    return (int(m.group(1)), int(m.group(2))) if m else None


# -- the manifest ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ArchivedFile:
    """One committed offset range; ``key`` is None when the range held no data records
    (only control batches), which still counts as archived."""

    first: int
    last: int
    key: str | None
    records: int
    bytes: int  # the Parquet file's size
    max_timestamp_ms: int = -1
    # the log bytes of the range (its record batches' sizes, as Kafka counts a remote
    # segment's size for retention.bytes); -1 for a file archived before it was recorded
    log_bytes: int = -1

    @property
    def retained_bytes(self) -> int:
        """What the file counts for ``retention.bytes``: its log bytes, or its Parquet size
        when they were not recorded."""
        return self.log_bytes if self.log_bytes >= 0 else self.bytes


@dataclass(frozen=True, slots=True)
class Manifest:
    topic: str
    partition: int
    version: int = 0
    files: tuple[ArchivedFile, ...] = ()
    log_start: int = 0  # raised by cold retention; files below it are gone
    updated_ms: int = 0
    topic_id: str = ""  # the topic's id (Kafka keys remote data by it); "" before it was kept

    @property
    def next_offset(self) -> int:
        """The first offset not yet archived (0 when nothing is)."""
        return self.files[-1].last + 1 if self.files else self.log_start

    @property
    def start_offset(self) -> int:
        """The cold log start: the first archived offset still kept."""
        return max(self.files[0].first, self.log_start) if self.files else self.next_offset

    @property
    def bytes(self) -> int:
        """The Parquet files' size (what the store holds)."""
        return sum(f.bytes for f in self.files)

    @property
    def retained_bytes(self) -> int:
        """What the archive counts for ``retention.bytes`` (:attr:`ArchivedFile.retained_bytes`)."""
        return sum(f.retained_bytes for f in self.files)

    def file_for(self, offset: int) -> ArchivedFile | None:
        """The committed file holding ``offset``, else the first one after it."""
        for f in self.files:
            if f.last >= offset:
                return f
        return None

    def to_json(self) -> bytes:
        body = asdict(self)
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        body = json.loads(data)
        files = tuple(ArchivedFile(**f) for f in body.pop("files"))
        known = {f.name for f in fields(cls)}
        return cls(files=files, **{k: v for k, v in body.items() if k in known})


class ConcurrentCommitError(Exception):
    """Another writer committed version N+1 first; reload and retry."""


def _version_key(topic: str, partition: int, version: int) -> str:
    return f"{manifest_dir(topic, partition)}/{version:020d}.json"


def load(store: ColdStore, topic: str, partition: int, topic_id: str | None = None) -> Manifest:
    """The latest committed version (an empty manifest when none exists).

    With ``topic_id``, a version written for another topic of the same name (one deleted
    while a commit raced its deletion) counts as empty: a re-created topic never sees the old
    topic's files. Its version number is kept so the next commit still creates a new one."""
    keys = [k for k in store.list(manifest_dir(topic, partition)) if k.endswith(".json")]
    for key in reversed(keys):
        try:
            current = Manifest.from_json(store.get(key))
        except FileNotFoundError:  # trimmed by a newer commit while we listed: look again
            return load(store, topic, partition, topic_id)
        if topic_id and current.topic_id and current.topic_id != topic_id:
            return Manifest(topic, partition, version=current.version, topic_id=topic_id)
        return replace(current, topic_id=topic_id) if topic_id else current
    return Manifest(topic, partition, topic_id=topic_id or "")


def merge(current: Manifest, new_files: Iterable[ArchivedFile]) -> tuple[Manifest, list]:
    """The manifest after adding ``new_files`` and the files dropped as already covered.

    A file whose range starts below the current end is a duplicate (a rerun of a job whose
    earlier run committed): it is dropped whole. Ranges are added in offset order."""
    files = list(current.files)
    dropped: list[ArchivedFile] = []
    end = current.next_offset
    for f in sorted(new_files, key=lambda f: (f.first, f.last)):
        if f.last < f.first:
            raise ValueError(f"empty range {f.first}-{f.last}")
        if f.first < end:
            dropped.append(f)
            continue
        files.append(f)
        end = f.last + 1
    return replace(current, files=tuple(files)), dropped


def commit(store: ColdStore, manifest: Manifest) -> Manifest:
    """Write ``manifest`` as the version after the one it was derived from. Raises
    :class:`ConcurrentCommitError` when that version exists already."""
    out = replace(manifest, version=manifest.version + 1, updated_ms=int(time.time() * 1000))
    try:
        store.create_exclusive(_version_key(out.topic, out.partition, out.version), out.to_json())
    except AlreadyExistsError:
        raise ConcurrentCommitError(f"{out.topic}-{out.partition} v{out.version}") from None
    _trim_versions(store, out)
    return out


def _trim_versions(store: ColdStore, manifest: Manifest) -> None:
    keys = store.list(manifest_dir(manifest.topic, manifest.partition))
    for key in keys[:-KEEP_VERSIONS]:
        store.delete(key)


def truncate_before(
    current: Manifest, offset: int, *, past_end: bool = False
) -> tuple[Manifest, list[ArchivedFile]]:
    """The manifest after cold retention moved the log start to ``offset``: files wholly
    below it leave (returned, for deletion after the commit). The start stops at the
    archive's end unless ``past_end`` (the whole log's start moved past it: offsets that
    retention deleted before they were archived must never be archived later)."""
    if offset <= current.log_start:
        return current, []
    keep = tuple(f for f in current.files if f.last >= offset)
    gone = [f for f in current.files if f.last < offset]
    start = offset if keep or past_end or offset <= current.next_offset else current.next_offset
    return replace(current, files=keep, log_start=start), gone


# -- planning -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ArchiveTask:
    """One uploaded segment's not-yet-archived offsets: the unit of one Spark partition and
    of one Parquet file."""

    topic: str
    partition: int
    segment_key: str
    first: int
    last: int

    @property
    def output_key(self) -> str:
        return parquet_key(self.topic, self.partition, self.first, self.last)


@dataclass(frozen=True, slots=True)
class SegmentRef:
    key: str
    base: int
    last: int
    size: int = field(default=0, compare=False)


def plan_ranges(
    topic: str, partition: int, next_offset: int, segments: Sequence[SegmentRef]
) -> list[ArchiveTask]:
    """The tasks that archive every uploaded offset from ``next_offset`` on, once each.

    Segments may overlap (a segment re-sealed with a different end after a crash): each
    offset goes to the first segment, in (base, last) order, that holds it."""
    tasks = []
    end = next_offset
    for seg in sorted(segments, key=lambda s: (s.base, s.last)):
        if seg.last < end:
            continue
        first = max(seg.base, end)
        tasks.append(ArchiveTask(topic, partition, seg.key, first, seg.last))
        end = seg.last + 1
    return tasks


def list_segments(store: ColdStore, topic: str, partition: int) -> list[SegmentRef]:
    out = []
    for key, size in store.list_sizes(segments_dir(topic, partition)):
        rng = parse_range(key)
        if rng is not None and key.endswith(".log"):
            out.append(SegmentRef(key, rng[0], rng[1], size))
    return out
