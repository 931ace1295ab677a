"""The archive job's executor side: one task's uploaded segment in, one staged Parquet file
out (:func:`stage_task`), and the function Spark runs per partition (:func:`stage_partition`).

Kept apart from :mod:`stonemq.tiering.archive_job` so that a Spark Python worker imports only
pyarrow, the cold store and the row decoder: that module imports ``pyspark.sql``, which the
workers load from Spark's ``pyspark.zip`` by compiling its source (no bytecode cache in the
zip), about 0.3 s per worker.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from stonemq.protocol.record_batch import set_stored_limit
from stonemq.tiering import manifest as mf
from stonemq.tiering.cold_store import ColdStore, StoreSpec
from stonemq.tiering.rows import ARROW_SCHEMA, DecodeProgress, decode_segment

DEFAULT_ZSTD_LEVEL = 1
ROW_GROUP_RECORDS = 16384  # cold reads skip whole row groups by their offset statistics
# Parquet dictionary encoding only where values repeat: hashing every 1 KiB value only to
# fall back to plain encoding made the write ~2x slower for no smaller file
DICTIONARY_COLUMNS = ["topic", "partition", "timestamp_type", "key", "producer_id"]
# min/max statistics where a reader can use them (cold reads skip row groups by offset and
# timestamp, Spark prunes by key or producer); none for values and headers, whose min/max
# cost a pass over every byte and prune nothing
STATISTICS_COLUMNS = [f.name for f in ARROW_SCHEMA if f.name not in ("value", "headers")]

log = logging.getLogger("stonemq.tiering")


@dataclass
class StagedFile:
    """One task's output: its range, and the staged Parquet file (none when the range holds
    no data record, control batches only)."""

    topic: str
    partition: int
    first: int
    last: int
    staging_key: str | None
    records: int
    bytes: int
    max_timestamp_ms: int
    bytes_in: int = 0  # the uploaded segment bytes this task read
    # False: the segment's rows ended before the task's range did (a batch the archive's
    # validator refuses, a torn or short upload); ``last`` is then where they ended (below
    # ``first`` when none was decoded), and no later range of the partition may be committed
    complete: bool = True
    log_bytes: int = 0  # the record batches' bytes of ``first..last`` (retention.bytes)


def stage_task(store: ColdStore, task: dict[str, Any], zstd_level: int) -> StagedFile:
    """Decode one task's uploaded segment and write its rows as one staged Parquet file."""
    topic, partition = task["topic"], task["partition"]
    first, last = task["first"], task["last"]
    data = store.get(task["segment_key"])
    bytes_in = len(data)

    def refused(pos: int, exc: Exception) -> None:
        log.warning(
            "%s-%d: segment %s ends at byte %d, a batch the validator refuses: %s",
            topic,
            partition,
            task["segment_key"],
            pos,
            exc,
        )

    progress = DecodeProgress()
    table = decode_segment(data, topic, partition, first, last, refused, progress)
    del data
    complete = progress.walked_to >= last
    if not complete:
        # the range ends where the rows do: offsets past it were never decoded, and a
        # commit of the whole range lost them for good once local retention deleted the
        # segment (audit36 p6: a batch above tier run's batch.max.uncompressed.bytes)
        last = max(progress.walked_to, first - 1)
        log.error(
            "%s-%d: segment %s: offsets %d..%d not decoded; the archive stops at %d "
            "(give tier run the broker's settings, batch.max.uncompressed.bytes among them)",
            topic,
            partition,
            task["segment_key"],
            last + 1,
            task["last"],
            last + 1,
        )
    if table.num_rows == 0:
        return StagedFile(
            topic, partition, first, last, None, 0, 0, -1, bytes_in, complete, progress.log_bytes
        )
    name = f"{first:020d}-{last:020d}.{uuid.uuid4().hex}.parquet"
    key = f"{mf.staging_dir(topic, partition)}/{name}"
    size = write_parquet(store, key, table, zstd_level)
    max_ts = max(table.column("timestamp").cast(pa.int64()).to_pylist()) // 1000
    return StagedFile(
        topic,
        partition,
        first,
        last,
        key,
        table.num_rows,
        size,
        max_ts,
        bytes_in,
        complete,
        progress.log_bytes,
    )


def stage_partition(
    store_json: str, zstd_level: int, stored_limit_bytes: int
) -> Callable[[Iterator[list[dict[str, Any]]]], Iterator[str]]:
    """The executors' function: stage each task of the groups of tasks in a Spark
    partition; one staged file (as JSON) out per task. ``stored_limit_bytes``: the broker's
    ``batch.max.uncompressed.bytes`` (the driver's :func:`stored_limit`), which an executor,
    another process, would not know: a batch the broker accepted above the default limit
    ended its segment's rows there (refused), and the archive stopped at it."""

    def run(groups: Iterator[list[dict[str, Any]]]) -> Iterator[str]:
        set_stored_limit(stored_limit_bytes)
        store = StoreSpec(**json.loads(store_json)).open()
        for group in groups:
            for task in group:
                yield json.dumps(asdict(stage_task(store, task, zstd_level)))

    return run


def write_parquet(store: ColdStore, key: str, table: pa.Table, zstd_level: int) -> int:
    """Write ``table`` as one zstd Parquet object at ``key``; returns its size. The file is
    built in memory (about a quarter of the segment's bytes for message-like data) and
    written once, instead of through a local temporary file read back for the upload."""
    sink = pa.BufferOutputStream()
    pq.write_table(
        table,
        sink,
        compression="zstd",
        compression_level=zstd_level,
        row_group_size=ROW_GROUP_RECORDS,
        use_dictionary=DICTIONARY_COLUMNS,
        write_statistics=STATISTICS_COLUMNS,
    )
    return store.put_atomic(key, memoryview(sink.getvalue()))
