"""Group APIs (classic protocol): FindCoordinator (10), JoinGroup (11), Heartbeat (12),
LeaveGroup (13), SyncGroup (14), DescribeGroups (15), ListGroups (16), DeleteGroups (42).

With one broker, this broker coordinates every group: FindCoordinator answers with itself
(for v4+ per coordinator key), after creating ``__consumer_offsets`` if it is missing, as Kafka
does on first use. Transaction coordinators are not offered (COORDINATOR_NOT_AVAILABLE). The
group semantics live in :mod:`stonemq.coordinator.group_coordinator`; this module turns
requests into its calls and its results into version-specific responses. JoinGroup and
SyncGroup wait (without blocking other requests) until the coordinator answers them.
The new consumer protocol (KIP-848, ConsumerGroupHeartbeat) is not offered.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from typing import Any, TypeVar

from kio.schema.errors import ErrorCode

from stonemq.coordinator.group_coordinator import (
    GroupCoordinator,
    GroupSummary,
    JoinRequest,
    JoinResult,
    SyncResult,
)
from stonemq.coordinator.group_log import OFFSETS_TOPIC
from stonemq.coordinator.group_state import GroupState
from stonemq.handlers.authorized_operations import (
    UNKNOWN_AUTHORIZED_OPERATIONS,
    group_operations,
)
from stonemq.handlers.context import RequestContext
from stonemq.handlers.registry import api

KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1
CLASSIC_GROUP_TYPE = "classic"
GROUP_NOT_FOUND_VERSION = 6

T = TypeVar("T")


def coordinator(ctx: RequestContext) -> GroupCoordinator:
    return ctx.broker.groups.coordinator


def waiter() -> tuple[asyncio.Future[Any], Callable[[Any], None]]:
    """A future and the callback that resolves it (once; later calls are ignored)."""
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def resolve(value: Any) -> None:
        if not future.done():
            future.set_result(value)

    return future, resolve


def millis(value: datetime.timedelta | None, default: int) -> int:
    if value is None:
        return default
    ms = int(value / datetime.timedelta(milliseconds=1))
    return default if ms < 0 else ms


def client_host(ctx: RequestContext) -> str:
    return "/" + ctx.client_host  # Kafka reports the InetAddress string, with its slash


def _member_refusal(ctx: RequestContext, group_id: str) -> ErrorCode:
    """SyncGroup's, Heartbeat's and LeaveGroup's answer before the coordinator is asked: an
    empty group id is INVALID_GROUP_ID, before coordination is looked at (Kafka's
    GroupCoordinatorService; it was UNKNOWN_MEMBER_ID), then NOT_COORDINATOR or the like."""
    if not group_id:
        return ErrorCode.invalid_group_id
    if not coordinates(ctx, group_id):
        return refusal(ctx, group_id)
    return ErrorCode.none


SYNC_PROTOCOL_REQUIRED_VERSION = 5
"""From this SyncGroup version the protocol type and name must be set: null is
INCONSISTENT_GROUP_PROTOCOL, as Kafka."""


# -- FindCoordinator -----------------------------------------------------------------------------
# v5 and v6 carry v4's body (v6 adds key type 2, share groups: refused as an unknown type here)
@api(10, 0, 6)
async def handle_find_coordinator(ctx: RequestContext, request: Any) -> Any:
    key_type = getattr(request, "key_type", KEY_TYPE_GROUP)
    if ctx.api_version >= 4:
        coordinators = []
        async for key in ctx.paced(request.coordinator_keys):
            error, message = await _coordinator_error(ctx, key_type, key)
            coordinators.append(
                ctx.build("Coordinator", key=key, **_node(ctx, error, message, key))
            )
        return ctx.build(
            "FindCoordinatorResponse", throttle_time=0, coordinators=tuple(coordinators)
        )
    error, message = await _coordinator_error(ctx, key_type, request.key)
    return ctx.build(
        "FindCoordinatorResponse", throttle_time=0, **_node(ctx, error, message, request.key)
    )


async def _coordinator_error(
    ctx: RequestContext, key_type: int, key: str
) -> tuple[ErrorCode, str | None]:
    if key_type == KEY_TYPE_TRANSACTION:
        # not COORDINATOR_NOT_AVAILABLE, which every client retries until its own timeout
        # (librdkafka's init_transactions says "retry call to resume"; aiokafka's start never
        # returns): Kafka's answer for a transactional id the client may not use, which
        # clients take as fatal at once, as InitProducerId answers it here
        return (
            ErrorCode.transactional_id_authorization_failed,
            "transactions are not supported",
        )
    if key_type != KEY_TYPE_GROUP:
        return ErrorCode.invalid_request, f"unknown coordinator key type {key_type}"
    if not key:
        return ErrorCode.invalid_request, "empty group id"
    try:
        await ctx.broker.groups.log.ensure_topic_async()
    except Exception as exc:
        return ErrorCode.coordinator_not_available, str(exc)
    return ErrorCode.none, None


def _node(
    ctx: RequestContext, error: ErrorCode, message: str | None, group_id: str
) -> dict[str, Any]:
    """The group's coordinator: the leader of the journal partition that carries the group's
    ``__consumer_offsets`` partition (this broker on a single node); COORDINATOR_NOT_AVAILABLE
    while that journal partition has no live leader."""
    if error == ErrorCode.none:
        endpoint = ctx.broker.routing.broker(coordinator_id(ctx, group_id))
        if endpoint is None:
            error, message = ErrorCode.coordinator_not_available, "the coordinator is not live"
    if error != ErrorCode.none:
        return {
            "error_code": error,
            "error_message": message,
            "node_id": -1,
            "host": "",
            "port": -1,
        }
    host, port = ctx.address_of(endpoint.broker_id, endpoint.host, endpoint.port)
    return {
        "error_code": error,
        "error_message": None,
        "node_id": endpoint.broker_id,
        "host": host,
        "port": port,
    }


def coordinator_id(ctx: RequestContext, group_id: str) -> int:
    """The broker that coordinates ``group_id``: the leader of the journal partition carrying
    the group's ``__consumer_offsets`` partition (-1: none, or the topic does not exist)."""
    offsets = ctx.broker.topics.get(OFFSETS_TOPIC)
    if offsets is None:
        return -1
    partition = ctx.broker.groups.log.partition(group_id)
    return ctx.broker.routing.leadership(offsets.journal_partitions[partition]).leader


