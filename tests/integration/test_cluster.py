"""Three brokers, one cluster (replication factor 1: each journal partition lives on its home
broker): real ZooKeeper, three ``stonemq serve`` processes, unmodified clients. Topic
partitions are led by the broker that hosts their journal partition; clients bootstrap from
any broker and are routed by Metadata, NOT_LEADER_OR_FOLLOWER and FindCoordinator; a group
commits and resumes; a stopped broker's partitions have no leader until it is back."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from polling import wait_for

from .rawclient import (
    RawConnection,
    build_batch,
    fetch_request,
    produce_raw,
    produce_request,
    schema,
    topic_metadata,
)
from .test_replication import _restart

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

NOT_LEADER_OR_FOLLOWER = 6


@pytest.fixture
def cluster(broker_factory, zookeeper) -> list[Any]:
    chroot = f"{zookeeper.connect}/stonemq-cluster-{uuid.uuid4().hex[:8]}"
    return [
        broker_factory(zookeeper_connect=chroot, broker_id=b, journal_partitions=2)
        for b in (1, 2, 3)
    ]


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return {p: m.leader for p, m in meta.topics[topic].partitions.items()}


def test_clients_are_routed_to_each_partitions_leader(cluster) -> None:
    b1, b2, b3 = cluster
    admin = AdminClient({"bootstrap.servers": b2.bootstrap})
    admin.create_topics([NewTopic("spread", 12, 1)])["spread"].result(30)
    meta = AdminClient({"bootstrap.servers": b1.bootstrap}).list_topics(timeout=10)
    assert sorted(meta.brokers) == [1, 2, 3]
    assert {meta.brokers[b].port for b in meta.brokers} == {b1.port, b2.port, b3.port}
    assert meta.controller_id in (1, 2, 3)
    describer = AdminClient({"bootstrap.servers": b2.bootstrap})
    described = describer.describe_cluster().result(10)
    assert sorted(n.id for n in described.nodes) == [1, 2, 3]
    assert described.controller.id == meta.controller_id
    led = leaders(b3.bootstrap, "spread")
    assert sorted(led) == list(range(12))
    assert set(led.values()) == {1, 2, 3}  # 6 journal partitions, two per broker

    # a produce sent to a broker that does not lead the partition: NOT_LEADER_OR_FOLLOWER
    by_port = {b1.port: 1, b2.port: 2, b3.port: 3}
    elsewhere = next(b for b in cluster if by_port[b.port] != led[0])
    with RawConnection(elsewhere.host, elsewhere.port) as conn:
        answer = produce_raw(conn, "spread", 0, bytes(build_batch([(None, b"x")])))
    assert answer.error_code == NOT_LEADER_OR_FOLLOWER

    producer = Producer({"bootstrap.servers": b3.bootstrap, "enable.idempotence": True})
    for i in range(600):
        producer.produce("spread", value=b"v%d" % i, key=b"k%d" % i)
    assert producer.flush(60) == 0

    def consume(expect: int) -> list[bytes]:
        consumer = Consumer(
            {
                "bootstrap.servers": b1.bootstrap,
                "group.id": "spread-group",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        consumer.subscribe(["spread"])
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < expect and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
        if got:
            consumer.commit(asynchronous=False)
        consumer.close()
        return got

    got = consume(600)
    assert sorted(got) == sorted(b"v%d" % i for i in range(600))
    # the group resumes from its commits (on the broker that coordinates it): nothing again
    producer.produce("spread", value=b"after", key=b"k0")
    assert producer.flush(30) == 0
    assert consume(1) == [b"after"]


def test_a_stopped_broker_leaves_its_partitions_leaderless_until_it_returns(cluster) -> None:
    b1, b2, b3 = cluster
    admin = AdminClient({"bootstrap.servers": b1.bootstrap})
    admin.create_topics([NewTopic("back", 6, 1)])["back"].result(30)
    led = leaders(b1.bootstrap, "back")
    mine = [p for p, leader in led.items() if leader == 2]
    assert mine
    producer = Producer({"bootstrap.servers": b1.bootstrap})
    for p in range(6):
        producer.produce("back", value=b"before", partition=p)
    assert producer.flush(30) == 0
    b2.stop()
    deadline = time.monotonic() + 30
    while any(leaders(b1.bootstrap, "back")[p] != -1 for p in mine):
        assert time.monotonic() < deadline, "the stopped broker's partitions kept a leader"
        time.sleep(0.2)
    b2.start()
    deadline = time.monotonic() + 30
    while leaders(b3.bootstrap, "back") != led:
        assert time.monotonic() < deadline, "leadership did not come back"
        time.sleep(0.2)
    producer = Producer({"bootstrap.servers": b3.bootstrap})
    for p in range(6):
        producer.produce("back", value=b"after", partition=p)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": b3.bootstrap, "group.id": "back-check"})
    for p in range(6):
        low, high = consumer.get_watermark_offsets(TopicPartition("back", p), timeout=10)
        assert (low, high) == (0, 2), (p, low, high)
    consumer.close()


def test_kcat_kafka_python_and_aiokafka_across_the_cluster(cluster) -> None:
    """kcat produces through one broker, kafka-python reads every partition in a group through
    another, aiokafka produces and reads through the third: each client follows Metadata to
    the leaders."""
    import asyncio
    import subprocess

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from kafka import KafkaConsumer

    b1, b2, b3 = cluster
    admin = AdminClient({"bootstrap.servers": b1.bootstrap})
    admin.create_topics([NewTopic("mixed", 6, 1)])["mixed"].result(30)
    lines = b"".join(b"k%d:kcat-%d\n" % (i, i) for i in range(60))
    subprocess.run(
        ["kcat", "-b", b2.bootstrap, "-P", "-t", "mixed", "-K", ":"],
        input=lines,
        check=True,
        timeout=60,
    )
    consumer = KafkaConsumer(
        "mixed",
        bootstrap_servers=b3.bootstrap,
        group_id="mixed-kp",
        auto_offset_reset="earliest",
        consumer_timeout_ms=20_000,
    )
    got = []
    for msg in consumer:
        got.append(msg.value)
        if len(got) == 60:
            break
    consumer.commit()
    consumer.close()
    assert sorted(got) == sorted(b"kcat-%d" % i for i in range(60))

    async def aio() -> list[bytes]:
        producer = AIOKafkaProducer(bootstrap_servers=b1.bootstrap, acks="all")
        await producer.start()
        try:
            for i in range(30):
                await producer.send_and_wait("mixed", b"aio-%d" % i, key=b"a%d" % i)
        finally:
            await producer.stop()
        reader = AIOKafkaConsumer(
            "mixed",
            bootstrap_servers=b1.bootstrap,
            group_id="mixed-kp",  # resumes after kafka-python's commits: only aiokafka's
            auto_offset_reset="earliest",
        )
        await reader.start()
        values: list[bytes] = []
        try:
            while len(values) < 30:
                batch = await asyncio.wait_for(reader.getmany(timeout_ms=1000), 30)
                values.extend(m.value for msgs in batch.values() for m in msgs)
        finally:
            await reader.stop()
        return values

    assert sorted(asyncio.run(aio())) == sorted(b"aio-%d" % i for i in range(30))


def test_admin_calls_through_any_broker_are_seen_by_all(cluster) -> None:
    """Create through one broker, grow and configure through another, describe through the
    third, delete through the first: every broker follows (ZooKeeper watches), and the
    partitions each hosts come and go with the topic."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions

    SET = AlterConfigOpType.SET

    b3 = cluster[2]
    a1, a2, a3 = (AdminClient({"bootstrap.servers": b.bootstrap}) for b in cluster)
    a1.create_topics([NewTopic("admin-any", 3, 1)])["admin-any"].result(30)
    a2.create_partitions([NewPartitions("admin-any", 9)])["admin-any"].result(30)
    resource = ConfigResource(ConfigResource.Type.TOPIC, "admin-any")
    a2.incremental_alter_configs(
        [
            ConfigResource(
                ConfigResource.Type.TOPIC,
                "admin-any",
                incremental_configs=[
                    ConfigEntry("retention.ms", "3600000", incremental_operation=SET)
                ],
            )
        ]
    )[resource].result(30)
    deadline = time.monotonic() + 20
    while True:
        configs = a3.describe_configs([resource])[resource].result(10)
        seen = len(leaders(b3.bootstrap, "admin-any"))
        if configs["retention.ms"].value == "3600000" and seen == 9:
            break
        assert time.monotonic() < deadline, (configs["retention.ms"].value, seen)
        time.sleep(0.2)
    producer = Producer({"bootstrap.servers": b3.bootstrap})
    for p in range(9):
        producer.produce("admin-any", value=b"x", partition=p)
    assert producer.flush(30) == 0

    def hosted_dirs() -> dict[int, int]:
        return {
            i: len(list((b.data_dir / "queues").glob("admin-any-*")))
            for i, b in enumerate(cluster, 1)
        }

    assert sum(hosted_dirs().values()) == 9  # each partition on the broker hosting it
    assert all(n > 0 for n in hosted_dirs().values())
    a1.delete_topics(["admin-any"])["admin-any"].result(30)
    deadline = time.monotonic() + 20
    while any(
        "admin-any"
        in AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=10).topics
        for b in cluster
    ):
        assert time.monotonic() < deadline, "a broker still lists the deleted topic"
        time.sleep(0.2)
    # every broker removed the partitions it hosted (their queue-log directories are gone)
    deadline = time.monotonic() + 20
    while any(hosted_dirs().values()):
        assert time.monotonic() < deadline, "queue logs of the deleted topic remain"
        time.sleep(0.2)


