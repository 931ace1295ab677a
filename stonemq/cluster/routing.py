"""Routing: which journal partitions exist, which this broker hosts (and under which local
storage index), who leads each, and the live brokers' endpoints.

Every topic partition follows its journal partition (../shared/design/cluster.md, invariant
1), so answering "who leads topic partition (t, p)" is answering it for the journal partition
the store maps (t, p) to. Two implementations:

- :class:`SingleNodeRouting`: journal partitions ``0..journal.partitions-1``, all here, all
  led here in leader epoch 0 (the single node, unchanged).
- :class:`ClusterRouting`: read from ZooKeeper (the controller's ``/journal_partitions`` nodes,
  ``/brokers/ids``, ``/controller``) and kept current by watches: one children watch on each
  of those directories and one data watch per journal partition's state; never anything per
  topic partition. The journal partitions this broker hosts are those whose replicas name
  it; the storage engine numbers them locally ``0..k-1`` in the order of the checkpoint file
  ``<journal dir>/hosted-journal-partitions`` (ids only ever appended, so a local index and
  its directory never change meaning).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stonemq.cluster import ClusterStartError
from stonemq.cluster.journal_state import NO_LEADER, Assignment, PartitionState
from stonemq.storage import fileio
from stonemq.storage.checkpoint import CheckpointFile

if TYPE_CHECKING:
    from kazoo.client import KazooClient

# kazoo, and the controller and membership modules that import it, are imported where
# ClusterRouting uses them: a single node (SingleNodeRouting) never loads them, a process size
# bounded by tests/integration/test_process_size.py

log = logging.getLogger(__name__)

HOSTED_FILE = "hosted-journal-partitions"


@dataclass(frozen=True, slots=True)
class BrokerEndpoint:
    broker_id: int
    host: str
    port: int
    rack: str | None


@dataclass(frozen=True, slots=True)
class Leadership:
    """A journal partition's replicas, leader (-1: none), leader epoch and ISR."""

    replicas: tuple[int, ...]
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]


class SingleNodeRouting:
    """One broker: every journal partition here, led here, epoch 0."""

    def __init__(self, broker_id: int, journal_partitions: int, host: str, port: int) -> None:
        self.broker_id = broker_id
        self._count = journal_partitions
        self._self = BrokerEndpoint(broker_id, host, port, None)
        self._leadership = Leadership((broker_id,), broker_id, 0, (broker_id,))

    @property
    def clustered(self) -> bool:
        return False

    def total(self) -> int:
        return self._count

    def hosted(self) -> list[int]:
        return list(range(self._count))

    def local_index(self, journal_partition: int) -> int | None:
        return journal_partition if 0 <= journal_partition < self._count else None

    def leadership(self, journal_partition: int) -> Leadership:
        return self._leadership

    def leads(self, journal_partition: int) -> bool:
        return 0 <= journal_partition < self._count

    def brokers(self) -> list[BrokerEndpoint]:
        return [self._self]

    def broker(self, broker_id: int) -> BrokerEndpoint | None:
        return self._self if broker_id == self.broker_id else None

    def controller_id(self) -> int:
        return self.broker_id

    def dead(self) -> frozenset[int]:
        """Registered brokers judged dead (none on a single node)."""
        return frozenset()

    def replication_factor(self) -> int:
        """The replica count of every journal partition, so of every topic partition (one
        here)."""
        return 1


Routing = SingleNodeRouting  # the interface; ClusterRouting has the same methods


