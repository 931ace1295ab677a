"""The controller's placement and election rules (stonemq/cluster/journal_state.py), as
properties over any brokers, racks and live sets."""

from __future__ import annotations

import collections

from hypothesis import given
from hypothesis import strategies as st

from stonemq.cluster.journal_state import (
    NO_LEADER,
    PREFERRED_ELECTED,
    PREFERRED_NOT_AVAILABLE,
    PREFERRED_NOT_NEEDED,
    Assignment,
    PartitionState,
    drop_from_isr,
    elect,
    elect_preferred,
    imbalanced,
    initial_state,
    move_from_full,
    place_replicas,
    rack_alternated,
)

brokers_st = st.dictionaries(
    st.integers(0, 20), st.one_of(st.none(), st.sampled_from("abc")), min_size=1, max_size=8
)


@given(brokers_st, st.data())
def test_placement_puts_home_first_and_spreads_over_racks(brokers, data) -> None:
    home = data.draw(st.sampled_from(sorted(brokers)))
    rf = data.draw(st.integers(1, len(brokers)))
    partition = data.draw(st.integers(0, 1000))
    replicas = place_replicas(home, brokers, rf, partition)
    assert replicas[0] == home
    assert len(replicas) == len(set(replicas)) == rf
    assert set(replicas) <= set(brokers)
    racks = {brokers[b] for b in brokers}
    assert len({brokers[b] for b in replicas}) == min(rf, len(racks))


def test_placement_shares_followers_out_evenly() -> None:
    brokers = {1: None, 2: None, 3: None}
    followers: collections.Counter[int] = collections.Counter()
    j = 0
    for home in brokers:
        for _ in range(4):
            followers.update(place_replicas(home, brokers, 2, j)[1:])
            j += 1
    assert sorted(followers.values()) == [4, 4, 4]


def test_rack_alternated_takes_one_broker_per_rack_in_turn() -> None:
    brokers = {1: "a", 2: "a", 3: "b", 4: "c", 5: "b"}
    assert rack_alternated(brokers) == [1, 3, 4, 2, 5]


def test_too_few_brokers_is_refused() -> None:
    try:
        place_replicas(1, {1: None}, 2, 0)
    except ValueError as exc:
        assert "replication factor 2" in str(exc)
    else:
        raise AssertionError("placement with too few brokers was accepted")


@given(
    st.lists(st.integers(0, 6), min_size=1, max_size=4, unique=True),
    st.sets(st.integers(0, 6)),
    st.lists(st.sets(st.integers(0, 6)), max_size=6),
    st.booleans(),
)
def test_election_keeps_kafkas_rules(replicas, first_live, changes, unclean) -> None:
    assignment = Assignment(tuple(replicas))
    state = initial_state(assignment, first_live, 1)
    for live in changes:
        new = elect(assignment, state, live, 2, unclean)
        if new is None:
            # nothing to do: the leader is live, or there was and is no leader to be had
            assert (state.leader in live) or state.leader == NO_LEADER
            continue
        assert new.leader_epoch == state.leader_epoch + 1
        assert new.leader != state.leader
        assert new.controller_epoch == 2
        if new.leader != NO_LEADER:
            assert new.leader in live and new.leader in replicas
            assert new.leader in new.isr
            assert set(new.isr) <= set(live)
            if new.leader not in state.isr:  # only an unclean election leaves the ISR
                assert unclean and new.isr == (new.leader,)
        else:
            assert new.isr == state.isr  # the last ISR is kept for a clean election
            assert not any(r in live for r in state.isr)
        state = new


def test_a_replica_outside_the_isr_never_leads_a_clean_election() -> None:
    assignment = Assignment((1, 2))
    state = PartitionState(leader=1, leader_epoch=3, isr=(1,), controller_epoch=1)
    assert elect(assignment, state, {2}, 2) == PartitionState(NO_LEADER, 4, (1,), 2)
    assert elect(assignment, state, {2}, 2, unclean=True) == PartitionState(2, 4, (2,), 2)