def coordinates(ctx: RequestContext, group_id: str) -> bool:
    """Whether this broker coordinates ``group_id`` and has its groups loaded (always, on a
    single node). A group request sent elsewhere is answered NOT_COORDINATOR, as Kafka
    answers it: the client asks FindCoordinator again; one whose offsets partition is still
    being loaded here (a new leader of its journal partition) COORDINATOR_LOAD_IN_PROGRESS
    (:func:`refusal`)."""
    if not ctx.broker.routing.clustered:
        return True
    if coordinator_id(ctx, group_id) != ctx.broker.broker_id:
        return False
    return not _loading(ctx, group_id)


def _loading(ctx: RequestContext, group_id: str) -> bool:
    """Whether the group's offsets partition is not ready here although routing names this
    broker its leader: the journal partition's leadership is still being taken (its epoch
    checkpointed; the reload starts only then) or its groups are being reloaded."""
    groups = ctx.broker.groups
    partition = groups.log.partition(group_id)
    if groups.loading and partition in groups.loading:
        return True
    replicas = ctx.broker.replicas
    offsets = ctx.broker.topics.get(OFFSETS_TOPIC)
    return (
        replicas is not None
        and offsets is not None
        and not replicas.leads(offsets.journal_partitions[partition])
    )


def refusal(ctx: RequestContext, group_id: str) -> ErrorCode:
    """The error for a group request this broker does not answer (``coordinates`` False)."""
    if (
        group_id
        and coordinator_id(ctx, group_id) == ctx.broker.broker_id
        and _loading(ctx, group_id)
    ):
        return ErrorCode.coordinator_load_in_progress
    return ErrorCode.not_coordinator