class ClusterRouting(SingleNodeRouting):
    """Routing from ZooKeeper, current through watches (callbacks in kazoo's thread update
    plain dicts the event loop reads; each update replaces a whole entry)."""

    def __init__(self, client: KazooClient, broker_id: int, journal_dir: str) -> None:
        self.client = client
        self.broker_id = broker_id
        self._journal_dir = journal_dir
        self._partitions: dict[int, Leadership] = {}
        self._brokers: dict[int, BrokerEndpoint] = {}
        self._controller = -1
        self._local: dict[int, int] = {}
        self._order: list[int] = []
        self._watched: set[int] = set()
        self.on_change: Callable[[], None] | None = None
        # called (kazoo's thread) with a journal partition placed on this broker that it
        # does not host yet: placed after it started (see :meth:`take_new_hosted`)
        self._on_new_hosted: Callable[[int], None] | None = None
        self._unhosted: list[int] = []
        self._shutting_down: frozenset[int] = frozenset()  # brokers in a controlled shutdown
        self._hook_lock = threading.Lock()
        # registered brokers judged dead before their sessions end: :meth:`dead`
        self._dead: Callable[[], frozenset[int]] = frozenset

    @property
    def clustered(self) -> bool:
        return True

    # -- start-up ---------------------------------------------------------------------------
    def wait_for_placement(self, expected: int, timeout_s: float | None = None) -> list[int]:
        """Wait until the controller has placed ``expected`` journal partitions homed on this
        broker; then fix the local numbering (hosted file) and start watching. Returns the
        hosted journal partitions in local order. Journal partitions placed on this broker
        later (another broker's, as it joins) are reported to :meth:`take_new_hosted`'s
        hook."""
        from stonemq.cluster.controller import (
            CONTROLLER_PATH,
            JOURNAL_PATH,
            read_journal_partitions,
        )
        from stonemq.cluster.membership import BROKER_IDS_PATH, SHUTTING_DOWN_PATH

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        last_log = 0.0
        while True:
            parts = read_journal_partitions(self.client)
            homed = [j for j, p in parts.items() if p.assignment.home == self.broker_id]
            if len(homed) >= expected:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise ClusterStartError(
                    f"the controller placed {len(homed)} of this broker's {expected} journal "
                    f"partitions within {timeout_s:.0f} s (is default.replication.factor more "
                    "than the live brokers?)"
                )
            if time.monotonic() - last_log > 10:
                log.info(
                    "waiting for the controller to place broker %d's journal partitions "
                    "(%d of %d so far)",
                    self.broker_id,
                    len(homed),
                    expected,
                )
                last_log = time.monotonic()
            time.sleep(0.05)
        hosted = sorted(j for j, p in parts.items() if self.broker_id in p.assignment.replicas)
        self._order = self._fix_order(hosted)
        self._local = {j: i for i, j in enumerate(self._order)}
        for j, p in parts.items():
            self._partitions[j] = _leadership(p.assignment, p.state)
        self.client.ChildrenWatch(BROKER_IDS_PATH, self._on_brokers)
        self.client.DataWatch(CONTROLLER_PATH, self._on_controller)
        self.client.ChildrenWatch(JOURNAL_PATH, self._on_journal_partitions)
        self.client.ensure_path(SHUTTING_DOWN_PATH)
        self.client.ChildrenWatch(SHUTTING_DOWN_PATH, self._on_shutting_down)
        return list(self._order)

    def _fix_order(self, hosted: list[int]) -> list[int]:
        """The local numbering: what the hosted file lists, then any new journal partition
        (written back durably before the storage engine opens its directories)."""
        path = os.path.join(self._journal_dir, HOSTED_FILE)
        fileio.makedirs_durable(self._journal_dir)
        checkpoint = CheckpointFile(path, 1)
        known = [int(entry[0]) for entry in checkpoint.read() or []]
        gone = [j for j in known if j not in hosted]
        if gone:
            raise ClusterStartError(
                f"{path} lists journal partitions {gone} that the cluster does not place on "
                f"broker {self.broker_id}: this data directory belongs to another cluster or "
                "broker id"
            )
        order = known + [j for j in hosted if j not in known]
        if order != known:
            checkpoint.write((j,) for j in order)
        return order

    def take_new_hosted(self, hook: Callable[[int], None] | None) -> None:
        """Report to ``hook`` (kazoo's thread, or this one) each journal partition placed on
        this broker after its start, those already seen first; None stops reporting."""
        with self._hook_lock:
            self._on_new_hosted = hook
            seen, self._unhosted = self._unhosted, []
        if hook is not None:
            for j in seen:
                hook(j)

    def host(self, j: int) -> int:
        """Host journal partition ``j`` (placed here after the start) under the next local
        index: appended durably to the hosted file first, so a restart opens the same
        directory for it. The local index is published only by :meth:`publish` (once the
        storage engine has opened it). Returns the new local index."""
        if j in self._local:
            return self._local[j]
        order = [*self._order, j]
        CheckpointFile(os.path.join(self._journal_dir, HOSTED_FILE), 1).write(
            (each,) for each in order
        )
        return len(order) - 1

    def publish(self, j: int, local: int) -> None:
        """Journal partition ``j`` is open in storage under ``local``: route to it."""
        assert local == len(self._order), (j, local, self._order)
        self._order.append(j)
        self._local[j] = local

    # -- watches (kazoo's thread) -----------------------------------------------------------
    def _on_brokers(self, children: list[str]) -> None:
        from stonemq.cluster.membership import read_brokers

        self._brokers = {
            b: BrokerEndpoint(b, node["host"], int(node["port"]), node.get("rack"))
            for b, node in read_brokers(self.client, children).items()
        }
        self._changed()

    def _on_shutting_down(self, children: list[str]) -> None:
        self._shutting_down = frozenset(int(c) for c in children if c.isdigit())

    def shutting_down(self) -> frozenset[int]:
        """Brokers in a controlled shutdown: a leader takes none of them back into an ISR."""
        return self._shutting_down

    def _on_controller(self, data: bytes | None, _stat: object) -> None:
        self._controller = int(json.loads(data)["brokerid"]) if data else -1

    def _on_journal_partitions(self, children: list[str]) -> None:
        for child in children:
            if child.isdigit() and int(child) not in self._watched:
                j = int(child)
                self._watched.add(j)
                self._watch_state(j)

    def _watch_state(self, j: int) -> None:
        from kazoo.exceptions import NoNodeError

        from stonemq.cluster.controller import JOURNAL_PATH

        try:
            data, _ = self.client.get(f"{JOURNAL_PATH}/{j}")
        except NoNodeError:
            self._watched.discard(j)
            return
        assignment = Assignment.from_json(data)

        def on_state(state: bytes | None, _stat: object) -> None:
            if state is not None:
                self._partitions[j] = _leadership(assignment, PartitionState.from_json(state))
                self._changed()

        self.client.DataWatch(f"{JOURNAL_PATH}/{j}/state", on_state)
        if self.broker_id in assignment.replicas and j not in self._local:
            with self._hook_lock:
                hook = self._on_new_hosted
                if hook is None:  # before the broker serves: reported once it does
                    self._unhosted.append(j)
            if hook is not None:
                hook(j)

    def judge_with(self, dead: Callable[[], frozenset[int]]) -> None:
        """Where :meth:`dead` comes from (the controller's reachability watch)."""
        self._dead = dead

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    # -- reads (any thread) -----------------------------------------------------------------
    def total(self) -> int:
        """Journal partitions in the cluster (ids ``0..total-1``: the controller numbers
        them in order); new topics spread over all of them."""
        return max(self._partitions, default=-1) + 1

    def hosted(self) -> list[int]:
        return list(self._order)

    def local_index(self, journal_partition: int) -> int | None:
        return self._local.get(journal_partition)

    def journal_of(self, local: int) -> int:
        """The journal partition stored under local index ``local``."""
        return self._order[local]

    def leadership(self, journal_partition: int) -> Leadership:
        found = self._partitions.get(journal_partition)
        return found if found is not None else Leadership((), NO_LEADER, -1, ())

    def leads(self, journal_partition: int) -> bool:
        return (
            journal_partition in self._local
            and self.leadership(journal_partition).leader == self.broker_id
        )

    def brokers(self) -> list[BrokerEndpoint]:
        """The registered brokers (those judged dead too, until their sessions end: see
        :meth:`dead`)."""
        return [self._brokers[b] for b in sorted(self._brokers)]

    def broker(self, broker_id: int) -> BrokerEndpoint | None:
        return self._brokers.get(broker_id)

    def dead(self) -> frozenset[int]:
        """Registered brokers judged dead before their sessions end, and those whose
        connection has just closed and are being tried again (the controller's reachability
        watch, ``Reachability.unreachable``: stonemq/cluster/liveness.py). Elections never
        use this, only client answers and ISR expansion. They stay in :meth:`brokers` until
        their sessions end: librdkafka decommissions a broker that leaves the Metadata
        response's broker list and forgets the leader of every partition still moving off
        it, which costs its 1 s metadata scan right when it is finding the new leader. A
        partition led by one is answered LEADER_NOT_AVAILABLE (handlers/metadata.py)."""
        return self._dead()

    def controller_id(self) -> int:
        return self._controller

    def replication_factor(self) -> int:
        """The replica count of the cluster's journal partitions: the controller places every
        one with its ``default.replication.factor`` (stonemq/cluster/controller.py), so every
        topic partition has this many replicas whatever its creator asked for."""
        return max((len(lead.replicas) for lead in list(self._partitions.values())), default=1)