def test_states_round_trip_as_kafkas_json() -> None:
    state = PartitionState(leader=2, leader_epoch=7, isr=(2, 3), controller_epoch=5)
    assert PartitionState.from_json(state.to_json()) == state
    assert Assignment.from_json(Assignment((3, 1)).to_json()) == Assignment((3, 1))


@given(
    st.lists(st.integers(0, 6), min_size=1, max_size=4, unique=True),
    st.sets(st.integers(0, 6)),
    st.integers(0, 5),
)
def test_brokers_gone_or_stopping_leave_the_isr_of_a_serving_leader(isr, serving, epoch) -> None:
    state = PartitionState(leader=isr[0], leader_epoch=epoch, isr=tuple(isr), controller_epoch=1)
    new = drop_from_isr(state, serving, 2)
    if state.leader not in serving or set(isr) <= serving:
        assert new is None  # a leader gone is the election's business; else nothing to drop
        return
    assert new is not None
    assert new.isr == tuple(b for b in isr if b in serving)  # order kept, leader first
    assert new.leader == state.leader and new.leader_epoch == epoch  # no election
    assert new.controller_epoch == 2


@given(
    st.lists(st.integers(0, 6), min_size=1, max_size=4, unique=True),
    st.integers(-1, 6),
    st.sets(st.integers(0, 6)),
    st.sets(st.integers(0, 6)),
    st.integers(0, 5),
)
def test_a_preferred_election_moves_the_leadership_home_only_to_a_serving_isr_member(
    replicas, leader, isr, serving, epoch
) -> None:
    """Kafka's preferred-replica election: the first replica leads in the next leader epoch,
    the ISR untouched, when it is serving and in the ISR; never another replica."""
    assignment = Assignment(tuple(replicas))
    state = PartitionState(leader, epoch, tuple(sorted(isr)), 1)
    outcome, new = elect_preferred(assignment, state, serving, 2)
    home = replicas[0]
    if leader == home:
        assert (outcome, new) == (PREFERRED_NOT_NEEDED, None)
    elif home not in serving or home not in isr:
        assert (outcome, new) == (PREFERRED_NOT_AVAILABLE, None)
    else:
        assert outcome == PREFERRED_ELECTED
        assert new == PartitionState(home, epoch + 1, state.isr, 2)


@given(
    st.lists(st.integers(0, 6), min_size=1, max_size=4, unique=True),
    st.integers(-1, 6),
    st.sets(st.integers(0, 6)),
    st.sets(st.integers(0, 6)),
    st.sets(st.integers(0, 6)),
    st.integers(0, 5),
)
def test_a_leader_out_of_space_hands_over_to_a_serving_isr_member_with_room(
    replicas, leader, isr, serving, full, epoch
) -> None:
    """The leadership leaves a leader out of space for the first assigned ISR member that
    serves and has room, in the next leader epoch with the ISR unchanged (every
    acknowledged record is on it); with none such, or a leader with room, nothing moves."""
    assignment = Assignment(tuple(replicas))
    state = PartitionState(leader, epoch, tuple(sorted(isr)), 1)
    new = move_from_full(assignment, state, serving, full, 2)
    able = [r for r in replicas if r in isr and r in serving and r not in full]
    if leader == NO_LEADER or leader not in full or not able:
        assert new is None
    else:
        assert new == PartitionState(able[0], epoch + 1, state.isr, 2)


def test_a_leader_out_of_space_examples() -> None:
    assignment = Assignment((1, 2, 3))
    state = PartitionState(leader=1, leader_epoch=4, isr=(1, 2, 3), controller_epoch=1)
    assert move_from_full(assignment, state, {1, 2, 3}, {1}, 3) == PartitionState(
        2, 5, (1, 2, 3), 3
    )
    assert move_from_full(assignment, state, {1, 3}, {1}, 3) == PartitionState(3, 5, (1, 2, 3), 3)
    assert move_from_full(assignment, state, {1, 2, 3}, {1, 2, 3}, 3) is None  # all full
    assert move_from_full(assignment, state, {1, 2, 3}, {2}, 3) is None  # the leader has room


