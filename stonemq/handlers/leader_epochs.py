"""OffsetForLeaderEpoch (23): the end offset of a leader epoch, which clients use to detect log
truncation after a leader change or an unclean restart (KIP-320).

A partition's leader epoch is its journal partition's (the routing's: 0 on a single node, the
controller's epoch in a cluster). The answers follow Kafka's ``LeaderEpochFileCache.endOffsetFor``:

* epoch -1 (undefined), or one above the current epoch: epoch -1, offset -1;
* the current epoch: that epoch and the log end offset;
* an earlier epoch: from the partition's own batches, which carry the journal partition's
  leader epoch that wrote them (``StorageEngine.epoch_end_offset``): the largest epoch at or
  below the one asked among them and the offset where the next epoch's batches start (the
  log end when none do); an epoch below every batch answers itself with the first batch's
  offset. This is the per-partition view of the journal partition's leader-epoch checkpoint
  (storage/leader_epoch.py), which answers the followers (handlers/replica_fetch.py).

``current_leader_epoch`` (-1: not given) is checked first, as Kafka does
(``RequestContext.leader_epoch_error``, shared with Fetch and ListOffsets): below the current
epoch FENCED_LEADER_EPOCH, above it UNKNOWN_LEADER_EPOCH; a partition whose journal
partition another broker leads is NOT_LEADER_OR_FOLLOWER.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from stonemq.handlers.context import RequestContext, read_failure
from stonemq.handlers.registry import api
from stonemq.storage.engine import StorageError, UnknownPartitionError

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


async def end_offset_for(
    storage: Any, topic: str, partition: int, requested: int, current: int
) -> tuple[int, int]:
    """``(epoch, end offset)`` answered for ``requested`` when ``current`` is the partition's
    leader epoch (see the module doc)."""
    if requested == UNDEFINED_EPOCH or requested > current:
        return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
    if requested == current:
        return requested, storage.log_end_offset(topic, partition)
    return await storage.epoch_end_offset(topic, partition, requested)


@api(23, 2, 4)
async def handle_offset_for_leader_epoch(ctx: RequestContext, request: Any) -> Any:
    storage = ctx.broker.storage
    routing = ctx.broker.routing
    topics = []
    async for topic in ctx.paced(request.topics):
        record = ctx.broker.topics.get(topic.topic)
        partitions = []
        async for p in ctx.paced(topic.partitions):
            epoch, end_offset = UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            current = -1
            if record is None or not 0 <= p.partition < record.partitions:
                error = ErrorCode.unknown_topic_or_partition
            else:
                error = ctx.leader_epoch_error(record, p.partition, p.current_leader_epoch)
                journal_partition = record.journal_partitions[p.partition]
                if error == ErrorCode.none and not routing.leads(journal_partition):
                    error = ErrorCode.not_leader_or_follower
                elif error == ErrorCode.none:
                    current = routing.leadership(journal_partition).leader_epoch
            if error == ErrorCode.none:
                try:
                    epoch, end_offset = await end_offset_for(
                        storage, topic.topic, p.partition, p.leader_epoch, current
                    )
                except UnknownPartitionError:
                    error = ctx.not_here(topic.topic, p.partition)
                except StorageError:
                    error = ErrorCode.kafka_storage_error
                except Exception as exc:  # stored bytes damaged on disk, or unforeseen
                    where = f"{topic.topic}-{p.partition} at epoch {p.leader_epoch}"
                    error = read_failure(exc, where, "OffsetForLeaderEpoch")
            partitions.append(
                ctx.build(
                    "EpochEndOffset",
                    error_code=error,
                    partition=p.partition,
                    leader_epoch=epoch,
                    end_offset=end_offset,
                )
            )
        topics.append(
            ctx.build("OffsetForLeaderTopicResult", topic=topic.topic, partitions=tuple(partitions))
        )
    return ctx.build("OffsetForLeaderEpochResponse", throttle_time=0, topics=tuple(topics))
