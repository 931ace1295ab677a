"""Partition admin calls against a real broker, as a one-broker Kafka answers them:
DescribeLogDirs and AlterReplicaLogDirs (kafka-python), ElectLeaders (confluent-kafka and
kafka-python), Alter/ListPartitionReassignments (kafka-python), and raw requests for what the
clients do not send (every version, bad election types).
"""

from __future__ import annotations

import os
import time

import pytest
from confluent_kafka import ElectionType
from confluent_kafka import TopicPartition as CKTopicPartition
from kafka import TopicPartition
from kafka import errors as kerrors
from kafka.admin import KafkaAdminClient
from kio.schema.errors import ErrorCode

from . import rawclient
from .helpers import Msg, admin, create_topic, produce, unique_topic

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def kp_admin(module_broker):  # type: ignore[no-untyped-def]
    client = KafkaAdminClient(bootstrap_servers=module_broker.bootstrap, request_timeout_ms=15000)
    yield client
    client.close()


def _queue_dir(broker) -> str:  # type: ignore[no-untyped-def]
    return os.path.abspath(broker.data_dir / "queues")


def _journal_dir(broker) -> str:  # type: ignore[no-untyped-def]
    return os.path.abspath(broker.data_dir / "journal")


def _dir_bytes(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(path)
        for name in names
        if name.endswith(".log")
    )


# -- DescribeLogDirs ------------------------------------------------------------------------------
def test_describe_log_dirs_reports_queue_log_sizes_and_both_directories(module_broker, kp_admin):
    topic = create_topic(module_broker.bootstrap, partitions=3)
    value = b"x" * 1000
    produce(module_broker.bootstrap, topic, [Msg(None, value)] * 50, partition=1)
    produce(module_broker.bootstrap, topic, [Msg(None, value)] * 5, partition=2)
    queue_dir, journal_dir = _queue_dir(module_broker), _journal_dir(module_broker)

    for _ in range(100):  # the splitter trails the acknowledgement by milliseconds
        (answer,) = kp_admin.describe_log_dirs({topic: [0, 1, 2]})
        dirs = {d["log_dir"]: d for d in answer["log_dirs"]}
        parts = {
            p["partition_index"]: p
            for t in dirs[queue_dir]["topics"]
            if t["name"] == topic
            for p in t["partitions"]
        }
        if all(p["offset_lag"] == 0 for p in parts.values()) and parts[2]["partition_size"]:
            break
        time.sleep(0.05)
    assert answer["broker"] == 1
    assert set(dirs) == {queue_dir, journal_dir}
    for d in dirs.values():
        assert d["error_code"] == 0
        st = os.statvfs(d["log_dir"])
        assert d["total_bytes"] == st.f_blocks * st.f_frsize
        # usable space moves as other tests write; it is the file system's, not a constant
        assert 0 < d["usable_bytes"] <= d["total_bytes"]
    assert dirs[journal_dir]["topics"] == []  # journal partitions are not topic partitions
    assert set(parts) == {0, 1, 2}
    assert parts[0]["partition_size"] == 0
    # the sizes are the queue logs' segment files
    for index in (1, 2):
        on_disk = _dir_bytes(os.path.join(queue_dir, f"{topic}-{index}"))
        assert parts[index]["partition_size"] == on_disk
    assert parts[1]["partition_size"] > 50 * 1000 > parts[2]["partition_size"] > 5 * 1000
    assert all(p["offset_lag"] == 0 and p["is_future_key"] is False for p in parts.values())


