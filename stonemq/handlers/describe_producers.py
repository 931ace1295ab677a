"""DescribeProducers (61): the idempotent producers each partition knows, from its producer
state (stonemq/storage/producer_state.py), as Kafka's ``handleDescribeProducersRequest``.

Each producer's epoch, last sequence and last timestamp cover every batch the partition has
acknowledged, split into its queue log or still in the journal. StoneMQ has no transactions,
so the coordinator epoch and the current transaction's start offset are -1, Kafka's values
for a producer outside a transaction. A topic name Kafka refuses is INVALID_TOPIC_EXCEPTION,
an unknown topic UNKNOWN_TOPIC_OR_PARTITION (with Kafka's message), and so is a partition
the topic does not have.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kio.schema.errors import ErrorCode

from stonemq.handlers.context import ENTRIES_OFF_LOOP, RequestContext, heavy_work
from stonemq.handlers.registry import api
from stonemq.storage.engine import StorageError, UnknownPartitionError
from stonemq.topics import AdminError, validate_topic_name

UNKNOWN_TOPIC_MESSAGE = "This server does not host this topic-partition."


@api(61, 0, 0)
async def handle_describe_producers(ctx: RequestContext, request: Any) -> Any:
    topics = []
    async for topic in ctx.paced(request.topics):
        topic_error: tuple[ErrorCode, str] | None = None
        record = None
        try:
            validate_topic_name(topic.name)
        except AdminError as exc:
            topic_error = (exc.error_code, exc.message)
        else:
            record = ctx.broker.topics.get(topic.name)
            if record is None:
                topic_error = (ErrorCode.unknown_topic_or_partition, UNKNOWN_TOPIC_MESSAGE)
        partitions = []
        async for index in ctx.paced(topic.partition_indexes):
            if topic_error is not None:
                partitions.append(_partition(ctx, index, *topic_error))
            elif record is not None and not 0 <= index < record.partitions:
                partitions.append(_partition(ctx, index, ErrorCode.unknown_topic_or_partition))
            else:
                partitions.append(await _producers(ctx, topic.name, index))
        topics.append(ctx.build("TopicResponse", name=topic.name, partitions=tuple(partitions)))
    return ctx.build("DescribeProducersResponse", throttle_time=0, topics=tuple(topics))


def _partition(
    ctx: RequestContext,
    index: int,
    error: ErrorCode,
    message: str | None = None,
    producers: tuple[Any, ...] = (),
) -> Any:
    return ctx.build(
        "PartitionResponse",
        partition_index=index,
        error_code=error,
        error_message=message,
        active_producers=producers,
    )


async def _producers(ctx: RequestContext, topic: str, index: int) -> Any:
    """One partition's producers. Any client may pick any producer id, so a partition can
    know hundreds of thousands: past ``ENTRIES_OFF_LOOP`` they are sorted and built in the
    heavy-work thread and the answer encoded there (200,000 held the loop about 2 s on every
    call; helper-74's audit, p4), as Kafka builds it on a request handler thread."""
    try:
        active = ctx.broker.storage.active_producers(topic, index)
    except UnknownPartitionError:  # not hosted here: led by another broker?
        return _partition(ctx, index, ctx.not_here(topic, index))
    except StorageError:
        return _partition(ctx, index, ErrorCode.kafka_storage_error)
    if len(active) < ENTRIES_OFF_LOOP:
        return _partition(ctx, index, ErrorCode.none, producers=_states(ctx, active))
    ctx.mark_large()
    loop = asyncio.get_running_loop()
    states = await loop.run_in_executor(heavy_work(), _states, ctx, active)
    return _partition(ctx, index, ErrorCode.none, producers=states)


def _states(ctx: RequestContext, active: list[tuple[int, int, int, int]]) -> tuple[Any, ...]:
    return tuple(
        ctx.build(
            "ProducerState",
            producer_id=pid,
            producer_epoch=epoch,
            last_sequence=last_sequence,
            last_timestamp=last_timestamp,
            coordinator_epoch=-1,
            current_txn_start_offset=-1,
        )
        for pid, epoch, last_sequence, last_timestamp in sorted(active)
    )
