"""The group coordinator (classic protocol): members, generations, rebalances, committed offsets.

Sans-IO: no sockets, no event loop, no files. Requests that wait (JoinGroup until the rebalance
completes, SyncGroup until the leader's assignment is stored) take a ``respond`` callback;
everything to be made durable goes to a :class:`GroupLogSink` with a ``done`` callback; every
timeout is an entry in one :class:`~stonemq.coordinator.group_timers.TimerQueue` on an injected
clock. The states and their transitions are the tables of :mod:`stonemq.coordinator.group_state`.

Kafka's rules followed here: JoinGroup v4+ from an unknown dynamic member gets
MEMBER_ID_REQUIRED with its new id; the first rebalance of an empty group waits
``group.initial.rebalance.delay.ms`` (extended while members keep arriving, bounded by the
rebalance timeout); a rebalance completes when every member rejoined or at the rebalance
timeout, dropping dynamic members that did not; the protocol is the one all members support
that most members prefer; members that do not SyncGroup within the rebalance timeout are
removed; a member silent for its session timeout is removed (not while it waits on us); a
static member (group.instance.id) that rejoins with the same protocols replaces its old id
without a rebalance, and an old id still using that instance is FENCED_INSTANCE_ID.
"""

from __future__ import annotations

import logging
import struct
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol

from kio.schema.errors import ErrorCode

from stonemq.coordinator import group_log as glog
from stonemq.coordinator.group_log import CommittedOffset, GroupKey, OffsetKey, StoredGroup
from stonemq.coordinator.group_state import (
    COMMIT_ANSWER,
    DESCRIBE_WITH_METADATA,
    HEARTBEAT_ANSWER,
    JOIN_WITHOUT_REBALANCE,
    SYNC_ANSWER,
    Clock,
    GroupEvent,
    GroupState,
    next_state,
)
from stonemq.coordinator.group_timers import Timer, TimerQueue

log = logging.getLogger(__name__)

CONSUMER_PROTOCOL_TYPE = "consumer"
OFFSET_METADATA_MAX_BYTES = 4096  # Kafka's offset.metadata.max.bytes

TopicPartition = tuple[str, int]


COMMIT_GROUP_NOT_FOUND_VERSION = 9
"""From this OffsetCommit version a commit with a generation to a group that does not exist is
GROUP_ID_NOT_FOUND (before it: ILLEGAL_GENERATION), as Kafka."""


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """Kafka's group.* and offsets.* settings, in ms."""

    initial_rebalance_delay_ms: int = 3000
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    offsets_retention_ms: int = 10080 * 60_000
    offsets_retention_check_interval_ms: int = 600_000
    # how long a new member's first JoinGroup may stay parked (Kafka's fixed 5 minutes,
    # classicGroupNewMemberJoinTimeoutMs): its session cannot run while it has no generation
    new_member_join_timeout_ms: int = 300_000


class GroupLogSink(Protocol):
    """Where durable group changes go (the ``__consumer_offsets`` writer in the broker)."""

    def write(
        self,
        group_id: str,
        entries: list[tuple[glog.Key, glog.Value]],
        done: Callable[[BaseException | None], None],
    ) -> None: ...


# -- requests and answers --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    require_known_member_id: bool  # JoinGroup v4+
    skip_assignment_supported: bool = True  # JoinGroup v9+ (KIP-814)


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    member_id: str = ""
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()  # only for the leader
    skip_assignment: bool = False


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str | None
    retention_ms: int = -1  # OffsetCommit v2-v4's retention_time; -1: the broker's


@dataclass(frozen=True, slots=True)
class MemberSummary:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupSummary:
    group_id: str
    state: GroupState
    protocol_type: str
    protocol: str
    members: tuple[MemberSummary, ...]