def test_describe_log_dirs_all_topics_and_unknown_ones(module_broker, kp_admin):
    topic = create_topic(module_broker.bootstrap, partitions=2)
    (answer,) = kp_admin.describe_log_dirs(None)
    dirs = {d["log_dir"]: d for d in answer["log_dirs"]}
    listed = {t["name"]: t for t in dirs[_queue_dir(module_broker)]["topics"]}
    assert sorted(p["partition_index"] for p in listed[topic]["partitions"]) == [0, 1]

    # topics and partitions the broker does not have are left out, as Kafka does
    (answer,) = kp_admin.describe_log_dirs({"no-such-topic": [0], topic: [1, 7]})
    dirs = {d["log_dir"]: d for d in answer["log_dirs"]}
    (only,) = dirs[_queue_dir(module_broker)]["topics"]
    assert only["name"] == topic
    assert [p["partition_index"] for p in only["partitions"]] == [1]


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5])
def test_describe_log_dirs_every_version(module_broker, version):
    topic = create_topic(module_broker.bootstrap)
    req = rawclient.schema("describe_log_dirs", version, "request")
    resp = rawclient.schema("describe_log_dirs", version, "response")
    with rawclient.RawConnection(module_broker.host, module_broker.port) as conn:
        answer = conn.request(
            req.DescribeLogDirsRequest(
                topics=(req.DescribableLogDirTopic(topic=topic, partitions=(0,)),)
            ),
            resp.DescribeLogDirsResponse,
        )
    results = {r.log_dir: r for r in answer.results}
    queue = results[_queue_dir(module_broker)]
    assert queue.error_code == ErrorCode.none
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in queue.topics] == [
        (topic, [0])
    ]
    if version >= 4:
        assert queue.total_bytes > 0 and queue.usable_bytes > 0


# -- AlterReplicaLogDirs --------------------------------------------------------------------------
def test_alter_replica_log_dirs_same_dir_unknown_dir_unknown_partition(module_broker, kp_admin):
    topic = create_topic(module_broker.bootstrap, partitions=2)
    broker_id = 1
    answer = kp_admin.alter_replica_log_dirs(
        {
            (topic, 0, broker_id): _queue_dir(module_broker),  # already there: nothing to do
            (topic, 5, broker_id): _queue_dir(module_broker),
            ("no-such-topic", 0, broker_id): _queue_dir(module_broker),
            # the journal holds no partition's log
            (topic, 1, broker_id): _journal_dir(module_broker),
        }
    )
    by_tp = {(tpr.topic, tpr.partition): err for tpr, err in answer.items()}
    assert by_tp == {
        (topic, 0): kerrors.NoError,
        (topic, 1): kerrors.LogDirNotFoundError,
        (topic, 5): kerrors.UnknownTopicOrPartitionError,
        ("no-such-topic", 0): kerrors.UnknownTopicOrPartitionError,
    }


def test_alter_replica_log_dirs_to_an_unknown_dir_is_log_dir_not_found(module_broker, kp_admin):
    topic = create_topic(module_broker.bootstrap)
    answer = kp_admin.alter_replica_log_dirs({(topic, 0, 1): "/elsewhere"})
    assert {(t.topic, t.partition): e for t, e in answer.items()} == {
        (topic, 0): kerrors.LogDirNotFoundError
    }


# -- ElectLeaders ---------------------------------------------------------------------------------
@pytest.mark.parametrize("election", [ElectionType.PREFERRED, ElectionType.UNCLEAN])
def test_elect_leaders_confluent_election_not_needed(module_broker, election):
    topic = create_topic(module_broker.bootstrap, partitions=2)
    client = admin(module_broker.bootstrap)
    future = client.elect_leaders(
        election, [CKTopicPartition(topic, 0), CKTopicPartition(topic, 1)]
    )
    result = future.result(timeout=20)
    assert sorted((tp.topic, tp.partition) for tp in result) == [(topic, 0), (topic, 1)]
    for error in result.values():
        assert error is not None and error.code() == ErrorCode.election_not_needed


def test_elect_leaders_kafka_python_unknown_partition_and_all(module_broker, kp_admin):
    topic = create_topic(module_broker.bootstrap, partitions=2)
    response = kp_admin.elect_leaders(0, {topic: [0, 9]}, raise_errors=False)
    (result,) = response.replica_election_results
    assert result.topic == topic
    assert [(p.partition_id, p.error_code) for p in result.partition_result] == [
        (0, ErrorCode.election_not_needed),
        (9, ErrorCode.unknown_topic_or_partition),
    ]
    assert result.partition_result[1].error_message == f"Unable to find partition {topic}:9."
    # null (every partition): each topic is listed, none of its partitions, as no election
    # was needed (kafka-python expands None itself, so the raw client sends the null)
    req = rawclient.schema("elect_leaders", 2, "request")
    resp = rawclient.schema("elect_leaders", 2, "response")
    with rawclient.RawConnection(module_broker.host, module_broker.port) as conn:
        response = conn.request(
            req.ElectLeadersRequest(
                election_type=0, topic_partitions=None, timeout=rawclient.ms(10000)
            ),
            resp.ElectLeadersResponse,
        )
    listed = {r.topic: list(r.partition_result) for r in response.replica_election_results}
    assert listed[topic] == []


