"""DescribeTopicPartitions (75): topics and their partitions a page at a time (KIP-966), as
Kafka's ``DescribeTopicPartitionsRequestHandler`` answers.

Topics are answered in name order from the cursor's topic (the cursor's partition first), at
most ``min(response_partition_limit, max.request.partition.size.limit)`` partitions (at least
one) in a response; when partitions are left the response carries ``next_cursor`` (the topic
and partition to ask from next). No topics named means every topic, and then missing topics
do not appear; a named topic that does not exist is UNKNOWN_TOPIC_OR_PARTITION (or
INVALID_TOPIC_EXCEPTION for a name Kafka refuses). A cursor whose topic the request does not
name, or with a negative partition, makes the request invalid: every named topic answers
INVALID_REQUEST. Each partition has its journal partition's leader, leader epoch, replicas and
ISR, as in Metadata (one broker: this one, epoch 0); eligible leader replicas are empty, as
Kafka reports them with ELR disabled. Authorized operations are every topic operation (no
authorizer).
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from stonemq.cluster.routing import Leadership, live_leader, offline_replicas
from stonemq.coordinator.group_log import OFFSETS_TOPIC
from stonemq.handlers.authorized_operations import (
    TOPIC_AUTHORIZED_OPERATIONS,
    UNKNOWN_AUTHORIZED_OPERATIONS,
)
from stonemq.handlers.context import RequestContext
from stonemq.handlers.registry import api
from stonemq.topics import AdminError, validate_topic_name


class _InvalidRequest(Exception):
    pass


@api(75, 0, 0)
async def handle_describe_topic_partitions(ctx: RequestContext, request: Any) -> Any:
    try:
        names, fetch_all = await _names(ctx, request)
    except _InvalidRequest:
        return ctx.build(
            "DescribeTopicPartitionsResponse",
            throttle_time=0,
            topics=tuple(
                [
                    ctx.build(
                        "DescribeTopicPartitionsResponseTopic",
                        error_code=ErrorCode.invalid_request,
                        name=t.name,
                        topic_id=None,
                        is_internal=False,
                        partitions=(),
                        topic_authorized_operations=UNKNOWN_AUTHORIZED_OPERATIONS,
                    )
                    async for t in ctx.paced(request.topics)
                ]
            ),
            next_cursor=None,
        )
    cursor = request.cursor
    limit = max(
        min(ctx.broker.settings.max_request_partition_size_limit, request.response_partition_limit),
        1,
    )
    remaining = limit
    topics = []
    next_cursor = None
    routing = ctx.broker.routing
    async for name in ctx.paced(names):
        if remaining == 0:
            next_cursor = ctx.build("Cursor", topic_name=name, partition_index=0)
            break
        record = ctx.broker.topics.get(name)
        if record is None:
            if not fetch_all:
                topics.append(_missing(ctx, name))
            continue
        start = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
        upper = min(record.partitions, start + remaining)
        topics.append(
            ctx.build(
                "DescribeTopicPartitionsResponseTopic",
                error_code=ErrorCode.none,
                name=name,
                topic_id=record.topic_id,
                is_internal=name == OFFSETS_TOPIC,
                partitions=tuple(
                    _partition(ctx, p, routing.leadership(record.journal_partitions[p]))
                    for p in range(start, upper)
                ),
                topic_authorized_operations=TOPIC_AUTHORIZED_OPERATIONS,
            )
        )
        if upper < record.partitions:
            next_cursor = ctx.build("Cursor", topic_name=name, partition_index=upper)
            break
        remaining -= max(upper - start, 0)
    return ctx.build(
        "DescribeTopicPartitionsResponse",
        throttle_time=0,
        topics=tuple(topics),
        next_cursor=next_cursor,
    )


async def _names(ctx: RequestContext, request: Any) -> tuple[list[str], bool]:
    """The topic names to answer, in order from the cursor's, and whether all were asked."""
    cursor = request.cursor
    after = cursor.topic_name if cursor is not None else ""
    fetch_all = not request.topics
    if fetch_all:
        listed = ctx.broker.metadata.list_topics()
        names = {r.name async for r in ctx.paced(listed) if r.name >= after}
    else:
        names = {t.name async for t in ctx.paced(request.topics) if t.name >= after}
        if cursor is not None and cursor.topic_name not in names:
            raise _InvalidRequest
    if cursor is not None and cursor.partition_index < 0:
        raise _InvalidRequest
    return await ctx.paced_sorted(names), fetch_all


def _partition(ctx: RequestContext, index: int, lead: Leadership) -> Any:
    """The same judgements as Metadata's: a leader not live (or judged dead before its
    ZooKeeper session ends) is -1 with LEADER_NOT_AVAILABLE, as Kafka's NO_LEADER_ID, and
    such a broker's replicas are offline."""
    routing = ctx.broker.routing
    dead = routing.dead()
    leader = live_leader(routing, lead, dead)
    return ctx.build(
        "DescribeTopicPartitionsResponsePartition",
        error_code=ErrorCode.none if leader >= 0 else ErrorCode.leader_not_available,
        partition_index=index,
        leader_id=leader,
        leader_epoch=lead.leader_epoch,
        replica_nodes=lead.replicas,
        isr_nodes=lead.isr,
        eligible_leader_replicas=(),
        last_known_elr=(),
        offline_replicas=offline_replicas(routing, lead.replicas, dead),
    )


def _missing(ctx: RequestContext, name: str) -> Any:
    try:
        validate_topic_name(name)
        error = ErrorCode.unknown_topic_or_partition
    except AdminError:
        error = ErrorCode.invalid_topic_exception
    return ctx.build(
        "DescribeTopicPartitionsResponseTopic",
        error_code=error,
        name=name,
        topic_id=None,
        is_internal=name == OFFSETS_TOPIC,
        partitions=(),
        topic_authorized_operations=TOPIC_AUTHORIZED_OPERATIONS,
    )
