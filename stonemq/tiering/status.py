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
from typing import TYPE_CHECKING, Any

from stonemq.protocol.record_batch import RecordBatchError, iter_batches
from stonemq.tiering import manifest as mf
from stonemq.tiering.cold_store import ColdStore
from stonemq.tiering.uploader import local_segments, waiting_bytes

if TYPE_CHECKING:
    from stonemq.config import Settings

LAST_RUN_KEY = "status/last_run.json"


@dataclass(frozen=True, slots=True)
class TieredTopic:
    name: str
    partitions: int
    retention_ms: int
    retention_bytes: int
    topic_id: str = ""


def tiered_topics(settings: Settings, names: list[str] | None = None) -> list[TieredTopic]:
    """Topics with ``remote.storage.enable=true`` (of ``names`` when given), from the metadata
    store the settings name: ZooKeeper with ``zookeeper.connect`` (a cluster broker has no
    ``metadata.db``: ``tier run`` and ``tier status`` saw no topic there, so a cluster never
    archived), else the data directory's SQLite file."""
    from stonemq.metadata.store import MetadataStore
    from stonemq.topic_configs import DynamicBrokerConfigs, resolve_topic, whole_retention

    store: MetadataStore
    if settings.zookeeper_connect:
        from stonemq.metadata.zookeeper import ZooKeeperMetadataStore

        store = ZooKeeperMetadataStore(
            settings.zookeeper_connect,
            broker_id=settings.broker_id,
            session_timeout_ms=settings.zookeeper_session_timeout_ms,
            connect_timeout_s=settings.zookeeper_connection_timeout_ms / 1000,
        )
    else:
        from stonemq.metadata.sqlite import SqliteMetadataStore

        db = Path(settings.data_dir) / "metadata.db"
        if not db.exists():
            return []
        store = SqliteMetadataStore(db)
    try:
        dynamic = DynamicBrokerConfigs(
            own=store.broker_configs(str(settings.broker_id)), default=store.broker_configs()
        )
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
                        *whole_retention(values),
                        str(record.topic_id),
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
COMMIT_RETRIES = 5


@dataclass(frozen=True, slots=True)
class ColdRetention:
    """What one cold-retention pass did to a partition."""

    files_deleted: int = 0
    segments_deleted: int = 0
    strays_deleted: int = 0
    log_start: int = 0  # the cold log start after the pass


def apply_cold_retention(
    store: ColdStore,
    topic: TieredTopic,
    partition: int,
    local_bytes: int,
    now_ms: int,
    *,
    local_start: int | None = None,
    delete_before: int = -1,
) -> ColdRetention:
    """Apply ``retention.ms`` / ``retention.bytes`` (the whole log: cold plus the local bytes
    not yet archived) to the cold tier: whole Parquet files leave oldest first.

    ``local_start`` is the local log start: when retention (or DeleteRecords) moved it past
    the archive's end, the cold log start follows, so those offsets are never archived.
    ``delete_before`` is a DeleteRecords offset: the cold log start moves to it (KIP-405: the
    log start offset covers the remote log too), past the archive's end as ``local_start``.

    Crash-safe order: the manifest version that drops the files is committed first, then
    the files are deleted; a pass also removes what an earlier pass (or a killed run) left
    behind: uploaded segments the manifest covers and Parquet files below the cold log start
    that no version lists. A commit racing ``tier run`` is retried on the newer version."""
    for _ in range(COMMIT_RETRIES):
        current = mf.load(store, topic.name, partition, topic.topic_id or None)
        files = current.files
        cut = 0
        if topic.retention_ms >= 0:
            expired_before = now_ms - topic.retention_ms
            while cut < len(files) and (
                files[cut].key is None or 0 <= files[cut].max_timestamp_ms < expired_before
            ):
                cut += 1
        if topic.retention_bytes >= 0:
            # log bytes, as Kafka counts remote segments: the Parquet files are several
            # times smaller, and the log kept 6.7-7.4x retention.bytes (audit36 p7)
            total = current.retained_bytes + local_bytes
            for f in files[:cut]:
                total -= f.retained_bytes
            while cut < len(files) and total - files[cut].retained_bytes >= topic.retention_bytes:
                total -= files[cut].retained_bytes
                cut += 1
        offset = files[cut - 1].last + 1 if cut else current.log_start
        past_end = local_start is not None and local_start > current.next_offset
        if past_end:
            offset = max(offset, int(local_start or 0))
        if delete_before > offset:
            offset = delete_before
            past_end = past_end or delete_before > current.next_offset
        trimmed, gone = mf.truncate_before(current, offset, past_end=past_end)
        if trimmed is not current:
            try:
                current = mf.commit(store, trimmed)
            except mf.ConcurrentCommitError:
                continue
        break
    else:
        raise mf.ConcurrentCommitError(f"{topic.name}-{partition}: cold retention gave up")
    for f in gone:  # the manifest no longer lists them: readers never open them again
        if f.key:
            store.delete(f.key)
    from stonemq.tiering.uploader import delete_archived

    segments = delete_archived(store, topic.name, partition, current.next_offset)
    listed = {f.key for f in current.files if f.key}
    strays = 0
    for key in store.list(mf.partition_dir(topic.name, partition)):
        rng = mf.parse_range(key)
        if rng is not None and rng[1] < current.start_offset and key not in listed:
            store.delete(key)
            strays += 1
    return ColdRetention(sum(1 for f in gone if f.key), segments, strays, current.start_offset)


def delete_topic_data(store: ColdStore, topic: str, topic_id: str) -> None:
    """Remove a deleted topic's cold data: a tombstone first (a crash resumes from it), then
    the manifests (so nothing counts as archived any more), then the Parquet files, the
    uploaded segments and the staged files, then the tombstone."""
    store.put_atomic(
        mf.tombstone_key(topic), json.dumps({"topic": topic, "topic_id": topic_id}).encode()
    )
    for prefix in mf.topic_dirs(topic):
        store.delete_prefix(prefix)
    store.delete(mf.tombstone_key(topic))


def pending_deletes(store: ColdStore) -> dict[str, str]:
    """Deleted topics whose cold data is not wholly removed yet: name -> topic id."""
    out = {}
    for key in store.list("deleting"):
        try:
            body = json.loads(store.get(key))
            out[str(body["topic"])] = str(body.get("topic_id", ""))
        except (FileNotFoundError, ValueError, KeyError):
            continue
    return out


def as_dict(status: PartitionStatus) -> dict[str, Any]:
    return asdict(status)
