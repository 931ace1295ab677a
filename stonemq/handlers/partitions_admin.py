"""Partition leadership and placement: ElectLeaders (43), AlterPartitionReassignments (45) and
ListPartitionReassignments (46), answered as Kafka's controller answers them
(``ReplicationControlManager``) on a one-broker cluster.

Every partition has one replica, this broker, which leads it. So a leader election is never
needed (ELECTION_NOT_NEEDED, preferred or unclean: the preferred replica leads and a leader
exists), and when the request names no partitions the answer lists every topic with no
partition results (Kafka leaves out the partitions that already have the desired leader). A
reassignment to ``[this broker]`` is the current assignment: accepted with nothing to do, as
Kafka accepts a reassignment that changes nothing. A target naming any other broker is
INVALID_REPLICA_ASSIGNMENT (no such broker is registered), and cancelling (null replicas) is
NO_REASSIGNMENT_IN_PROGRESS. No reassignment is ever in progress, so the list is empty.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from stonemq.handlers.context import RequestContext
from stonemq.handlers.registry import api
from stonemq.metadata.store import TopicRecord

PREFERRED = 0
UNCLEAN = 1

ELECTION_NOT_NEEDED_MESSAGE = "Leader election not needed for topic partition."
NO_REASSIGNMENT_MESSAGE = "No partition reassignment is in progress."


class _PartitionError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _require_partition(ctx: RequestContext, topic: str, partition: int) -> TopicRecord:
    record = ctx.broker.topics.get(topic)
    if record is None:
        raise _PartitionError(
            ErrorCode.unknown_topic_or_partition, f"Unable to find a topic named {topic}."
        )
    if not 0 <= partition < record.partitions:
        raise _PartitionError(
            ErrorCode.unknown_topic_or_partition,
            f"Unable to find partition {topic}:{partition}.",
        )
    return record


# -- ElectLeaders ---------------------------------------------------------------------------------
@api(43, 0, 2)
async def handle_elect_leaders(ctx: RequestContext, request: Any) -> Any:
    election_type = int(getattr(request, "election_type", PREFERRED))
    if election_type not in (PREFERRED, UNCLEAN):
        message = f"Unknown election type {election_type}"
        return _elect_response(
            ctx,
            ErrorCode.invalid_request,
            tuple(
                _election_result(
                    ctx,
                    t.topic,
                    [(p, ErrorCode.invalid_request, message) for p in t.partitions],
                )
                for t in request.topic_partitions or ()
            ),
        )
    if request.topic_partitions is None:
        # every partition already has the desired leader, and those are left out
        results = tuple(
            _election_result(ctx, record.name, []) for record in ctx.broker.metadata.list_topics()
        )
        return _elect_response(ctx, ErrorCode.none, results)
    topic_results = []
    for topic in request.topic_partitions:
        outcomes: list[tuple[int, ErrorCode, str | None]] = []
        for partition in topic.partitions:
            try:
                _require_partition(ctx, topic.topic, partition)
            except _PartitionError as exc:
                outcomes.append((partition, exc.code, exc.message))
            else:
                outcomes.append(
                    (partition, ErrorCode.election_not_needed, ELECTION_NOT_NEEDED_MESSAGE)
                )
        topic_results.append(_election_result(ctx, topic.topic, outcomes))
    return _elect_response(ctx, ErrorCode.none, tuple(topic_results))


def _election_result(
    ctx: RequestContext, topic: str, outcomes: list[tuple[int, ErrorCode, str | None]]
) -> Any:
    return ctx.build(
        "ReplicaElectionResult",
        topic=topic,
        partition_result=tuple(
            ctx.build("PartitionResult", partition_id=p, error_code=code, error_message=message)
            for p, code, message in outcomes
        ),
    )


def _elect_response(ctx: RequestContext, error: ErrorCode, results: tuple[Any, ...]) -> Any:
    return ctx.build(
        "ElectLeadersResponse",
        throttle_time=0,
        error_code=error,
        replica_election_results=results,
    )


# -- AlterPartitionReassignments ------------------------------------------------------------------
@api(45, 0, 1)
async def handle_alter_partition_reassignments(ctx: RequestContext, request: Any) -> Any:
    responses = []
    for topic in request.topics:
        partitions = []
        for target in topic.partitions:
            code, message = ErrorCode.none, None
            try:
                _require_partition(ctx, topic.name, target.partition_index)
                _check_target(ctx, target.replicas)
            except _PartitionError as exc:
                code, message = exc.code, exc.message
            partitions.append(
                ctx.build(
                    "ReassignablePartitionResponse",
                    partition_index=target.partition_index,
                    error_code=code,
                    error_message=message,
                )
            )
        responses.append(
            ctx.build("ReassignableTopicResponse", name=topic.name, partitions=tuple(partitions))
        )
    return ctx.build(
        "AlterPartitionReassignmentsResponse",
        throttle_time=0,
        allow_replication_factor_change=getattr(request, "allow_replication_factor_change", True),
        error_code=ErrorCode.none,
        error_message=None,
        responses=tuple(responses),
    )


def _check_target(ctx: RequestContext, replicas: tuple[int, ...] | None) -> None:
    """Kafka's checks of a reassignment target (null: cancel the ongoing one)."""
    if replicas is None:
        raise _PartitionError(ErrorCode.no_reassignment_in_progress, NO_REASSIGNMENT_MESSAGE)
    if not replicas:
        raise _PartitionError(
            ErrorCode.invalid_replica_assignment,
            "The manual partition assignment includes an empty replica list.",
        )
    registered = ctx.broker.settings.broker_id
    previous: int | None = None
    for broker_id in sorted(replicas):
        if broker_id != registered:
            raise _PartitionError(
                ErrorCode.invalid_replica_assignment,
                f"The manual partition assignment includes broker {broker_id}, but no such "
                "broker is registered.",
            )
        if broker_id == previous:
            raise _PartitionError(
                ErrorCode.invalid_replica_assignment,
                f"The manual partition assignment includes the broker {previous} more than once.",
            )
        previous = broker_id
    # [this broker] is the current assignment: nothing to move, nothing in progress after


# -- ListPartitionReassignments -------------------------------------------------------------------
@api(46, 0, 0)
async def handle_list_partition_reassignments(ctx: RequestContext, request: Any) -> Any:
    """No reassignment is ever in progress: Kafka lists only partitions being reassigned."""
    return ctx.build(
        "ListPartitionReassignmentsResponse",
        throttle_time=0,
        error_code=ErrorCode.none,
        error_message=None,
        topics=(),
    )