@pytest.mark.parametrize("version", [0, 1, 2])
def test_elect_leaders_every_version(module_broker, version):
    topic = create_topic(module_broker.bootstrap)
    req = rawclient.schema("elect_leaders", version, "request")
    resp = rawclient.schema("elect_leaders", version, "response")
    extra = {"election_type": 0} if version >= 1 else {}
    with rawclient.RawConnection(module_broker.host, module_broker.port) as conn:
        answer = conn.request(
            rawclient.build(
                req.ElectLeadersRequest,
                topic_partitions=(req.TopicPartitions(topic=topic, partitions=(0,)),),
                timeout=rawclient.ms(10000),
                **extra,
            ),
            resp.ElectLeadersResponse,
        )
        (result,) = answer.replica_election_results
        assert [p.error_code for p in result.partition_result] == [ErrorCode.election_not_needed]
        if version >= 1:
            assert answer.error_code == ErrorCode.none
            bad = conn.request(
                req.ElectLeadersRequest(
                    election_type=7,
                    topic_partitions=(req.TopicPartitions(topic=topic, partitions=(0,)),),
                    timeout=rawclient.ms(10000),
                ),
                resp.ElectLeadersResponse,
            )
            assert bad.error_code == ErrorCode.invalid_request
            (result,) = bad.replica_election_results
            assert [p.error_code for p in result.partition_result] == [ErrorCode.invalid_request]


# -- Alter/ListPartitionReassignments -------------------------------------------------------------
def test_alter_partition_reassignments_one_broker(module_broker, kp_admin):
    topic = create_topic(module_broker.bootstrap, partitions=2)
    answer = kp_admin.alter_partition_reassignments(
        {
            TopicPartition(topic, 0): [1],  # the current assignment: accepted, nothing moves
            TopicPartition(topic, 1): [2],  # no broker 2
            TopicPartition(topic, 7): [1],
            TopicPartition(unique_topic(), 0): [1],
        }
    )
    assert answer[TopicPartition(topic, 0)] is None
    assert answer[TopicPartition(topic, 1)] is kerrors.InvalidReplicationAssignmentError
    assert answer[TopicPartition(topic, 7)] is kerrors.UnknownTopicOrPartitionError
    assert len(answer) == 4
    # cancelling: there is never a reassignment in progress
    answer = kp_admin.alter_partition_reassignments({TopicPartition(topic, 0): None})
    assert answer == {TopicPartition(topic, 0): kerrors.NoReassignmentInProgressError}
    assert kp_admin.list_partition_reassignments() == {}
    assert kp_admin.list_partition_reassignments({topic: [0, 1]}) == {}


@pytest.mark.parametrize("version", [0, 1])
def test_alter_partition_reassignments_raw_messages(module_broker, version):
    topic = create_topic(module_broker.bootstrap)
    req = rawclient.schema("alter_partition_reassignments", version, "request")
    resp = rawclient.schema("alter_partition_reassignments", version, "response")
    targets = [(1,), (), (1, 1), (3, 1)]
    with rawclient.RawConnection(module_broker.host, module_broker.port) as conn:
        answer = conn.request(
            rawclient.build(
                req.AlterPartitionReassignmentsRequest,
                timeout=rawclient.ms(10000),
                allow_replication_factor_change=False,
                topics=tuple(
                    req.ReassignableTopic(
                        name=topic,
                        partitions=(req.ReassignablePartition(partition_index=0, replicas=r),),
                    )
                    for r in targets
                ),
            ),
            resp.AlterPartitionReassignmentsResponse,
        )
    assert answer.error_code == ErrorCode.none
    got = [(p.error_code, p.error_message) for t in answer.responses for p in t.partitions]
    assert got == [
        (ErrorCode.none, None),
        (
            ErrorCode.invalid_replica_assignment,
            "The manual partition assignment includes an empty replica list.",
        ),
        (
            ErrorCode.invalid_replica_assignment,
            "The manual partition assignment includes the broker 1 more than once.",
        ),
        (
            ErrorCode.invalid_replica_assignment,
            "The manual partition assignment includes broker 3, but no such broker is registered.",
        ),
    ]
    if version >= 1:
        assert answer.allow_replication_factor_change is False