# -- JoinGroup -------------------------------------------------------------------------------
@api(11, 0, 9)
async def handle_join_group(ctx: RequestContext, request: Any) -> Any:
    session_ms = millis(request.session_timeout, 0)
    join = JoinRequest(
        group_id=request.group_id,
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None),
        client_id=ctx.client_id or "",
        client_host=client_host(ctx),
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=millis(getattr(request, "rebalance_timeout", None), session_ms),
        protocol_type=request.protocol_type,
        protocols=tuple((p.name, p.metadata) for p in request.protocols),
        require_known_member_id=ctx.api_version >= 4,
        skip_assignment_supported=ctx.api_version >= 9,
    )
    if coordinates(ctx, request.group_id):
        future, respond = waiter()
        coordinator(ctx).join(join, respond)
        result: JoinResult = await future
    else:
        result = JoinResult(refusal(ctx, request.group_id), member_id=request.member_id)
    protocol_name = result.protocol_name
    if protocol_name is None and ctx.api_version < 7:
        protocol_name = ""  # nullable only from v7
    return ctx.build(
        "JoinGroupResponse",
        throttle_time=0,
        error_code=result.error,
        generation_id=result.generation,
        protocol_type=result.protocol_type,
        protocol_name=protocol_name,
        leader=result.leader,
        skip_assignment=result.skip_assignment,
        member_id=result.member_id,
        members=tuple(
            ctx.build(
                "JoinGroupResponseMember",
                member_id=member_id,
                group_instance_id=instance,
                metadata=metadata,
            )
            for member_id, instance, metadata in result.members
        ),
    )


# -- SyncGroup -------------------------------------------------------------------------------
@api(14, 0, 5)
async def handle_sync_group(ctx: RequestContext, request: Any) -> Any:
    error = _member_refusal(ctx, request.group_id)
    if (
        error == ErrorCode.none
        and ctx.api_version >= SYNC_PROTOCOL_REQUIRED_VERSION
        and (request.protocol_type is None or request.protocol_name is None)
    ):  # Kafka's SyncGroupRequest.areMandatoryProtocolTypeAndNamePresent
        error = ErrorCode.inconsistent_group_protocol
    if error != ErrorCode.none:
        return ctx.build(
            "SyncGroupResponse",
            throttle_time=0,
            error_code=error,
            protocol_type=None,
            protocol_name=None,
            assignment=b"",
        )
    future, respond = waiter()
    coordinator(ctx).sync(
        request.group_id,
        request.generation_id,
        request.member_id,
        getattr(request, "group_instance_id", None),
        getattr(request, "protocol_type", None),
        getattr(request, "protocol_name", None),
        {a.member_id: a.assignment for a in request.assignments},
        respond,
    )
    result: SyncResult = await future
    return ctx.build(
        "SyncGroupResponse",
        throttle_time=0,
        error_code=result.error,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name,
        assignment=result.assignment,
    )


# -- Heartbeat -------------------------------------------------------------------------------
@api(12, 0, 4)
async def handle_heartbeat(ctx: RequestContext, request: Any) -> Any:
    refused = _member_refusal(ctx, request.group_id)
    if refused != ErrorCode.none:
        return ctx.build("HeartbeatResponse", throttle_time=0, error_code=refused)
    error = coordinator(ctx).heartbeat(
        request.group_id,
        request.generation_id,
        request.member_id,
        getattr(request, "group_instance_id", None),
    )
    return ctx.build("HeartbeatResponse", throttle_time=0, error_code=error)


# -- LeaveGroup ------------------------------------------------------------------------------
@api(13, 0, 5)
async def handle_leave_group(ctx: RequestContext, request: Any) -> Any:
    refused = _member_refusal(ctx, request.group_id)
    if refused != ErrorCode.none:
        if ctx.api_version < 3:
            return ctx.build("LeaveGroupResponse", throttle_time=0, error_code=refused)
        return ctx.build("LeaveGroupResponse", throttle_time=0, error_code=refused, members=())
    if ctx.api_version < 3:
        leaving = [(request.member_id, None)]
    else:
        leaving = [(m.member_id, m.group_instance_id) for m in request.members]
    results = coordinator(ctx).leave(request.group_id, leaving)
    if ctx.api_version < 3:
        return ctx.build("LeaveGroupResponse", throttle_time=0, error_code=results[0][2])
    return ctx.build(
        "LeaveGroupResponse",
        throttle_time=0,
        error_code=ErrorCode.none,
        members=tuple(
            ctx.build(
                "MemberResponse", member_id=member_id, group_instance_id=instance, error_code=error
            )
            for member_id, instance, error in results
        ),
    )


