"""The partition admin calls on a three-broker cluster (real ZooKeeper, three brokers,
replication factor 1): OffsetForLeaderEpoch and DescribeProducers answer at the leader and
send clients elsewhere to it, DescribeTopicPartitions agrees with Metadata, ElectLeaders
finds every preferred replica leading, a reassignment is accepted only to the current
replicas, DescribeLogDirs lists on each broker the partitions it holds."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)
from kafka import TopicPartition
from kafka import errors as kerrors
from kafka.admin import KafkaAdminClient
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8, i16, i32

from . import rawclient
from .test_replication import _start_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


@pytest.fixture
def cluster(broker_factory, zookeeper) -> list[Any]:
    chroot = f"{zookeeper.connect}/stonemq-admin-{uuid.uuid4().hex[:8]}"
    return [
        broker_factory(zookeeper_connect=chroot, broker_id=b, journal_partitions=2)
        for b in (1, 2, 3)
    ]


def _metadata_answer(broker: Any, topic: str) -> Any:
    """Metadata v12 of ``topic`` from ``broker`` (the whole answer)."""
    req = rawclient.schema("metadata", 12, "request")
    resp = rawclient.schema("metadata", 12, "response")
    with rawclient.RawConnection(broker.host, broker.port) as conn:
        return conn.request(
            req.MetadataRequest(
                topics=(req.MetadataRequestTopic(topic_id=None, name=topic),),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            ),
            resp.MetadataResponse,
        )


def _metadata(broker, topic: str) -> dict[int, tuple[int, int, tuple[int, ...]]]:  # type: ignore[no-untyped-def]
    (t,) = _metadata_answer(broker, topic).topics
    return {
        p.partition_index: (p.leader_id, p.leader_epoch, tuple(p.replica_nodes))
        for p in t.partitions
    }


def _epoch_end(broker, topic: str, partition: int, epoch: int):  # type: ignore[no-untyped-def]
    req = rawclient.schema("offset_for_leader_epoch", 4, "request")
    resp = rawclient.schema("offset_for_leader_epoch", 4, "response")
    with rawclient.RawConnection(broker.host, broker.port) as conn:
        answer = conn.request(
            req.OffsetForLeaderEpochRequest(
                replica_id=-1,
                topics=(
                    req.OffsetForLeaderTopic(
                        topic=topic,
                        partitions=(
                            req.OffsetForLeaderPartition(
                                partition=partition, current_leader_epoch=epoch, leader_epoch=epoch
                            ),
                        ),
                    ),
                ),
            ),
            resp.OffsetForLeaderEpochResponse,
        )
    ((p,),) = [t.partitions for t in answer.topics]
    return p.error_code, p.leader_epoch, p.end_offset


def test_partition_admin_calls_follow_the_routing(cluster) -> None:
    b1, b2, b3 = cluster
    by_id = {1: b1, 2: b2, 3: b3}
    creator = AdminClient({"bootstrap.servers": b1.bootstrap})  # referenced until done
    creator.create_topics([NewTopic("adm", 6, 1)])["adm"].result(30)
    deadline = time.monotonic() + 30
    while True:  # every broker learns of the topic through ZooKeeper
        meta = _metadata(b2, "adm")
        if len(meta) == 6 and all(m[0] > 0 for m in meta.values()):
            break
        assert time.monotonic() < deadline, meta
        time.sleep(0.1)
    assert sorted(meta) == list(range(6)) and {m[0] for m in meta.values()} == {1, 2, 3}
    producer = Producer({"bootstrap.servers": b1.bootstrap, "enable.idempotence": True})
    for p in range(6):
        for i in range(p + 1):
            producer.produce("adm", value=b"v%d" % i, partition=p)
    assert producer.flush(30) == 0

    for p, (leader, epoch, _) in meta.items():
        # at the leader: its epoch ends at the log end; elsewhere: go to the leader
        assert _epoch_end(by_id[leader], "adm", p, epoch) == (ErrorCode.none, epoch, p + 1)
        other = by_id[leader % 3 + 1]
        assert _epoch_end(other, "adm", p, epoch)[0] == ErrorCode.not_leader_or_follower

    # DescribeTopicPartitions agrees with Metadata, from any broker
    client = KafkaAdminClient(bootstrap_servers=b3.bootstrap, request_timeout_ms=15000)
    try:
        (described,) = client.describe_topic_partitions(["adm"])["topics"]
        assert {
            p["partition_index"]: (p["leader_id"], p["leader_epoch"], tuple(p["replica_nodes"]))
            for p in described["partitions"]
        } == meta
        # every preferred replica leads: no election needed
        response = client.elect_leaders(0, {"adm": list(range(6))}, raise_errors=False)
        (result,) = response.replica_election_results
        assert {p.error_code for p in result.partition_result} == {ErrorCode.election_not_needed}
        # a reassignment to the current replicas is accepted; another broker's is not
        current = meta[0][2]
        elsewhere = [b for b in (1, 2, 3) if b not in current][:1]
        answer = client.alter_partition_reassignments(
            {TopicPartition("adm", 0): list(current), TopicPartition("adm", 1): elsewhere}
        )
        assert answer[TopicPartition("adm", 0)] is None
        assert answer[TopicPartition("adm", 1)] is kerrors.InvalidReplicationAssignmentError
        # each broker lists the partitions it holds, the producer state at the leader
        logs = client.describe_log_dirs({"adm": list(range(6))})
        held: dict[int, set[int]] = {}
        for entry in logs:
            for d in entry["log_dirs"]:
                for t in d["topics"]:
                    held.setdefault(entry["broker"], set()).update(
                        p["partition_index"] for p in t["partitions"]
                    )
        assert held == {
            b: {p for p, m in meta.items() if m[0] == b} for b in (1, 2, 3) if b in held
        }
        assert set().union(*held.values()) == set(range(6))
        states = client.describe_producers([TopicPartition("adm", p) for p in range(6)])
        for p in range(6):
            (producer_state,) = states[TopicPartition("adm", p)].active_producers
            assert producer_state.last_sequence == p
    finally:
        client.close()


def _broker_config(admin: AdminClient, broker_id: int, name: str) -> tuple[str, int]:
    resource = ConfigResource(ResourceType.BROKER, str(broker_id))
    configs = admin.describe_configs([resource], request_timeout=15)[resource].result(timeout=20)
    return configs[name].value, configs[name].source


def _set(admin: AdminClient, broker_id: int, name: str, value: str) -> None:
    resource = ConfigResource(
        ResourceType.BROKER,
        str(broker_id),
        incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)],
    )
    admin.incremental_alter_configs([resource])[resource].result(timeout=20)


def _set_default(broker: Any, name: str, value: str) -> int:
    """IncrementalAlterConfigs SET on broker resource "" (the cluster-wide default) through
    ``broker`` (confluent-kafka's admin client refuses an empty resource name)."""
    req = rawclient.schema("incremental_alter_configs", 0, "request")
    resp = rawclient.schema("incremental_alter_configs", 0, "response")
    with rawclient.RawConnection(broker.host, broker.port) as conn:
        answer = conn.request(
            req.IncrementalAlterConfigsRequest(
                resources=(
                    req.AlterConfigsResource(
                        resource_type=i8(4),
                        resource_name="",
                        configs=(
                            req.AlterableConfig(name=name, config_operation=i8(0), value=value),
                        ),
                    ),
                ),
                validate_only=False,
            ),
            resp.IncrementalAlterConfigsResponse,
        )
    return int(answer.responses[0].error_code)


def _describe_error(broker: Any, resource_name: str) -> int:
    req = rawclient.schema("describe_configs", 4, "request")
    resp = rawclient.schema("describe_configs", 4, "response")
    with rawclient.RawConnection(broker.host, broker.port) as conn:
        answer = conn.request(
            req.DescribeConfigsRequest(
                resources=(
                    req.DescribeConfigsResource(
                        resource_type=i8(4), resource_name=resource_name, configuration_keys=None
                    ),
                ),
                include_synonyms=False,
                include_documentation=False,
            ),
            resp.DescribeConfigsResponse,
        )
    return int(answer.results[0].error_code)


def test_dynamic_broker_configs_have_kafkas_two_levels_across_brokers(cluster) -> None:
    """The cluster-wide default (resource "") set through one broker is in force on every
    broker at once, under each broker's own value (resource "<id>"), which no other broker
    takes; two brokers' concurrent changes of the default both stay (conditional writes on
    what the store holds, not on each broker's copy)."""
    admin = AdminClient({"bootstrap.servers": cluster[0].bootstrap})
    assert _set_default(cluster[0], "log.retention.ms", "7200000") == ErrorCode.none
    default = ("7200000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    for b in (1, 2, 3):
        _wait_for(lambda b=b: _broker_config(admin, b, "log.retention.ms") == default)

    _set(admin, 2, "log.retention.ms", "3600000")
    own = ("3600000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    assert _broker_config(admin, 2, "log.retention.ms") == own
    time.sleep(1)  # broker 2's own value must not reach the others
    assert _broker_config(admin, 1, "log.retention.ms") == default
    assert _broker_config(admin, 3, "log.retention.ms") == default

    errors: list[int] = []

    def alter(broker: Any, name: str, values: list[str]) -> None:
        errors.extend(_set_default(broker, name, v) for v in values)

    threads = [
        threading.Thread(
            target=alter, args=(cluster[0], "num.partitions", [str(2 + i) for i in range(10)])
        ),
        threading.Thread(
            target=alter,
            args=(cluster[1], "log.segment.bytes", [str((1 + i) << 20) for i in range(10)]),
        ),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [ErrorCode.none] * 20
    for b in (1, 2, 3):
        _wait_for(
            lambda b=b: (
                _broker_config(admin, b, "num.partitions")[0] == "11"
                and _broker_config(admin, b, "log.segment.bytes")[0] == str(10 << 20)
            )
        )
    assert _broker_config(admin, 2, "log.retention.ms") == own
    assert _broker_config(admin, 3, "log.retention.ms") == default
    # another broker's id is refused as Kafka refuses it; "" describes the defaults
    assert _describe_error(cluster[0], "2") == ErrorCode.invalid_request
    assert _describe_error(cluster[0], "") == ErrorCode.none


def _wait_for(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.2)


def _offline_by_metadata(broker: Any, topic: str) -> tuple[list[int], dict[int, tuple[int, ...]]]:
    answer = _metadata_answer(broker, topic)
    (t,) = answer.topics
    brokers = sorted(b.node_id for b in answer.brokers)
    return brokers, {p.partition_index: tuple(p.offline_replicas) for p in t.partitions}


def _partition_view(answer_topic: Any) -> dict[int, tuple[int, int, tuple[int, ...]]]:
    """Partition → (error code, leader id, offline replicas)."""
    return {
        p.partition_index: (p.error_code, p.leader_id, tuple(p.offline_replicas))
        for p in answer_topic.partitions
    }


def _offline_by_describe_topic_partitions(
    broker: Any, topic: str, whole: bool = False
) -> dict[int, Any]:
    req = rawclient.schema("describe_topic_partitions", 0, "request")
    resp = rawclient.schema("describe_topic_partitions", 0, "response")
    with rawclient.RawConnection(broker.host, broker.port) as conn:
        answer = conn.request(
            req.DescribeTopicPartitionsRequest(
                topics=(req.TopicRequest(name=topic),), response_partition_limit=i32(2000)
            ),
            resp.DescribeTopicPartitionsResponse,
        )
    (t,) = answer.topics
    if whole:
        return _partition_view(t)
    return {p.partition_index: tuple(p.offline_replicas) for p in t.partitions}


def _metadata_view(broker: Any, topic: str) -> dict[int, Any]:
    (t,) = _metadata_answer(broker, topic).topics
    return _partition_view(t)


def test_describe_topic_partitions_names_a_killed_brokers_replicas_offline_as_metadata_does(
    cluster,
) -> None:
    """A SIGKILLed broker is judged dead at once (its listener refuses connects): Metadata
    lists its replicas offline right away, and DescribeTopicPartitions (what Kafka 4's
    AdminClient.describeTopics sends) must say the same, not wait for its ZooKeeper session
    (18 s) to end."""
    b1, _, b3 = cluster
    admin = AdminClient({"bootstrap.servers": b1.bootstrap})  # referenced until done
    admin.create_topics([NewTopic("offl", 6, 1)])["offl"].result(30)
    _wait_for(lambda: len(_metadata(b1, "offl")) == 6)
    on_b3 = {p for p, (leader, _, _) in _metadata(b1, "offl").items() if leader == 3}
    assert on_b3
    assert set(_offline_by_describe_topic_partitions(b1, "offl").values()) == {()}
    # broker 1's reachability watch judges only a broker whose connection it had (and lost):
    # give it time to connect to broker 3's listener, which just started
    time.sleep(2)
    b3.kill()
    _wait_for(lambda: {p for p, o in _offline_by_metadata(b1, "offl")[1].items() if o} == on_b3)
    described = _offline_by_describe_topic_partitions(b1, "offl")
    brokers, by_metadata = _offline_by_metadata(b1, "offl")
    assert 3 in brokers  # its session has not ended: registered, judged dead
    assert described == by_metadata
    assert {p for p, o in described.items() if o} == on_b3
    # and the leader: -1 with LEADER_NOT_AVAILABLE in both (DTP named the dead broker)
    whole = _offline_by_describe_topic_partitions(b1, "offl", whole=True)
    assert whole == _metadata_view(b1, "offl")
    for p in on_b3:
        assert whole[p][:2] == (ErrorCode.leader_not_available, -1), whole[p]


def _create_raw(
    broker: Any,
    name: str,
    *,
    partitions: int = -1,
    replication_factor: int = -1,
    assignments: list[list[int]] | None = None,
    validate_only: bool = False,
) -> Any:
    """CreateTopics v7 as a client sends it: the topic's result (error, message, the
    replication factor the broker reports)."""
    req = rawclient.schema("create_topics", 7, "request")
    resp = rawclient.schema("create_topics", 7, "response")
    with rawclient.RawConnection(broker.host, broker.port) as conn:
        answer = conn.request(
            req.CreateTopicsRequest(
                topics=(
                    req.CreatableTopic(
                        name=name,
                        num_partitions=i32(partitions),
                        replication_factor=i16(replication_factor),
                        assignments=tuple(
                            req.CreatableReplicaAssignment(
                                partition_index=i32(p), broker_ids=tuple(i32(b) for b in ids)
                            )
                            for p, ids in enumerate(assignments or ())
                        ),
                        configs=(),
                    ),
                ),
                timeout=rawclient.ms(20000),
                validate_only=validate_only,
            ),
            resp.CreateTopicsResponse,
        )
    (result,) = answer.topics
    return result


def test_a_replication_factor_above_the_journal_partitions_is_refused(cluster) -> None:
    """Replication factor 1 (journal partitions of one replica): asking for 3 replicas is
    INVALID_REPLICATION_FACTOR saying why, not a topic of one replica answered as 3; 1 and -1
    are created with 1; more than the live brokers keeps Kafka's message."""
    b1, b2, _ = cluster
    for validate_only in (True, False):
        refused = _create_raw(
            b1, "rf3", partitions=3, replication_factor=3, validate_only=validate_only
        )
        assert refused.error_code == ErrorCode.invalid_replication_factor
        assert "journal partition's 1 replica(s)" in refused.error_message
        assert "default.replication.factor" in refused.error_message
    assert _metadata_replicas(b2, "rf3") is None
    more = _create_raw(b1, "rf4", partitions=1, replication_factor=4)
    assert more.error_code == ErrorCode.invalid_replication_factor
    assert "only 3 broker(s) are registered" in more.error_message
    zero = _create_raw(b1, "rf0", partitions=1, replication_factor=0)
    assert zero.error_message.startswith("Replication factor must be larger than 0")
    for rf in (1, -1):
        created = _create_raw(b2, f"rf-ok{-rf}", partitions=3, replication_factor=rf)
        assert (created.error_code, created.replication_factor) == (ErrorCode.none, 1)
        _wait_for(lambda rf=rf: _metadata_replicas(b1, f"rf-ok{-rf}") is not None)
        assert {len(r) for r in _metadata_replicas(b1, f"rf-ok{-rf}").values()} == {1}


def _metadata_replicas(broker: Any, topic: str) -> dict[int, tuple[int, ...]] | None:
    req = rawclient.schema("metadata", 12, "request")
    resp = rawclient.schema("metadata", 12, "response")
    with rawclient.RawConnection(broker.host, broker.port) as conn:
        answer = conn.request(
            req.MetadataRequest(
                topics=(req.MetadataRequestTopic(topic_id=None, name=topic),),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            ),
            resp.MetadataResponse,
        )
    (t,) = answer.topics
    if t.error_code != ErrorCode.none:
        return None
    return {p.partition_index: tuple(p.replica_nodes) for p in t.partitions}


def test_a_smaller_replication_factor_gets_the_journal_partitions_and_says_so(
    broker_factory, zookeeper
) -> None:
    """Replication factor 3: a topic asked with 1 or 2 replicas (validate_only too) is
    answered with 3, the replicas it gets (each partition has its journal partition's)."""
    (b1, b2, b3), _ = _start_cluster(broker_factory, zookeeper)
    checked = _create_raw(b1, "rf-two", partitions=2, replication_factor=2, validate_only=True)
    assert (checked.error_code, checked.replication_factor) == (ErrorCode.none, 3)
    for rf in (1, 2):
        created = _create_raw(b2, f"rf-{rf}", partitions=3, replication_factor=rf)
        assert (created.error_code, created.replication_factor) == (ErrorCode.none, 3)
        _wait_for(lambda rf=rf: _metadata_replicas(b3, f"rf-{rf}") is not None)
        assert {len(r) for r in _metadata_replicas(b3, f"rf-{rf}").values()} == {3}
    # a manual assignment: a journal partition with that replica list (order too), else one
    # with the same replicas
    lists = set(_metadata_replicas(b3, "rf-1").values())
    first = sorted(lists)[0]
    other = next(p for p in itertools.permutations(first) if p not in lists)
    created = _create_raw(b1, "as-3", assignments=[list(first), list(other)])
    assert (created.error_code, created.replication_factor) == (ErrorCode.none, 3)
    _wait_for(lambda: _metadata_replicas(b2, "as-3") is not None)
    placed = _metadata_replicas(b2, "as-3")
    assert placed[0] == first and placed[1] in lists and sorted(placed[1]) == sorted(other)


def test_replica_assignments_place_partitions_on_journal_partitions_of_those_replicas(
    cluster,
) -> None:
    """Replication factor 1: an assignment naming one broker per partition places each
    partition on a journal partition of that broker (CreateTopics and CreatePartitions,
    confluent-kafka); Kafka's checks answer an empty list, an unknown or repeated broker
    and inconsistent lengths; a list no journal partition has is INVALID_REPLICA_ASSIGNMENT
    naming the lists they have."""
    from confluent_kafka.admin import NewPartitions

    b1, b2, _ = cluster
    admin = AdminClient({"bootstrap.servers": b1.bootstrap})  # referenced until done
    admin.create_topics(
        [NewTopic("assigned", 4, replica_assignment=[[2], [3], [1], [2]])], operation_timeout=20
    )["assigned"].result(30)
    admin.create_partitions(
        [NewPartitions("assigned", 6, replica_assignment=[[3], [1]])], operation_timeout=20
    )["assigned"].result(30)
    _wait_for(lambda: len(_metadata_replicas(b2, "assigned") or {}) == 6)
    assert _metadata_replicas(b2, "assigned") == {
        0: (2,),
        1: (3,),
        2: (1,),
        3: (2,),
        4: (3,),
        5: (1,),
    }
    assert {leader for leader, _, _ in _metadata(b2, "assigned").values()} == {1, 2, 3}
    for assignment, code, message in [
        ([[1, 2, 3]], ErrorCode.invalid_replica_assignment, "replica lists [1], [2], [3]."),
        ([[4]], ErrorCode.invalid_replica_assignment, "includes broker 4, but no such broker"),
        ([[1, 1]], ErrorCode.invalid_replica_assignment, "includes the broker 1 more than once"),
        ([[1], [2, 3]], ErrorCode.invalid_replica_assignment, "not consistent with previous"),
        ([[]], ErrorCode.invalid_replica_assignment, "includes an empty replica list"),
    ]:
        refused = _create_raw(b1, "refused", assignments=assignment)
        assert refused.error_code == code, (assignment, refused)
        assert message in refused.error_message, (assignment, refused.error_message)
    grown = admin.create_partitions(
        [NewPartitions("assigned", 7, replica_assignment=[[1, 2]])], operation_timeout=20
    )["assigned"]
    with pytest.raises(Exception, match="which have 1 replica"):
        grown.result(30)