def test_a_killed_controller_is_replaced_and_rejoins_with_its_data(
    broker_factory, zookeeper
) -> None:
    """SIGKILL the controller: another broker is the controller (epoch + 1; at once, the
    killed one judged dead, or when its ZooKeeper session expires) with no metadata lost;
    the killed broker, restarted, recovers its journal and queue logs and leads its
    partitions again with everything acknowledged."""
    from kazoo.client import KazooClient

    from stonemq.cluster.controller import read_controller

    base = f"/stonemq-kill-{uuid.uuid4().hex[:8]}"
    chroot = zookeeper.connect + base
    brokers = {
        b: broker_factory(
            zookeeper_connect=chroot,
            broker_id=b,
            journal_partitions=2,
            zookeeper_session_timeout_ms=3000,
        )
        for b in (1, 2, 3)
    }
    zk = KazooClient(chroot)
    zk.start(10)
    try:
        controller, epoch = read_controller(zk)
        assert controller == 1 and epoch == 1
        admin = AdminClient({"bootstrap.servers": brokers[2].bootstrap})
        admin.create_topics([NewTopic("survive", 6, 1)])["survive"].result(30)
        producer = Producer({"bootstrap.servers": brokers[2].bootstrap, "acks": "all"})
        for i in range(120):
            producer.produce("survive", value=b"v%d" % i, key=b"k%d" % i)
        assert producer.flush(30) == 0
        led = leaders(brokers[2].bootstrap, "survive")
        brokers[1].kill()
        deadline = time.monotonic() + 30
        while read_controller(zk)[0] in (1, -1):
            assert time.monotonic() < deadline, "no new controller after the kill"
            time.sleep(0.2)
        assert read_controller(zk)[1] == 2
        _restart(brokers[1], chroot)  # once its old session expired
        deadline = time.monotonic() + 30
        while leaders(brokers[3].bootstrap, "survive") != led:
            assert time.monotonic() < deadline, "the restarted broker does not lead again"
            time.sleep(0.2)
        # ListOffsets answers with the journal partition's leader epoch, as Metadata does
        from confluent_kafka.admin import OffsetSpec

        # (two leader changes since: offline at the kill, back at the restart)
        back = next(p for p, leader in led.items() if leader == 1)
        listed = admin.list_offsets({TopicPartition("survive", back): OffsetSpec.latest()})
        info = next(iter(listed.values())).result(10)
        assert info.leader_epoch == 2
        consumer = Consumer(
            {
                "bootstrap.servers": brokers[3].bootstrap,
                "group.id": "survive",
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe(["survive"])
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < 120 and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
        consumer.close()
        assert sorted(got) == sorted(b"v%d" % i for i in range(120))
    finally:
        zk.stop()
        zk.close()


def test_kafkajs_produces_and_consumes_in_a_group_across_the_cluster(cluster) -> None:
    """kafkajs: an idempotent producer bootstrapping from one broker, a group consumer (with
    commits) from another; every record comes back once."""
    import base64
    import json
    import os
    import subprocess
    from pathlib import Path

    js = Path(__file__).resolve().parent.parent / "js"
    b1, b2, _b3 = cluster
    admin = AdminClient({"bootstrap.servers": b1.bootstrap})
    admin.create_topics([NewTopic("js-cluster", 6, 1)])["js-cluster"].result(30)
    messages = [
        {
            "key": base64.b64encode(b"k%d" % i).decode(),
            "value": base64.b64encode(b"v%d" % i).decode(),
        }
        for i in range(60)
    ]
    env = {**os.environ, "KAFKAJS_NO_PARTITIONER_WARNING": "1"}

    def node(script: str, spec: dict[str, Any]) -> Any:
        proc = subprocess.run(
            ["node", str(js / script), json.dumps(spec)],
            capture_output=True,
            timeout=90,
            cwd=js,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
        return json.loads(proc.stdout)

    step = {"op": "produce", "topic": "js-cluster", "idempotent": True, "messages": messages}
    node("kafkajs_ops.js", {"brokers": [b1.bootstrap], "steps": [step]})
    consume = {"brokers": [b2.bootstrap], "topic": "js-cluster", "groupId": "js-g", "expect": 60}
    records = node("kafkajs_groups.js", consume)["records"]
    assert sorted(v for _, _, v in records) == sorted(f"v{i}" for i in range(60))


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_per_partition_memory_in_a_cluster_is_the_single_nodes(broker_factory, zookeeper) -> None:
    """A broker of a three-broker cluster holding its 10,000 of 30,000 topic partitions costs
    no more memory per partition than a single node holding 10,000: replication state,
    watches and routing are per journal partition, never per topic partition."""
    per = 10_000

    def grown(broker: Any, before: int, topic: str, partitions: int, hosted: int) -> float:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "socket.timeout.ms": 120000})
        admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=120)[topic].result(
            180
        )
        time.sleep(2)
        return (_rss_bytes(broker.proc.pid) - before) / hosted

    single = broker_factory(journal_partitions=2)
    time.sleep(1)
    single_cost = grown(single, _rss_bytes(single.proc.pid), "flat-single", per, per)
    single.stop()

    chroot = f"{zookeeper.connect}/stonemq-flat-{uuid.uuid4().hex[:8]}"
    brokers = [
        broker_factory(zookeeper_connect=chroot, broker_id=b, journal_partitions=2)
        for b in (1, 2, 3)
    ]
    time.sleep(1)
    before = [_rss_bytes(b.proc.pid) for b in brokers]
    admin = AdminClient({"bootstrap.servers": brokers[0].bootstrap, "socket.timeout.ms": 120000})
    admin.create_topics([NewTopic("flat-cluster", 3 * per, 1)], operation_timeout=120)[
        "flat-cluster"
    ].result(180)
    deadline = time.monotonic() + 60
    while True:  # every broker registered its share
        hosted = [len(list((b.data_dir / "queues").glob("flat-cluster-*"))) for b in brokers]
        if sum(hosted) == 3 * per or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sum(hosted) == 3 * per, hosted
    time.sleep(2)
    costs = [(_rss_bytes(b.proc.pid) - before[i]) / hosted[i] for i, b in enumerate(brokers)]
    print(f"bytes per partition: single {single_cost:.0f}, cluster {[round(c) for c in costs]}")
    assert max(costs) <= 1.25 * single_cost + 200, (single_cost, costs)


