"""Controller election and journal-partition placement against a real ZooKeeper (Debian's
package; one chroot per test): one controller at a time with a growing controller epoch, a
new controller when it goes (clean stop or expired session), placement that survives, leader
elections as brokers leave and come back, and a deposed controller's writes fenced."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient
from polling import wait_for
from tcplistener import Listener

from stonemq.cluster.controller import (
    NOT_CONTROLLER,
    UNKNOWN_JOURNAL,
    Controller,
    NotControllerError,
    StateChangedError,
    read_controller,
    read_journal_partitions,
)
from stonemq.cluster.journal_state import (
    NO_LEADER,
    PREFERRED_ELECTED,
    PREFERRED_NOT_AVAILABLE,
    PREFERRED_NOT_NEEDED,
    PartitionState,
)
from stonemq.cluster.membership import Membership

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

_chroots = itertools.count()


class Node:
    """One broker's ZooKeeper session, registration and controller candidate."""

    def __init__(
        self, connect: str, broker_id: int, rack: str | None, rf: int, listen: bool = False
    ) -> None:
        self.connect = connect
        self.broker_id = broker_id
        self.client = KazooClient(connect, timeout=4.0)
        self.client.start(10)
        # a real listener when asked (the others watch it: stonemq/cluster/liveness.py);
        # otherwise a port nothing listens on, as a broker still recovering
        self.listener = Listener() if listen else None
        port = self.listener.port if self.listener is not None else 9000 + broker_id
        self.membership = Membership(self.client, broker_id, "127.0.0.1", port, rack)
        self.membership.register()
        self.controller = Controller(self.client, broker_id, 4, rf)
        self.controller.start()

    def stop(self) -> None:
        self.controller.close()
        self.membership.close()
        self.client.stop()
        self.client.close()
        if self.listener is not None and self.listener.listening:
            self.listener.kill()

    def expire_session(self) -> None:
        """Expire this node's session from the server's side (another connection with the
        same session id and password closes it), as a long pause would."""
        session_id, password = self.client.client_id
        other = KazooClient(self.connect.split("/")[0], client_id=(session_id, password))
        other.start(10)
        other.stop()
        other.close()


@pytest.fixture
def cluster(zookeeper: Any) -> Iterator[Callable[..., Node]]:
    chroot = f"/stonemq-ctl-{next(_chroots)}"
    admin = KazooClient(zookeeper.connect)
    admin.start(10)
    admin.ensure_path(chroot)
    admin.stop()
    admin.close()
    root = zookeeper.connect + chroot
    nodes: list[Node] = []

    def start(broker_id: int, rack: str | None = None, rf: int = 1, listen: bool = False) -> Node:
        nodes.append(Node(root, broker_id, rack, rf, listen))
        return nodes[-1]

    yield start
    for node in nodes:
        with contextlib.suppress(Exception):
            node.stop()


def actives(nodes: list[Node]) -> list[int]:
    return [n.broker_id for n in nodes if n.controller.active]


def test_one_controller_places_each_brokers_journal_partitions(cluster) -> None:
    nodes = [cluster(i) for i in (1, 2, 3)]
    wait_for("a controller", lambda: actives(nodes))
    assert len(actives(nodes)) == 1
    controller, epoch = read_controller(nodes[0].client)
    assert controller == actives(nodes)[0] and epoch == 1
    parts = wait_for(
        "12 journal partitions",
        lambda: (p := read_journal_partitions(nodes[0].client)) and len(p) == 12 and p,
    )
    assert sorted(parts) == list(range(12))
    homes = sorted(p.assignment.home for p in parts.values())
    assert homes == [1] * 4 + [2] * 4 + [3] * 4
    for p in parts.values():
        assert p.state == PartitionState(p.assignment.home, 0, (p.assignment.home,), 1)


