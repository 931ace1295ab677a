"""Partition leadership and placement: ElectLeaders (43), AlterPartitionReassignments (45) and
ListPartitionReassignments (46), answered as Kafka's controller answers them
(``ReplicationControlManager``).

A partition's replicas, leader and ISR are its journal partition's (stonemq/cluster/routing.py;
on a single node: this broker alone, which leads every partition). A preferred election is
ELECTION_NOT_NEEDED when the first replica leads, an unclean one when any replica leads, as
in Kafka; when the request names no partitions those are left out and every topic is listed.

In a cluster a preferred election is the controller's (stonemq/cluster/controller.py, Kafka's
ZooKeeper-mode ``processReplicaLeaderElection``): it moves each named partition's journal
partition (every journal partition when the request names none) to its first replica when
that replica is live and in the ISR, in a new leader epoch; every topic partition of that
journal partition moves with it. The answer per topic partition is Kafka's: NONE once
elected, ELECTION_NOT_NEEDED when the preferred replica leads already,
PREFERRED_LEADER_NOT_AVAILABLE when it is not live or not in the ISR. Clients send
ElectLeaders to the controller Metadata names; a broker that is not the controller (the
client's metadata older than a controller change) forwards the request to the controller and
returns its answer, as Kafka 4's brokers forward it (stonemq/cluster/forwarding.py); only
when the controller cannot be reached, or for a request another broker forwarded, does it
answer NOT_CONTROLLER for each partition, as Kafka's ZooKeeper-mode brokers did. An
unclean election is never run on request (the controller elects an out-of-sync replica
itself when unclean.leader.election.enable is set): a partition without a leader is
ELIGIBLE_LEADERS_NOT_AVAILABLE with the reason.

A reassignment to the partition's current replicas changes nothing and is accepted, as in
Kafka. A target naming a broker that is not registered is INVALID_REPLICA_ASSIGNMENT with
Kafka's message, as are an empty or repeating list; any other target too, as a partition is
placed with its journal partition and cannot move alone. Cancelling (null replicas) is
NO_REASSIGNMENT_IN_PROGRESS: no reassignment is ever in progress, so the list is empty.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kio.schema.errors import ErrorCode

from stonemq.cluster import forwarding
from stonemq.cluster.journal_state import (
    PREFERRED_ELECTED,
    PREFERRED_NOT_AVAILABLE,
    PREFERRED_NOT_NEEDED,
)
from stonemq.cluster.routing import Leadership
from stonemq.handlers.context import RequestContext
from stonemq.handlers.registry import api
from stonemq.metadata.store import TopicRecord
from stonemq.topic_configs import AdminError
from stonemq.topics import check_manual_assignment

PREFERRED = 0
UNCLEAN = 1

ELECTION_NOT_NEEDED_MESSAGE = "Leader election not needed for topic partition."
NO_REASSIGNMENT_MESSAGE = "No partition reassignment is in progress."
NOT_CONTROLLER_MESSAGE = "This is not the correct controller for this cluster."
DEFAULT_ELECTION_TIMEOUT_S = 60.0
FORWARD_MARGIN_S = 5.0
"""A forwarded election waits for the controller this much longer than the request's timeout
(the controller answers REQUEST_TIMED_OUT at that timeout itself)."""


_Outcome = tuple[ErrorCode, str | None]


class _PartitionError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _leadership(ctx: RequestContext, topic: str, partition: int) -> Leadership:
    record = _require_partition(ctx, topic, partition)
    return ctx.broker.routing.leadership(record.journal_partitions[partition])


def _election(ctx: RequestContext, topic: str, partition: int, election_type: int) -> _Outcome:
    """Kafka's ``electLeader`` for one partition."""
    try:
        lead = _leadership(ctx, topic, partition)
    except _PartitionError as exc:
        return exc.code, exc.message
    if election_type == PREFERRED and lead.replicas and lead.leader == lead.replicas[0]:
        return ErrorCode.election_not_needed, ELECTION_NOT_NEEDED_MESSAGE
    if election_type == UNCLEAN and lead.leader >= 0:
        return ErrorCode.election_not_needed, ELECTION_NOT_NEEDED_MESSAGE
    if election_type == PREFERRED:  # a cluster's preferred election: _elect_preferred
        return (
            ErrorCode.preferred_leader_not_available,
            f"The preferred leader of {topic}-{partition} does not lead.",
        )
    return (
        ErrorCode.eligible_leaders_not_available,
        f"{topic}-{partition} has no leader; StoneMQ's controller elects journal-partition "
        "leaders itself (unclean.leader.election.enable) and runs no election on request.",
    )


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
                [
                    await _election_result(
                        ctx,
                        t.topic,
                        [(p, ErrorCode.invalid_request, message) for p in t.partitions],
                    )
                    async for t in ctx.paced(request.topic_partitions or ())
                ]
            ),
        )
    controller = getattr(ctx.broker, "controller", None)
    if election_type == PREFERRED and controller is not None:
        if not forwarding.forwarded(ctx.client_id):  # not the controller: it elects
            timeout = getattr(request, "timeout", None)
            answer = await forwarding.to_controller(
                ctx.broker.routing,
                ctx.broker.settings.broker_id,
                ctx.api_key,
                ctx.api_version,
                request,
                (timeout.total_seconds() if timeout is not None else DEFAULT_ELECTION_TIMEOUT_S)
                + FORWARD_MARGIN_S,
            )
            if answer is not None:
                return answer
        return await _elect_preferred(ctx, request, controller)
    if request.topic_partitions is None:
        # every partition; those that already have the desired leader are left out
        results = []
        async for record in ctx.paced(ctx.broker.metadata.list_topics()):
            outcomes = [
                (p, *_election(ctx, record.name, p, election_type))
                async for p in ctx.paced(range(record.partitions))
            ]
            kept = [o for o in outcomes if o[1] != ErrorCode.election_not_needed]
            results.append(await _election_result(ctx, record.name, kept))
        return _elect_response(ctx, ErrorCode.none, tuple(results))
    topic_results = []
    async for topic in ctx.paced(request.topic_partitions):
        outcomes = [
            (partition, *_election(ctx, topic.topic, partition, election_type))
            async for partition in ctx.paced(topic.partitions)
        ]
        topic_results.append(await _election_result(ctx, topic.topic, outcomes))
    return _elect_response(ctx, ErrorCode.none, tuple(topic_results))


