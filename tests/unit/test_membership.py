"""A broker's registration under ``/brokers/ids`` against another session's: a start waits
for a registration that outlives its session to go (a broker restarted right after a crash
finds its previous run's node, alive until that session expires) and registers then; one
held by a live session past the wait is refused (BrokerIdInUseError), as Kafka refuses it.
Real ZooKeeper, marker cluster."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

from stonemq.cluster.membership import BrokerIdInUseError, Membership

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]

_chroots = itertools.count()


@pytest.fixture
def connect(zookeeper: Any) -> Iterator[str]:
    chroot = f"/stonemq-members-{next(_chroots)}"
    admin = KazooClient(zookeeper.connect)
    admin.start(10)
    admin.ensure_path(chroot)
    admin.stop()
    admin.close()
    yield zookeeper.connect + chroot


def _client(connect: str) -> KazooClient:
    client = KazooClient(connect, timeout=4.0)
    client.start(10)
    return client


def test_a_start_waits_for_a_previous_runs_registration_to_go(connect: str) -> None:
    old = _client(connect)
    Membership(old, 7, "127.0.0.1", 9007).register()
    new = _client(connect)
    try:
        membership = Membership(new, 7, "127.0.0.1", 9107, wait_registered_s=20.0)
        done: list[float] = []
        errors: list[BaseException] = []

        def register() -> None:
            try:
                membership.register()
                done.append(time.monotonic())
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=register)
        thread.start()
        time.sleep(1.0)
        assert not done and not errors  # still waiting: the old session holds the node
        gone_at = time.monotonic()
        old.stop()  # the old session ends (as when it expires), its node goes
        old.close()
        thread.join(15)
        assert not errors, errors
        assert done and done[0] - gone_at < 5.0, done
        data, stat = new.get("/brokers/ids/7")
        assert stat.ephemeralOwner == new.client_id[0]
        assert b'"port": 9107' in data
    finally:
        new.stop()
        new.close()


def test_a_live_sessions_registration_is_refused_after_the_wait(connect: str) -> None:
    other = _client(connect)
    Membership(other, 8, "127.0.0.1", 9008).register()
    mine = _client(connect)
    try:
        started = time.monotonic()
        with pytest.raises(BrokerIdInUseError, match=r"broker\.id 8"):
            Membership(mine, 8, "127.0.0.1", 9108, wait_registered_s=1.5).register()
        assert time.monotonic() - started >= 1.5
        _, stat = mine.get("/brokers/ids/8")
        assert stat.ephemeralOwner == other.client_id[0]  # untouched
    finally:
        for client in (mine, other):
            client.stop()
            client.close()


def test_a_new_session_reports_the_offline_journals_before_it_registers(connect: str) -> None:
    """After an expired session both the registration and the offline-journal nodes are
    gone. The registration came back at once and the offline nodes only at the replica
    manager's next reconcile: for that moment the controller saw the broker live with no
    copy offline, and could elect it for a journal partition it cannot write (an independent
    review). Re-registering now writes the offline nodes first."""
    from stonemq.cluster.membership import OFFLINE_REPLICAS_PATH

    client = _client(connect)
    try:
        membership = Membership(client, 7, "127.0.0.1", 9007)
        membership.register()
        membership.offline_journals = lambda: (2, 5)
        # as after a new session: the ephemeral nodes of the old one are gone
        client.delete(membership.path)
        membership._reregister()
        registered = client.exists(membership.path)
        assert registered is not None
        for journal in (2, 5):
            offline = client.exists(f"{OFFLINE_REPLICAS_PATH}/{journal}-7")
            assert offline is not None and offline.ephemeralOwner == client.client_id[0]
            assert offline.czxid < registered.czxid  # written before the registration
    finally:
        client.stop()
        client.close()