def test_the_controller_moves_on_and_placement_survives(cluster) -> None:
    nodes = {i: cluster(i) for i in (1, 2, 3)}
    first = wait_for("a controller", lambda: actives(list(nodes.values())))[0]
    before = wait_for(
        "12 journal partitions",
        lambda: (p := read_journal_partitions(nodes[1].client)) and len(p) == 12 and p,
    )
    nodes.pop(first).stop()
    rest = list(nodes.values())
    wait_for("a new controller", lambda: actives(rest))
    assert len(actives(rest)) == 1
    assert read_controller(rest[0].client)[1] == 2
    # the stopped broker's partitions lose their leader (replication factor 1): epoch + 1
    after = wait_for(
        "the stopped broker's partitions offline",
        lambda: (
            (p := read_journal_partitions(rest[0].client))
            and all(p[j].state.leader == NO_LEADER for j in p if p[j].assignment.home == first)
            and p
        ),
    )
    assert {j: p.assignment for j, p in after.items()} == {
        j: p.assignment for j, p in before.items()
    }
    for j, p in after.items():
        if p.assignment.home == first:
            assert p.state.leader_epoch == 1 and p.state.isr == (first,)
        else:
            assert p.state == before[j].state
    # it comes back: it leads its partitions again, in a new leader epoch; nothing new placed
    back = cluster(first)
    final = wait_for(
        "the returning broker leading again",
        lambda: (
            (p := read_journal_partitions(back.client))
            and all(p[j].state.leader == first for j in p if p[j].assignment.home == first)
            and p
        ),
    )
    assert len(final) == 12
    assert all(p.state.leader_epoch == 2 for p in final.values() if p.assignment.home == first)


def test_an_expired_session_ends_its_controllers_reign_and_its_writes(cluster) -> None:
    a = cluster(1)
    wait_for("broker 1 controller", lambda: a.controller.active)
    wait_for("4 journal partitions", lambda: len(read_journal_partitions(a.client)) == 4)
    b = cluster(2)
    wait_for("8 journal partitions", lambda: len(read_journal_partitions(b.client)) == 8)
    a.expire_session()
    wait_for("broker 2 controller", lambda: b.controller.active)
    assert read_controller(b.client) == (2, 2)
    # back on a new session, broker 1 registers again as a broker, not as the controller
    wait_for("broker 1 registered again", lambda: 1 in b.membership.live)
    assert not a.controller.active and read_controller(a.client) == (2, 2)
    # a controller that has not noticed yet (a long pause) writes with its old epoch: refused
    a.controller.active = True
    stale = PartitionState(leader=1, leader_epoch=99, isr=(1,), controller_epoch=1)
    version = read_journal_partitions(b.client)[0].state_version
    with pytest.raises(NotControllerError):
        a.controller._set_state(0, stale, version)
    assert read_journal_partitions(b.client)[0].state.leader_epoch != 99


def test_an_election_never_overwrites_an_isr_change_it_did_not_read(cluster) -> None:
    """The controller writes a journal partition's state at the version it read: a leader's
    ISR change in between (a conditional write of its own) makes the election's write fail,
    so it is taken again from a fresh read instead of undoing the shrink (invariant 7)."""
    a = cluster(1)
    wait_for("broker 1 controller", lambda: a.controller.active)
    wait_for("4 journal partitions", lambda: len(read_journal_partitions(a.client)) == 4)
    before = read_journal_partitions(a.client)[0]
    shrunk = before.state.__class__(
        before.state.leader, before.state.leader_epoch, (), before.state.controller_epoch
    )
    a.client.set("/journal_partitions/0/state", shrunk.to_json(), version=before.state_version)
    elected = before.state.__class__(1, before.state.leader_epoch + 1, (1,), a.controller.epoch)
    with pytest.raises(StateChangedError, match="changed since it was read"):
        a.controller._set_state(0, elected, before.state_version)
    assert read_journal_partitions(a.client)[0].state == shrunk


def test_replicas_follow_racks_and_a_follower_in_the_isr_takes_over(cluster) -> None:
    # placement waits for two live brokers; one per rack first, so every placement can
    # spread over both racks
    nodes = {1: cluster(1, "a", rf=2), 3: cluster(3, "b", rf=2)}
    nodes[2] = cluster(2, "a", rf=2)
    parts = wait_for(
        "12 journal partitions",
        lambda: (p := read_journal_partitions(nodes[1].client)) and len(p) == 12 and p,
    )
    racks = {1: "a", 2: "a", 3: "b"}
    for p in parts.values():
        assert len(p.assignment.replicas) == 2
        assert {racks[r] for r in p.assignment.replicas} == {"a", "b"}
        assert p.state.isr == p.assignment.replicas
    victim = 3
    if nodes[victim].controller.active:
        victim = 2
    nodes.pop(victim).stop()
    moved = wait_for(
        "leaders moved off the stopped broker",
        lambda: (
            (p := read_journal_partitions(nodes[1].client))
            and all(p[j].state.leader != victim for j in p)
            and p
        ),
    )
    for j, p in moved.items():
        if parts[j].state.leader == victim:
            assert p.state.leader == p.assignment.replicas[1]
            assert p.state.leader_epoch == 1 and p.state.isr == (p.assignment.replicas[1],)


