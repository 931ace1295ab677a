"""The group coordinator on a driven clock: no sockets, no event loop, no sleeping."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from stonemq.coordinator import group_log as glog
from stonemq.coordinator.group_coordinator import (
    Group,
    GroupConfig,
    GroupCoordinator,
    JoinRequest,
    JoinResult,
    Member,
    OffsetCommit,
    SyncResult,
)
from stonemq.coordinator.group_state import (
    TRANSITIONS,
    GroupEvent,
    GroupState,
    IllegalTransition,
    ManualClock,
    next_state,
)
from stonemq.coordinator.group_timers import TimerQueue

SESSION_MS = 10_000
REBALANCE_MS = 30_000
DELAY_MS = 3_000


class ListSink:
    """Keeps what would be written; answers at once (or holds answers when ``hold``)."""

    def __init__(self) -> None:
        self.entries: list[tuple[glog.Key, glog.Value]] = []
        self.hold = False
        self.held: list[Callable[[BaseException | None], None]] = []

    def write(self, group_id, entries, done) -> None:  # type: ignore[no-untyped-def]
        self.entries += entries
        if self.hold:
            self.held.append(done)
        else:
            done(None)


class Harness:
    def __init__(self, delay_ms: int = DELAY_MS, wall: ManualClock | None = None) -> None:
        self.clock = ManualClock()  # the timers' clock (monotonic in the broker)
        self.wall = wall or self.clock  # the coordinator's timestamps
        self.timers = TimerQueue(self.clock)
        self.sink = ListSink()
        self.coord = GroupCoordinator(
            self.wall,
            self.timers,
            self.sink,
            GroupConfig(initial_rebalance_delay_ms=delay_ms),
            lambda topic: 6 if topic == "t" else None,
        )

    def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        self.timers.fire_due()

    def join(
        self,
        member_id: str = "",
        instance: str | None = None,
        protocols: tuple[tuple[str, bytes], ...] = (("range", b"m"),),
        v4: bool = True,
        group: str = "g",
        v9: bool = True,
        rebalance_ms: int = REBALANCE_MS,
    ) -> list[JoinResult]:
        out: list[JoinResult] = []
        req = JoinRequest(
            group, member_id, instance, "client", "/127.0.0.1", SESSION_MS, rebalance_ms,
            "consumer", protocols, v4, v9,
        )  # fmt: skip
        self.coord.join(req, out.append)
        return out

    def join_new(self, **kw) -> list[JoinResult]:  # type: ignore[no-untyped-def]
        """A dynamic member's two-step v4+ join (MEMBER_ID_REQUIRED first)."""
        first = self.join(**kw)
        assert first[0].error == ErrorCode.member_id_required
        return self.join(member_id=first[0].member_id, **kw)

    def sync(
        self, member_id: str, generation: int, assignments: dict[str, bytes] | None = None
    ) -> list[SyncResult]:
        out: list[SyncResult] = []
        self.coord.sync("g", generation, member_id, None, None, None, assignments or {}, out.append)
        return out

    def state(self) -> GroupState:
        return self.coord.groups["g"].state


def stable_group(h: Harness, n: int) -> list[str]:
    """n members through one rebalance and the leader's sync; their ids, leader first."""
    joins = [h.join_new() for _ in range(n)]
    assert all(not j for j in joins)  # parked during the initial delay
    h.advance(DELAY_MS)  # members arrived during the delay: it runs once more
    assert all(not j for j in joins) or n == 1
    h.advance(DELAY_MS)
    results = [j[0] for j in joins]
    assert {r.error for r in results} == {ErrorCode.none}
    leader = results[0].leader
    ids = [r.member_id for r in results]
    gen = results[0].generation
    followers = [h.sync(m, gen) for m in ids if m != leader]
    assert all(not f for f in followers)
    h.sync(leader, gen, {m: m.encode() for m in ids})
    assert h.state() == GroupState.STABLE
    assert [f[0].assignment for f in followers] == [m.encode() for m in ids if m != leader]
    return [leader] + [m for m in ids if m != leader]


def test_transition_table_is_kafkas() -> None:
    assert next_state(GroupState.EMPTY, GroupEvent.MEMBER_JOINED) == GroupState.PREPARING_REBALANCE
    assert next_state(GroupState.COMPLETING_REBALANCE, GroupEvent.LEADER_SYNCED) == (
        GroupState.STABLE
    )
    with pytest.raises(IllegalTransition):
        next_state(GroupState.EMPTY, GroupEvent.LEADER_SYNCED)
    with pytest.raises(IllegalTransition):
        next_state(GroupState.DEAD, GroupEvent.MEMBER_JOINED)
    # Dead is final except for being removed again
    assert {nxt for (s, _), nxt in TRANSITIONS.items() if s == GroupState.DEAD} == {GroupState.DEAD}


def test_member_id_required_then_initial_delay_then_join() -> None:
    h = Harness()
    first = h.join()
    assert first[0].error == ErrorCode.member_id_required and first[0].member_id
    second = h.join(member_id=first[0].member_id)
    assert not second and h.state() == GroupState.PREPARING_REBALANCE
    h.advance(DELAY_MS - 1)
    assert not second
    h.advance(1)
    r = second[0]
    assert (r.error, r.generation, r.leader, r.protocol_name) == (
        ErrorCode.none, 1, r.member_id, "range",
    )  # fmt: skip
    assert [m[0] for m in r.members] == [r.member_id]
    assert h.state() == GroupState.COMPLETING_REBALANCE


