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

OffsetCommit v10 and OffsetFetch v10 name topics by topic id (KIP-848's clients): an id this
broker does not know is UNKNOWN_TOPIC_ID for each of its partitions (before any group check,
as Kafka), answers carry ids, and OffsetFetch of every committed partition leaves out topics
that no longer exist (they have no id to be named by).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from stonemq.coordinator.group_coordinator import OffsetCommit, TopicPartition
from stonemq.coordinator.group_log import CommittedOffset
from stonemq.handlers.context import RequestContext
from stonemq.handlers.groups import coordinates, coordinator, millis, refusal, waiter
from stonemq.handlers.registry import api
from stonemq.topics import UnknownTopicIdError

NO_OFFSET = -1
COMMIT_TOPIC_IDS_VERSION = 10
FETCH_TOPIC_IDS_VERSION = 10


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


def _by_topic_id(
    ctx: RequestContext, type_topic: str, items: Iterable[tuple[uuid.UUID | None, Any]]
) -> tuple[Any, ...]:
    """:func:`_by_topic` for the versions that name topics by id."""
    topics: dict[uuid.UUID | None, list[Any]] = {}
    for topic_id, partition in items:
        topics.setdefault(topic_id, []).append(partition)
    return tuple(
        ctx.build(type_topic, topic_id=topic_id, partitions=tuple(parts))
        for topic_id, parts in topics.items()
    )


def _topic_name(ctx: RequestContext, topic_id: uuid.UUID | None) -> str | None:
    """The name of the topic with ``topic_id``, or None when this broker knows no such id."""
    if topic_id is None or topic_id.int == 0:
        return None
    try:
        return ctx.broker.topics.by_id(topic_id).name
    except UnknownTopicIdError:
        return None


def _topic_id(ctx: RequestContext, name: str) -> uuid.UUID | None:
    record = ctx.broker.topics.get(name)
    return record.topic_id if record is not None else None


# -- OffsetCommit ----------------------------------------------------------------------------
@api(8, 2, 10)
async def handle_offset_commit(ctx: RequestContext, request: Any) -> Any:
    coord = coordinator(ctx)
    by_id = ctx.api_version >= COMMIT_TOPIC_IDS_VERSION
    # (topic name or None, topic id or None, partition, error), in the request's order
    errors: list[tuple[str | None, uuid.UUID | None, int, ErrorCode]] = []
    valid: list[OffsetCommit] = []  # the partitions that may be committed
    # v2-v4's retention time (-1: offsets.retention.minutes), as Kafka: the offsets expire
    # that long after this commit, under the same conditions as others
    retention_ms = millis(getattr(request, "retention_time", None), -1)
    async for topic in ctx.paced(request.topics):
        topic_id = topic.topic_id if by_id else None
        name = _topic_name(ctx, topic_id) if by_id else topic.name
        async for p in ctx.paced(topic.partitions):
            if name is None:  # an id this broker does not know, whatever the group's state
                errors.append((None, topic_id, p.partition_index, ErrorCode.unknown_topic_id))
                continue
            error = coord.partition_error(name, p.partition_index, p.committed_metadata)
            if error == ErrorCode.none:
                valid.append(
                    OffsetCommit(
                        name,
                        p.partition_index,
                        p.committed_offset,
                        getattr(p, "committed_leader_epoch", -1),
                        p.committed_metadata,
                        retention_ms,
                    )
                )
            errors.append((name, topic_id, p.partition_index, error))
    # the member is checked after the partitions (the loop above lets other connections go
    # first now and then), so nothing comes between its check and the commit; its error
    # stands before a partition's, as in Kafka
    group_error = (
        coord.validate_commit(
            request.group_id,
            request.generation_id_or_member_epoch,
            request.member_id,
            getattr(request, "group_instance_id", None),
            ctx.api_version,
        )
        if coordinates(ctx, request.group_id)
        else refusal(ctx, request.group_id)
    )
    commits = valid
    if group_error != ErrorCode.none:
        commits = []
        # an unknown topic or partition keeps its own error: Kafka's KafkaApis answers those
        # before the coordinator sees the request (metadata too large is the coordinator's,
        # after the group's checks)
        errors = [
            (t, i, p, e if t is None or e == ErrorCode.unknown_topic_or_partition else group_error)
            for t, i, p, e in errors
        ]
    if commits:
        future, respond = waiter()
        coord.commit(request.group_id, commits, respond)
        written: ErrorCode = await future
        if written != ErrorCode.none:
            errors = [(t, i, p, written if e == ErrorCode.none else e) for t, i, p, e in errors]
    entries = [
        (t, i, ctx.build("OffsetCommitResponsePartition", partition_index=p, error_code=e))
        async for t, i, p, e in ctx.paced(errors)
    ]
    topics = (
        _by_topic_id(ctx, "OffsetCommitResponseTopic", ((i, entry) for _, i, entry in entries))
        if by_id
        else _by_topic(ctx, "OffsetCommitResponseTopic", ((t, entry) for t, _, entry in entries))
    )
    return ctx.build("OffsetCommitResponse", throttle_time=0, topics=topics)


# -- OffsetFetch -----------------------------------------------------------------------------
@api(9, 1, 10)
async def handle_offset_fetch(ctx: RequestContext, request: Any) -> Any:
    if ctx.api_version >= 8:
        groups = []
        async for g in ctx.paced(request.groups):
            error = _fetch_error(ctx, g.group_id)
            topics = (
                await _fetch_topics(ctx, g.group_id, g.topics, "OffsetFetchResponseTopics")
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
            await _fetch_topics(ctx, request.group_id, request.topics, "OffsetFetchResponseTopic")
            if error != ErrorCode.not_coordinator
            else ()
        ),
    )


