"""DeleteRecords (21): advance partitions' log start offsets on request.

Per partition, as Kafka answers: an unknown topic or partition is UNKNOWN_TOPIC_OR_PARTITION;
in a cluster, a partition not led here is NOT_LEADER_OR_FOLLOWER (a follower holds its own
copy of the partition, which only the leader's deletes may move);
an offset of -1 means the high watermark; an offset above the high watermark (or below -1) is
OFFSET_OUT_OF_RANGE; an internal topic is INVALID_TOPIC_EXCEPTION (its coordinator trims it);
otherwise the log start offset becomes max(current, offset), whole
queue-log segments below it are deleted, and ``low_watermark`` is the new log start offset.
A storage failure is KAFKA_STORAGE_ERROR. Before it checks the offset the request waits for
the split to reach what was acknowledged (``FetchWaiters.until_split``, at most a second for
the whole request), so a delete up to a record acknowledged just before, or to -1, covers it
as on a single Kafka broker; the deletion itself is synchronous, so ``timeout`` never expires.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kio.schema.errors import ErrorCode

from stonemq.handlers.context import RequestContext
from stonemq.handlers.fetch_waiters import ACKNOWLEDGED_WAIT_S
from stonemq.handlers.registry import api
from stonemq.storage.engine import OffsetOutOfRangeError, StorageError, UnknownPartitionError
from stonemq.topics import is_internal


@api(21, 0, 2)
async def handle_delete_records(ctx: RequestContext, request: Any) -> Any:
    deadline = asyncio.get_running_loop().time() + ACKNOWLEDGED_WAIT_S  # for the whole request
    storage, waiters = ctx.broker.storage, ctx.broker.fetch_waiters
    topics = []
    async for topic in ctx.paced(request.topics):
        record = ctx.broker.topics.get(topic.name)
        partitions = []
        async for p in ctx.paced(topic.partitions):
            low_watermark, error = -1, ErrorCode.none
            if record is None or not 0 <= p.partition_index < record.partitions:
                error = ErrorCode.unknown_topic_or_partition
            elif is_internal(topic.name):  # Kafka: "Cannot delete records of internal topic"
                error = ErrorCode.invalid_topic_exception
            elif ctx.not_led_here(record, p.partition_index):  # a follower holds it too
                error = ErrorCode.not_leader_or_follower
            else:
                try:
                    await waiters.until_split(storage, topic.name, p.partition_index, deadline)
                    low_watermark = storage.delete_records(topic.name, p.partition_index, p.offset)
                except UnknownPartitionError:  # not hosted here: led by another broker?
                    error = ctx.not_here(topic.name, p.partition_index)
                except OffsetOutOfRangeError:
                    error = ErrorCode.offset_out_of_range
                except (StorageError, OSError):
                    error = ErrorCode.kafka_storage_error
            partitions.append(
                ctx.build(
                    "DeleteRecordsPartitionResult",
                    partition_index=p.partition_index,
                    low_watermark=low_watermark,
                    error_code=error,
                )
            )
        topics.append(
            ctx.build("DeleteRecordsTopicResult", name=topic.name, partitions=tuple(partitions))
        )
    return ctx.build("DeleteRecordsResponse", throttle_time=0, topics=tuple(topics))