def test_group_requests_at_another_broker_get_not_coordinator(cluster) -> None:
    """FindCoordinator names one broker; Heartbeat, OffsetFetch and OffsetCommit sent to any
    other are answered NOT_COORDINATOR (Kafka's answer; clients look the coordinator up
    again), and the coordinator itself answers them."""
    from .rawclient import RawConnection, build, schema

    NOT_COORDINATOR = 16
    b1 = cluster[0]
    admin = AdminClient({"bootstrap.servers": b1.bootstrap})
    admin.create_topics([NewTopic("coord-t", 3, 1)])["coord-t"].result(30)
    by_id = {1: cluster[0], 2: cluster[1], 3: cluster[2]}
    with RawConnection(b1.host, b1.port) as conn:
        req = schema("find_coordinator", 3, "request")
        found = conn.request(
            build(req.FindCoordinatorRequest, key="coord-g", key_type=0),
            schema("find_coordinator", 3, "response").FindCoordinatorResponse,
        )
    assert found.error_code == 0 and found.node_id in by_id
    coordinator = by_id[found.node_id]
    assert found.port == coordinator.port

    def ask(broker: Any) -> tuple[int, int, int]:
        with RawConnection(broker.host, broker.port) as conn:
            hb = schema("heartbeat", 4, "request")
            beat = conn.request(
                build(hb.HeartbeatRequest, group_id="coord-g", generation_id=1, member_id="m"),
                schema("heartbeat", 4, "response").HeartbeatResponse,
            )
            of = schema("offset_fetch", 7, "request")
            fetched = conn.request(
                build(of.OffsetFetchRequest, group_id="coord-g", topics=None),
                schema("offset_fetch", 7, "response").OffsetFetchResponse,
            )
            oc = schema("offset_commit", 8, "request")
            committed = conn.request(
                build(
                    oc.OffsetCommitRequest,
                    group_id="coord-g",
                    generation_id_or_member_epoch=-1,
                    member_id="",
                    topics=(
                        build(
                            oc.OffsetCommitRequestTopic,
                            name="coord-t",
                            partitions=(
                                build(
                                    oc.OffsetCommitRequestPartition,
                                    partition_index=0,
                                    committed_offset=0,
                                    committed_metadata="",
                                ),
                            ),
                        ),
                    ),
                ),
                schema("offset_commit", 8, "response").OffsetCommitResponse,
            )
            return (
                beat.error_code,
                fetched.error_code,
                committed.topics[0].partitions[0].error_code,
            )

    # the coordinator learns of __consumer_offsets (created through b1) by a watch, a moment
    # later: until then it, too, answers NOT_COORDINATOR, and clients ask again
    wait_for("the coordinator to know its group", lambda: ask(coordinator)[0] != NOT_COORDINATOR)
    for broker_id, broker in by_id.items():
        errors = ask(broker)
        if broker_id == found.node_id:
            assert errors == (25, 0, 0), errors  # UNKNOWN_MEMBER_ID: no such member yet
        else:
            assert errors == (NOT_COORDINATOR,) * 3, (broker_id, errors)


