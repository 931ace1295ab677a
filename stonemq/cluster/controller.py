"""The controller: elected through ZooKeeper, it places journal partitions and elects their
leaders; and the view every broker keeps of the journal partitions' state.

Election, as Kafka's ZooKeeper-mode controller: every broker watches the ephemeral
``/controller`` node; when it is absent each tries one transaction that creates it and bumps
``/controller_epoch`` from the version it read. One wins; its controller epoch is the new
value. Every write the controller makes afterwards is a transaction that also checks
``/controller_epoch``'s version, so a controller that lost its session (a long pause) can
never write once another was elected: its writes fail and it resigns. A lost session makes it
stop acting at once, before any new election.

A broker whose copy of a journal partition goes offline (fail-stop: a write, fsync or
read error, ``storage/health.py``) says so with an ephemeral node under
``/brokers/offline_journal_replicas``: to the controller that broker is then not live for that
journal partition only (another ISR member leads it, and it leaves the ISR), as Kafka's
controller treats the replicas of a failed log directory. The node goes with the broker's
session; the restarted broker recovers its copy and rejoins the ISR by catching up.

State, per journal partition only (never per topic partition):

- ``/journal_partitions/<j>``: the assignment ``{"version": 1, "replicas": [...]}``
- ``/journal_partitions/<j>/state``: leader, leader epoch, ISR, controller epoch; written by
  the controller (elections) and by the leader (ISR changes), each at the version it read

The controller acts in one thread, on events (became controller, brokers changed, a preferred
election asked for), so its decisions never interleave. Placement and election rules are
:mod:`stonemq.cluster.journal_state`.

**Preferred elections on request** (ElectLeaders, election type PREFERRED; Kafka's
``processReplicaLeaderElection``): the controller moves a journal partition's leadership to its
first assigned replica when that replica serves (live, not judged dead, its copy online, not
stopping) and is in the ISR, in the next leader epoch with the ISR unchanged, by the same
conditional write as an election (at the state version it read, under the controller epoch).
Nothing acknowledged can be lost: acks=all was answered only once every ISR member, the new
leader among them, held the record, and the ISR is not changed by the move; a leader's ISR
shrink made meanwhile fails the write, and the election is decided again from a fresh read
(the preferred replica may no longer be in the ISR). The old leader's ISR changes name the
state version it read and fail once the move is written; it resigns as soon as its watch
sees the new epoch, and the followers fetch from the new leader from then on, so its high
watermark cannot pass what the new leader holds. Only the controller runs these: a broker
that is not the controller answers NOT_CONTROLLER, as Kafka's ZooKeeper-mode brokers do.
The same election also runs by itself (``auto.leader.rebalance.enable``): every
``leader.imbalance.check.interval.seconds`` the controller's thread takes the journal
partitions of a home broker that leads too few of its own (``journal_state.imbalanced``).

**Deaths before the session ends.** Every broker watches the listeners of the others
(:mod:`stonemq.cluster.liveness`): a broker whose connection closed and whose listener then
refuses connections (a killed process: its kernel closed its sockets) is judged dead without
waiting ``zookeeper.session.timeout.ms`` for its registration to go. To the controller a
broker judged dead is not live: the journal partitions it led get new leaders from their ISR
(the leader epoch bumped) and it leaves every ISR, through the same conditional writes as on
its session's expiry. A wrong judgement (a live broker whose listener could not be reached)
is safe for the same reasons a paused leader's deposition is: its ISR changes are conditional
writes naming its old epoch, which fail; its followers fetch from the new leader once they
see the new state, so its high watermark cannot pass what the new leader holds; and once its
listener accepts again it is live, follows, truncates to the new leader's epoch boundary and
rejoins the ISR by catching up.

A dead controller holds ``/controller`` until its session ends. A broker that judges the
controller dead takes over in one transaction: it checks that ``/controller_epoch`` is still
at the version written by that controller's election (the zxid that created ``/controller``
is the one that last wrote ``/controller_epoch``), deletes ``/controller``, creates its own
and bumps the epoch. If the judgement was wrong, the old controller's next write fails its
epoch check and it resigns (it also resigns as soon as it sees ``/controller`` name another
broker), exactly as a controller whose session expired.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError
from kazoo.protocol.states import KazooState

from stonemq.cluster.journal_state import (
    NO_LEADER,
    PREFERRED_ELECTED,
    PREFERRED_NOT_AVAILABLE,
    Assignment,
    PartitionState,
    drop_from_isr,
    elect,
    elect_preferred,
    imbalanced,
    initial_state,
    move_from_full,
    place_replicas,
)
from stonemq.cluster.liveness import Reachability, Registration
from stonemq.cluster.membership import (
    BROKER_IDS_PATH,
    CLOSE_TIMEOUT_S,
    FULL_REPLICAS_PATH,
    OFFLINE_REPLICAS_PATH,
    SHUTTING_DOWN_PATH,
    read_brokers,
    read_full_replicas,
    read_offline_replicas,
)

log = logging.getLogger(__name__)

CONTROLLER_PATH = "/controller"
CONTROLLER_EPOCH_PATH = "/controller_epoch"
JOURNAL_PATH = "/journal_partitions"

# outcomes of a preferred election besides journal_state's PREFERRED_*
NOT_CONTROLLER = "not_controller"
UNKNOWN_JOURNAL = "unknown"  # no such journal partition
ELECTION_FAILED = "failed"  # ZooKeeper failed (the write may or may not have been applied)
PREFERRED_ATTEMPTS = 10  # fresh reads when a leader's ISR change raced the write


@dataclass(frozen=True)
class LeaderRebalance:
    """Kafka's automatic preferred-leader rebalance: ``auto.leader.rebalance.enable``,
    ``leader.imbalance.check.interval.seconds``, ``leader.imbalance.per.broker.percentage``."""

    enable: bool = True
    interval_s: float = 300.0
    percentage: int = 10


class NotControllerError(Exception):
    """This broker is no longer the controller (another was elected, or its session is gone)."""


class StateChangedError(RuntimeError):
    """A conditional write found a node changed since it was read (a leader's ISR change in
    between): expected, the event is decided again from a fresh read."""


@dataclass(frozen=True)
class JournalPartition:
    """A journal partition as the cluster knows it."""

    id: int
    assignment: Assignment
    state: PartitionState
    state_version: int = -1  # the state node's ZooKeeper version when read


def read_journal_partitions(client: KazooClient) -> dict[int, JournalPartition]:
    """Every journal partition's assignment and state, read from ZooKeeper."""
    out: dict[int, JournalPartition] = {}
    try:
        children = client.retry(client.get_children, JOURNAL_PATH)
    except NoNodeError:
        return out
    ids = [c for c in children if c.isdigit()]
    # every read sent at once (one round trip, not two per journal partition: the
    # controller's elections wait for this); a failure other than a missing node is read again
    # one by one, with kazoo's retry
    pending = [
        (
            c,
            client.get_async(f"{JOURNAL_PATH}/{c}"),
            client.get_async(f"{JOURNAL_PATH}/{c}/state"),
        )
        for c in ids
    ]
    for child, assignment_read, state_read in pending:
        try:
            try:
                data, _ = assignment_read.get()
                state, stat = state_read.get()
            except NoNodeError:
                raise
            except Exception:
                data, _ = client.retry(client.get, f"{JOURNAL_PATH}/{child}")
                state, stat = client.retry(client.get, f"{JOURNAL_PATH}/{child}/state")
        except NoNodeError:
            continue  # being created: its transaction writes both nodes at once
        j = int(child)
        out[j] = JournalPartition(
            j, Assignment.from_json(data), PartitionState.from_json(state), stat.version
        )
    return dict(sorted(out.items()))