def test_timers_run_on_their_own_clock_whatever_the_wall_clock_does() -> None:
    """Deadlines (the initial delay and its extension, the rebalance and session timeouts)
    are on the timers' clock, a monotonic one in the broker; the wall clock only stamps.
    They were on the wall clock: a step back of the broker's clock during a new group's
    initial delay left its consumer without an assignment for as long (audit35 p6)."""
    wall = ManualClock(start_ms=1_800_000_000_000)  # not the timers' clock, nor in step
    h = Harness(wall=wall)
    a = h.join_new()
    wall.advance(-40_000)  # an NTP step back mid-delay
    h.advance(DELAY_MS - 100)
    b = h.join_new()  # a member arrives: the delay extends by one more delay
    wall.advance(3_600_000)  # and a step forward
    h.advance(100)
    assert not a and not b
    h.advance(DELAY_MS)
    assert a[0].error == b[0].error == ErrorCode.none and a[0].generation == 1
    leader = a[0].leader
    h.sync(leader, 1, {a[0].member_id: b"a", b[0].member_id: b"b"})
    h.sync(b[0].member_id if leader == a[0].member_id else a[0].member_id, 1)
    assert h.state() == GroupState.STABLE
    wall.advance(-86_400_000)
    h.advance(SESSION_MS + 1)  # neither heartbeated: both sessions expire on time
    assert not h.coord.groups["g"].members


def test_old_join_versions_get_an_id_at_once() -> None:
    h = Harness(delay_ms=0)
    out = h.join(v4=False)
    assert out[0].error == ErrorCode.none and out[0].member_id


def test_initial_delay_extends_while_members_arrive_bounded_by_rebalance_timeout() -> None:
    h = Harness()
    a = h.join_new()
    h.advance(DELAY_MS - 100)
    b = h.join_new()
    h.advance(100)  # first delay over, but b arrived: wait another delay
    assert not a and not b
    h.advance(DELAY_MS)
    assert a[0].error == b[0].error == ErrorCode.none
    assert a[0].generation == b[0].generation == 1


def test_the_initial_delay_is_whole_under_a_shorter_rebalance_timeout() -> None:
    """Kafka's prepareRebalance waits the whole initial delay for an empty group's first
    members even when their rebalance timeout is shorter (it bounds only the extensions)."""
    h = Harness()
    a = h.join_new(rebalance_ms=1_000)
    h.advance(1_000)
    assert not a
    h.advance(DELAY_MS - 1_000)
    assert a[0].error == ErrorCode.none and a[0].generation == 1


def test_three_members_stable_with_distinct_assignments() -> None:
    h = Harness()
    ids = stable_group(h, 3)
    assert len(set(ids)) == 3
    for m in ids:
        assert h.coord.heartbeat("g", 1, m, None) == ErrorCode.none


def test_generation_and_member_checks() -> None:
    h = Harness()
    leader, follower = stable_group(h, 2)
    assert h.coord.heartbeat("g", 0, leader, None) == ErrorCode.illegal_generation
    assert h.coord.heartbeat("g", 1, "nobody", None) == ErrorCode.unknown_member_id
    assert h.coord.heartbeat("nogroup", 1, leader, None) == ErrorCode.unknown_member_id
    assert h.coord.validate_commit("g", 0, leader, None) == ErrorCode.illegal_generation
    assert h.coord.validate_commit("g", -1, "", None) == ErrorCode.unknown_member_id
    assert h.coord.validate_commit("g", 1, follower, None) == ErrorCode.none
    assert h.sync("nobody", 1)[0].error == ErrorCode.unknown_member_id


def test_leave_rebalances_and_heartbeat_says_rebalance_in_progress() -> None:
    h = Harness()
    leader, f1, f2 = stable_group(h, 3)
    [(mid, _, error)] = h.coord.leave("g", [(f2, None)])
    assert (mid, error) == (f2, ErrorCode.none)
    assert h.state() == GroupState.PREPARING_REBALANCE
    assert h.coord.heartbeat("g", 1, leader, None) == ErrorCode.rebalance_in_progress
    # commits are still accepted while preparing (a revoke callback commits before rejoining)
    assert h.coord.validate_commit("g", 1, f1, None) == ErrorCode.none
    j1, j2 = h.join(member_id=leader), h.join(member_id=f1)
    assert j1[0].generation == j2[0].generation == 2
    assert h.state() == GroupState.COMPLETING_REBALANCE
    assert h.coord.validate_commit("g", 2, f1, None) == ErrorCode.rebalance_in_progress
    assert h.coord.leave("g", [("ghost", None)])[0][2] == ErrorCode.unknown_member_id


