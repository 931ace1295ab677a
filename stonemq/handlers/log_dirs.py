"""Log directories: DescribeLogDirs (35) and AlterReplicaLogDirs (34).

StoneMQ's log directories are two: the journal directory (``journal.dir``, where every
produce is appended, interleaved over the journal partitions) and the queue directory
(``queue.dir``, where the splitter writes each partition's own log). DescribeLogDirs answers
both, with their file system's total and usable bytes, as Kafka answers each ``log.dirs``
entry. Partition logs are in the queue directory: each requested partition (every one when
the request names none) with its queue log's size in bytes and its offset lag, which here is
how many acknowledged offsets the queue log does not hold yet (the split lag: log end minus
high watermark); Kafka reports a current replica's lag behind its high watermark, always 0
on a leader. The journal directory lists no partitions: a journal partition is not a topic
partition.

AlterReplicaLogDirs answers as Kafka's ``ReplicaManager.alterReplicaLogDirs`` does when the
destination is the directory the partition is already in: nothing to move, NONE. Only the
queue directory can hold a partition's log, so any other path (the journal directory too)
is LOG_DIR_NOT_FOUND, Kafka's answer for a path that is not a log directory of the broker;
a partition that does not exist is UNKNOWN_TOPIC_OR_PARTITION, one whose replicas are on other
brokers REPLICA_NOT_AVAILABLE.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from kio.schema.errors import ErrorCode

from stonemq.handlers.context import RequestContext, heavy_work
from stonemq.handlers.registry import api
from stonemq.storage.engine import StorageError, UnknownPartitionError

log = logging.getLogger(__name__)

LARGE_RESPONSE_PARTITIONS = 5000
"""From this many partitions on, the response is built in a thread (as Metadata's is)."""


def log_dir_path(directory: str) -> str:
    """A directory as log-dir APIs name it: absolute and normalised (Kafka's absolute path)."""
    return os.path.abspath(directory)


def disk_space(directory: str) -> tuple[int, int]:
    """``(total bytes, usable bytes)`` of the file system holding ``directory``."""
    st = os.statvfs(directory)
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


@api(35, 1, 5)
async def handle_describe_log_dirs(ctx: RequestContext, request: Any) -> Any:
    wanted = await _wanted_partitions(ctx, request.topics)
    if len(wanted) < LARGE_RESPONSE_PARTITIONS:
        results = _results(ctx, wanted)
    else:
        ctx.encode_in_thread = True
        loop = asyncio.get_running_loop()
        results = await loop.run_in_executor(heavy_work(), _results, ctx, wanted)
    return ctx.build(
        "DescribeLogDirsResponse", throttle_time=0, error_code=ErrorCode.none, results=results
    )


async def _wanted_partitions(ctx: RequestContext, topics: Any) -> list[tuple[str, int]]:
    """The (topic, partition) pairs asked for that exist; every partition for null topics."""
    manager = ctx.broker.topics
    if topics is None:
        return [
            (record.name, p)
            for record in ctx.broker.metadata.list_topics()
            for p in range(record.partitions)
        ]
    wanted: dict[tuple[str, int], None] = {}
    async for topic in ctx.paced(topics):
        record = manager.get(topic.topic)
        if record is None:
            continue  # Kafka leaves out what it does not host
        async for p in ctx.paced(topic.partitions):
            if 0 <= p < record.partitions:
                wanted[(topic.topic, p)] = None
    return list(wanted)


def _results(ctx: RequestContext, wanted: list[tuple[str, int]]) -> tuple[Any, ...]:
    storage = ctx.broker.storage
    queue_dir = log_dir_path(storage.queue_dir)
    journal_dir = log_dir_path(storage.journal_dir)
    by_topic: dict[str, list[Any]] = {}
    for topic, partition in wanted:
        try:
            size = storage.partition_size_bytes(topic, partition)
            lag = storage.log_end_offset(topic, partition) - storage.high_watermark(
                topic, partition
            )
        except (UnknownPartitionError, StorageError):
            continue  # deleted meanwhile, or a failed queue log: not hosted
        by_topic.setdefault(topic, []).append(
            ctx.build(
                "DescribeLogDirsPartition",
                partition_index=partition,
                partition_size=size,
                offset_lag=max(lag, 0),
                is_future_key=False,
            )
        )
    topics = tuple(
        ctx.build("DescribeLogDirsTopic", name=name, partitions=tuple(partitions))
        for name, partitions in by_topic.items()
    )
    results = [_dir_result(ctx, queue_dir, topics)]
    if journal_dir != queue_dir:
        results.append(_dir_result(ctx, journal_dir, ()))
    return tuple(results)


def _dir_result(ctx: RequestContext, path: str, topics: tuple[Any, ...]) -> Any:
    try:
        total, usable = disk_space(path)
    except OSError as exc:
        log.warning("cannot describe log dir %s: %s", path, exc)
        return ctx.build(
            "DescribeLogDirsResult",
            error_code=ErrorCode.kafka_storage_error,
            log_dir=path,
            topics=(),
            total_bytes=-1,
            usable_bytes=-1,
            is_cordoned=False,
        )
    return ctx.build(
        "DescribeLogDirsResult",
        error_code=ErrorCode.none,
        log_dir=path,
        topics=topics,
        total_bytes=total,
        usable_bytes=usable,
        is_cordoned=False,
    )


def _hosted(ctx: RequestContext, topic: str, partition: int) -> bool:
    """Whether this broker holds a replica of the partition (its journal partition's)."""
    try:
        ctx.broker.storage.log_end_offset(topic, partition)
    except UnknownPartitionError:
        return False
    return True


@api(34, 1, 2)
async def handle_alter_replica_log_dirs(ctx: RequestContext, request: Any) -> Any:
    queue_dir = log_dir_path(ctx.broker.storage.queue_dir)
    manager = ctx.broker.topics
    # (topic, partition) -> error; a partition named twice gets the last one's answer
    outcome: dict[str, dict[int, ErrorCode]] = {}
    async for directory in ctx.paced(request.dirs):
        async for topic in ctx.paced(directory.topics):
            record = manager.get(topic.name)
            async for partition in ctx.paced(topic.partitions):
                if directory.path != queue_dir:
                    error = ErrorCode.log_dir_not_found
                elif record is None or not 0 <= partition < record.partitions:
                    error = ErrorCode.unknown_topic_or_partition
                elif not _hosted(ctx, topic.name, partition):
                    error = ErrorCode.replica_not_available  # Kafka's, for no local replica
                else:
                    error = ErrorCode.none  # already there: nothing to move
                outcome.setdefault(topic.name, {})[partition] = error
    return ctx.build(
        "AlterReplicaLogDirsResponse",
        throttle_time=0,
        results=tuple(
            [
                ctx.build(
                    "AlterReplicaLogDirTopicResult",
                    topic_name=name,
                    partitions=tuple(
                        [
                            ctx.build(
                                "AlterReplicaLogDirPartitionResult",
                                partition_index=p,
                                error_code=error,
                            )
                            async for p, error in ctx.paced(list(partitions.items()))
                        ]
                    ),
                )
                async for name, partitions in ctx.paced(list(outcome.items()))
            ]
        ),
    )
