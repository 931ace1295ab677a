"""This broker's registration in ZooKeeper and the view of the live brokers.

Each broker holds an ephemeral node ``/brokers/ids/<broker.id>`` (Kafka's layout: host, port,
endpoints, rack, registration time) for as long as its ZooKeeper session lives. A broker id
already registered by another session is refused at start, as Kafka refuses it, once that
registration has outlived a session timeout: a broker restarted right after a crash finds its
previous run's node, which lives until that session expires (the cluster has moved on by then:
stonemq/cluster/liveness.py), so it waits for the expiry instead of failing. When
the session expires (a long pause, a partition from ZooKeeper), the node is gone; once a new
session is up the broker registers again, as Kafka's brokers do.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.protocol.states import KazooState

from stonemq.cluster import ClusterStartError

CLOSE_TIMEOUT_S = 2.0
"""How long a stop waits for each ZooKeeper call it makes (deregistration, resignation)."""

log = logging.getLogger(__name__)

BROKER_IDS_PATH = "/brokers/ids"
# brokers in a controlled shutdown (ephemeral nodes, one per broker id): the controller moves
# their leaderships to other ISR members before they stop
SHUTTING_DOWN_PATH = "/brokers/shutting_down"
# journal partitions whose copy on a broker went offline (fail-stop: storage/health.py): one
# ephemeral node ``<journal>-<broker>`` each, gone with the broker's session (a restart
# recovers the copy). The controller elects another ISR member for one it leads and takes it
# out of the ISR, as Kafka's controller does for the replicas of a failed log directory.
OFFLINE_REPLICAS_PATH = "/brokers/offline_journal_replicas"
# journal partitions whose copy on a broker is out of space (journal or queue logs full:
# storage/health.py), ``<journal>-<broker>`` ephemeral nodes the broker removes once a write
# succeeds again: the controller moves the leadership of one it leads to an ISR member that
# has room and takes it out of the ISR of those it follows, as Kafka's controller treats a
# log directory that failed on ENOSPC, without the restart Kafka needs to bring it back
FULL_REPLICAS_PATH = "/brokers/full_journal_replicas"


def report_offline_journals(
    client: KazooClient, broker_id: int, journals: list[int], under: str = OFFLINE_REPLICAS_PATH
) -> None:
    """Create the offline nodes of ``journals`` for this broker's session (blocking: a
    thread). A node left by an earlier session of this broker id is replaced."""
    for journal in journals:
        path = f"{under}/{journal}-{broker_id}"
        while True:
            try:
                client.retry(client.create, path, b"", ephemeral=True, makepath=True)
                break
            except NodeExistsError:
                try:
                    _, stat = client.retry(client.get, path)
                    if stat.ephemeralOwner == client.client_id[0]:
                        break
                    client.retry(client.delete, path, version=stat.version)
                except NoNodeError:
                    pass  # gone meanwhile: create it


def report_full_journals(client: KazooClient, broker_id: int, journals: list[int]) -> None:
    """Make this broker's full nodes name exactly ``journals`` (blocking: a thread): create
    the missing ones for this session, delete the others."""
    report_offline_journals(client, broker_id, journals, FULL_REPLICAS_PATH)
    suffix = f"-{broker_id}"
    try:
        children = client.retry(client.get_children, FULL_REPLICAS_PATH)
    except NoNodeError:
        return
    for child in children:
        journal = child[: -len(suffix)]
        if child.endswith(suffix) and journal.isdigit() and int(journal) not in journals:
            with contextlib.suppress(NoNodeError):
                client.retry(client.delete, f"{FULL_REPLICAS_PATH}/{child}")


def read_full_replicas(client: KazooClient) -> dict[int, set[int]]:
    """The brokers whose copy of each journal partition is out of space, by journal
    partition."""
    return read_offline_replicas(client, FULL_REPLICAS_PATH)


def read_offline_replicas(
    client: KazooClient, path: str = OFFLINE_REPLICAS_PATH
) -> dict[int, set[int]]:
    """The brokers whose copy of each journal partition is offline, by journal partition."""
    try:
        children = client.retry(client.get_children, path)
    except NoNodeError:
        return {}
    out: dict[int, set[int]] = {}
    for child in children:
        journal, _, broker = child.partition("-")
        if journal.isdigit() and broker.isdigit():
            out.setdefault(int(journal), set()).add(int(broker))
    return out


def read_brokers(client: KazooClient, ids: list[str] | None = None) -> dict[int, dict[str, Any]]:
    """The registered brokers' nodes (Kafka's JSON) by id, read from ZooKeeper; ``ids``: the
    children of ``/brokers/ids`` when the caller already has them (a watch's)."""
    out: dict[int, dict[str, Any]] = {}
    if ids is None:
        try:
            ids = client.retry(client.get_children, BROKER_IDS_PATH)
        except NoNodeError:  # no broker ever registered
            return out
    for child in ids:
        if not child.isdigit():
            continue
        try:
            data, _ = client.retry(client.get, f"{BROKER_IDS_PATH}/{child}")
        except NoNodeError:  # gone meanwhile
            continue
        out[int(child)] = json.loads(data)
    return dict(sorted(out.items()))


class BrokerIdInUseError(ClusterStartError):
    """Another live broker is registered under this ``broker.id``."""


class Membership:
    """Register ``broker_id`` (advertised ``host:port``, optional ``rack``) and watch the
    live brokers (``on_change(ids)`` after each change, in kazoo's thread)."""

    def __init__(
        self,
        client: KazooClient,
        broker_id: int,
        host: str,
        port: int,
        rack: str | None = None,
        on_change: Callable[[list[int]], None] | None = None,
        wait_registered_s: float = 0.0,
    ) -> None:
        self.client = client
        # how long a start waits for a registration left by another session to go
        self.wait_registered_s = wait_registered_s
        self.broker_id = broker_id
        self.path = f"{BROKER_IDS_PATH}/{broker_id}"
        self._node = json.dumps(
            {
                "version": 5,
                "host": host,
                "port": port,
                "endpoints": [f"PLAINTEXT://{host}:{port}"],
                "listener_security_protocol_map": {"PLAINTEXT": "PLAINTEXT"},
                "rack": rack,
                "jmx_port": -1,
                "timestamp": str(int(time.time() * 1000)),
            },
            sort_keys=True,
        ).encode()
        self._on_change = on_change
        self._registered = False
        self._closed = False
        # the journal partitions whose copy here is offline (the replica manager's): written
        # again before the broker registers in a new session, or the controller would see it
        # live and not offline for a moment and could elect it for one of them
        self.offline_journals: Callable[[], tuple[int, ...]] | None = None
        self.live: list[int] = []

    def register(self) -> None:
        """Create this broker's node and start following the live brokers. A node held by
        another session is waited for up to ``wait_registered_s`` (BrokerIdInUseError if it
        is still there then)."""
        self.client.retry(self.client.ensure_path, BROKER_IDS_PATH)
        deadline = time.monotonic() + self.wait_registered_s
        while True:
            try:
                self._create()
                break
            except BrokerIdInUseError:
                if time.monotonic() >= deadline:
                    raise
                log.warning(
                    "broker.id %d is registered by another ZooKeeper session (this broker's "
                    "previous run, if it stopped less than a session timeout ago): waiting up "
                    "to %.0f s for that session to expire",
                    self.broker_id,
                    deadline - time.monotonic(),
                )
                gone = threading.Event()
                stat = self.client.retry(
                    self.client.exists, self.path, watch=lambda _event, gone=gone: gone.set()
                )
                if stat is not None:
                    gone.wait(max(0.0, deadline - time.monotonic()))
        self._registered = True
        self.client.add_listener(self._on_state)
        self.client.ChildrenWatch(BROKER_IDS_PATH, self._on_ids)

    def _create(self) -> None:
        try:
            self.client.retry(self.client.create, self.path, self._node, ephemeral=True)
        except NodeExistsError:
            _, stat = self.client.retry(self.client.get, self.path)
            if stat.ephemeralOwner != self.client.client_id[0]:
                raise BrokerIdInUseError(
                    f"broker.id {self.broker_id} is registered in ZooKeeper by another live "
                    f"broker ({self.path}, for longer than {self.wait_registered_s:.0f} s); "
                    "give each broker its own broker.id"
                ) from None

    def _on_state(self, state: KazooState) -> None:
        """kazoo's connection listener: after an expired session, register again (off its
        thread: a listener must not block)."""
        if state == KazooState.LOST:
            log.warning("ZooKeeper session lost: broker %d is unregistered", self.broker_id)
        elif state == KazooState.CONNECTED and self._registered and not self._closed:
            threading.Thread(target=self._reregister, daemon=True).start()

    def _reregister(self) -> None:
        try:
            if self.client.exists(self.path) is None:
                journals = self.offline_journals() if self.offline_journals is not None else ()
                if journals:
                    report_offline_journals(self.client, self.broker_id, list(journals))
                self._create()
                log.warning("broker %d registered again in ZooKeeper", self.broker_id)
        except Exception as exc:  # logged: the next reconnect tries again
            log.error("broker %d could not register again: %s", self.broker_id, exc)

    def _on_ids(self, children: list[str]) -> bool | None:
        if self._closed:
            return False
        self.live = sorted(int(c) for c in children if c.isdigit())
        if self._on_change is not None:
            self._on_change(self.live)
        return None

    def brokers(self) -> dict[int, dict[str, Any]]:
        """The registered brokers' nodes by id (read from ZooKeeper)."""
        return read_brokers(self.client)

    def close(self) -> None:
        """Deregister (a clean stop; a crash lets the session expire instead). Bounded: with
        ZooKeeper unreachable the stop goes on and the session's expiry removes the node (an
        unbounded retry held a stop past its timeout)."""
        self._closed = True
        if self._registered and self.client.connected:
            try:
                self.client.delete_async(self.path).get(timeout=CLOSE_TIMEOUT_S)
            except NoNodeError:
                pass
            except Exception as exc:
                log.warning("broker %d not deregistered: %s", self.broker_id, exc)