def test_a_preferred_election_examples() -> None:
    assignment = Assignment((1, 2, 3))
    moved = PartitionState(leader=2, leader_epoch=4, isr=(2, 3, 1), controller_epoch=1)
    assert elect_preferred(assignment, moved, {1, 2, 3}, 3) == (
        PREFERRED_ELECTED,
        PartitionState(1, 5, (2, 3, 1), 3),
    )
    # back but not caught up yet (not in the ISR), or stopping / dead (not serving)
    behind = PartitionState(leader=2, leader_epoch=4, isr=(2, 3), controller_epoch=1)
    assert elect_preferred(assignment, behind, {1, 2, 3}, 3) == (PREFERRED_NOT_AVAILABLE, None)
    assert elect_preferred(assignment, moved, {2, 3}, 3) == (PREFERRED_NOT_AVAILABLE, None)
    home = PartitionState(leader=1, leader_epoch=4, isr=(1, 2, 3), controller_epoch=1)
    assert elect_preferred(assignment, home, {1, 2, 3}, 3) == (PREFERRED_NOT_NEEDED, None)
    # a journal partition without a leader whose preferred replica is in the ISR and serving
    offline = PartitionState(leader=NO_LEADER, leader_epoch=4, isr=(1,), controller_epoch=1)
    assert elect_preferred(assignment, offline, {1}, 3) == (
        PREFERRED_ELECTED,
        PartitionState(1, 5, (1,), 3),
    )


@given(
    st.lists(
        st.tuples(st.integers(1, 4), st.integers(-1, 4)), min_size=1, max_size=30
    ),  # (home, leader) per journal partition
    st.sets(st.integers(1, 4)),
    st.integers(0, 100),
)
def test_the_rebalance_takes_a_home_brokers_partitions_led_elsewhere_past_the_threshold(
    partitions, serving, percentage
) -> None:
    """Kafka's checkAndTriggerAutoLeaderRebalance: per home broker, the share of its
    partitions led elsewhere (leaderless included) above the percentage gives those
    partitions, when the home broker serves; never a partition led at home."""
    rows = [
        (j, Assignment((home, home % 4 + 1)), PartitionState(leader, 1, (home,), 1))
        for j, (home, leader) in enumerate(partitions)
    ]
    chosen = imbalanced(rows, serving, percentage)
    for home in {h for h, _ in partitions}:
        group = [(j, leader) for j, (h, leader) in enumerate(partitions) if h == home]
        elsewhere = {j for j, leader in group if leader != home}
        due = home in serving and len(elsewhere) / len(group) > percentage / 100
        assert {j for j, _ in group} & chosen == (elsewhere if due else set())


def test_the_rebalance_examples() -> None:
    def rows(*leaders: tuple[int, int]):  # (home, leader)
        return [
            (j, Assignment((home, 9)), PartitionState(leader, 3, (home, 9), 1))
            for j, (home, leader) in enumerate(leaders)
        ]

    # broker 1 back from a restart: both its partitions led by 2
    assert imbalanced(rows((1, 2), (1, 2), (2, 2)), {1, 2}, 10) == {0, 1}
    # 1 of 10 led elsewhere is 10%: not above the default threshold; 2 of 10 is
    ten = rows(*([(1, 1)] * 9 + [(1, 2)]))
    assert imbalanced(ten, {1, 2}, 10) == set()
    assert imbalanced(rows(*([(1, 1)] * 8 + [(1, 2)] * 2)), {1, 2}, 10) == {8, 9}
    assert imbalanced(ten, {1, 2}, 0) == {9}
    # the home broker is not serving (dead, stopping): left where it is
    assert imbalanced(rows((1, 2), (1, 2)), {2}, 10) == set()