async def _elect_preferred(ctx: RequestContext, request: Any, controller: Any) -> Any:
    """A preferred election in a cluster: the controller's, run on its thread (a broker that
    is not the controller answers NOT_CONTROLLER per partition)."""
    everything = request.topic_partitions is None
    wanted: list[tuple[str, list[int]]] = []
    if everything:
        async for record in ctx.paced(ctx.broker.metadata.list_topics()):
            wanted.append((record.name, list(range(record.partitions))))
    else:
        async for topic in ctx.paced(request.topic_partitions):
            wanted.append((topic.topic, list(topic.partitions)))
    # (topic, partition) -> journal partition, or the partition's error
    journal_of: dict[tuple[str, int], int] = {}
    errors: dict[tuple[str, int], _Outcome] = {}
    for topic, partitions in wanted:
        for p in partitions:
            try:
                record = _require_partition(ctx, topic, p)
            except _PartitionError as exc:
                errors[(topic, p)] = (exc.code, exc.message)
                continue
            journal_of[(topic, p)] = record.journal_partitions[p]
    timeout = getattr(request, "timeout", None)
    timeout_s = timeout.total_seconds() if timeout is not None else DEFAULT_ELECTION_TIMEOUT_S
    outcomes: dict[int, str] = {}
    timed_out = False
    if journal_of:
        done = controller.elect_preferred(None if everything else set(journal_of.values()))
        try:
            outcomes = await asyncio.wait_for(
                asyncio.shield(asyncio.wrap_future(done)), max(timeout_s, 0.001)
            )
        except TimeoutError:
            timed_out = True  # the controller may still elect: Kafka's purgatory timeout
    results = []
    for topic, partitions in wanted:
        answers = []
        for p in partitions:
            if (topic, p) in errors:
                code, message = errors[(topic, p)]
            elif timed_out:
                code, message = ErrorCode.request_timed_out, "The election did not finish in time."
            else:
                code, message = _preferred_answer(
                    ctx, topic, p, journal_of[(topic, p)], outcomes.get(journal_of[(topic, p)])
                )
            if everything and code == ErrorCode.election_not_needed:
                continue  # Kafka lists only the partitions elected or failed
            answers.append((p, code, message))
        results.append(await _election_result(ctx, topic, answers))  # as on one node
    return _elect_response(ctx, ErrorCode.none, tuple(results))


