"""The classic consumer-group state machine: its states, its transitions and its answers, as tables.

Kafka's group states (``GroupState``) and every transition between them are listed once, in
:data:`TRANSITIONS`: ``(state, event) -> next state``. Anything not in the table is illegal and
raises :class:`IllegalTransition`, so the coordinator cannot drift into a state Kafka never
reaches. The answers that depend only on the state (what a heartbeat, a SyncGroup or an
OffsetCommit from a valid member of the current generation gets) are tables too.

::

    Empty --join--> PreparingRebalance --joined--> CompletingRebalance --leader sync--> Stable
      ^                 |   ^                              |                            |
      |   no members    |   +- member joins/leaves/expires +----------------------------+
      +-----------------+
    any state --group deleted / offsets expired--> Dead

Time is never read here: the coordinator is given a :class:`Clock` (``SystemClock`` in the
broker, ``ManualClock`` in tests), so every timeout can be driven without sleeping.
"""

from __future__ import annotations

import enum
import time
from typing import Protocol

from kio.schema.errors import ErrorCode


class GroupState(enum.Enum):
    """Kafka's names, as DescribeGroups and ListGroups report them."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


class GroupEvent(enum.Enum):
    MEMBER_JOINED = "a member joined, or rejoined with changed protocols"
    MEMBER_LEFT = "a member left, expired, or missed the rebalance or sync deadline"
    JOIN_COMPLETE = "every member rejoined (or the rebalance timeout passed), some remain"
    JOIN_COMPLETE_EMPTY = "the join phase ended with no member left"
    LEADER_SYNCED = "the leader's assignment is stored"
    STORE_FAILED = "the leader's assignment could not be stored"
    REMOVED = "the group was deleted or its last offsets expired"
    LOADED = "restored from the offsets log"


S = GroupState
E = GroupEvent

TRANSITIONS: dict[tuple[GroupState, GroupEvent], GroupState] = {
    (S.EMPTY, E.MEMBER_JOINED): S.PREPARING_REBALANCE,
    (S.EMPTY, E.REMOVED): S.DEAD,
    (S.EMPTY, E.LOADED): S.STABLE,
    (S.PREPARING_REBALANCE, E.MEMBER_JOINED): S.PREPARING_REBALANCE,
    (S.PREPARING_REBALANCE, E.MEMBER_LEFT): S.PREPARING_REBALANCE,
    (S.PREPARING_REBALANCE, E.JOIN_COMPLETE): S.COMPLETING_REBALANCE,
    (S.PREPARING_REBALANCE, E.JOIN_COMPLETE_EMPTY): S.EMPTY,
    (S.PREPARING_REBALANCE, E.REMOVED): S.DEAD,
    (S.COMPLETING_REBALANCE, E.MEMBER_JOINED): S.PREPARING_REBALANCE,
    (S.COMPLETING_REBALANCE, E.MEMBER_LEFT): S.PREPARING_REBALANCE,
    (S.COMPLETING_REBALANCE, E.LEADER_SYNCED): S.STABLE,
    (S.COMPLETING_REBALANCE, E.STORE_FAILED): S.PREPARING_REBALANCE,
    (S.COMPLETING_REBALANCE, E.REMOVED): S.DEAD,
    (S.STABLE, E.MEMBER_JOINED): S.PREPARING_REBALANCE,
    (S.STABLE, E.MEMBER_LEFT): S.PREPARING_REBALANCE,
    (S.STABLE, E.REMOVED): S.DEAD,
    (S.DEAD, E.REMOVED): S.DEAD,
}
"""Every legal transition. A new group starts ``Empty``; one restored from the offsets log with
members (``LOADED``) becomes ``Stable``, its members on fresh session deadlines."""


class IllegalTransition(RuntimeError):
    pass


def next_state(state: GroupState, event: GroupEvent) -> GroupState:
    """The state ``event`` leads to from ``state``; raises :class:`IllegalTransition`."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(f"{event.name} is not allowed in {state.value}") from None


# What a known member of the current generation gets, by group state.
HEARTBEAT_ANSWER: dict[GroupState, ErrorCode] = {
    S.EMPTY: ErrorCode.unknown_member_id,
    S.PREPARING_REBALANCE: ErrorCode.rebalance_in_progress,
    S.COMPLETING_REBALANCE: ErrorCode.none,
    S.STABLE: ErrorCode.none,
    S.DEAD: ErrorCode.coordinator_not_available,
}

SYNC_ANSWER: dict[GroupState, ErrorCode | None] = {
    S.EMPTY: ErrorCode.unknown_member_id,
    S.PREPARING_REBALANCE: ErrorCode.rebalance_in_progress,
    S.COMPLETING_REBALANCE: None,  # park until the leader's assignment arrives
    S.STABLE: None,  # answer with the member's current assignment
    S.DEAD: ErrorCode.coordinator_not_available,
}

COMMIT_ANSWER: dict[GroupState, ErrorCode] = {
    # PreparingRebalance accepts commits so members can commit in their revoke callback.
    S.EMPTY: ErrorCode.none,
    S.PREPARING_REBALANCE: ErrorCode.none,
    S.COMPLETING_REBALANCE: ErrorCode.rebalance_in_progress,
    S.STABLE: ErrorCode.none,
    S.DEAD: ErrorCode.coordinator_not_available,
}

# States in which a member's JoinGroup (known member, same protocols) is answered at once with
# the current generation rather than starting a rebalance; the leader always rebalances in
# Stable (Kafka: it may want a new assignment).
JOIN_WITHOUT_REBALANCE: frozenset[GroupState] = frozenset({S.COMPLETING_REBALANCE, S.STABLE})

# States whose DescribeGroups answer carries member metadata and assignments.
DESCRIBE_WITH_METADATA: frozenset[GroupState] = frozenset({S.STABLE})


class Clock(Protocol):
    """Milliseconds since the epoch. Wall time, because commit timestamps outlive a restart."""

    def now_ms(self) -> int: ...


class SystemClock:
    def now_ms(self) -> int:
        return int(time.time() * 1000)


class MonotonicClock:
    """Milliseconds of a clock no wall-clock step moves: what timer deadlines run on (Kafka's
    SystemTimer, on ``Time.hiResClockMs``). On the wall clock, a step back of the broker's
    clock (an NTP step, a VM resynced) held every pending session, rebalance and delay
    timer back by as much, a step forward fired them early (audit35 p6)."""

    def now_ms(self) -> int:
        return int(time.monotonic() * 1000)


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.now = start_ms

    def now_ms(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now