def partition_leadership(conn: RawConnection, topic: str) -> tuple[Any, dict[int, Any]]:
    """Metadata v12 of ``topic``: its topic id, and each partition's entry (leader, epoch)."""
    answer = topic_metadata(conn, topic)
    return answer.topic_id, {p.partition_index: p for p in answer.partitions}


def test_not_leader_answers_name_the_leader(cluster) -> None:
    """KIP-951: a Produce (v10+) or Fetch (v16+) sent to a broker that does not lead the
    partition is answered NOT_LEADER_OR_FOLLOWER with the leader's id and epoch, and the
    leader's endpoint in node_endpoints, so the client goes there without a Metadata call."""
    admin = AdminClient({"bootstrap.servers": cluster[0].bootstrap})
    admin.create_topics([NewTopic("hinted", 6, 1)])["hinted"].result(30)
    with RawConnection(cluster[0].host, cluster[0].port) as conn:
        deadline = time.monotonic() + 30
        while True:
            topic_id, parts = partition_leadership(conn, "hinted")
            if len(parts) == 6 and all(p.leader_id >= 0 for p in parts.values()):
                break
            assert time.monotonic() < deadline, parts
            time.sleep(0.2)
    leader = parts[0].leader_id
    epoch = parts[0].leader_epoch
    by_id = {b: cluster[b - 1] for b in (1, 2, 3)}
    host, port = by_id[leader].host, by_id[leader].port
    elsewhere = next(b for b_id, b in by_id.items() if b_id != leader)
    batch = bytes(build_batch([(None, b"x")]))
    with RawConnection(elsewhere.host, elsewhere.port) as conn:
        for version in range(3, 14):
            request = produce_request("hinted", 0, batch, version=version, topic_id=topic_id)
            answer = conn.request(request, schema("produce", version, "response").ProduceResponse)
            (part,) = answer.responses[0].partition_responses
            assert part.error_code == NOT_LEADER_OR_FOLLOWER, (version, part)
            if version < 10:
                assert not hasattr(answer, "node_endpoints")
                continue
            assert (part.current_leader.leader_id, part.current_leader.leader_epoch) == (
                leader,
                epoch,
            ), version
            assert [(e.node_id, e.host, e.port) for e in answer.node_endpoints] == [
                (leader, host, port)
            ], version
        for version in range(4, 19):
            request = fetch_request("hinted", 0, 0, version=version, topic_id=topic_id)
            answer = conn.request(request, schema("fetch", version, "response").FetchResponse)
            (part,) = answer.responses[0].partitions
            assert part.error_code == NOT_LEADER_OR_FOLLOWER, (version, part)
            if version < 16:  # Kafka fills the hint from v16 only
                hint = getattr(part, "current_leader", None)  # v12-15 have the field, unset
                assert hint is None or (hint.leader_id, hint.leader_epoch) == (-1, -1)
                assert not hasattr(answer, "node_endpoints")
                continue
            assert (part.current_leader.leader_id, part.current_leader.leader_epoch) == (
                leader,
                epoch,
            ), version
            assert [(e.node_id, e.host, e.port) for e in answer.node_endpoints] == [
                (leader, host, port)
            ], version
    # the leader itself takes both
    with RawConnection(host, port) as conn:
        request = produce_request("hinted", 0, batch, version=13, topic_id=topic_id)
        answer = conn.request(request, schema("produce", 13, "response").ProduceResponse)
        assert answer.responses[0].partition_responses[0].error_code == 0
        assert answer.node_endpoints == ()


