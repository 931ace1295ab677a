"""Committed offsets: OffsetCommit (8), OffsetFetch (9, incl. the v8+ multi-group form) and
OffsetDelete (47).

OffsetCommit follows Kafka: the member is checked first (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION,
FENCED_INSTANCE_ID, REBALANCE_IN_PROGRESS while the group completes a rebalance; a generation of
-1 commits for a group that only stores offsets); then each partition (a topic or partition
that does not exist is UNKNOWN_TOPIC_OR_PARTITION, metadata over ``offset.metadata.max.bytes``
is OFFSET_METADATA_TOO_LARGE); the others are written to ``__consumer_offsets`` and the
response waits until that write is in the journal file. OffsetFetch answers -1 for a partition
without a committed offset, and every committed partition when ``topics`` is null. OffsetDelete
refuses partitions of topics the group's members subscribe to (GROUP_SUBSCRIBED_TO_TOPIC).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from stonemq.coordinator.group_coordinator import OffsetCommit, TopicPartition
from stonemq.coordinator.group_log import CommittedOffset
from stonemq.handlers.context import RequestContext
from stonemq.handlers.groups import coordinates, coordinator, waiter
from stonemq.handlers.registry import api

NO_OFFSET = -1


def _by_topic(
    ctx: RequestContext, type_topic: str, items: Iterable[tuple[str, Any]]
) -> tuple[Any, ...]:
    """Group built partition entries under their topics, keeping the request's order."""
    topics: dict[str, list[Any]] = {}
    for topic, partition in items:
        topics.setdefault(topic, []).append(partition)
    return tuple(
        ctx.build(type_topic, name=name, partitions=tuple(parts)) for name, parts in topics.items()
    )


# -- OffsetCommit ----------------------------------------------------------------------------
@api(8, 2, 9)
async def handle_offset_commit(ctx: RequestContext, request: Any) -> Any:
    coord = coordinator(ctx)
    group_error = (
        coord.validate_commit(
            request.group_id,
            request.generation_id_or_member_epoch,
            request.member_id,
            getattr(request, "group_instance_id", None),
        )
        if coordinates(ctx, request.group_id)
        else ErrorCode.not_coordinator
    )
    errors: list[tuple[str, int, ErrorCode]] = []
    commits: list[OffsetCommit] = []
    for topic in request.topics:
        for p in topic.partitions:
            error = group_error
            if error == ErrorCode.none:
                error = coord.partition_error(topic.name, p.partition_index, p.committed_metadata)
            if error == ErrorCode.none:
                commits.append(
                    OffsetCommit(
                        topic.name,
                        p.partition_index,
                        p.committed_offset,
                        getattr(p, "committed_leader_epoch", -1),
                        p.committed_metadata,
                    )
                )
            errors.append((topic.name, p.partition_index, error))
    if commits:
        future, respond = waiter()
        coord.commit(request.group_id, commits, respond)
        written: ErrorCode = await future
        if written != ErrorCode.none:
            errors = [(t, p, written if e == ErrorCode.none else e) for t, p, e in errors]
    return ctx.build(
        "OffsetCommitResponse",
        throttle_time=0,
        topics=_by_topic(
            ctx,
            "OffsetCommitResponseTopic",
            (
                (t, ctx.build("OffsetCommitResponsePartition", partition_index=p, error_code=e))
                for t, p, e in errors
            ),
        ),
    )


# -- OffsetFetch -----------------------------------------------------------------------------
@api(9, 1, 9)
async def handle_offset_fetch(ctx: RequestContext, request: Any) -> Any:
    if ctx.api_version >= 8:
        groups = []
        for g in request.groups:
            error = _fetch_error(ctx, g.group_id)
            topics = (
                _fetch_topics(ctx, g.group_id, g.topics, "OffsetFetchResponseTopics")
                if error != ErrorCode.not_coordinator
                else ()
            )
            groups.append(
                ctx.build(
                    "OffsetFetchResponseGroup", group_id=g.group_id, topics=topics, error_code=error
                )
            )
        return ctx.build("OffsetFetchResponse", throttle_time=0, groups=tuple(groups))
    error = _fetch_error(ctx, request.group_id)
    return ctx.build(
        "OffsetFetchResponse",
        throttle_time=0,
        error_code=error,
        topics=(
            _fetch_topics(ctx, request.group_id, request.topics, "OffsetFetchResponseTopic")
            if error != ErrorCode.not_coordinator
            else ()
        ),
    )


def _fetch_error(ctx: RequestContext, group_id: str) -> ErrorCode:
    if not group_id:
        return ErrorCode.invalid_group_id
    return ErrorCode.none if coordinates(ctx, group_id) else ErrorCode.not_coordinator


def _fetch_topics(
    ctx: RequestContext, group_id: str, topics: tuple[Any, ...] | None, type_topic: str
) -> tuple[Any, ...]:
    wanted: list[TopicPartition] | None = None
    if topics is not None:
        wanted = [(t.name, p) for t in topics for p in t.partition_indexes]
    offsets = coordinator(ctx).fetch_offsets(group_id, wanted)
    type_partition = (
        "OffsetFetchResponsePartitions" if ctx.api_version >= 8 else "OffsetFetchResponsePartition"
    )
    return _by_topic(
        ctx,
        type_topic,
        ((tp[0], _fetched(ctx, type_partition, tp[1], c)) for tp, c in offsets.items()),
    )


def _fetched(
    ctx: RequestContext, type_partition: str, partition: int, committed: CommittedOffset | None
) -> Any:
    return ctx.build(
        type_partition,
        partition_index=partition,
        committed_offset=committed.offset if committed is not None else NO_OFFSET,
        committed_leader_epoch=committed.leader_epoch if committed is not None else -1,
        metadata=committed.metadata if committed is not None else "",
        error_code=ErrorCode.none,
    )


# -- OffsetDelete ----------------------------------------------------------------------------
@api(47, 0, 0)
async def handle_offset_delete(ctx: RequestContext, request: Any) -> Any:
    wanted = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
    if not coordinates(ctx, request.group_id):
        return ctx.build(
            "OffsetDeleteResponse", error_code=ErrorCode.not_coordinator, throttle_time=0, topics=()
        )
    future, respond = waiter()
    coordinator(ctx).delete_offsets(
        request.group_id, wanted, lambda error, errors: respond((error, errors))
    )
    error, errors = await future
    if error != ErrorCode.none and not errors:
        return ctx.build("OffsetDeleteResponse", error_code=error, throttle_time=0, topics=())
    return ctx.build(
        "OffsetDeleteResponse",
        error_code=ErrorCode.none,
        throttle_time=0,
        topics=_by_topic(
            ctx,
            "OffsetDeleteResponseTopic",
            (
                (
                    t,
                    ctx.build(
                        "OffsetDeleteResponsePartition",
                        partition_index=p,
                        error_code=errors.get((t, p), error),
                    ),
                )
                for t, p in wanted
            ),
        ),
    )