def offline_replicas(
    routing: SingleNodeRouting, replicas: tuple[int, ...], dead: frozenset[int] | None = None
) -> tuple[int, ...]:
    """The replicas of ``replicas`` on brokers that are not live: not registered, or judged
    dead before their sessions end (:meth:`ClusterRouting.dead`). The one judgement behind
    Metadata's and DescribeTopicPartitions' ``offline_replicas`` and behind the placement of
    new topic partitions (stonemq/topics.py); ``dead`` is ``routing.dead()`` when the caller
    has it already."""
    if dead is None:
        dead = routing.dead()
    return tuple(r for r in replicas if r in dead or routing.broker(r) is None)


def live_leader(
    routing: SingleNodeRouting, lead: Leadership, dead: frozenset[int] | None = None
) -> int:
    """``lead``'s leader if it is live (registered and not judged dead), else -1: the one
    judgement behind Metadata's and DescribeTopicPartitions' leader (LEADER_NOT_AVAILABLE
    with -1, as Kafka, so clients ask again instead of waiting on a dead leader)."""
    if dead is None:
        dead = routing.dead()
    leader = lead.leader
    return leader if leader >= 0 and leader not in dead and routing.broker(leader) else -1


def _leadership(assignment: Assignment, state: PartitionState) -> Leadership:
    return Leadership(assignment.replicas, state.leader, state.leader_epoch, state.isr)
