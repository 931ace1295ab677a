"""Tiering status: which topics tier, and per partition the local range, the archived range,
the bytes waiting to be archived and the last run; also cold retention (``retention.ms`` /
``retention.bytes`` over the whole log delete cold files too).

Works from a separate process while the broker runs: topics and configs come from the
metadata store (SQLite, WAL mode), local ranges from the queue-log folders, archived ranges
from the manifests, the last run from ``status/last_run.json`` in the cold store.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stonemq.config import Settings
from stonemq.protocol.record_batch import RecordBatchError, iter_batches
from stonemq.tiering import manifest as mf
from stonemq.tiering.cold_store import ColdStore
from stonemq.tiering.uploader import local_segments, waiting_bytes

LAST_RUN_KEY = "status/last_run.json"


@dataclass(frozen=True, slots=True)
class TieredTopic:
    name: str
    partitions: int
    retention_ms: int
    retention_bytes: int


def tiered_topics(settings: Settings, names: list[str] | None = None) -> list[TieredTopic]:
    """Topics with ``remote.storage.enable=true`` (of ``names`` when given)."""
    from stonemq.metadata.sqlite import SqliteMetadataStore
    from stonemq.topic_configs import resolve_topic

    db = Path(settings.data_dir) / "metadata.db"
    if not db.exists():
        return []
    store = SqliteMetadataStore(db)
    try:
        dynamic = store.broker_configs()
        out = []
        for record in store.list_topics():
            if names and record.name not in names:
                continue
            values = resolve_topic(settings, dynamic, record.configs).values
            if values.get("remote.storage.enable"):
                out.append(
                    TieredTopic(
                        record.name,
                        record.partitions,
                        int(values["retention.ms"]),
                        int(values["retention.bytes"]),
                    )
                )
        return out
    finally:
        store.close()


def local_range(queue_dir: str, topic: str, partition: int) -> tuple[int, int] | None:
    """(first offset held locally, next offset) from the queue-log files; None if empty."""
    segs = local_segments(queue_dir, topic, partition)
    if not segs:
        return None
    last = segs[-1]
    next_offset = last.base
    try:
        with open(last.path, "rb") as fh:
            data = fh.read()
        for _, header in iter_batches(data):
            next_offset = header.next_offset
    except (OSError, RecordBatchError):
        pass
    return segs[0].base, next_offset


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    topic: str
    partition: int
    local: tuple[int, int] | None  # (first, next)
    archived: tuple[int, int] | None  # (first, next)
    archived_files: int
    archived_bytes: int
    waiting_bytes: int


def partition_status(
    store: ColdStore, queue_dir: str, topic: str, partition: int
) -> PartitionStatus:
    current = mf.load(store, topic, partition)
    archived = (
        (current.start_offset, current.next_offset)
        if current.next_offset > current.start_offset
        else None
    )
    return PartitionStatus(
        topic,
        partition,
        local_range(queue_dir, topic, partition),
        archived,
        len(current.files),
        current.bytes,
        waiting_bytes(queue_dir, topic, partition, current.next_offset),
    )


# -- last run --------------------------------------------------------------------------------
def record_run(store: ColdStore, summary: dict[str, Any]) -> None:
    body = dict(summary, finished_ms=int(time.time() * 1000))
    store.put_atomic(LAST_RUN_KEY, json.dumps(body).encode())


def last_run(store: ColdStore) -> dict[str, Any] | None:
    try:
        return dict(json.loads(store.get(LAST_RUN_KEY)))
    except (FileNotFoundError, ValueError):
        return None


# -- cold retention --------------------------------------------------------------------------
def apply_cold_retention(
    store: ColdStore, topic: TieredTopic, partition: int, local_bytes: int, now_ms: int
) -> int:
    """Delete whole cold files that ``retention.ms`` / ``retention.bytes`` (the whole log:
    cold plus local-only bytes) let go, oldest first: a manifest commit, then the deletes.
    Returns the number of files removed."""
    current = mf.load(store, topic.name, partition)
    if not current.files:
        return 0
    cut = 0
    files = current.files
    if topic.retention_ms >= 0:
        expired_before = now_ms - topic.retention_ms
        while cut < len(files) and (
            files[cut].key is None or 0 <= files[cut].max_timestamp_ms < expired_before
        ):
            cut += 1
    if topic.retention_bytes >= 0:
        total = current.bytes + local_bytes
        for f in files[:cut]:
            total -= f.bytes
        while cut < len(files) and total - files[cut].bytes >= topic.retention_bytes:
            total -= files[cut].bytes
            cut += 1
    if cut == 0:
        return 0
    trimmed, gone = mf.truncate_before(current, files[cut - 1].last + 1)
    mf.commit(store, trimmed)
    for f in gone:
        if f.key:
            store.delete(f.key)
    return len(gone)


def as_dict(status: PartitionStatus) -> dict[str, Any]:
    return asdict(status)
