"""A broker whose metadata lives in ZooKeeper (``zookeeper.connect``): real ZooKeeper, real
``stonemq serve`` processes, confluent-kafka. Topics, their journal mapping and configs are
in ZooKeeper and survive a restart; the broker registers under ``/brokers/ids``; a broker id
in use and an unreachable ZooKeeper are refused at start with a clear message (several
brokers: tests/integration/test_cluster.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)
from conftest import BrokerStartError, free_port
from kazoo.client import KazooClient
from polling import wait_for

from . import rawclient

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.fixture
def chroot(zookeeper: Any) -> str:
    return f"{zookeeper.connect}/stonemq-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def zk(zookeeper: Any) -> Any:
    client = KazooClient(zookeeper.connect)
    client.start(10)
    yield client
    client.stop()
    client.close()


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for value in values:
        producer.produce(topic, value, partition=0)
    assert producer.flush(30) == 0


def consume(bootstrap: str, topic: str, count: int) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    got: list[bytes] = []
    try:
        for _ in range(300):
            msg = consumer.poll(0.1)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
            if len(got) >= count:
                break
    finally:
        consumer.close()
    return got


def test_topics_live_in_zookeeper_and_survive_a_restart(broker_factory, chroot, zk) -> None:
    broker = broker_factory(zookeeper_connect=chroot, broker_id=3)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    new = NewTopic("zt", 3, 1, config={"retention.ms": "86400000"})
    admin.create_topics([new])["zt"].result(30)
    produce(broker.bootstrap, "zt", [b"a", b"b", b"c"])
    base = chroot.split("/", 1)[1]
    node = json.loads(zk.get(f"/{base}/brokers/topics/zt")[0])
    config = json.loads(zk.get(f"/{base}/config/topics/zt")[0])
    assert config["config"] == {"retention.ms": "86400000"}
    registered = json.loads(zk.get(f"/{base}/brokers/ids/3")[0])
    assert registered["port"] == broker.port and registered["host"] == "127.0.0.1"
    cluster_id = json.loads(zk.get(f"/{base}/cluster/id")[0])["id"]

    broker.stop()
    assert zk.exists(f"/{base}/brokers/ids/3") is None  # a clean stop deregisters
    broker.start()
    assert consume(broker.bootstrap, "zt", 3) == [b"a", b"b", b"c"]
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    meta = admin.list_topics(timeout=10)
    assert meta.cluster_id == cluster_id
    assert len(meta.topics["zt"].partitions) == 3
    resource = ConfigResource(ConfigResource.Type.TOPIC, "zt")
    configs = admin.describe_configs([resource])[resource].result(10)
    assert configs["retention.ms"].value == "86400000"
    assert json.loads(zk.get(f"/{base}/brokers/topics/zt")[0]) == node


def test_a_broker_id_in_use_is_refused(broker_factory, chroot) -> None:
    """A second broker under a live broker's id waits for that registration to go (a restart
    right after a crash finds its previous run's node until the session expires:
    tests/unit/test_membership.py), then is refused: after the session timeout (2 s here)
    and a 5 s margin."""
    broker_factory(zookeeper_connect=chroot, broker_id=1)
    started = time.monotonic()
    with pytest.raises(BrokerStartError, match=r"broker\.id 1 is registered in ZooKeeper"):
        broker_factory(zookeeper_connect=chroot, broker_id=1, zookeeper_session_timeout_ms=2000)
    assert time.monotonic() - started >= 7.0


def test_an_unreachable_zookeeper_is_refused_clearly(broker_factory) -> None:
    with pytest.raises(BrokerStartError, match="cannot reach ZooKeeper"):
        broker_factory(
            zookeeper_connect=f"127.0.0.1:{free_port()}", zookeeper_connection_timeout_ms=2000
        )


def test_the_broker_is_controller_and_its_journal_partitions_survive(
    broker_factory, chroot, zk
) -> None:
    """A broker joining a cluster takes part in controller election; elected, it places its
    journal.partitions journal partitions (leader, epoch, ISR in ZooKeeper). `stonemq cluster
    describe` shows them with the topic partitions each carries; a restart keeps the
    placement, and the controller epoch grows with each election."""
    broker = broker_factory(
        zookeeper_connect=chroot, broker_id=5, journal_partitions=3, broker_rack="r1"
    )
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("zc", 7, 1)])["zc"].result(30)

    def describe() -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-m", "stonemq", "cluster", "describe", "--json"],
            env={**os.environ, "STONEMQ_ZOOKEEPER_CONNECT": chroot},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return json.loads(out.stdout)

    view = wait_for("3 journal partitions", lambda: (v := describe())["journal_partitions"] and v)
    assert view["controller"] == 5 and view["controller_epoch"] == 1
    assert view["brokers"] == {
        "5": {"endpoints": [f"PLAINTEXT://127.0.0.1:{broker.port}"], "rack": "r1"}
    }
    assert [
        (p["id"], p["replicas"], p["leader"], p["leader_epoch"], p["isr"])
        for p in view["journal_partitions"]
    ] == [(j, [5], 5, 0, [5]) for j in range(3)]
    assert sum(p["topic_partitions"] for p in view["journal_partitions"]) == 7

    broker.stop()
    broker.start()
    again = wait_for(
        "the controller back",
        lambda: (v := describe())["controller"] == 5 and v["journal_partitions"] and v,
    )
    assert again["controller_epoch"] == 2
    assert [(p["id"], p["replicas"]) for p in again["journal_partitions"]] == [
        (j, [5]) for j in range(3)
    ]
    # leader epochs: each restart is a leader change (offline while stopped, then back)
    assert all(p["leader"] == 5 for p in again["journal_partitions"])


def _alter_config(bootstrap: str) -> None:
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        "paused",
        incremental_configs=[
            ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.incremental_alter_configs([resource])[resource].result(60)


def _init_producer_id(bootstrap: str) -> None:  # the first one reserves a producer-id block
    produce(bootstrap, "paused", [b"idempotent"])


def _find_coordinator(bootstrap: str) -> None:  # the first one creates __consumer_offsets
    host, port = bootstrap.rsplit(":", 1)
    req = rawclient.schema("find_coordinator", 3, "request")
    with rawclient.RawConnection(host, int(port), timeout=60) as conn:
        answer = conn.request(
            rawclient.build(req.FindCoordinatorRequest, key="paused-g", key_type=0),
            rawclient.schema("find_coordinator", 3, "response").FindCoordinatorResponse,
        )
    assert answer.error_code == 0, answer


@pytest.mark.parametrize("store_write", [_alter_config, _init_producer_id, _find_coordinator])
def test_a_store_write_waiting_on_zookeeper_never_stalls_other_clients(
    broker_factory, tmp_path, store_write
) -> None:
    """Config changes, producer-id blocks and the creation of ``__consumer_offsets`` are
    store writes: a ZooKeeper round trip (or a SQLite commit's fsync). They run in the
    store's thread; on the event loop, a paused ZooKeeper froze every client of the broker
    until it answered (ApiVersions from another connection waited as long as the pause).
    The broker's stop afterwards, with ZooKeeper gone, is bounded too (teardown checks it)."""
    import signal
    import threading
    import time

    import zkserver

    server = zkserver.ZooKeeperServer(tmp_path / "zk", free_port())
    server.start()
    try:
        broker = broker_factory(zookeeper_connect=f"{server.connect}/stonemq", broker_id=1)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("paused", 1, 1)])["paused"].result(30)
        with rawclient.RawConnection("127.0.0.1", broker.port, timeout=5) as probe:
            probe.api_versions()
            os.killpg(server.proc.pid, signal.SIGSTOP)
            try:
                done = threading.Event()
                results: list[Any] = []

                def write() -> None:
                    try:
                        results.append(store_write(broker.bootstrap))
                    except Exception as exc:  # reported by the assertion below
                        results.append(exc)
                    done.set()

                threading.Thread(target=write, daemon=True).start()
                time.sleep(0.5)  # the write is waiting on ZooKeeper
                slowest = 0.0
                for _ in range(8):
                    started = time.monotonic()
                    assert probe.api_versions()
                    slowest = max(slowest, time.monotonic() - started)
                    time.sleep(0.25)
                assert not done.is_set(), f"{results}: the write did not wait for ZooKeeper"
            finally:
                os.killpg(server.proc.pid, signal.SIGCONT)
        assert slowest < 1.0, f"ApiVersions waited {slowest:.2f} s behind a store write"
        assert done.wait(60) and results == [None]
    finally:
        server.stop()