# -- state -----------------------------------------------------------------------------------
@dataclass(slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes = b""
    join_respond: Callable[[JoinResult], None] | None = None
    sync_respond: Callable[[SyncResult], None] | None = None
    session_timer: Timer | None = None
    is_new: bool = False  # joined, and no join phase has completed with it yet

    def metadata(self, protocol: str | None) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""


@dataclass(slots=True)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    state_timestamp_ms: int = -1
    # changed only through add_member, pop_member, rename_member, set_protocols and
    # set_join_respond, which keep protocol_counts (protocol name -> members listing it,
    # Kafka's supportedProtocols) and awaiting_join (members with a JoinGroup parked, Kafka's
    # numMembersAwaitingJoinResponse): a join asks them, not every member
    members: dict[str, Member] = field(default_factory=dict)
    protocol_counts: dict[str, int] = field(default_factory=dict)
    awaiting_join: int = 0
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    pending_members: dict[str, Timer] = field(default_factory=dict)  # MEMBER_ID_REQUIRED given
    pending_sync: set[str] = field(default_factory=set)
    offsets: dict[TopicPartition, CommittedOffset] = field(default_factory=dict)
    join_timer: Timer | None = None
    sync_timer: Timer | None = None
    initial_delay_until_ms: int = -1  # >= 0 while the initial rebalance delay runs (timers' clock)
    new_member_added: bool = False

    def transition(self, event: GroupEvent, now_ms: int) -> None:
        self.state = next_state(self.state, event)
        self.state_timestamp_ms = now_ms

    def all_joined(self) -> bool:
        return not self.pending_members and self.awaiting_join == len(self.members)

    def max_rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def add_member(self, member: Member) -> None:
        self.members[member.member_id] = member
        self._count(member.protocols, 1)
        if member.join_respond is not None:
            self.awaiting_join += 1

    def pop_member(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is not None:
            self._count(member.protocols, -1)
            if member.join_respond is not None:
                self.awaiting_join -= 1
        return member

    def set_join_respond(
        self, member: Member, respond: Callable[[JoinResult], None] | None
    ) -> Callable[[JoinResult], None] | None:
        """Park (or, with None, take back) the JoinGroup answer of ``member``, one of the
        group's; the one parked before."""
        before, member.join_respond = member.join_respond, respond
        self.awaiting_join += (respond is not None) - (before is not None)
        return before

    def rename_member(self, old_id: str, new_id: str) -> Member:
        member = self.members.pop(old_id)
        member.member_id = new_id
        self.members[new_id] = member
        return member

    def set_protocols(self, member: Member, protocols: tuple[tuple[str, bytes], ...]) -> None:
        """Replace the protocols of ``member``, one of the group's."""
        self._count(member.protocols, -1)
        member.protocols = protocols
        self._count(protocols, 1)

    def _count(self, protocols: tuple[tuple[str, bytes], ...], step: int) -> None:
        counts = self.protocol_counts
        for name in {name for name, _ in protocols}:
            count = counts.get(name, 0) + step
            if count:
                counts[name] = count
            else:
                del counts[name]

    def supports(self, protocol_type: str, protocols: Iterable[str]) -> bool:
        """Whether a member of ``protocol_type`` listing ``protocols`` could join: one of them
        is listed by every member. Constant in the group's size, as Kafka's counts of
        supported protocols (it intersected every member's protocols at each join: filling
        a group of n members took n^2/2 set operations, helper-74's audit p8)."""
        if not self.members:
            return True
        if protocol_type != self.protocol_type:
            return False
        everyone = len(self.members)
        return any(self.protocol_counts.get(name) == everyone for name in protocols)

    def common_protocols(self) -> set[str]:
        everyone = len(self.members)
        return {name for name, count in self.protocol_counts.items() if count == everyone}

    def select_protocol(self) -> str:
        """The protocol all members support that most members list first among those (a tie:
        the one listed first, by the first member that lists it); linear in the protocols
        listed, as Kafka's ``ClassicGroup.selectProtocol`` (a list lookup per protocol held
        the loop for seconds with 30,000 of them)."""
        candidates = self.common_protocols()
        votes: dict[str, int] = {}
        order: dict[str, int] = {}
        for m in self.members.values():
            for name, _ in m.protocols:
                order.setdefault(name, len(order))
            choice = next(name for name, _ in m.protocols if name in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(votes, key=lambda name: (votes[name], -order[name]))


class GroupCoordinator:
    def __init__(
        self,
        clock: Clock,
        timers: TimerQueue,
        sink: GroupLogSink,
        config: GroupConfig,
        partitions_of: Callable[[str], int | None],
    ) -> None:
        self.clock = clock
        self.timers = timers
        self.sink = sink
        self.config = config
        self.partitions_of = partitions_of  # a topic's partition count, None when it is unknown
        self.groups: dict[str, Group] = {}
        self._retention_timer: Timer | None = None

    # -- JoinGroup -----------------------------------------------------------------------------
    def join(self, req: JoinRequest, respond: Callable[[JoinResult], None]) -> None:
        error = self._join_error(req)
        if error is not None:
            respond(JoinResult(error, member_id=req.member_id))
            return
        group = self.groups.get(req.group_id)
        if group is None:
            if req.member_id:
                respond(JoinResult(ErrorCode.unknown_member_id, member_id=req.member_id))
                return
            group = self.groups[req.group_id] = Group(req.group_id)
        if not group.supports(req.protocol_type, (name for name, _ in req.protocols)):
            respond(JoinResult(ErrorCode.inconsistent_group_protocol, member_id=req.member_id))
        elif not req.member_id:
            self._join_unknown(group, req, respond)
        else:
            self._join_known(group, req, respond)

    def _join_error(self, req: JoinRequest) -> ErrorCode | None:
        if not req.group_id:
            return ErrorCode.invalid_group_id
        cfg = self.config
        if not cfg.min_session_timeout_ms <= req.session_timeout_ms <= cfg.max_session_timeout_ms:
            return ErrorCode.invalid_session_timeout
        if not req.protocol_type or not req.protocols:
            return ErrorCode.inconsistent_group_protocol
        return None

    def _join_unknown(
        self, group: Group, req: JoinRequest, respond: Callable[[JoinResult], None]
    ) -> None:
        # Kafka's ClassicGroup.generateMemberId: the instance id of a static member, else
        # the client id, then "-" and a random UUID (an empty client id gives "-<uuid>")
        prefix = req.group_instance_id if req.group_instance_id is not None else req.client_id
        member_id = f"{prefix or ''}-{uuid.uuid4()}"
        instance = req.group_instance_id
        if instance is not None and instance in group.static_members:
            self._replace_static_member(
                group, group.static_members[instance], member_id, req, respond
            )
        elif instance is None and req.require_known_member_id:
            # KIP-394: hand out the id first; the member joins with it in its next request.
            timer = self.timers.after(
                req.session_timeout_ms, lambda: self._expire_pending(group, member_id)
            )
            group.pending_members[member_id] = timer
            respond(JoinResult(ErrorCode.member_id_required, member_id=member_id))
        else:
            self._add_member(group, member_id, req, respond)

    def _join_known(
        self, group: Group, req: JoinRequest, respond: Callable[[JoinResult], None]
    ) -> None:
        member_id = req.member_id
        if member_id in group.pending_members:
            group.pending_members.pop(member_id).cancel()
            self._add_member(group, member_id, req, respond)
            return
        fenced = self._fenced(group, member_id, req.group_instance_id)
        if fenced is not None:
            respond(JoinResult(fenced, member_id=member_id))
            return
        member = group.members[member_id]
        if group.state in (GroupState.EMPTY, GroupState.DEAD):
            respond(JoinResult(ErrorCode.unknown_member_id, member_id=member_id))
        elif group.state == GroupState.PREPARING_REBALANCE:
            self._update_member(group, member, req, respond)
            self._try_complete_join(group)
        elif (
            group.state in JOIN_WITHOUT_REBALANCE
            and member.protocols == req.protocols
            and not (group.state == GroupState.STABLE and member_id == group.leader)
        ):
            self._refresh_session(group, member)
            respond(self._join_result(group, member, skip_assignment=False))
        else:
            self._update_member(group, member, req, respond)
            self._prepare_rebalance(group, GroupEvent.MEMBER_JOINED)

    def _fenced(self, group: Group, member_id: str, instance: str | None) -> ErrorCode | None:
        """FENCED_INSTANCE_ID / UNKNOWN_MEMBER_ID for a member id that is not (or no longer)
        this group's; None when it is a current member. An instance id must name a static
        member, and that member must be this one (Kafka's ClassicGroup.validateMember)."""
        if instance is not None:
            current = group.static_members.get(instance)
            if current is None:
                return ErrorCode.unknown_member_id
            if current != member_id:
                return ErrorCode.fenced_instance_id
        if member_id not in group.members:
            return ErrorCode.unknown_member_id
        return None

    def _add_member(
        self,
        group: Group,
        member_id: str,
        req: JoinRequest,
        respond: Callable[[JoinResult], None],
    ) -> None:
        member = Member(
            member_id,
            req.group_instance_id,
            req.client_id,
            req.client_host,
            req.session_timeout_ms,
            req.rebalance_timeout_ms,
            req.protocol_type,
            req.protocols,
            join_respond=respond,
            is_new=True,
        )
        if not group.members:
            group.protocol_type = req.protocol_type
        group.add_member(member)
        if member.group_instance_id is not None:
            group.static_members[member.group_instance_id] = member_id
        if group.leader is None:
            group.leader = member_id
        group.new_member_added = True
        # Kafka: a new member's parked JoinGroup cannot be heartbeated and its disconnect is
        # not seen, so it expires after the new-member join timeout, even while it waits
        self._refresh_session(group, member, self.config.new_member_join_timeout_ms)
        if group.state == GroupState.PREPARING_REBALANCE:
            self._try_complete_join(group)
        else:
            self._prepare_rebalance(group, GroupEvent.MEMBER_JOINED)

    def _update_member(
        self,
        group: Group,
        member: Member,
        req: JoinRequest,
        respond: Callable[[JoinResult], None],
    ) -> None:
        group.set_protocols(member, req.protocols)
        member.session_timeout_ms = req.session_timeout_ms
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.client_id, member.client_host = req.client_id, req.client_host
        older = group.set_join_respond(member, respond)
        if older is not None:  # a duplicate join: the older request loses
            older(JoinResult(ErrorCode.rebalance_in_progress, member.member_id))

    def _replace_static_member(
        self,
        group: Group,
        old_id: str,
        new_id: str,
        req: JoinRequest,
        respond: Callable[[JoinResult], None],
    ) -> None:
        """KIP-345: a known group.instance.id rejoining with a fresh member id."""
        leader_before = group.leader
        member = group.rename_member(old_id, new_id)
        older = group.set_join_respond(member, None)
        if older is not None:
            older(JoinResult(ErrorCode.fenced_instance_id, member_id=old_id))
        if member.sync_respond is not None:
            member.sync_respond(SyncResult(ErrorCode.fenced_instance_id))
        member.sync_respond = None
        # Kafka rebalances only when the group's selected protocol would change: a restarted
        # Java consumer's subscription bytes always differ (its owned partitions and
        # generation are gone), and comparing the bytes rebalanced the whole group for it
        old_protocols = member.protocols
        group.set_protocols(member, req.protocols)
        try:
            unchanged = group.protocol is not None and group.select_protocol() == group.protocol
        except (StopIteration, ValueError):  # no protocol in common any more
            unchanged = False
        group.set_protocols(member, old_protocols)
        group.static_members[req.group_instance_id or ""] = new_id
        if group.leader == old_id:
            group.leader = new_id
        if old_id in group.pending_sync:
            group.pending_sync.discard(old_id)
            group.pending_sync.add(new_id)
        member.client_id, member.client_host = req.client_id, req.client_host
        member.session_timeout_ms = req.session_timeout_ms
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        self._refresh_session(group, member)
        if group.state == GroupState.STABLE and unchanged:
            group.set_protocols(member, req.protocols)
            self._persist_group(group)
            result = self._join_result(group, member, skip_assignment=new_id == group.leader)
            if not req.skip_assignment_supported:
                # Before JoinGroup v9 an answer cannot say "you lead, keep the assignment"
                # (KIP-814): as Kafka, it names the leader as it was before the replacement
                # and lists no members, so a restarted leader syncs as a follower and gets
                # its assignment back instead of assigning again
                result = replace(
                    result, leader=leader_before or "", members=(), skip_assignment=False
                )
            respond(result)
            return
        group.set_protocols(member, req.protocols)
        group.set_join_respond(member, respond)
        if group.state == GroupState.PREPARING_REBALANCE:
            self._try_complete_join(group)
        else:
            self._prepare_rebalance(group, GroupEvent.MEMBER_JOINED)

    def _join_result(self, group: Group, member: Member, skip_assignment: bool) -> JoinResult:
        is_leader = member.member_id == group.leader
        members: tuple[tuple[str, str | None, bytes], ...] = ()
        if is_leader:
            members = tuple(
                (m.member_id, m.group_instance_id, m.metadata(group.protocol))
                for m in group.members.values()
            )
        return JoinResult(
            ErrorCode.none,
            member_id=member.member_id,
            generation=group.generation,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol,
            leader=group.leader or "",
            members=members,
            skip_assignment=skip_assignment,
        )

    # -- rebalance -----------------------------------------------------------------------------
    def _prepare_rebalance(self, group: Group, event: GroupEvent) -> None:
        now = self.clock.now_ms()
        if group.state == GroupState.COMPLETING_REBALANCE:
            for m in group.members.values():
                m.assignment = b""
                if m.sync_respond is not None:
                    m.sync_respond(SyncResult(ErrorCode.rebalance_in_progress))
                    m.sync_respond = None
        if group.sync_timer is not None:
            group.sync_timer.cancel()
        group.pending_sync.clear()
        was_empty = group.state == GroupState.EMPTY
        group.transition(event, now)
        now = self.timers.now_ms()  # deadlines: the timers' clock from here
        rebalance_timeout = group.max_rebalance_timeout_ms()
        delay = self.config.initial_rebalance_delay_ms
        if was_empty and delay > 0:
            # Kafka's initial rebalance: the whole delay first, whatever the rebalance
            # timeout, then more of it while members keep arriving, up to the rebalance
            # timeout (GroupMetadataManager.prepareRebalance)
            group.initial_delay_until_ms = now + max(delay, rebalance_timeout)
            group.new_member_added = False
            self._arm_join_timer(group, now + delay)
        else:
            group.initial_delay_until_ms = -1
            self._arm_join_timer(group, now + rebalance_timeout)
            self._try_complete_join(group)

    def _arm_join_timer(self, group: Group, deadline_ms: int) -> None:
        if group.join_timer is not None:
            group.join_timer.cancel()
        group.join_timer = self.timers.schedule(deadline_ms, lambda: self._join_deadline(group))

    def _join_deadline(self, group: Group) -> None:
        group.join_timer = None
        if group.state != GroupState.PREPARING_REBALANCE:
            return
        now = self.timers.now_ms()
        if group.initial_delay_until_ms >= 0:
            remaining = group.initial_delay_until_ms - now
            if group.new_member_added and remaining > 0:
                group.new_member_added = False
                delay = min(self.config.initial_rebalance_delay_ms, remaining)
                self._arm_join_timer(group, now + delay)
                return
            group.initial_delay_until_ms = -1
        self._complete_join(group)

    def _try_complete_join(self, group: Group) -> None:
        if (
            group.state == GroupState.PREPARING_REBALANCE
            and group.initial_delay_until_ms < 0
            and group.all_joined()
        ):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        if group.join_timer is not None:
            group.join_timer.cancel()
            group.join_timer = None
        for m in list(group.members.values()):
            if m.join_respond is None and m.group_instance_id is None:
                self._remove_member(group, m)
        now = self.clock.now_ms()
        if group.members and not group.awaiting_join:
            # Only static members are left and none of them rejoined (restarting, say): as
            # Kafka's completeClassicGroupJoin, the join phase waits another rebalance
            # timeout rather than starting a generation nobody joined, until they rejoin
            # or their sessions expire.
            log.info("group %s: no member rejoined; the rebalance waits for them", group.group_id)
            self._arm_join_timer(group, self.timers.now_ms() + group.max_rebalance_timeout_ms())
            return
        group.generation += 1
        if not group.members:
            group.transition(GroupEvent.JOIN_COMPLETE_EMPTY, now)
            group.protocol = None
            group.leader = None
            self._persist_group(group)
            return
        if group.leader not in group.members or group.members[group.leader].join_respond is None:
            joined = [m.member_id for m in group.members.values() if m.join_respond is not None]
            group.leader = joined[0] if joined else next(iter(group.members))
        group.protocol = group.select_protocol()
        group.transition(GroupEvent.JOIN_COMPLETE, now)
        group.pending_sync = set(group.members)
        for m in group.members.values():
            respond = group.set_join_respond(m, None)
            m.is_new = False
            self._refresh_session(group, m)
            if respond is not None:
                respond(self._join_result(group, m, skip_assignment=False))
        generation = group.generation
        group.sync_timer = self.timers.after(
            group.max_rebalance_timeout_ms(), lambda: self._sync_deadline(group, generation)
        )

    def _sync_deadline(self, group: Group, generation: int) -> None:
        """Members that never sent SyncGroup within the rebalance timeout are removed."""
        group.sync_timer = None
        if group.generation != generation or not group.pending_sync:
            return
        if group.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return
        for member_id in list(group.pending_sync):
            member = group.members.get(member_id)
            if member is not None:
                self._remove_member(group, member)
        self._member_left(group)

    # -- SyncGroup -----------------------------------------------------------------------------
    def sync(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
        respond: Callable[[SyncResult], None],
    ) -> None:
        group = self.groups.get(group_id)
        if group is None:
            respond(SyncResult(ErrorCode.unknown_member_id))
            return
        error = self._fenced(group, member_id, group_instance_id)
        if error is None and generation != group.generation:
            error = ErrorCode.illegal_generation
        if error is None and (
            (protocol_type is not None and protocol_type != group.protocol_type)
            or (protocol_name is not None and protocol_name != group.protocol)
        ):
            error = ErrorCode.inconsistent_group_protocol
        if error is None:
            error = SYNC_ANSWER[group.state]
        if error is not None:
            respond(SyncResult(error))
            return
        member = group.members[member_id]
        group.pending_sync.discard(member_id)
        self._refresh_session(group, member)
        if group.state == GroupState.STABLE:
            respond(self._sync_result(group, member))
            return
        if member.sync_respond is not None:
            member.sync_respond(SyncResult(ErrorCode.rebalance_in_progress))
        member.sync_respond = respond
        if member_id == group.leader:
            assignment = {m: assignments.get(m, b"") for m in group.members}
            self._store_assignment(group, assignment)

    def _store_assignment(self, group: Group, assignment: dict[str, bytes]) -> None:
        """Write the group with the leader's assignment, then answer the parked SyncGroups
        (Kafka's storeGroup): the group turns Stable only once its record is durable. A failed
        write answers them COORDINATOR_NOT_AVAILABLE and starts a new rebalance; a rebalance
        or deletion that overtakes the write has answered them already."""
        generation = group.generation
        record = self.stored(group, assignment)

        def written(error: BaseException | None) -> None:
            if (
                self.groups.get(group.group_id) is not group
                or group.state != GroupState.COMPLETING_REBALANCE
                or group.generation != generation
            ):
                return
            if error is not None:
                log.warning("group %s: cannot store its assignment: %s", group.group_id, error)
                for m in group.members.values():
                    respond_m, m.sync_respond = m.sync_respond, None
                    if respond_m is not None:
                        respond_m(SyncResult(ErrorCode.coordinator_not_available))
                self._prepare_rebalance(group, GroupEvent.STORE_FAILED)
                return
            for m in group.members.values():
                m.assignment = assignment.get(m.member_id, b"")
            group.transition(GroupEvent.LEADER_SYNCED, self.clock.now_ms())
            for m in group.members.values():
                respond_m, m.sync_respond = m.sync_respond, None
                if respond_m is not None:
                    respond_m(self._sync_result(group, m))

        self.sink.write(group.group_id, [(GroupKey(group.group_id), record)], written)

    def _sync_result(self, group: Group, member: Member) -> SyncResult:
        return SyncResult(ErrorCode.none, member.assignment, group.protocol_type, group.protocol)

    # -- Heartbeat and LeaveGroup --------------------------------------------------------------
    def heartbeat(
        self, group_id: str, generation: int, member_id: str, group_instance_id: str | None
    ) -> ErrorCode:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        error = self._fenced(group, member_id, group_instance_id)
        if error is not None:
            return error
        if generation != group.generation:
            return ErrorCode.illegal_generation
        answer = HEARTBEAT_ANSWER[group.state]
        if answer in (ErrorCode.none, ErrorCode.rebalance_in_progress):
            self._refresh_session(group, group.members[member_id])
        return answer

    def leave(
        self, group_id: str, leaving: list[tuple[str, str | None]]
    ) -> list[tuple[str, str | None, ErrorCode]]:
        """Remove each (member id, instance id); the per-member errors, in order, each
        answered with the member id the request named (Kafka echoes an empty one for a
        member named by its instance id: the Java AdminClient looks its answer up by
        ("", instance id) and failed the removal when given the member's own id)."""
        group = self.groups.get(group_id)
        results = []
        removed = False
        for named, instance in leaving:
            member_id = named
            error = ErrorCode.unknown_member_id
            if group is None:
                results.append((named, instance, error))
                continue
            if instance is not None:
                current = group.static_members.get(instance)
                if current is not None and member_id and member_id != current:
                    error = ErrorCode.fenced_instance_id
                elif current is not None:
                    member_id, error = current, ErrorCode.none
            elif member_id in group.pending_members:
                group.pending_members.pop(member_id).cancel()
                error = ErrorCode.none
            elif member_id in group.members:
                error = ErrorCode.none
            if error == ErrorCode.none and member_id in group.members:
                self._remove_member(group, group.members[member_id])
                removed = True
            results.append((named, instance, error))
        if group is not None and (removed or group.state == GroupState.PREPARING_REBALANCE):
            self._member_left(group)
        return results

    def _remove_member(self, group: Group, member: Member) -> None:
        group.pop_member(member.member_id)
        group.pending_sync.discard(member.member_id)
        instance = member.group_instance_id
        if instance is not None and group.static_members.get(instance) == member.member_id:
            del group.static_members[instance]
        if member.session_timer is not None:
            member.session_timer.cancel()
        if member.join_respond is not None:
            member.join_respond(JoinResult(ErrorCode.unknown_member_id, member.member_id))
            member.join_respond = None
        if member.sync_respond is not None:
            member.sync_respond(SyncResult(ErrorCode.unknown_member_id))
            member.sync_respond = None
        if group.leader == member.member_id:
            group.leader = next(iter(group.members), None)

    def _member_left(self, group: Group) -> None:
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, GroupEvent.MEMBER_LEFT)
        elif group.state == GroupState.PREPARING_REBALANCE:
            self._try_complete_join(group)

    # -- sessions ------------------------------------------------------------------------------
    def _refresh_session(self, group: Group, member: Member, timeout_ms: int = -1) -> None:
        if member.session_timer is not None:
            member.session_timer.cancel()
        member.session_timer = self.timers.after(
            member.session_timeout_ms if timeout_ms < 0 else timeout_ms,
            lambda: self._session_expired(group, member),
        )

    def _session_expired(self, group: Group, member: Member) -> None:
        if group.members.get(member.member_id) is not member:
            return
        waiting = member.join_respond is not None or member.sync_respond is not None
        if waiting and not member.is_new:
            self._refresh_session(group, member)  # it is waiting on us, not silent
            return
        if member.is_new:
            log.info(
                "group %s: new member %s: its join timed out", group.group_id, member.member_id
            )
        self._remove_member(group, member)
        self._member_left(group)

    def _expire_pending(self, group: Group, member_id: str) -> None:
        if group.pending_members.pop(member_id, None) is not None:
            self._try_complete_join(group)

    # -- committed offsets ---------------------------------------------------------------------
    def validate_commit(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        group_instance_id: str | None,
        version: int = COMMIT_GROUP_NOT_FOUND_VERSION,
    ) -> ErrorCode:
        """Whether this member may commit now (Kafka's checks, in Kafka's order). A group
        that does not exist takes a commit of generation -1 (a simple consumer's); with a
        generation, OffsetCommit v9+ answers GROUP_ID_NOT_FOUND and older versions
        ILLEGAL_GENERATION, as Kafka's OffsetMetadataManager."""
        if not group_id:
            return ErrorCode.invalid_group_id
        group = self.groups.get(group_id)
        if group is None:
            if generation < 0:
                return ErrorCode.none
            if version >= COMMIT_GROUP_NOT_FOUND_VERSION:
                return ErrorCode.group_id_not_found
            return ErrorCode.illegal_generation
        if generation < 0 and group.state == GroupState.EMPTY:
            return ErrorCode.none  # a group that only stores offsets
        error = self._fenced(group, member_id, group_instance_id)
        if error is not None:
            return error
        if generation != group.generation:
            return ErrorCode.illegal_generation
        answer = COMMIT_ANSWER[group.state]
        if answer == ErrorCode.none:
            self._refresh_session(group, group.members[member_id])
        return answer

    def partition_error(self, topic: str, partition: int, metadata: str | None) -> ErrorCode:
        if metadata is not None and len(metadata.encode("utf-8")) > OFFSET_METADATA_MAX_BYTES:
            return ErrorCode.offset_metadata_too_large
        count = self.partitions_of(topic)
        if count is None or not 0 <= partition < count:
            return ErrorCode.unknown_topic_or_partition
        return ErrorCode.none

    def commit(
        self,
        group_id: str,
        commits: list[OffsetCommit],
        done: Callable[[ErrorCode], None],
    ) -> None:
        """Write validated commits; ``done`` gets NONE once they are durable and visible."""
        now = self.clock.now_ms()
        values = {
            (c.topic, c.partition): CommittedOffset(
                c.offset,
                c.leader_epoch,
                c.metadata or "",
                now,
                now + c.retention_ms if c.retention_ms != -1 else -1,
            )
            for c in commits
        }
        if not values:
            done(ErrorCode.none)
            return
        if group_id not in self.groups:
            self.groups[group_id] = Group(group_id, state_timestamp_ms=now)
        entries: list[tuple[glog.Key, glog.Value]] = [
            (OffsetKey(group_id, t, p), v) for (t, p), v in values.items()
        ]

        def written(error: BaseException | None) -> None:
            if error is not None:
                done(ErrorCode.coordinator_not_available)
                return
            group = self.groups.get(group_id)
            if group is None:  # deleted meanwhile; Kafka answers the commit all the same
                group = self.groups[group_id] = Group(group_id, state_timestamp_ms=now)
            group.offsets.update(values)
            done(ErrorCode.none)

        self.sink.write(group_id, entries, written)

    def fetch_offsets(
        self, group_id: str, partitions: list[TopicPartition] | None
    ) -> dict[TopicPartition, CommittedOffset | None]:
        """Committed offsets for ``partitions`` (None for all the group has)."""
        group = self.groups.get(group_id)
        offsets = group.offsets if group is not None else {}
        if partitions is None:
            return dict(sorted(offsets.items()))
        return {tp: offsets.get(tp) for tp in partitions}

    def delete_offsets(
        self,
        group_id: str,
        partitions: list[TopicPartition],
        done: Callable[[ErrorCode, dict[TopicPartition, ErrorCode]], None],
    ) -> None:
        """OffsetDelete: only offsets of topics no current member subscribes to."""
        group = self.groups.get(group_id)
        if group is None or group.state == GroupState.DEAD:
            done(ErrorCode.group_id_not_found, {})
            return
        subscribed: set[str] = set()
        if group.state != GroupState.EMPTY:
            if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
                done(ErrorCode.non_empty_group, {})
                return
            subscribed = self.subscribed_topics(group)
        errors = {
            tp: ErrorCode.group_subscribed_to_topic
            if subscribed is None or tp[0] in subscribed
            else ErrorCode.none
            for tp in partitions
        }
        gone = [tp for tp, e in errors.items() if e == ErrorCode.none and tp in group.offsets]

        def written(error: ErrorCode) -> None:
            done(
                ErrorCode.none,
                {tp: error if e == ErrorCode.none else e for tp, e in errors.items()},
            )

        self._write_tombstones(group, gone, written)

    def subscribed_topics(self, group: Group) -> set[str] | None:
        """The topics the members of a consumer group subscribe to; None when they cannot be
        known: no protocol chosen yet (the first rebalance) or a subscription that is not
        the consumer protocol's. Kafka's ClassicGroup.isSubscribedToTopic then counts every
        topic as subscribed, so no offset is deleted or expired under a member's feet."""
        if not group.members:
            return set()
        if group.protocol is None:
            return None
        topics: set[str] = set()
        for m in group.members.values():
            member_topics = consumer_subscription(m.metadata(group.protocol))
            if member_topics is None:
                return None
            topics |= member_topics
        return topics

    def _write_tombstones(
        self, group: Group, partitions: list[TopicPartition], done: Callable[[ErrorCode], None]
    ) -> None:
        if not partitions:
            done(ErrorCode.none)
            return
        entries: list[tuple[glog.Key, glog.Value]] = [
            (OffsetKey(group.group_id, t, p), None) for t, p in partitions
        ]

        def written(error: BaseException | None) -> None:
            if error is not None:
                done(ErrorCode.coordinator_not_available)
                return
            for tp in partitions:
                group.offsets.pop(tp, None)
            done(ErrorCode.none)

        self.sink.write(group.group_id, entries, written)

    # -- DescribeGroups, ListGroups, DeleteGroups ----------------------------------------------
    def describe(self, group_id: str) -> GroupSummary:
        group = self.groups.get(group_id)
        if group is None:
            return GroupSummary(group_id, GroupState.DEAD, "", "", ())
        full = group.state in DESCRIBE_WITH_METADATA
        members = tuple(
            MemberSummary(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.metadata(group.protocol) if full else b"",
                m.assignment if full else b"",
            )
            for m in group.members.values()
        )
        return GroupSummary(
            group_id,
            group.state,
            group.protocol_type or "",
            (group.protocol or "") if full else "",
            members,
        )

    def list_groups(self, states: set[str] | None = None) -> list[tuple[str, str, GroupState]]:
        """(group id, protocol type, state); ``states`` filters by name, case-insensitively."""
        wanted = {s.lower() for s in states} if states else None
        return [
            (g.group_id, g.protocol_type or "", g.state)
            for g in self.groups.values()
            if wanted is None or g.state.value.lower() in wanted
        ]

    def delete_group(self, group_id: str, done: Callable[[ErrorCode], None]) -> None:
        if not group_id:
            done(ErrorCode.invalid_group_id)
            return
        group = self.groups.get(group_id)
        if group is None or group.state == GroupState.DEAD:
            done(ErrorCode.group_id_not_found)
            return
        if group.state != GroupState.EMPTY:
            done(ErrorCode.non_empty_group)
            return
        self._remove_group(group, done)

    def _remove_group(self, group: Group, done: Callable[[ErrorCode], None]) -> None:
        entries: list[tuple[glog.Key, glog.Value]] = [
            (OffsetKey(group.group_id, t, p), None) for t, p in group.offsets
        ]
        entries.append((GroupKey(group.group_id), None))
        group.transition(GroupEvent.REMOVED, self.clock.now_ms())
        if self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]

        def written(error: BaseException | None) -> None:
            done(ErrorCode.none if error is None else ErrorCode.coordinator_not_available)

        self.sink.write(group.group_id, entries, written)

    # -- retention -----------------------------------------------------------------------------
    def start_retention(self) -> None:
        """Run the offsets expiry every ``offsets.retention.check.interval.ms``."""
        self._retention_timer = self.timers.after(
            self.config.offsets_retention_check_interval_ms, self._retention_tick
        )

    def _retention_tick(self) -> None:
        self.expire_offsets()
        self.start_retention()

    def expire_offsets(self) -> int:
        """Kafka's offsets.retention.minutes (KIP-211): an empty consumer group's offsets go
        once it has been empty that long; a group without group management, or a stable
        consumer group's topics no member subscribes to, lose each offset that long after
        its commit; an offset committed with a retention time (OffsetCommit v2-v4) goes at
        the expiry that set, under the same conditions (ClassicGroup.offsetExpirationCondition).
        A group left empty with no offsets is deleted. Returns the number of offsets expired."""
        now = self.clock.now_ms()
        retention = self.config.offsets_retention_ms
        expired = 0
        for group in list(self.groups.values()):
            since_empty = group.state == GroupState.EMPTY and bool(group.protocol_type)
            if group.state != GroupState.EMPTY and (
                group.protocol_type != CONSUMER_PROTOCOL_TYPE or group.state != GroupState.STABLE
            ):
                continue
            subscribed = self.subscribed_topics(group)
            if subscribed is None:
                continue
            gone = [
                tp
                for tp, c in group.offsets.items()
                if tp[0] not in subscribed
                and (
                    now >= c.expire_timestamp_ms
                    if c.expire_timestamp_ms >= 0
                    else (group.state_timestamp_ms if since_empty else c.commit_timestamp_ms)
                    + retention
                    <= now
                )
            ]
            expired += len(gone)
            self._drop_offsets(group, gone)
        return expired

    def remove_topic_offsets(self, topic: str) -> int:
        """``topic`` was deleted: every group's committed offsets of it go (tombstones in the
        group log), and a group left empty without offsets with them, as Kafka's coordinator
        does when partitions are deleted; a topic created again under the name starts without
        the old one's commits. Returns the number of offsets removed."""
        removed = 0
        for group in list(self.groups.values()):
            gone = [tp for tp in group.offsets if tp[0] == topic]
            if not gone:
                continue
            removed += len(gone)
            self._drop_offsets(group, gone)
        return removed

    def _drop_offsets(self, group: Group, gone: list[TopicPartition]) -> None:
        """Remove ``gone`` from the group's offsets, tombstones in the group log; a group
        left empty without offsets or pending members goes too (Kafka's
        ``cleanupGroupMetadata``)."""
        for tp in gone:
            group.offsets.pop(tp)
        if gone:
            tombstones: list[tuple[glog.Key, glog.Value]] = [
                (OffsetKey(group.group_id, t, p), None) for t, p in gone
            ]
            self.sink.write(group.group_id, tombstones, _ignore_error)
        if group.state == GroupState.EMPTY and not group.offsets and not group.pending_members:
            self._remove_group(group, _ignore)

    # -- durability ----------------------------------------------------------------------------
    def _persist_group(self, group: Group) -> None:
        self.sink.write(
            group.group_id, [(GroupKey(group.group_id), self.stored(group))], _ignore_error
        )

    def stored(self, group: Group, assignment: dict[str, bytes] | None = None) -> StoredGroup:
        """The group's record: its members only when Stable, or with ``assignment`` (the
        leader's, about to make it Stable)."""
        members = tuple(
            glog.StoredMember(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.rebalance_timeout_ms,
                m.session_timeout_ms,
                m.metadata(group.protocol),
                m.assignment if assignment is None else assignment.get(m.member_id, b""),
            )
            for m in group.members.values()
        )
        if group.state != GroupState.STABLE and assignment is None:
            members = ()
        return StoredGroup(
            group.protocol_type or "",
            group.generation,
            group.protocol,
            group.leader if members else None,
            group.state_timestamp_ms,
            members,
        )

    def snapshot(self, group_ids: Iterable[str]) -> list[tuple[glog.Key, glog.Value]]:
        """The live records of these groups: replaying them alone rebuilds their state."""
        out: list[tuple[glog.Key, glog.Value]] = []
        for gid in group_ids:
            group = self.groups.get(gid)
            if group is None:
                continue
            if group.protocol_type:
                out.append((GroupKey(gid), self.stored(group)))
            out += [(OffsetKey(gid, t, p), v) for (t, p), v in group.offsets.items()]
        return out

    def replay(self, key: glog.Key, value: glog.Value) -> None:
        """Apply one record read back from the offsets log (at start, before serving)."""
        group = self.groups.get(key.group_id)
        if isinstance(key, OffsetKey):
            if value is None:
                if group is not None:
                    group.offsets.pop((key.topic, key.partition), None)
                return
            assert isinstance(value, CommittedOffset)
            if group is None:
                group = self.groups[key.group_id] = Group(
                    key.group_id, state_timestamp_ms=value.commit_timestamp_ms
                )
            group.offsets[(key.topic, key.partition)] = value
            return
        if value is None:
            self.groups.pop(key.group_id, None)
            return
        assert isinstance(value, StoredGroup)
        offsets = group.offsets if group is not None else {}
        self.groups[key.group_id] = self._restore(key.group_id, value, offsets)

    def _restore(
        self, group_id: str, stored: StoredGroup, offsets: dict[TopicPartition, CommittedOffset]
    ) -> Group:
        group = Group(
            group_id,
            generation=stored.generation,
            protocol_type=stored.protocol_type or None,
            protocol=stored.protocol,
            leader=stored.leader,
            state_timestamp_ms=stored.state_timestamp_ms,
            offsets=offsets,
        )
        for sm in stored.members:
            group.add_member(
                Member(
                    sm.member_id,
                    sm.group_instance_id,
                    sm.client_id,
                    sm.client_host,
                    sm.session_timeout_ms,
                    sm.rebalance_timeout_ms,
                    stored.protocol_type,
                    ((stored.protocol or "", sm.subscription),),
                    assignment=sm.assignment,
                )
            )
            if sm.group_instance_id is not None:
                group.static_members[sm.group_instance_id] = sm.member_id
        if group.members:
            group.transition(GroupEvent.LOADED, stored.state_timestamp_ms)
        return group

    def resume_sessions(self, group_ids: set[str]) -> None:
        """After a reload of these groups (a new coordinator): start their members' session
        clocks afresh."""
        for group_id in group_ids:
            group = self.groups.get(group_id)
            if group is not None:
                for member in group.members.values():
                    self._refresh_session(group, member)

    def unload(self, group_ids: set[str]) -> int:
        """This broker stopped coordinating these groups (their ``__consumer_offsets``
        partition is led elsewhere now), as Kafka's ``GroupMetadataManager`` unloads them: every
        timer stops (no session expires here, nothing is written for them), members waiting
        in JoinGroup or SyncGroup are answered NOT_COORDINATOR (they find the new coordinator)
        and the groups and their offsets leave memory; a later reload replays them from the
        log. Returns how many groups were unloaded."""
        unloaded = 0
        for group_id in group_ids:
            group = self.groups.pop(group_id, None)
            if group is None:
                continue
            unloaded += 1
            for timer in (group.join_timer, group.sync_timer, *group.pending_members.values()):
                if timer is not None:
                    timer.cancel()
            group.join_timer = group.sync_timer = None
            group.pending_members.clear()
            for member in group.members.values():
                if member.session_timer is not None:
                    member.session_timer.cancel()
                    member.session_timer = None
                join, member.join_respond = member.join_respond, None
                sync, member.sync_respond = member.sync_respond, None
                if join is not None:
                    join(JoinResult(ErrorCode.not_coordinator, member.member_id))
                if sync is not None:
                    sync(SyncResult(ErrorCode.not_coordinator))
        return unloaded

    def finish_loading(self) -> None:
        """After replay: start the loaded members' session clocks, and the retention timer."""
        for group in self.groups.values():
            for member in group.members.values():
                self._refresh_session(group, member)
        self.start_retention()


def _ignore(_: ErrorCode) -> None:
    pass


def _ignore_error(_: BaseException | None) -> None:
    pass


def consumer_subscription(metadata: bytes) -> set[str] | None:
    """Topics of a ConsumerProtocolSubscription (every version starts: int16 version, then
    an int32-counted array of int16-length topic names); None for anything else."""
    try:
        (count,) = struct.unpack_from(">i", metadata, 2)
        if count < 0:
            return None
        pos = 6
        topics = set()
        for _ in range(count):
            (length,) = struct.unpack_from(">h", metadata, pos)
            if length < 0 or pos + 2 + length > len(metadata):
                return None
            topics.add(metadata[pos + 2 : pos + 2 + length].decode("utf-8"))
            pos += 2 + length
        return topics
    except (struct.error, UnicodeDecodeError):
        return None
