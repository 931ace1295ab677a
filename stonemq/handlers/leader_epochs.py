"""OffsetForLeaderEpoch (23): the end offset of a leader epoch, which clients use to detect log
truncation after a leader change or an unclean restart (KIP-320).

On one broker every partition has had one leader epoch, 0, since it was created (Metadata,
ListOffsets and Fetch all answer epoch 0), so Kafka's leader-epoch cache is a single entry
``(epoch 0, start offset = log start)`` and its answers (``LeaderEpochFileCache.endOffsetFor``)
are:

* epoch -1 (undefined): epoch -1, offset -1;
* the current epoch, 0: epoch 0 and the log end offset (what is acknowledged; a consumer's
  position never passes it, so only a log that lost acknowledged records — an unflushed
  journal tail after a crash — makes a client see truncation);
* an epoch above the current one: epoch -1, offset -1 (no such epoch here);
* an epoch below 0 other than -1: that epoch and the first epoch's start, the log start.

``current_leader_epoch`` (-1: not given) is checked first, as Kafka does: below the current
epoch FENCED_LEADER_EPOCH, above it UNKNOWN_LEADER_EPOCH.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from stonemq.handlers.context import RequestContext
from stonemq.handlers.registry import api
from stonemq.storage.engine import StorageError, UnknownPartitionError

LEADER_EPOCH = 0
"""Every partition's leader epoch on a single broker (what Metadata and ListOffsets answer)."""
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


def end_offset_for(requested: int, log_start: int, log_end: int) -> tuple[int, int]:
    """``(epoch, end offset)`` Kafka's one-entry leader-epoch cache answers for ``requested``."""
    if requested == UNDEFINED_EPOCH:
        return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
    if requested == LEADER_EPOCH:
        return LEADER_EPOCH, log_end
    if requested > LEADER_EPOCH:
        return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
    return requested, log_start


def check_current_epoch(current: int) -> ErrorCode:
    """Kafka's ``Partition.checkCurrentLeaderEpoch`` (-1: the client gave none)."""
    if current == -1 or current == LEADER_EPOCH:
        return ErrorCode.none
    if current < LEADER_EPOCH:
        return ErrorCode.fenced_leader_epoch
    return ErrorCode.unknown_leader_epoch


@api(23, 2, 4)
async def handle_offset_for_leader_epoch(ctx: RequestContext, request: Any) -> Any:
    storage = ctx.broker.storage
    topics = []
    for topic in request.topics:
        record = ctx.broker.topics.get(topic.topic)
        partitions = []
        for p in topic.partitions:
            epoch, end_offset = UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            if record is None or not 0 <= p.partition < record.partitions:
                error = ErrorCode.unknown_topic_or_partition
            else:
                error = check_current_epoch(p.current_leader_epoch)
            if error == ErrorCode.none:
                try:
                    epoch, end_offset = end_offset_for(
                        p.leader_epoch,
                        storage.log_start_offset(topic.topic, p.partition),
                        storage.log_end_offset(topic.topic, p.partition),
                    )
                except UnknownPartitionError:
                    error = ErrorCode.unknown_topic_or_partition
                except StorageError:
                    error = ErrorCode.kafka_storage_error
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