def _fetch_error(ctx: RequestContext, group_id: str) -> ErrorCode:
    if not group_id:
        return ErrorCode.invalid_group_id
    return ErrorCode.none if coordinates(ctx, group_id) else refusal(ctx, group_id)


async def _fetch_topics(
    ctx: RequestContext, group_id: str, topics: tuple[Any, ...] | None, type_topic: str
) -> tuple[Any, ...]:
    type_partition = (
        "OffsetFetchResponsePartitions" if ctx.api_version >= 8 else "OffsetFetchResponsePartition"
    )
    if ctx.api_version >= FETCH_TOPIC_IDS_VERSION:
        fetched = await _fetch_by_id(ctx, group_id, topics, type_partition)
        return _by_topic_id(ctx, type_topic, fetched)
    wanted: list[TopicPartition] | None = None
    if topics is not None:
        wanted = [(t.name, p) for t in topics for p in t.partition_indexes]
    offsets = coordinator(ctx).fetch_offsets(group_id, wanted)
    return _by_topic(
        ctx,
        type_topic,
        [
            (tp[0], _fetched(ctx, type_partition, tp[1], c))
            async for tp, c in ctx.paced(offsets.items())
        ],
    )


async def _fetch_by_id(
    ctx: RequestContext, group_id: str, topics: tuple[Any, ...] | None, type_partition: str
) -> list[tuple[uuid.UUID | None, Any]]:
    """v10: topics named by id; an unknown id is UNKNOWN_TOPIC_ID, and the offsets of a
    topic that no longer exists (which has no id to name it by) are left out of "all"."""
    coord = coordinator(ctx)
    if topics is None:
        out = []
        async for (name, partition), committed in ctx.paced(
            coord.fetch_offsets(group_id, None).items()
        ):
            topic_id = _topic_id(ctx, name)
            if topic_id is not None:
                out.append((topic_id, _fetched(ctx, type_partition, partition, committed)))
        return out
    out = []
    async for t in ctx.paced(topics):
        name = _topic_name(ctx, t.topic_id)
        if name is None:
            out.extend(
                [
                    (t.topic_id, _unknown_id(ctx, type_partition, p))
                    async for p in ctx.paced(t.partition_indexes)
                ]
            )
            continue
        offsets = coord.fetch_offsets(group_id, [(name, p) for p in t.partition_indexes])
        out.extend(
            [
                (t.topic_id, _fetched(ctx, type_partition, p, c))
                async for (_, p), c in ctx.paced(offsets.items())
            ]
        )
    return out


def _unknown_id(ctx: RequestContext, type_partition: str, partition: int) -> Any:
    return ctx.build(
        type_partition,
        partition_index=partition,
        committed_offset=NO_OFFSET,
        committed_leader_epoch=-1,
        metadata="",
        error_code=ErrorCode.unknown_topic_id,
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
            "OffsetDeleteResponse",
            error_code=refusal(ctx, request.group_id),
            throttle_time=0,
            topics=(),
        )
    coord = coordinator(ctx)
    # as Kafka's KafkaApis: a topic or partition that does not exist is answered
    # UNKNOWN_TOPIC_OR_PARTITION before the coordinator sees the request (its error, if the
    # group's, then replaces the whole answer)
    unknown = {
        (t, p)
        for t, p in wanted
        if coord.partition_error(t, p, None) == ErrorCode.unknown_topic_or_partition
    }
    future, respond = waiter()
    coord.delete_offsets(
        request.group_id,
        [tp for tp in wanted if tp not in unknown],
        lambda error, errors: respond((error, errors)),
    )
    error, errors = await future
    if error != ErrorCode.none and not errors:
        return ctx.build("OffsetDeleteResponse", error_code=error, throttle_time=0, topics=())
    errors = {**errors, **dict.fromkeys(unknown, ErrorCode.unknown_topic_or_partition)}
    return ctx.build(
        "OffsetDeleteResponse",
        error_code=ErrorCode.none,
        throttle_time=0,
        topics=_by_topic(
            ctx,
            "OffsetDeleteResponseTopic",
            [
                (
                    t,
                    ctx.build(
                        "OffsetDeleteResponsePartition",
                        partition_index=p,
                        error_code=errors.get((t, p), error),
                    ),
                )
                async for t, p in ctx.paced(wanted)
            ],
        ),
    )