def test_a_deposed_leaders_isr_change_fails(cluster) -> None:
    """The leader's ISR writes (stonemq/replication/manager.py write_isr) succeed only while the
    state node names it leader in its epoch: once the controller elected another leader (a
    newer epoch), the old leader's shrink is refused and the node is unchanged."""
    from stonemq.replication.manager import write_isr

    a = cluster(1)
    wait_for("4 journal partitions", lambda: len(read_journal_partitions(a.client)) == 4)
    path = "/journal_partitions/0/state"
    a.client.set(path, PartitionState(1, 5, (1, 2, 3), 1).to_json())
    assert write_isr(a.client, 0, 1, 5, (1, 2))  # the leader in its epoch: written
    assert read_journal_partitions(a.client)[0].state.isr == (1, 2)
    assert write_isr(a.client, 0, 1, 5, (1, 2, 3))  # and grown back
    # the controller elects broker 2 in epoch 6: broker 1's writes in epoch 5 fail
    a.client.set(path, PartitionState(2, 6, (2, 3), 1).to_json())
    assert not write_isr(a.client, 0, 1, 5, (1,))
    assert not write_isr(a.client, 0, 1, 6, (1,))  # not the leader, whatever the epoch
    assert read_journal_partitions(a.client)[0].state == PartitionState(2, 6, (2, 3), 1)


def _registered(node: Node) -> list[int]:
    return sorted(int(c) for c in node.client.get_children("/brokers/ids"))


def test_a_broker_judged_dead_loses_leaderships_and_isrs_before_its_session_ends(
    cluster,
) -> None:
    """A broker whose listener dies (its connections closed, connects refused) while its
    ZooKeeper session lives on: the controller elects new leaders for what it led (leader
    epoch + 1) and takes it out of every ISR within a second, its registration still there.
    Its listener back, it is live again: no election puts it back, the leaders' ISR
    expansion does (not here: no replication in this test)."""
    nodes = {i: cluster(i, rf=3, listen=True) for i in (1, 2, 3)}
    parts = wait_for(
        "12 journal partitions",
        lambda: (p := read_journal_partitions(nodes[1].client)) and len(p) == 12 and p,
    )
    controller = actives(list(nodes.values()))[0]
    victim = next(b for b in nodes if b != controller)
    time.sleep(0.5)  # every watch connected
    nodes[victim].listener.kill()
    started = time.monotonic()
    moved = wait_for(
        "leaders moved off the dead broker and out of every ISR",
        lambda: (
            (p := read_journal_partitions(nodes[controller].client))
            and all(victim not in s.state.isr and s.state.leader != victim for s in p.values())
            and p
        ),
        timeout=10,
    )
    assert time.monotonic() - started < 2.0
    assert victim in _registered(nodes[controller])  # its session has not ended
    for j, p in moved.items():
        before = parts[j].state
        if before.leader == victim:
            assert p.state.leader == p.assignment.replicas[1]
            assert p.state.leader_epoch == before.leader_epoch + 1
        else:
            assert (p.state.leader, p.state.leader_epoch) == (before.leader, before.leader_epoch)
    assert nodes[controller].controller.reach.dead() == {victim}
    nodes[victim].listener.revive()
    wait_for("live again", lambda: not nodes[controller].controller.reach.dead())
    assert actives(list(nodes.values())) == [controller]


