"""ListOffsets (2): earliest (-2), latest (-1), max timestamp (-3) and offsets by timestamp.

Versions 1-11, as Kafka 4 serves them: v8 adds earliest-local (-4, KIP-405), v9 latest-tiered
(-5, KIP-1005), v11 earliest-pending-upload (-6, KIP-1023); v10's timeout (KIP-1075) bounds an
asynchronous remote lookup, and StoneMQ's archive lookup answers within the request. For a
topic that does not tier, -4 is the log start and -5 / -6 answer offset -1, as Kafka does
for a topic without remote storage.

Latest is the high watermark (what consumers can read). Latest, max-timestamp and
by-timestamp lookups first wait for the split to reach what was acknowledged when the request
arrived (``FetchWaiters.until_split``): a client that produces and then asks for the end
(seek-to-end, consumer lag, offsets by time) sees its own records, as it would against a
single Kafka broker. By timestamp, the answer is the
first offset whose record timestamp is >= the target: for a tiered topic the archive below
the local log start is searched first (off the event loop, stonemq/tiering/service.py), then
the local time index; when there is none, offset and timestamp are -1, as Kafka answers.
Earliest is the cold log start for a tiered topic. A partition named twice in one request
is INVALID_REQUEST, each time, as Kafka answers; a negative target that is none of the
special values, or one older than the request's version (-3 before v7, -4 before v8, -5
before v9, -6 before v11), is UNSUPPORTED_VERSION, as Kafka's ReplicaManager answers. From
v4 a partition's ``current_leader_epoch`` is checked first (KIP-320): FENCED_LEADER_EPOCH below the
partition's leader epoch, UNKNOWN_LEADER_EPOCH above it. Each answer's ``leader_epoch`` is
the epoch of the batch holding the offset answered (latest: the current epoch; nothing found:
-1), as Kafka's leader-epoch cache answers (``_epoch_of``).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from kio.schema.errors import ErrorCode

from stonemq.handlers.context import RequestContext, read_failure
from stonemq.handlers.fetch_waiters import ACKNOWLEDGED_WAIT_S
from stonemq.handlers.registry import api
from stonemq.storage.engine import StorageError, UnknownPartitionError

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5
EARLIEST_PENDING_UPLOAD = -6


@api(2, 1, 11)
async def handle_list_offsets(ctx: RequestContext, request: Any) -> Any:
    deadline = asyncio.get_running_loop().time() + ACKNOWLEDGED_WAIT_S  # for the whole request
    # a partition named more than once: INVALID_REQUEST for each, as Kafka's ReplicaManager
    # answers its ListOffsetsRequest.duplicatePartitions (clients merge answers by partition)
    named: collections.Counter[tuple[str, int]] = collections.Counter()
    async for topic in ctx.paced(request.topics):
        async for p in ctx.paced(topic.partitions):
            named[topic.name, p.partition_index] += 1
    topics = []
    async for topic in ctx.paced(request.topics):
        record = ctx.broker.topics.get(topic.name)
        partitions = []
        async for p in ctx.paced(topic.partitions):
            epoch = -1
            if named[topic.name, p.partition_index] > 1:
                error, offset, timestamp = ErrorCode.invalid_request, -1, -1
            elif _unsupported(p.timestamp, ctx.api_version):
                error, offset, timestamp = ErrorCode.unsupported_version, -1, -1
            elif record is None or not 0 <= p.partition_index < record.partitions:
                error, offset, timestamp = ErrorCode.unknown_topic_or_partition, -1, -1
            elif (
                fenced := ctx.leader_epoch_error(
                    record, p.partition_index, getattr(p, "current_leader_epoch", -1)
                )
            ) != ErrorCode.none:
                error, offset, timestamp = fenced, -1, -1  # KIP-320
            elif ctx.not_led_here(record, p.partition_index):
                error, offset, timestamp = ErrorCode.not_leader_or_follower, -1, -1
            else:
                try:
                    error = ErrorCode.none
                    offset, timestamp = await _lookup(
                        ctx, topic.name, p.partition_index, p.timestamp, deadline
                    )
                    epoch = await _epoch_of(
                        ctx, record, topic.name, p.partition_index, p.timestamp, offset
                    )
                except UnknownPartitionError:  # not hosted here: led by another broker?
                    error, offset, timestamp = ctx.not_here(topic.name, p.partition_index), -1, -1
                except StorageError:  # a failed queue log, or records that cannot be decoded
                    error, offset, timestamp = ErrorCode.kafka_storage_error, -1, -1
                except Exception as exc:  # stored bytes damaged on disk, or unforeseen
                    where = f"{topic.name}-{p.partition_index} at timestamp {p.timestamp}"
                    error, offset, timestamp = read_failure(exc, where, "ListOffsets"), -1, -1
            partitions.append(
                ctx.build(
                    "ListOffsetsPartitionResponse",
                    partition_index=p.partition_index,
                    error_code=error,
                    timestamp=timestamp,
                    offset=offset,
                    leader_epoch=epoch,
                )
            )
        topics.append(
            ctx.build("ListOffsetsTopicResponse", name=topic.name, partitions=tuple(partitions))
        )
    return ctx.build("ListOffsetsResponse", throttle_time=0, topics=tuple(topics))


async def _epoch_of(
    ctx: RequestContext, record: Any, topic: str, partition: int, target: int, offset: int
) -> int:
    """The leader epoch answered beside ``offset``, as Kafka's leader-epoch cache says it
    (UnifiedLog.fetchOffsetByTimestamp): latest, the partition's current epoch; an offset a
    local batch holds (earliest, by timestamp, max timestamp), that batch's epoch; earliest
    of a log with no batch left, the current epoch (the cache's entry at the log start);
    anything else (nothing found, an archived offset), -1. Clients keep it to validate
    their position after a leader change (KIP-320)."""
    current = ctx.broker.routing.leadership(record.journal_partitions[partition]).leader_epoch
    if target == LATEST:
        return current
    if offset < 0:
        return -1
    storage = ctx.broker.storage
    if target in (EARLIEST, EARLIEST_LOCAL) and offset >= storage.high_watermark(topic, partition):
        return current
    return await storage.leader_epoch_at(topic, partition, offset)


SPECIAL_SINCE = {
    LATEST: 0,
    EARLIEST: 0,
    MAX_TIMESTAMP: 7,
    EARLIEST_LOCAL: 8,
    LATEST_TIERED: 9,
    EARLIEST_PENDING_UPLOAD: 11,
}
"""Each special target and the first version that has it (Kafka's
ListOffsetsRequest.timestampMinSupportedVersion)."""


def _unsupported(target: int, version: int) -> bool:
    """Kafka's ReplicaManager.isListOffsetsTimestampUnsupported: a negative target that is no
    special value, or one the request's version does not have yet, is UNSUPPORTED_VERSION
    (not a search for the first record's time)."""
    return target < 0 and version < SPECIAL_SINCE.get(target, 1 << 15)


async def _lookup(
    ctx: RequestContext, topic: str, partition: int, target: int, deadline: float
) -> tuple[int, int]:
    storage = ctx.broker.storage
    tier = getattr(ctx.broker, "tier", None)
    if target in (LATEST, MAX_TIMESTAMP) or target >= 0:
        await ctx.broker.fetch_waiters.until_split(storage, topic, partition, deadline)
    if target == LATEST:
        return storage.high_watermark(topic, partition), -1
    if target == EARLIEST:
        if tier is None:
            return storage.log_start_offset(topic, partition), -1
        await tier.load_manifests([(topic, partition)])
        start = storage.log_start_offset(topic, partition)
        return tier.log_start(topic, partition, start), -1
    if target == EARLIEST_LOCAL:
        return storage.log_start_offset(topic, partition), -1
    if target in (LATEST_TIERED, EARLIEST_PENDING_UPLOAD):
        if tier is None or not tier.tiered(topic):
            return -1, -1
        archived_next = tier.archived_next(topic, partition)  # first offset not archived
        if target == LATEST_TIERED:
            return archived_next - 1, -1  # -1 while nothing is archived
        if archived_next >= storage.high_watermark(topic, partition):
            return -1, -1  # nothing waits for upload
        return max(archived_next, storage.log_start_offset(topic, partition)), -1
    if target == MAX_TIMESTAMP:
        found = await storage.max_timestamp(topic, partition)
    else:
        found = None
        if tier is not None:  # archived records below the local log start come first
            start = storage.log_start_offset(topic, partition)
            found = await tier.offset_for_timestamp(topic, partition, target, start)
        if found is None:
            found = await storage.offset_for_timestamp(topic, partition, target)
    if found is None:
        return -1, -1
    offset, timestamp = found
    return offset, timestamp
