"""Journal partition placement and leader election: the controller's rules, as pure functions.

A cluster replicates journal partitions only (../shared/design/cluster.md): each has an
assignment (its replicas, the first of them its *home* broker, the one whose joining created
it) that never changes, and a state (leader, leader epoch, ISR, the controller epoch that
wrote it), Kafka's partition state. The rules follow Kafka's controller:

- Placement: ``journal.partitions`` partitions per broker, created when the broker first joins
  and once ``default.replication.factor`` brokers are live (as Kafka creates an internal topic
  only once its replication factor can be met). Replicas after the home broker are spread
  across racks first (Kafka's rack-alternated broker list), then across brokers, rotated by
  the partition id so that followers are shared out evenly.
- Election (Kafka's offline-partition election): the first assigned replica that is live and
  in the ISR leads; with none, the leader is -1 (offline) and the ISR keeps its last members,
  unless ``unclean.leader.election.enable`` lets the first live replica lead with an ISR of
  itself. Every leader change bumps the leader epoch; nothing else does.
- Preferred election (Kafka's ``PreferredReplicaPartitionLeaderElectionStrategy``, run on an
  ElectLeaders request): the first assigned replica (the home broker) leads again when it is
  serving (live, its copy online, not in a controlled shutdown) and in the ISR; the ISR is
  kept as it is.
- Automatic rebalance (Kafka's ``auto.leader.rebalance.enable``): every
  ``leader.imbalance.check.interval.seconds`` the controller finds, for each home broker, the
  share of its journal partitions that another broker leads; above
  ``leader.imbalance.per.broker.percentage`` those whose home broker serves get a preferred
  election (:func:`imbalanced`), so leadership comes back after a restart by itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

NO_LEADER = -1


@dataclass(frozen=True)
class Assignment:
    """A journal partition's replicas (never changed once written); ``replicas[0]`` is home."""

    replicas: tuple[int, ...]

    @property
    def home(self) -> int:
        return self.replicas[0]

    def to_json(self) -> bytes:
        return json.dumps({"version": 1, "replicas": list(self.replicas)}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Assignment:
        node = json.loads(data)
        return cls(tuple(int(r) for r in node["replicas"]))


@dataclass(frozen=True)
class PartitionState:
    """Leader, leader epoch and ISR of a journal partition, with the controller epoch of the
    controller that last wrote them (Kafka's ``.../partitions/<p>/state`` node)."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "version": 1,
                "leader": self.leader,
                "leader_epoch": self.leader_epoch,
                "isr": list(self.isr),
                "controller_epoch": self.controller_epoch,
            }
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> PartitionState:
        node = json.loads(data)
        return cls(
            int(node["leader"]),
            int(node["leader_epoch"]),
            tuple(int(r) for r in node["isr"]),
            int(node["controller_epoch"]),
        )


def rack_alternated(brokers: Mapping[int, str | None]) -> list[int]:
    """Brokers ordered so that consecutive ones are on different racks where possible
    (racks in name order, each rack's brokers in id order, taken one per rack in turn);
    brokers without a rack form one rack of their own."""
    by_rack: dict[str, list[int]] = {}
    for broker, rack in sorted(brokers.items()):
        by_rack.setdefault("" if rack is None else rack, []).append(broker)
    racks = [by_rack[r] for r in sorted(by_rack)]
    out: list[int] = []
    for i in range(max((len(r) for r in racks), default=0)):
        out.extend(r[i] for r in racks if i < len(r))
    return out


def place_replicas(
    home: int, brokers: Mapping[int, str | None], replication_factor: int, partition: int
) -> tuple[int, ...]:
    """The replicas of journal partition ``partition`` homed on ``home``: ``home`` first, then
    ``replication_factor - 1`` other brokers of ``brokers`` (id → rack), each on a rack not yet
    used while one is left, rotated by ``partition``. ValueError when there are too few."""
    if home not in brokers:
        raise ValueError(f"home broker {home} is not among the brokers {sorted(brokers)}")
    if replication_factor > len(brokers):
        raise ValueError(
            f"replication factor {replication_factor} larger than the {len(brokers)} brokers"
        )
    others = [b for b in rack_alternated(brokers) if b != home]
    if others:
        shift = partition % len(others)
        others = others[shift:] + others[:shift]
    chosen = [home]
    racks = {brokers[home]}
    while len(chosen) < replication_factor:
        pick = next((b for b in others if brokers[b] not in racks), None)
        if pick is None:  # every rack used: any broker not chosen yet
            pick = others[0]
            racks = set()  # start a new round over the racks
        others.remove(pick)
        chosen.append(pick)
        racks.add(brokers[pick])
    return tuple(chosen)


def initial_state(
    assignment: Assignment, live: Iterable[int], controller_epoch: int
) -> PartitionState:
    """A new journal partition's state: the live replicas are the ISR, the first leads."""
    alive = set(live)
    isr = tuple(r for r in assignment.replicas if r in alive)
    return PartitionState(isr[0] if isr else NO_LEADER, 0, isr, controller_epoch)


def elect(
    assignment: Assignment,
    state: PartitionState,
    live: Iterable[int],
    controller_epoch: int,
    unclean: bool = False,
) -> PartitionState | None:
    """The state after the live brokers became ``live``; None when nothing changes (the leader
    is live, or there is still no leader to be had)."""
    alive = set(live)
    if state.leader != NO_LEADER and state.leader in alive:
        return None
    candidates = [r for r in assignment.replicas if r in alive and r in state.isr]
    if candidates:
        leader = candidates[0]
        isr = tuple(r for r in state.isr if r in alive)
    elif unclean and (live_replicas := [r for r in assignment.replicas if r in alive]):
        leader = live_replicas[0]
        isr = (leader,)
    else:
        if state.leader == NO_LEADER:
            return None
        leader, isr = NO_LEADER, state.isr  # Kafka keeps the last ISR for a clean election
    return replace(
        state,
        leader=leader,
        leader_epoch=state.leader_epoch + 1,
        isr=isr,
        controller_epoch=controller_epoch,
    )


def drop_from_isr(
    state: PartitionState, serving: Iterable[int], controller_epoch: int
) -> PartitionState | None:
    """The state once the ISR members that are not ``serving`` (gone from the cluster, or in a
    controlled shutdown) have left it, at the same leader epoch; None when the leader is not
    serving (an election's business) or every ISR member serves. Kafka's controller takes a
    dead broker out of the ISR of the partitions it follows as soon as it is gone, so acks=all
    does not wait ``replica.lag.time.max.ms`` for it; it comes back through its leader once
    it has caught up."""
    keep = set(serving)
    if state.leader not in keep:
        return None
    isr = tuple(b for b in state.isr if b in keep)
    if isr == state.isr:
        return None
    return replace(state, isr=isr, controller_epoch=controller_epoch)


def move_from_full(
    assignment: Assignment,
    state: PartitionState,
    serving: Iterable[int],
    full: Iterable[int],
    controller_epoch: int,
) -> PartitionState | None:
    """The state with the leadership moved off a leader whose copy is out of space: to the
    first assigned ISR member that serves and has room, in the next leader epoch, the ISR
    unchanged (as a preferred election moves it: every acknowledged record is on the new
    leader); None when the leader has room, or no ISR member has (the leader keeps it and
    its appends resume once space returns: moving between full copies helps no one)."""
    out_of_space = set(full)
    if state.leader == NO_LEADER or state.leader not in out_of_space:
        return None
    able = set(serving) - out_of_space
    for replica in assignment.replicas:
        if replica in able and replica in state.isr:
            return replace(
                state,
                leader=replica,
                leader_epoch=state.leader_epoch + 1,
                controller_epoch=controller_epoch,
            )
    return None


PREFERRED_ELECTED = "elected"
PREFERRED_NOT_NEEDED = "not_needed"
PREFERRED_NOT_AVAILABLE = "not_available"


def elect_preferred(
    assignment: Assignment,
    state: PartitionState,
    serving: Iterable[int],
    controller_epoch: int,
) -> tuple[str, PartitionState | None]:
    """Kafka's preferred-replica election for one journal partition: (``PREFERRED_ELECTED``,
    the state with the first assigned replica leading in the next leader epoch and the same
    ISR), (``PREFERRED_NOT_NEEDED``, None) when it already leads, or
    (``PREFERRED_NOT_AVAILABLE``, None) when it is not ``serving`` or not in the ISR (the
    leadership is then left where it is: moving it to any other replica is not a preferred
    election)."""
    preferred = assignment.home
    if state.leader == preferred:
        return PREFERRED_NOT_NEEDED, None
    if preferred not in set(serving) or preferred not in state.isr:
        return PREFERRED_NOT_AVAILABLE, None
    return PREFERRED_ELECTED, replace(
        state,
        leader=preferred,
        leader_epoch=state.leader_epoch + 1,
        controller_epoch=controller_epoch,
    )


def imbalanced(
    partitions: Iterable[tuple[int, Assignment, PartitionState]],
    serving: Iterable[int],
    percentage: int,
) -> set[int]:
    """The journal partitions an automatic rebalance elects again (Kafka's
    ``checkAndTriggerAutoLeaderRebalance``): grouped by home broker, a group in which the
    share led by another broker is above ``percentage`` percent gives its partitions led
    elsewhere whose home broker is ``serving`` (the preferred election then also wants it in
    the ISR). A partition with no leader counts as led elsewhere, as in Kafka."""
    by_home: dict[int, list[tuple[int, PartitionState]]] = {}
    for j, assignment, state in partitions:
        by_home.setdefault(assignment.home, []).append((j, state))
    live = set(serving)
    out: set[int] = set()
    for home, group in by_home.items():
        elsewhere = [j for j, state in group if state.leader != home]
        if len(elsewhere) * 100 > percentage * len(group) and home in live:
            out.update(elsewhere)
    return out