# -- DescribeGroups --------------------------------------------------------------------------
@api(15, 0, 6)
async def handle_describe_groups(ctx: RequestContext, request: Any) -> Any:
    """A group that does not exist is described as Dead until v5; from v6 (KIP-1043) it is
    GROUP_ID_NOT_FOUND with a message and no other details, as Kafka 4 answers."""
    coord = coordinator(ctx)
    operations = group_operations(getattr(request, "include_authorized_operations", False))
    groups = []
    async for group_id in ctx.paced(request.groups):
        summary = coord.describe(group_id)
        error = ErrorCode.none if group_id else ErrorCode.invalid_group_id
        if error == ErrorCode.none and not coordinates(ctx, group_id):
            error = refusal(ctx, group_id)
            summary = GroupSummary(group_id, GroupState.DEAD, "", "", ())
        elif (
            error == ErrorCode.none
            and summary.state == GroupState.DEAD
            and ctx.api_version >= GROUP_NOT_FOUND_VERSION
        ):
            groups.append(
                ctx.build(
                    "DescribedGroup",
                    error_code=ErrorCode.group_id_not_found,
                    error_message=f"Group {group_id} not found.",
                    group_id=group_id,
                    group_state="",
                    protocol_type="",
                    protocol_data="",
                    members=(),
                    authorized_operations=UNKNOWN_AUTHORIZED_OPERATIONS,
                )
            )
            continue
        groups.append(
            ctx.build(
                "DescribedGroup",
                error_code=error,
                group_id=group_id,
                group_state=summary.state.value,
                protocol_type=summary.protocol_type,
                protocol_data=summary.protocol,
                members=tuple(
                    ctx.build(
                        "DescribedGroupMember",
                        member_id=m.member_id,
                        group_instance_id=m.group_instance_id,
                        client_id=m.client_id,
                        client_host=m.client_host,
                        member_metadata=m.metadata,
                        member_assignment=m.assignment,
                    )
                    for m in summary.members
                ),
                authorized_operations=operations,
            )
        )
    return ctx.build("DescribeGroupsResponse", throttle_time=0, groups=tuple(groups))


# -- ListGroups ------------------------------------------------------------------------------
@api(16, 0, 5)
async def handle_list_groups(ctx: RequestContext, request: Any) -> Any:
    states = set(getattr(request, "states_filter", ()) or ())
    types = {t.lower() for t in getattr(request, "types_filter", ()) or ()}
    listed = (
        [] if types and CLASSIC_GROUP_TYPE not in types else coordinator(ctx).list_groups(states)
    )
    return ctx.build(
        "ListGroupsResponse",
        throttle_time=0,
        error_code=ErrorCode.none,
        groups=tuple(
            ctx.build(
                "ListedGroup",
                group_id=group_id,
                protocol_type=protocol_type,
                group_state=state.value,
                group_type=CLASSIC_GROUP_TYPE,
            )
            for group_id, protocol_type, state in sorted(listed, key=lambda g: g[0])
        ),
    )


# -- DeleteGroups ----------------------------------------------------------------------------
@api(42, 0, 2)
async def handle_delete_groups(ctx: RequestContext, request: Any) -> Any:
    coord = coordinator(ctx)
    pending = []
    async for group_id in ctx.paced(request.groups_names):
        future, respond = waiter()
        if group_id and not coordinates(ctx, group_id):
            respond(refusal(ctx, group_id))
        else:
            coord.delete_group(group_id, respond)
        pending.append((group_id, future))
    results = [(group_id, await future) async for group_id, future in ctx.paced(pending)]
    return ctx.build(
        "DeleteGroupsResponse",
        throttle_time=0,
        results=tuple(
            [
                ctx.build("DeletableGroupResult", group_id=group_id, error_code=error)
                async for group_id, error in ctx.paced(results)
            ]
        ),
    )