def test_a_controller_judged_dead_is_taken_over_and_fenced(cluster) -> None:
    """The controller's listener dies while its session lives on (its ``/controller`` node
    with it): another broker takes over at once with the next controller epoch, the old
    controller resigns on seeing the node name another, and a write it makes with its old
    epoch is refused."""
    nodes = {i: cluster(i, rf=3, listen=True) for i in (1, 2, 3)}
    wait_for(
        "12 journal partitions",
        lambda: len(read_journal_partitions(nodes[1].client)) == 12,
    )
    old = actives(list(nodes.values()))[0]
    _, epoch = read_controller(nodes[old].client)
    time.sleep(0.5)  # every watch connected
    nodes[old].listener.kill()
    started = time.monotonic()
    rest = [n for b, n in nodes.items() if b != old]
    new = wait_for("a new controller", lambda: actives(rest))
    assert time.monotonic() - started < 2.0
    assert len(new) == 1 and read_controller(nodes[old].client) == (new[0], epoch + 1)
    wait_for("the old controller resigned", lambda: not nodes[old].controller.active)
    assert old in _registered(nodes[new[0]])  # its session has not ended
    wait_for(
        "its leaderships moved",
        lambda: all(
            p.state.leader != old for p in read_journal_partitions(nodes[new[0]].client).values()
        ),
    )
    # a controller that has not noticed yet writes with its old epoch: refused
    nodes[old].controller.active = True
    state = read_journal_partitions(nodes[old].client)[0]
    stale = PartitionState(old, 99, (old,), epoch)
    with pytest.raises(NotControllerError):
        nodes[old].controller._set_state(0, stale, state.state_version)
    assert read_journal_partitions(nodes[old].client)[0].state == state.state


def test_a_preferred_election_on_request_moves_leaderships_home_under_the_controller_epoch(
    cluster,
) -> None:
    """ElectLeaders(PREFERRED) reaches the controller's thread: a journal partition led away
    from its home broker (as after a failover) is led by it again in the next leader epoch,
    its ISR unchanged; one whose home broker leads is left alone, one whose home broker is
    not in the ISR too. A broker that is not the controller elects nothing, and a deposed
    controller's write is refused by its controller-epoch check."""
    nodes = {i: cluster(i, rf=2, listen=True) for i in (1, 2)}
    parts = wait_for(
        "8 journal partitions with full ISRs",
        lambda: (
            (p := read_journal_partitions(nodes[1].client))
            and len(p) == 8
            and all(set(q.state.isr) == {1, 2} for q in p.values())
            and p
        ),
    )
    active = wait_for("a controller", lambda: actives(list(nodes.values())))[0]
    ctl, other = nodes[active].controller, nodes[3 - active].controller
    away, behind, home = sorted(j for j, p in parts.items() if p.assignment.home == 1)[:3]
    client = nodes[1].client
    # a failover moved two away from broker 1; broker 1 is back in one's ISR only
    client.set(f"/journal_partitions/{away}/state", PartitionState(2, 3, (2, 1), 1).to_json())
    client.set(f"/journal_partitions/{behind}/state", PartitionState(2, 3, (2,), 1).to_json())
    assert other.elect_preferred({away}).result(10) == {away: NOT_CONTROLLER}
    assert read_journal_partitions(client)[away].state.leader == 2
    outcomes = ctl.elect_preferred({away, behind, home, 99}).result(30)
    assert outcomes == {
        away: PREFERRED_ELECTED,
        behind: PREFERRED_NOT_AVAILABLE,
        home: PREFERRED_NOT_NEEDED,
        99: UNKNOWN_JOURNAL,
    }
    now = read_journal_partitions(client)
    assert now[away].state == PartitionState(1, 4, (2, 1), ctl.epoch)
    assert now[behind].state == PartitionState(2, 3, (2,), 1)
    assert now[home].state == parts[home].state
    # every journal partition (None): only those not led by their home are listed
    client.set(f"/journal_partitions/{away}/state", PartitionState(2, 5, (1, 2), 1).to_json())
    assert ctl.elect_preferred(None).result(30) == {
        **{j: PREFERRED_NOT_NEEDED for j in parts if j not in (away, behind)},
        away: PREFERRED_ELECTED,
        behind: PREFERRED_NOT_AVAILABLE,
    }
    # a deposed controller that does not know it yet (it holds the previous controller
    # epoch's version) writes nothing: its controller-epoch check fails and it stops acting
    client.set(f"/journal_partitions/{away}/state", PartitionState(2, 7, (1, 2), 1).to_json())
    other.epoch, other._epoch_version = ctl.epoch - 1, ctl._epoch_version - 1
    other.active = True
    assert other.elect_preferred({away}).result(30) == {away: NOT_CONTROLLER}
    assert not other.active
    assert read_journal_partitions(client)[away].state == PartitionState(2, 7, (1, 2), 1)