def read_controller(client: KazooClient) -> tuple[int, int]:
    """(controller broker id or -1, controller epoch or 0) as ZooKeeper holds them."""
    try:
        data, _ = client.retry(client.get, CONTROLLER_PATH)
        controller = int(json.loads(data)["brokerid"])
    except NoNodeError:
        controller = -1
    try:
        epoch_data, _ = client.retry(client.get, CONTROLLER_EPOCH_PATH)
        epoch = int(epoch_data)
    except NoNodeError:
        epoch = 0
    return controller, epoch


class Controller:
    """This broker's part in controller election and, while elected, the controller's work.

    ``journal_partitions`` is how many journal partitions each broker brings (placed when it
    first joins), ``replication_factor`` their replica count (placement waits until that many
    brokers are live)."""

    def __init__(
        self,
        client: KazooClient,
        broker_id: int,
        journal_partitions: int,
        replication_factor: int,
        unclean_leader_election: bool | Callable[[], bool] = False,
        on_elected: Callable[[int], None] | None = None,
        rebalance: LeaderRebalance | None = None,
    ) -> None:
        self.client = client
        self.broker_id = broker_id
        self.journal_partitions = journal_partitions
        self.replication_factor = replication_factor
        # unclean.leader.election.enable, read at each election: a dynamic broker config
        self._unclean = (
            unclean_leader_election
            if callable(unclean_leader_election)
            else (lambda: bool(unclean_leader_election))
        )
        self._on_elected = on_elected
        self._rebalance = rebalance or LeaderRebalance()
        self.epoch = 0  # this broker's controller epoch while it is the controller
        self._epoch_version = -1  # /controller_epoch's version that epoch was written at
        self.active = False
        self._events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name=f"stonemq-controller-{broker_id}", daemon=True
        )
        # the other brokers' listeners, watched for deaths before their sessions end
        self.reach = Reachability(broker_id, self._on_reach)

    # -- election -------------------------------------------------------------------------
    def start(self) -> None:
        self.client.retry(self.client.ensure_path, JOURNAL_PATH)
        self.client.retry(self.client.ensure_path, BROKER_IDS_PATH)
        self.client.retry(self.client.ensure_path, SHUTTING_DOWN_PATH)
        self.client.retry(self.client.ensure_path, OFFLINE_REPLICAS_PATH)
        self.client.retry(self.client.ensure_path, FULL_REPLICAS_PATH)
        with contextlib.suppress(NodeExistsError):
            self.client.retry(self.client.create, CONTROLLER_EPOCH_PATH, b"0")
        self._thread.start()
        self.reach.start()
        self.client.add_listener(self._on_session)
        self.client.DataWatch(CONTROLLER_PATH, self._on_controller_node)
        self.client.ChildrenWatch(BROKER_IDS_PATH, self._on_brokers)
        self.client.ChildrenWatch(SHUTTING_DOWN_PATH, self._on_brokers)
        self.client.ChildrenWatch(OFFLINE_REPLICAS_PATH, self._on_brokers)
        self.client.ChildrenWatch(FULL_REPLICAS_PATH, self._on_brokers)

    def _on_session(self, state: KazooState) -> None:
        if state == KazooState.LOST:
            # the ephemeral /controller is gone with the session: stop acting at once
            if self.active:
                log.warning("controller %d: ZooKeeper session lost, resigning", self.broker_id)
            self.active = False
        elif state == KazooState.CONNECTED:
            self._events.put(("elect", None))

    def _on_controller_node(self, data: bytes | None, _stat: object) -> bool | None:
        if self._closed:
            return False
        if data is None:
            self._events.put(("elect", None))
            return None
        holder = int(json.loads(data)["brokerid"])
        if holder != self.broker_id and self.active:
            # another broker took over (it judged this one dead): stop acting at once; any
            # write already under way fails its controller-epoch check anyway
            log.warning(
                "controller %d: broker %d is the controller now, resigning", self.broker_id, holder
            )
            self.active = False
        if holder in self.reach.dead():  # judged dead before this controller was seen
            self._events.put(("reach", holder))
        return None

    def _on_reach(self, broker: int, dead: bool) -> None:
        """The reachability watch judged ``broker`` dead (or live again)."""
        self._events.put(("reach", broker))

    def unclean_from(self, read: Callable[[], bool]) -> None:
        """Read unclean.leader.election.enable from ``read`` at each election from now on
        (the broker's effective value: dynamic over static)."""
        self._unclean = read

    def configs_changed(self) -> None:
        """Dynamic broker configs changed (unclean.leader.election.enable): a controller
        decides every journal partition's leadership again, so a leaderless one gets an
        unclean leader as soon as that is allowed, as Kafka's controller does."""
        self._events.put(("brokers", None))

    def _on_brokers(self, children: list[str]) -> bool | None:
        if self._closed:
            return False
        self._events.put(("brokers", None))
        return None

    def _try_elect(self) -> None:
        if self.active:
            return
        try:
            data, stat = self.client.retry(self.client.get, CONTROLLER_EPOCH_PATH)
            node = json.dumps(
                {
                    "version": 1,
                    "brokerid": self.broker_id,
                    "timestamp": str(int(time.time() * 1000)),
                }
            ).encode()
            tx = self.client.transaction()
            tx.create(CONTROLLER_PATH, node, ephemeral=True)
            tx.set_data(CONTROLLER_EPOCH_PATH, str(int(data) + 1).encode(), version=stat.version)
            results = tx.commit()
        except Exception as exc:  # a lost connection: the next session event elects again
            log.debug("controller election by %d failed: %s", self.broker_id, exc)
            return
        if any(isinstance(r, Exception) for r in results):
            return  # another broker is the controller
        self._became_controller(int(data) + 1, stat.version + 1, "")

    def _take_over(self) -> None:
        """Take the controller's role from a controller judged dead (its ``/controller``
        node lives until its session ends): one transaction that holds only while
        ``/controller_epoch`` is still at the version that controller's election wrote."""
        if self.active:
            return
        try:
            node, node_stat = self.client.retry(self.client.get, CONTROLLER_PATH)
            holder = int(json.loads(node)["brokerid"])
            if holder == self.broker_id or holder not in self.reach.dead():
                return
            data, stat = self.client.retry(self.client.get, CONTROLLER_EPOCH_PATH)
            if stat.mzxid != node_stat.czxid:
                return  # not the epoch that controller's election wrote: let it be
            me = json.dumps(
                {
                    "version": 1,
                    "brokerid": self.broker_id,
                    "timestamp": str(int(time.time() * 1000)),
                }
            ).encode()
            tx = self.client.transaction()
            tx.delete(CONTROLLER_PATH)
            tx.create(CONTROLLER_PATH, me, ephemeral=True)
            tx.set_data(CONTROLLER_EPOCH_PATH, str(int(data) + 1).encode(), version=stat.version)
            results = tx.commit()
        except NoNodeError:  # its session ended meanwhile: the ordinary election follows
            return
        if any(isinstance(r, Exception) for r in results):
            return  # another broker took over first
        self._became_controller(
            int(data) + 1, stat.version + 1, f", taken over from broker {holder}, judged dead"
        )

    def _became_controller(self, epoch: int, epoch_version: int, how: str) -> None:
        self.epoch = epoch
        self._epoch_version = epoch_version
        self.active = True
        log.info("broker %d is the controller (controller epoch %d%s)", self.broker_id, epoch, how)
        if self._on_elected is not None:
            self._on_elected(self.epoch)
        self._events.put(("brokers", None))

    # -- the controller's work -------------------------------------------------------------
    def _run(self) -> None:
        every = self._rebalance.interval_s
        next_check = time.monotonic() + every
        while True:
            if self._rebalance.enable and time.monotonic() >= next_check:
                next_check = time.monotonic() + every
                self._rebalance_event()
            timeout = max(0.0, next_check - time.monotonic()) if self._rebalance.enable else None
            try:
                kind, payload = self._events.get(timeout=timeout)
            except queue.Empty:
                continue
            if kind == "stop":
                self._answer_pending()
                return
            if kind == "preferred":
                wanted, done = payload  # type: ignore[misc]
                self._preferred_event(wanted, done)
                continue
            try:
                if kind == "elect":
                    self._try_elect()
                elif kind == "brokers":
                    self._watch_registrations()
                    if self.active:
                        self._brokers_changed()
                elif kind == "reach":
                    if self.active:
                        self._brokers_changed()
                    else:
                        self._take_over()
            except NotControllerError as exc:
                log.warning("controller %d resigns: %s", self.broker_id, exc)
                self.active = False
            except StateChangedError as exc:
                log.info("controller %d: %s; deciding again", self.broker_id, exc)
                time.sleep(0.05)
                self._events.put((kind, None))
            except Exception:
                log.exception("controller %d: %s event failed; retrying", self.broker_id, kind)
                time.sleep(0.5)
                self._events.put((kind, None))

    # -- automatic rebalance ---------------------------------------------------------------
    def _rebalance_event(self) -> None:
        """Kafka's ``checkAndTriggerAutoLeaderRebalance``, every
        ``leader.imbalance.check.interval.seconds`` while this broker is the controller: the
        journal partitions of a home broker leading too few of its own (``imbalanced``) get
        a preferred election, the same conditional write as one asked for by ElectLeaders.
        After a broker restarts, its leaderships come back to it by themselves."""
        if not self.active:
            return
        try:
            partitions = read_journal_partitions(self.client)
            shutting = self._shutting_down()
            serving = [b for b in self._live_brokers() if b not in shutting]
            wanted = imbalanced(
                ((j, p.assignment, p.state) for j, p in partitions.items()),
                serving,
                self._rebalance.percentage,
            )
            if not wanted:
                return
            log.info(
                "controller %d: leader imbalance above %d%%, preferred election of journal "
                "partitions %s",
                self.broker_id,
                self._rebalance.percentage,
                sorted(wanted),
            )
            outcomes: dict[int, str] = {}
            self._elect_preferred(frozenset(wanted), outcomes)
        except NotControllerError as exc:
            log.warning("controller %d resigns: %s", self.broker_id, exc)
            self.active = False
        except Exception:
            log.exception("controller %d: automatic leader rebalance failed", self.broker_id)

    # -- preferred elections on request ---------------------------------------------------
    def elect_preferred(
        self, journals: Iterable[int] | None
    ) -> concurrent.futures.Future[dict[int, str]]:
        """Have the controller's thread run a preferred election for ``journals`` (None:
        every journal partition); the future's result maps each journal partition to its
        outcome: journal_state's ``PREFERRED_*``, or ``NOT_CONTROLLER``, ``UNKNOWN_JOURNAL``,
        ``ELECTION_FAILED``. With ``journals`` None only the journal partitions found are
        listed."""
        done: concurrent.futures.Future[dict[int, str]] = concurrent.futures.Future()
        wanted = None if journals is None else frozenset(journals)
        if not self.active or self._closed:
            done.set_result({j: NOT_CONTROLLER for j in wanted or ()})
        else:
            self._events.put(("preferred", (wanted, done)))
        return done

    def _preferred_event(
        self, wanted: frozenset[int] | None, done: concurrent.futures.Future[dict[int, str]]
    ) -> None:
        outcomes: dict[int, str] = {}
        try:
            self._elect_preferred(wanted, outcomes)
        except Exception:
            log.exception("controller %d: preferred election failed", self.broker_id)
        undecided = NOT_CONTROLLER if not self.active else ELECTION_FAILED
        for j in wanted or ():
            outcomes.setdefault(j, undecided)
        if not done.done():
            done.set_result(outcomes)

    def _elect_preferred(self, wanted: frozenset[int] | None, outcomes: dict[int, str]) -> None:
        """Decide and write each wanted journal partition's preferred election into
        ``outcomes``; one whose write found its state changed (a leader's ISR change) is
        decided again from a fresh read."""
        for _ in range(PREFERRED_ATTEMPTS):
            if not self.active:
                return
            partitions = read_journal_partitions(self.client)
            todo = set(partitions) if wanted is None else set(wanted)
            todo -= outcomes.keys()
            for j in todo - partitions.keys():
                outcomes[j] = UNKNOWN_JOURNAL
            todo &= partitions.keys()
            if not todo:
                return
            live = self._live_brokers()
            offline = read_offline_replicas(self.client)
            full = read_full_replicas(self.client)
            shutting = self._shutting_down()
            changes: list[tuple[JournalPartition, PartitionState]] = []
            for j in sorted(todo):
                p = partitions[j]
                down = offline.get(j, set()) | full.get(j, set())  # no leadership back yet
                serving = [b for b in live if b not in down and b not in shutting]
                outcome, new = elect_preferred(p.assignment, p.state, serving, self.epoch)
                if new is None:
                    outcomes[j] = outcome
                else:
                    changes.append((p, new))
            if not changes:
                return
            sent = []
            for p, new in changes:
                tx = self._fenced()
                tx.set_data(f"{JOURNAL_PATH}/{p.id}/state", new.to_json(), version=p.state_version)
                sent.append((p, new, tx.commit_async()))
            raced = False
            for p, new, pending in sent:
                try:
                    self._check(pending.get(), f"set journal partition {p.id}'s state")
                except StateChangedError:
                    raced = True  # decided again from a fresh read
                    continue
                except NotControllerError as exc:
                    if self.active:
                        log.warning("controller %d resigns: %s", self.broker_id, exc)
                    self.active = False
                    continue
                outcomes[p.id] = PREFERRED_ELECTED
                log.info(
                    "journal partition %d: preferred replica elected, leader %d -> %d, "
                    "leader epoch %d, isr %s",
                    p.id,
                    p.state.leader,
                    new.leader,
                    new.leader_epoch,
                    list(new.isr),
                )
            if not raced:
                return
            time.sleep(0.05)
        for j in wanted or ():
            outcomes.setdefault(j, PREFERRED_NOT_AVAILABLE)  # its state kept changing

    def _answer_pending(self) -> None:
        """Stopping: answer the preferred elections still queued (not the controller)."""
        while True:
            try:
                kind, payload = self._events.get_nowait()
            except queue.Empty:
                return
            if kind == "preferred":
                wanted, done = payload  # type: ignore[misc]
                if not done.done():
                    done.set_result({j: NOT_CONTROLLER for j in wanted or ()})

    def _live_brokers(self) -> dict[int, str | None]:
        """The live brokers and their racks: registered and not judged dead."""
        dead = self.reach.dead()
        return {
            b: node.get("rack") for b, node in read_brokers(self.client).items() if b not in dead
        }

    def _watch_registrations(self) -> None:
        """Give the reachability watch the registered brokers' listeners (with the zxid that
        created each registration: a broker registered anew is judged afresh)."""
        try:
            ids = self.client.retry(self.client.get_children, BROKER_IDS_PATH)
        except NoNodeError:
            ids = []
        found: dict[int, Registration] = {}
        for child in ids:
            if not child.isdigit():
                continue
            try:
                data, stat = self.client.retry(self.client.get, f"{BROKER_IDS_PATH}/{child}")
            except NoNodeError:
                continue
            node = json.loads(data)
            found[int(child)] = Registration(str(node["host"]), int(node["port"]), stat.czxid)
        self.reach.set_brokers(found)

    def _brokers_changed(self) -> None:
        """Place the journal partitions of brokers that have none, elect a leader for every
        journal partition whose leader is not live (or is stopping, or has its copy offline),
        and take brokers that are gone or stopping out of the ISR of the partitions they
        follow, and out of the ISR of those whose copy they have offline."""
        live = self._live_brokers()
        partitions = read_journal_partitions(self.client)
        homed: dict[int, int] = {}
        for p in partitions.values():
            homed[p.assignment.home] = homed.get(p.assignment.home, 0) + 1
        next_id = max(partitions, default=-1) + 1
        if len(live) >= self.replication_factor:
            for broker in sorted(b for b in live if homed.get(b, 0) < self.journal_partitions):
                for _ in range(self.journal_partitions - homed.get(broker, 0)):
                    replicas = place_replicas(broker, live, self.replication_factor, next_id)
                    assignment = Assignment(replicas)
                    state = initial_state(assignment, live, self.epoch)
                    self._create(next_id, assignment, state)
                    next_id += 1
                log.info(
                    "controller %d placed %d journal partitions homed on broker %d",
                    self.broker_id,
                    self.journal_partitions,
                    broker,
                )
        shutting = self._shutting_down() & set(live)
        offline = read_offline_replicas(self.client)
        full = read_full_replicas(self.client)
        unclean = self._unclean()
        changes: list[tuple[JournalPartition, PartitionState]] = []
        for p in partitions.values():
            down = offline.get(p.id, set())  # brokers whose copy of it failed
            short = full.get(p.id, set())  # brokers whose copy of it is out of space
            up = {b: r for b, r in live.items() if b not in down} if down else live
            serving = {b: r for b, r in up.items() if b not in shutting}
            new = elect(p.assignment, p.state, up, self.epoch, unclean)
            if new is not None and new.leader in short:  # one with room rather, if any
                roomy = {b: r for b, r in up.items() if b not in short}
                better = elect(p.assignment, p.state, roomy, self.epoch, unclean)
                if better is not None and better.leader != NO_LEADER:
                    new = better
            if new is None and p.state.leader in shutting:  # a controlled shutdown: another
                new = elect(p.assignment, p.state, serving, self.epoch)  # ISR member leads
                if new is not None and new.leader == NO_LEADER:
                    new = None  # none: it stays with the stopping broker until it is gone
            if new is None and short:  # a leader out of space: an ISR member with room leads
                new = move_from_full(p.assignment, p.state, serving, short, self.epoch)
            if new is None or (short and new.leader != NO_LEADER):
                # a follower gone from the cluster, stopping (Kafka's controlled shutdown) or
                # out of space leaves the ISR now: acks=all does not wait
                # replica.lag.time.max.ms for it
                base = new or p.state
                keep = {b for b in serving if b not in short or b == base.leader}
                new = drop_from_isr(base, keep, self.epoch) or new
            if new is not None:
                changes.append((p, new))
        # leaderless partitions first: each write waits for ZooKeeper's disk, and producers
        # wait for the elections, not for the ISR changes
        changes.sort(key=lambda c: c[1].leader == c[0].state.leader)
        self._set_states(changes)

    def _set_states(self, changes: list[tuple[JournalPartition, PartitionState]]) -> None:
        """Write each new state at the version its election read (:meth:`_set_state`), all
        sent at once (one session keeps their order; ZooKeeper commits them in one go)."""
        sent = []
        for p, new in changes:
            tx = self._fenced()
            tx.set_data(f"{JOURNAL_PATH}/{p.id}/state", new.to_json(), version=p.state_version)
            sent.append((p, new, tx.commit_async()))
        failure: Exception | None = None
        for p, new, pending in sent:
            try:
                self._check(pending.get(), f"set journal partition {p.id}'s state")
            except Exception as exc:
                failure = failure if isinstance(failure, NotControllerError) else exc
                continue
            log.info(
                "journal partition %d: leader %d -> %d, leader epoch %d, isr %s",
                p.id,
                p.state.leader,
                new.leader,
                new.leader_epoch,
                list(new.isr),
            )
        if failure is not None:
            raise failure

    def _shutting_down(self) -> set[int]:
        """Brokers in a controlled shutdown (their nodes under ``/brokers/shutting_down``)."""
        try:
            children = self.client.retry(self.client.get_children, SHUTTING_DOWN_PATH)
        except NoNodeError:
            return set()
        return {int(c) for c in children if c.isdigit()}

    def _create(self, j: int, assignment: Assignment, state: PartitionState) -> None:
        tx = self._fenced()
        tx.create(f"{JOURNAL_PATH}/{j}", assignment.to_json())
        tx.create(f"{JOURNAL_PATH}/{j}/state", state.to_json())
        self._commit(tx, f"create journal partition {j}")

    def _set_state(self, j: int, state: PartitionState, version: int) -> None:
        """Write ``j``'s new state at the version the election read: a leader's ISR change
        made since (stonemq/replication/manager.py) fails this write, and the event is taken
        again from a fresh read, so an election never undoes an ISR shrink (invariant 7)."""
        tx = self._fenced()
        tx.set_data(f"{JOURNAL_PATH}/{j}/state", state.to_json(), version=version)
        self._commit(tx, f"set journal partition {j}'s state")

    def _fenced(self):  # type: ignore[no-untyped-def]
        """A transaction that commits only while this broker's controller epoch is current."""
        if not self.active:
            raise NotControllerError("not the controller")
        tx = self.client.transaction()
        tx.check(CONTROLLER_EPOCH_PATH, self._epoch_version)
        return tx

    def _commit(self, tx, what: str) -> None:  # type: ignore[no-untyped-def]
        """Commit (no retry: a transaction retried after a lost connection could apply
        twice; the event is taken again from a fresh read instead)."""
        self._check(tx.commit(), what)

    def _check(self, results: list[object], what: str) -> None:
        """Raise for a failed transaction's ``results``: NotControllerError when its
        controller-epoch check failed, RuntimeError for another failure."""
        failed = [r for r in results if isinstance(r, Exception)]
        if not failed:
            return
        if isinstance(results[0], (BadVersionError, NoNodeError)):
            raise NotControllerError(f"controller epoch {self.epoch} is no longer current")
        cause = next((r for r in failed if not isinstance(r, RolledBackError)), failed[0])
        if isinstance(cause, BadVersionError):
            raise StateChangedError(f"{what}: a node changed since it was read")
        raise RuntimeError(f"{what}: {cause!r}")

    def close(self) -> None:
        """Stop; resign (delete /controller) if elected, so another takes over at once."""
        self._closed = True
        was_active, self.active = self.active, False
        self._events.put(("stop", None))
        if self._thread.is_alive():
            self._thread.join(10)
        self._answer_pending()
        self.reach.close()
        if was_active and self.client.connected:
            try:
                data, _ = self.client.get_async(CONTROLLER_PATH).get(timeout=CLOSE_TIMEOUT_S)
                if int(json.loads(data)["brokerid"]) == self.broker_id:
                    self.client.delete_async(CONTROLLER_PATH).get(timeout=CLOSE_TIMEOUT_S)
            except Exception as exc:  # its session ends next, taking the node with it
                log.debug("controller %d: /controller not deleted: %s", self.broker_id, exc)