def test_partitions_created_while_a_broker_is_dead_are_placed_on_live_brokers(cluster) -> None:
    """Broker 3 SIGKILLed (judged dead at once, still registered): a topic created then, and
    partitions added to it, are routed only to journal partitions of the live brokers, as
    Kafka places new replicas on unfenced brokers; every one has a leader and takes a
    produce. Before, a third of them went to broker 3's journal partitions, leaderless."""
    from confluent_kafka.admin import NewPartitions

    b1, b2, b3 = cluster
    a1, a2 = (AdminClient({"bootstrap.servers": b.bootstrap}) for b in (b1, b2))
    a1.create_topics([NewTopic("probe", 6, 1)])["probe"].result(30)  # on every broker
    time.sleep(2)  # the brokers' reachability watches connect to broker 3's new listener
    b3.kill()

    def judged(broker: Any) -> bool:
        with RawConnection(broker.host, broker.port) as conn:
            meta = topic_metadata(conn, "probe")
        return any(3 in p.offline_replicas for p in meta.partitions)

    wait_for("broker 3 judged dead", lambda: judged(b1) and judged(b2), timeout=15)
    a1.create_topics([NewTopic("born", 6, 1)])["born"].result(30)
    a2.create_partitions([NewPartitions("born", 12)])["born"].result(30)

    def placed() -> dict[int, tuple[int, tuple[int, ...]]]:
        with RawConnection(b1.host, b1.port) as conn:
            meta = topic_metadata(conn, "born")
        return {p.partition_index: (p.leader_id, tuple(p.replica_nodes)) for p in meta.partitions}

    wait_for("12 partitions", lambda: len(placed()) == 12, timeout=15)
    got = placed()
    assert {leader for leader, _ in got.values()} == {1, 2}, got
    assert all(3 not in replicas for _, replicas in got.values()), got
    producer = Producer({"bootstrap.servers": b1.bootstrap, "message.timeout.ms": 15000})
    for p in range(12):
        producer.produce("born", value=b"v", partition=p)
    assert producer.flush(30) == 0