def test_session_expiry_removes_silent_member_only() -> None:
    h = Harness()
    a, b = stable_group(h, 2)
    h.advance(SESSION_MS // 2)
    assert h.coord.heartbeat("g", 1, a, None) == ErrorCode.none
    h.advance(SESSION_MS // 2 - 1)
    assert b in h.coord.groups["g"].members
    h.advance(1)
    assert h.coord.heartbeat("g", 1, a, None) == ErrorCode.rebalance_in_progress
    assert b not in h.coord.groups["g"].members
    assert h.state() == GroupState.PREPARING_REBALANCE
    rejoin = h.join(member_id=a)
    assert rejoin[0].generation == 2 and [m[0] for m in rejoin[0].members] == [a]


def test_unload_answers_waiting_members_not_coordinator_and_stops_every_timer() -> None:
    """A coordinator that stops leading the group's offsets partition unloads it (Kafka's
    GroupMetadataManager): a parked JoinGroup and a parked SyncGroup are answered
    NOT_COORDINATOR, no session expires and nothing is written afterwards, and the group is
    gone until a replay of the log brings it back."""
    h = Harness()
    a, b = stable_group(h, 2)
    written = list(h.sink.entries)
    rejoin = h.join(member_id=a)  # a rebalance: a waits in JoinGroup for b
    assert not rejoin
    other = h.join_new(group="g2")  # parked in g2's initial delay
    assert not other
    assert h.coord.unload({"g", "g2", "absent"}) == 2
    assert rejoin[0].error == ErrorCode.not_coordinator
    assert other[0].error == ErrorCode.not_coordinator
    assert "g" not in h.coord.groups and "g2" not in h.coord.groups
    h.advance(REBALANCE_MS + SESSION_MS * 3)  # timers of the unloaded groups never fire
    assert h.sink.entries == written
    assert h.coord.heartbeat("g", 1, b, None) != ErrorCode.none
    for key, value in written:  # the log brings the group back
        h.coord.replay(key, value)
    assert set(h.coord.groups["g"].members) == {a, b}


def test_unload_of_a_group_waiting_in_sync_answers_not_coordinator() -> None:
    h = Harness()
    joins = [h.join_new() for _ in range(2)]
    h.advance(DELAY_MS)
    h.advance(DELAY_MS)
    results = [j[0] for j in joins]
    follower = next(r.member_id for r in results if r.member_id != r.leader)
    parked = h.sync(follower, results[0].generation)
    assert not parked
    assert h.coord.unload({"g"}) == 1
    assert parked[0].error == ErrorCode.not_coordinator


def test_rebalance_timeout_drops_members_that_do_not_rejoin() -> None:
    h = Harness()
    a, b = stable_group(h, 2)
    ja = h.join(member_id=a, protocols=(("range", b"changed"),))
    assert not ja
    for _ in range(REBALANCE_MS // 5000):
        h.advance(5000)
        h.coord.heartbeat("g", 1, b, None)  # alive, but never rejoins
    assert ja[0].error == ErrorCode.none and ja[0].generation == 2
    assert list(h.coord.groups["g"].members) == [a]


def test_missing_sync_removes_member_after_rebalance_timeout() -> None:
    h = Harness()
    a, b = stable_group(h, 2)
    h.coord.leave("g", [(b, None)])
    h.join(member_id=a)
    assert h.state() == GroupState.COMPLETING_REBALANCE
    h.advance(REBALANCE_MS)
    assert a not in h.coord.groups["g"].members
    assert h.state() == GroupState.EMPTY


def test_last_member_leaving_empties_the_group() -> None:
    h = Harness()
    (a,) = stable_group(h, 1)
    h.coord.leave("g", [(a, None)])
    assert h.state() == GroupState.EMPTY
    assert h.coord.groups["g"].generation == 2


def test_protocol_selection_and_inconsistent_protocol() -> None:
    h = Harness(delay_ms=0)
    a = h.join(protocols=(("roundrobin", b""), ("range", b"")), v4=False)
    assert a[0].protocol_name == "roundrobin"
    b = h.join(protocols=(("range", b""), ("roundrobin", b"")), v4=False)
    c = h.join(protocols=(("range", b""),), v4=False)
    assert not b and not c  # rebalancing: a must rejoin
    h.join(member_id=a[0].member_id, protocols=(("roundrobin", b""), ("range", b"")))
    assert b[0].protocol_name == c[0].protocol_name == "range"
    bad = h.join(protocols=(("sticky", b""),), v4=False)
    assert bad[0].error == ErrorCode.inconsistent_group_protocol


def _group_of(protocol_lists: list[list[str]]) -> Group:
    group = Group("g", protocol_type="consumer")
    for i, names in enumerate(protocol_lists):
        group.add_member(Member(
            f"m{i}", None, "c", "h", SESSION_MS, REBALANCE_MS, "consumer",
            tuple((name, b"") for name in names),
        ))  # fmt: skip
    return group


@given(
    st.lists(
        st.lists(st.sampled_from("abcdef"), min_size=1, max_size=6, unique=True),
        min_size=1,
        max_size=6,
    )
)
def test_the_protocol_chosen_is_the_common_one_most_members_prefer(lists) -> None:  # type: ignore[no-untyped-def]
    """Each member votes for the first protocol it lists among those every member lists; the
    most votes win, a tie goes to the one listed first (by the first member listing it)."""
    common = set.intersection(*(set(names) for names in lists))
    if not common:
        return
    votes = collections.Counter(next(n for n in names if n in common) for names in lists)
    order = list(dict.fromkeys(n for names in lists for n in names))
    best = max(votes.values())
    want = min((n for n in votes if votes[n] == best), key=order.index)
    assert _group_of(lists).select_protocol() == want


def test_thirty_thousand_protocols_are_chosen_from_at_once() -> None:
    """One member listing 30,000 protocols (a 500 KB JoinGroup) held the event loop 3.4-4.2 s
    when its rebalance completed: the choice looked each protocol up in a list (helper-74's
    audit, p3). Linear now, as Kafka's ClassicGroup.selectProtocol."""
    names = [_Name(f"p{i}") for i in range(30_000)]
    group = _group_of([names, list(reversed(names))])
    _Name.compared = 0
    assert group.select_protocol() == "p0"  # a tie: p0 is listed first
    # linear: a list lookup per protocol compared names about n * n / 2 times (not timed:
    # a time bound failed on a loaded machine)
    assert _Name.compared <= 2 * len(names), _Name.compared


class _Name(str):
    """A protocol name that counts the comparisons made with it (lookups in a dict or a set
    by the same object compare none)."""

    compared = 0
    __hash__ = str.__hash__

    def __eq__(self, other: object) -> bool:
        _Name.compared += 1
        return str.__eq__(self, other)


class _Counted(tuple):  # type: ignore[type-arg]
    """A member's protocols that count how often they are iterated."""

    iterations = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        _Counted.iterations += 1
        return super().__iter__()


class _CountedMembers(dict):  # type: ignore[type-arg]
    """A group's members that count the members visited by scans of them."""

    visited = 0

    def values(self):  # type: ignore[no-untyped-def]
        for member in super().values():
            _CountedMembers.visited += 1
            yield member


def test_a_join_costs_the_same_whatever_the_groups_size() -> None:
    """Each JoinGroup intersected every member's protocols (``supports``) and, during a
    rebalance, scanned the members for one not rejoined yet (``all_joined``): filling a
    group, or a rebalance of it, cost n^2/2 (helper-74's audit, p8). Kafka keeps counts of
    the members listing each protocol and of those awaiting their answer; so does ``Group``
    now: a rejoin costs the same at 1,000 members as at 10."""
    n = 1000
    h = Harness(delay_ms=0)
    protocols = _Counted((("range", b"m"), ("roundrobin", b"m")))
    ids = [h.join_new(protocols=protocols)[0].member_id]
    group = h.coord.groups["g"]
    group.members = _CountedMembers(group.members)
    h.sync(ids[0], 1, {ids[0]: b"a"})
    _Counted.iterations = _CountedMembers.visited = 0
    for _ in range(n - 1):  # filling the group: n - 1 joins while it rebalances
        ids.append(h.join(protocols=protocols)[0].member_id)
        assert not h.join(member_id=ids[-1], protocols=protocols)
    assert h.join(member_id=ids[0], protocols=protocols)  # the last to rejoin completes it
    h.sync(ids[0], 2, {m: b"a" for m in ids})
    assert group.state == GroupState.STABLE and len(group.members) == n
    newcomer = h.join(protocols=protocols)[0].member_id  # a rebalance every member rejoins
    h.join(member_id=newcomer, protocols=protocols)
    for member_id in ids:  # in the order they joined: the last one completes it
        h.join(member_id=member_id, protocols=protocols)
    assert group.state == GroupState.COMPLETING_REBALANCE and len(group.members) == n + 1
    # per join a constant; each completion visits every member a few times
    assert _Counted.iterations < 20 * n, _Counted.iterations
    assert _CountedMembers.visited < 20 * n, _CountedMembers.visited


def test_static_member_rejoins_without_rebalance_and_old_id_is_fenced() -> None:
    h = Harness()
    first = h.join(instance="i-1")
    assert not first  # static members get no MEMBER_ID_REQUIRED
    h.advance(DELAY_MS)
    old = first[0].member_id
    h.sync(old, 1, {old: b"assigned"})
    again = h.join(instance="i-1")  # restarted: no member id
    new = again[0].member_id
    assert again[0].error == ErrorCode.none and new != old
    # Kafka's ClassicGroup.generateMemberId: a static member's id starts with its instance
    # id, a dynamic one's with its client id
    assert old.startswith("i-1-") and new.startswith("i-1-")
    assert Harness().join()[0].member_id.startswith("client-")  # MEMBER_ID_REQUIRED's id
    assert again[0].generation == 1 and h.state() == GroupState.STABLE
    assert h.sync(new, 1)[0].assignment == b"assigned"
    assert h.coord.heartbeat("g", 1, old, "i-1") == ErrorCode.fenced_instance_id
    assert h.coord.validate_commit("g", 1, old, "i-1") == ErrorCode.fenced_instance_id
    assert h.coord.heartbeat("g", 1, new, "i-1") == ErrorCode.none
    # restarted again with other subscription bytes (a Java consumer's owned partitions and
    # generation are gone after a restart), the same protocol: no rebalance, as Kafka
    third = h.join(instance="i-1", protocols=(("range", b"restarted"),))
    assert third[0].error == ErrorCode.none and third[0].generation == 1
    assert h.state() == GroupState.STABLE
    newest = third[0].member_id
    assert h.sync(newest, 1)[0].assignment == b"assigned"
    # removed by its instance id alone (the AdminClient's removeMembersFromConsumerGroup):
    # the answer names the member as the request did, "" (it looks the answer up so)
    assert h.coord.leave("g", [("", "i-1")]) == [("", "i-1", ErrorCode.none)]
    assert h.coord.heartbeat("g", 1, newest, "i-1") == ErrorCode.unknown_member_id


def parked_syncs(h: Harness) -> tuple[str, str, int, list[SyncResult], list[SyncResult]]:
    """Two members through a join phase, then both SyncGroups with the group write held:
    (leader, follower, generation, the follower's answers, the leader's answers)."""
    a = h.join(v4=False)[0].member_id
    b = h.join(v4=False)
    h.join(member_id=a, v4=False)
    assert h.state() == GroupState.COMPLETING_REBALANCE
    leader, gen = b[0].leader, b[0].generation
    follower = b[0].member_id if leader == a else a
    h.sink.hold = True
    f = h.sync(follower, gen)
    ld = h.sync(leader, gen, {leader: b"L", follower: b"F"})
    return leader, follower, gen, f, ld


def test_sync_answers_once_the_assignment_is_stored() -> None:
    h = Harness(delay_ms=0)
    leader, follower, gen, f, ld = parked_syncs(h)
    assert not f and not ld  # nothing answered before the record is durable
    assert h.state() == GroupState.COMPLETING_REBALANCE
    _key, value = h.sink.entries[-1]
    assert isinstance(value, glog.StoredGroup) and value.generation == gen
    assert {m.member_id: m.assignment for m in value.members} == {leader: b"L", follower: b"F"}
    h.sink.held.pop()(None)
    assert h.state() == GroupState.STABLE
    assert (f[0].error, f[0].assignment) == (ErrorCode.none, b"F")
    assert (ld[0].error, ld[0].assignment) == (ErrorCode.none, b"L")


def test_failed_assignment_write_answers_coordinator_not_available_and_rebalances() -> None:
    h = Harness(delay_ms=0)
    leader, follower, gen, f, ld = parked_syncs(h)
    h.sink.held.pop()(OSError("disk"))
    assert [r.error for r in f + ld] == [ErrorCode.coordinator_not_available] * 2
    assert h.state() == GroupState.PREPARING_REBALANCE
    assert all(m.assignment == b"" for m in h.coord.groups["g"].members.values())
    # both rejoin: a new generation, and this time the write lands
    h.sink.hold = False
    ja, jb = h.join(member_id=leader), h.join(member_id=follower)
    assert ja[0].generation == jb[0].generation == gen + 1
    assert h.sync(ja[0].leader, gen + 1, {leader: b"L2"})[0].error == ErrorCode.none
    assert h.state() == GroupState.STABLE


def test_rebalance_overtaking_the_assignment_write_wins() -> None:
    h = Harness(delay_ms=0)
    _leader, _follower, _gen, f, ld = parked_syncs(h)
    h.join(v4=False)  # a third member: back to PreparingRebalance
    assert [r.error for r in f + ld] == [ErrorCode.rebalance_in_progress] * 2
    h.sink.held.pop(0)(None)  # the old generation's write lands late
    assert h.state() == GroupState.PREPARING_REBALANCE
    assert all(m.assignment == b"" for m in h.coord.groups["g"].members.values())


def test_commit_waits_for_the_write_and_fetch_sees_it() -> None:
    h = Harness()
    h.sink.hold = True
    answers: list[ErrorCode] = []
    h.coord.commit("g", [OffsetCommit("t", 0, 42, 3, "meta")], answers.append)
    assert not answers and h.coord.fetch_offsets("g", [("t", 0)]) == {("t", 0): None}
    h.sink.held.pop()(None)
    assert answers == [ErrorCode.none]
    committed = h.coord.fetch_offsets("g", [("t", 0)])[("t", 0)]
    assert committed is not None and (committed.offset, committed.leader_epoch) == (42, 3)
    h.coord.commit("g", [OffsetCommit("t", 0, 50, 3, None)], answers.append)
    h.sink.held.pop()(OSError("disk"))
    assert answers[-1] == ErrorCode.coordinator_not_available
    assert h.coord.fetch_offsets("g", None)[("t", 0)].offset == 42  # type: ignore[union-attr]


def test_partition_errors() -> None:
    h = Harness()
    assert h.coord.partition_error("t", 5, None) == ErrorCode.none
    assert h.coord.partition_error("t", 6, None) == ErrorCode.unknown_topic_or_partition
    assert h.coord.partition_error("gone", 0, None) == ErrorCode.unknown_topic_or_partition
    assert h.coord.partition_error("t", 0, "x" * 5000) == ErrorCode.offset_metadata_too_large


def test_retention_expires_empty_groups_offsets_then_the_group() -> None:
    h = Harness()
    h.coord.commit("g", [OffsetCommit("t", 1, 7, -1, "")], lambda e: None)
    h.coord.start_retention()
    retention = h.coord.config.offsets_retention_ms
    h.advance(retention - 1)
    assert h.coord.fetch_offsets("g", None)
    h.advance(h.coord.config.offsets_retention_check_interval_ms)
    assert "g" not in h.coord.groups
    assert (glog.OffsetKey("g", "t", 1), None) in h.sink.entries


def test_a_commits_retention_time_expires_it_under_the_usual_conditions() -> None:
    """OffsetCommit v2-v4's retention time (Kafka's expireTimestampMs): the offset expires
    that long after its commit instead of offsets.retention.minutes after it (or after the
    group emptied), but only where an offset may expire at all: not a topic a stable
    consumer group subscribes to, nor while the group rebalances."""
    h = Harness(delay_ms=0)
    h.coord.commit("simple", [OffsetCommit("t", 0, 7, -1, "", 2_000)], lambda e: None)
    h.coord.commit("simple", [OffsetCommit("t", 1, 8, -1, "")], lambda e: None)
    subscription = b"\x00\x01" + b"\x00\x00\x00\x01" + b"\x00\x01t" + b"\xff\xff\xff\xff"
    j = h.join(protocols=(("range", subscription),), v4=False)
    h.sync(j[0].member_id, 1, {})
    kept = [OffsetCommit("t", 0, 1, -1, "", 2_000), OffsetCommit("u", 0, 1, -1, "", 2_000)]
    h.coord.commit("g", kept, lambda e: None)
    h.coord.config = dataclasses.replace(h.coord.config, offsets_retention_check_interval_ms=500)
    h.coord.start_retention()
    h.advance(1_500)
    assert set(h.coord.fetch_offsets("simple", None)) == {("t", 0), ("t", 1)}
    h.advance(500)
    assert set(h.coord.fetch_offsets("simple", None)) == {("t", 1)}
    assert set(h.coord.fetch_offsets("g", None)) == {("t", 0)}  # t is subscribed
    assert (glog.OffsetKey("simple", "t", 0), None) in h.sink.entries
    # while the group rebalances nothing of it expires (Kafka: only a stable group's)
    h.coord.commit("g", [OffsetCommit("u", 0, 1, -1, "", 1)], lambda e: None)
    h.join(member_id=j[0].member_id, protocols=(("range", subscription + b"x"),))
    h.join(v4=False)  # a second member: the group waits in its join phase for it
    h.advance(500)
    assert ("u", 0) in h.coord.fetch_offsets("g", None)


def test_an_expiring_commit_is_written_and_read_back_as_kafkas_v1_value() -> None:
    value = glog.CommittedOffset(42, -1, "meta", 1_000, 3_000)
    raw = glog.encode_value(value)
    assert raw is not None and raw[:2] == b"\x00\x01"
    assert glog.decode_offset_value(raw) == value
    plain = glog.CommittedOffset(42, 5, "meta", 1_000)
    assert glog.decode_offset_value(glog.encode_value(plain) or b"") == plain


def test_delete_group_and_offset_delete_rules() -> None:
    h = Harness()
    (a,) = stable_group(h, 1)
    out: list[ErrorCode] = []
    h.coord.delete_group("g", out.append)
    assert out == [ErrorCode.non_empty_group]
    h.coord.delete_group("none", out.append)
    assert out[-1] == ErrorCode.group_id_not_found
    h.coord.leave("g", [(a, None)])
    h.coord.commit("g", [OffsetCommit("t", 0, 1, -1, "")], lambda e: None)
    h.coord.delete_group("g", out.append)
    assert out[-1] == ErrorCode.none and "g" not in h.coord.groups


def test_offset_delete_refuses_subscribed_topics() -> None:
    h = Harness(delay_ms=0)
    subscription = b"\x00\x01" + b"\x00\x00\x00\x01" + b"\x00\x01t" + b"\xff\xff\xff\xff"
    j = h.join(protocols=(("range", subscription),), v4=False)
    h.sync(j[0].member_id, 1, {})
    h.coord.commit("g", [OffsetCommit("t", 0, 1, -1, ""), OffsetCommit("u", 0, 1, -1, "")], print)
    got: list[tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]] = []
    h.coord.delete_offsets("g", [("t", 0), ("u", 0)], lambda e, errs: got.append((e, errs)))
    assert got[0][1] == {("t", 0): ErrorCode.group_subscribed_to_topic, ("u", 0): ErrorCode.none}
    assert set(h.coord.fetch_offsets("g", None)) == {("t", 0)}


def test_offset_delete_refuses_every_topic_while_subscriptions_are_unknown() -> None:
    """Kafka's ClassicGroup.isSubscribedToTopic: a consumer group whose subscriptions are
    unknown (its first rebalance has chosen no protocol yet, or a member's subscription is
    not the consumer protocol's) counts every topic as subscribed."""
    h = Harness()
    subscription = b"\x00\x01" + b"\x00\x00\x00\x01" + b"\x00\x01t" + b"\xff\xff\xff\xff"
    assert not h.join_new(protocols=(("range", subscription),))  # the initial delay
    h.coord.commit("g", [OffsetCommit("u", 0, 1, -1, "")], lambda e: None)
    got: list[tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]] = []
    h.coord.delete_offsets("g", [("u", 0)], lambda e, errs: got.append((e, errs)))
    assert got[-1] == (ErrorCode.none, {("u", 0): ErrorCode.group_subscribed_to_topic})
    h.advance(DELAY_MS)
    h.coord.delete_offsets("g", [("u", 0)], lambda e, errs: got.append((e, errs)))
    assert got[-1] == (ErrorCode.none, {("u", 0): ErrorCode.none})  # now known: t only

    h2 = Harness(delay_ms=0)
    garbled = b"\x00\x01" + b"\x00\x00\x00\x02" + b"\x00\x01t"  # two topics, one there
    j = h2.join(protocols=(("range", garbled),), v4=False)
    h2.sync(j[0].member_id, 1, {})
    h2.coord.commit("g", [OffsetCommit("u", 0, 1, -1, "")], lambda e: None)
    h2.coord.delete_offsets("g", [("u", 0)], lambda e, errs: got.append((e, errs)))
    assert got[-1] == (ErrorCode.none, {("u", 0): ErrorCode.group_subscribed_to_topic})
    assert set(h2.coord.fetch_offsets("g", None)) == {("u", 0)}


def test_replay_of_the_written_records_rebuilds_the_state() -> None:
    h = Harness()
    ids = stable_group(h, 2)
    h.coord.commit("g", [OffsetCommit("t", 2, 9, 1, "m")], lambda e: None)
    h.coord.commit("simple", [OffsetCommit("t", 3, 4, -1, "")], lambda e: None)
    encoded = glog.encode_records(h.sink.entries)
    batch = glog.build_batch(encoded)
    from stonemq.protocol.record_batch import iter_records

    fresh = Harness()
    for rec in iter_records(batch):
        fresh.coord.replay(*glog.decode(rec.key, rec.value))
    fresh.coord.finish_loading()
    g = fresh.coord.groups["g"]
    assert g.state == GroupState.STABLE and list(g.members) == ids and g.generation == 1
    assert g.offsets == h.coord.groups["g"].offsets
    assert fresh.coord.fetch_offsets("simple", None)[("t", 3)].offset == 4  # type: ignore[union-attr]
    assert fresh.coord.heartbeat("g", 1, ids[1], None) == ErrorCode.none
    fresh.advance(SESSION_MS)  # nobody heartbeats after the restart: all expire
    assert fresh.coord.groups["g"].state == GroupState.EMPTY


def test_partition_for_matches_java_hash_code() -> None:
    # "abc".hashCode() == 96354; Java's hash of a non-ASCII id uses UTF-16 code units
    assert glog.partition_for("abc", 50) == 96354 % 50
    assert glog.partition_for("", 50) == 0
    assert glog.partition_for("é", 50) == 0xE9 % 50


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["join", "static", "rejoin", "leave", "heartbeat", "sync", "tick"]),
            st.integers(0, 3),
            st.integers(0, 12_000),
        ),
        max_size=60,
    )
)
def test_random_operations_keep_the_invariants(ops: list[tuple[str, int, int]]) -> None:
    """Whatever members do, the group stays in a state reachable through the table, the
    leader is a member, Empty means no members, and the group's counts (members listing
    each protocol, members with a join parked) are its members' (a join that would leave
    no protocol in common is refused)."""
    h = Harness()
    known: list[str] = []
    for op, who, ms in ops:
        member = known[who % len(known)] if known else ""
        group = h.coord.groups.get("g")
        gen = group.generation if group else 0
        protocols = PROTOCOL_CHOICES[ms % len(PROTOCOL_CHOICES)]
        if op == "join":
            out = h.join(protocols=protocols)
            if out and out[0].error == ErrorCode.member_id_required:
                known.append(out[0].member_id)
                h.join(member_id=out[0].member_id, protocols=protocols)
        elif op == "static":  # a static member joining, or replacing itself (KIP-345)
            out = h.join(instance=f"S{who}", protocols=protocols)
            if out and out[0].member_id and out[0].member_id not in known:
                known.append(out[0].member_id)
        elif op == "rejoin" and member:
            h.join(member_id=member, protocols=protocols)
        elif op == "leave" and member:
            h.coord.leave("g", [(member, None)])
        elif op == "heartbeat" and member:
            h.coord.heartbeat("g", gen, member, None)
        elif op == "sync" and member:
            h.sync(member, gen, {m: b"x" for m in known})
        else:
            h.advance(ms)
        group = h.coord.groups.get("g")
        if group is None:
            continue
        if group.leader is not None:
            assert group.leader in group.members
        if group.state == GroupState.EMPTY:
            assert not group.members
        if group.members:
            assert group.leader is not None
        counted = collections.Counter(
            name for m in group.members.values() for name in {n for n, _ in m.protocols}
        )
        assert group.protocol_counts == dict(counted)
        waiting = [m for m in group.members.values() if m.join_respond is not None]
        assert group.awaiting_join == len(waiting)
        if group.members:
            lists = [{n for n, _ in m.protocols} for m in group.members.values()]
            assert set.intersection(*lists), "members with no protocol in common"