def _preferred_answer(
    ctx: RequestContext, topic: str, partition: int, journal: int, outcome: str | None
) -> _Outcome:
    """A topic partition's answer from its journal partition's election outcome."""
    from stonemq.cluster.controller import NOT_CONTROLLER, UNKNOWN_JOURNAL

    if outcome == PREFERRED_ELECTED:
        return ErrorCode.none, None
    if outcome == PREFERRED_NOT_NEEDED:
        return ErrorCode.election_not_needed, ELECTION_NOT_NEEDED_MESSAGE
    if outcome == PREFERRED_NOT_AVAILABLE:
        lead = ctx.broker.routing.leadership(journal)
        preferred = lead.replicas[0] if lead.replicas else -1
        return (
            ErrorCode.preferred_leader_not_available,
            f"Failed to elect leader for partition {topic}-{partition} under strategy "
            f"PreferredReplicaPartitionLeaderElectionStrategy: its preferred replica "
            f"{preferred} is not live or not in the ISR {list(lead.isr)} of journal "
            f"partition {journal}.",
        )
    if outcome == NOT_CONTROLLER or outcome is None:
        return ErrorCode.not_controller, NOT_CONTROLLER_MESSAGE
    if outcome == UNKNOWN_JOURNAL:
        return (
            ErrorCode.unknown_topic_or_partition,
            f"Unable to find partition {topic}:{partition}.",
        )
    return (
        ErrorCode.unknown_server_error,
        f"The election of {topic}-{partition}'s leader failed (ZooKeeper); try again.",
    )


async def _election_result(
    ctx: RequestContext, topic: str, outcomes: list[tuple[int, ErrorCode, str | None]]
) -> Any:
    return ctx.build(
        "ReplicaElectionResult",
        topic=topic,
        partition_result=tuple(
            [
                ctx.build("PartitionResult", partition_id=p, error_code=code, error_message=message)
                async for p, code, message in ctx.paced(outcomes)
            ]
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
    async for topic in ctx.paced(request.topics):
        partitions = []
        async for target in ctx.paced(topic.partitions):
            code, message = ErrorCode.none, None
            try:
                lead = _leadership(ctx, topic.name, target.partition_index)
                _check_target(ctx, target.replicas, lead)
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


def _check_target(ctx: RequestContext, replicas: tuple[int, ...] | None, lead: Leadership) -> None:
    """Kafka's checks of a reassignment target (null: cancel the ongoing one), then whether
    it is the current assignment, the only one a partition can have here."""
    if replicas is None:
        raise _PartitionError(ErrorCode.no_reassignment_in_progress, NO_REASSIGNMENT_MESSAGE)
    routing = ctx.broker.routing
    try:  # Kafka's checks, shared with CreateTopics and CreatePartitions
        check_manual_assignment(replicas, lambda b: routing.broker(b) is not None)
    except AdminError as exc:
        raise _PartitionError(exc.error_code, exc.message) from None
    if tuple(replicas) != tuple(lead.replicas):
        raise _PartitionError(
            ErrorCode.invalid_replica_assignment,
            f"The partition's replicas are {list(lead.replicas)}, those of its journal "
            "partition: a partition cannot be moved on its own.",
        )
    # the current assignment: nothing to move, nothing in progress after


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