PROTOCOL_CHOICES = (
    (("range", b"m"),),
    (("range", b"m"), ("roundrobin", b"m")),
    (("roundrobin", b"m"), ("range", b"m")),
    (("sticky", b"m"),),
    (("range", b"m"), ("range", b"again")),
)


def static_stable_with_a_dynamic_member_gone(h: Harness) -> str:
    """Static member S stable alone; a dynamic member starts a rebalance and leaves before
    it completes. S's member id."""
    s = h.join(instance="S")
    h.advance(DELAY_MS)
    s_id = s[0].member_id
    h.sync(s_id, 1, {s_id: b"S"})
    d_id = h.join()[0].member_id
    assert not h.join(member_id=d_id) and h.state() == GroupState.PREPARING_REBALANCE
    assert h.coord.leave("g", [(d_id, None)]) == [(d_id, None, ErrorCode.none)]
    return s_id


def test_a_rebalance_no_member_rejoins_waits_for_the_static_ones() -> None:
    """Kafka's completeClassicGroupJoin: once the dynamic members that did not rejoin are
    gone, a join phase in which no member rejoined is not completed (a generation nobody
    joined, whose SyncGroup deadline would then evict the static members within their
    sessions); it waits another rebalance timeout until they rejoin or their sessions end."""
    h = Harness()
    s_id = static_stable_with_a_dynamic_member_gone(h)
    for _ in range(3 * REBALANCE_MS // 5000):  # S is alive but does not rejoin
        h.advance(5000)
        assert h.coord.heartbeat("g", 1, s_id, "S") == ErrorCode.rebalance_in_progress
    assert h.state() == GroupState.PREPARING_REBALANCE
    assert list(h.coord.groups["g"].members) == [s_id] and h.coord.groups["g"].generation == 1
    rejoined = h.join(member_id=s_id, instance="S")
    assert rejoined[0].error == ErrorCode.none and rejoined[0].generation == 2
    assert rejoined[0].leader == s_id


def test_a_waiting_rebalance_ends_when_the_static_members_session_does() -> None:
    h = Harness()
    s_id = static_stable_with_a_dynamic_member_gone(h)
    for _ in range(2 * REBALANCE_MS // 5000):
        h.advance(5000)
        h.coord.heartbeat("g", 1, s_id, "S")
    h.advance(SESSION_MS)  # then silent: its session ends, and the group is empty
    assert h.state() == GroupState.EMPTY and not h.coord.groups["g"].members
    assert h.coord.groups["g"].generation == 2


def test_an_instance_id_that_names_no_static_member_is_unknown() -> None:
    """Kafka's ClassicGroup.validateMember: a dynamic member's request carrying an instance
    id no static member holds is UNKNOWN_MEMBER_ID (it was served as the dynamic member)."""
    h = Harness()
    (a,) = stable_group(h, 1)
    assert h.coord.heartbeat("g", 1, a, None) == ErrorCode.none
    assert h.coord.heartbeat("g", 1, a, "ghost") == ErrorCode.unknown_member_id
    assert h.coord.validate_commit("g", 1, a, "ghost") == ErrorCode.unknown_member_id


@pytest.mark.parametrize("v9", [True, False])
def test_a_restarted_static_leader_is_told_it_leads_only_from_join_v9(v9: bool) -> None:
    """KIP-814: JoinGroup v9+ tells a static leader rejoining a stable group that it leads
    and may skip the assignment; an older answer cannot, so Kafka names the leader as it was
    (the old member id) and lists no members: the member syncs as a follower and gets its
    assignment back."""
    h = Harness()
    a = h.join(instance="A")
    h.advance(DELAY_MS)
    old = a[0].member_id
    assert a[0].leader == old
    h.sync(old, 1, {old: b"A's"})
    again = h.join(instance="A", v9=v9)[0]
    assert again.error == ErrorCode.none and again.generation == 1
    assert h.state() == GroupState.STABLE and h.coord.groups["g"].leader == again.member_id
    if v9:
        assert (again.leader, again.skip_assignment) == (again.member_id, True)
        assert [m[0] for m in again.members] == [again.member_id]
    else:
        assert (again.leader, again.skip_assignment, again.members) == (old, False, ())
    assert h.sync(again.member_id, 1)[0].assignment == b"A's"


def test_a_new_members_parked_join_times_out_after_five_minutes() -> None:
    """Kafka's classicGroupNewMemberJoinTimeoutMs: a new member parked in a rebalance that
    goes on (a rebalance timeout of hours, as Kafka Streams sets) is removed after five
    minutes, its JoinGroup answered UNKNOWN_MEMBER_ID (it may have disconnected unseen);
    members that already had a generation keep waiting."""
    h = Harness()
    a, b = stable_group(h, 2)
    long = 4 * 3_600_000
    ja = h.join(member_id=a, protocols=(("range", b"changed"),), rebalance_ms=long)
    assert not ja and h.state() == GroupState.PREPARING_REBALANCE
    first = h.join()
    newcomer = h.join(member_id=first[0].member_id, rebalance_ms=long)
    for _ in range(300_000 // 5_000 - 1):
        h.advance(5_000)
        h.coord.heartbeat("g", 1, b, None)  # b is alive but does not rejoin
    assert not newcomer and first[0].member_id in h.coord.groups["g"].members
    h.advance(5_000)
    assert newcomer[0].error == ErrorCode.unknown_member_id
    assert set(h.coord.groups["g"].members) == {a, b} and not ja
    assert h.state() == GroupState.PREPARING_REBALANCE
