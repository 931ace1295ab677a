"""Kafka's semantics at the log's edges, over a real broker: the reproduced defects 5-7 of the
I/O-error issue (ListOffsets by time below the log start, internal topics protected by the
broker, InitProducerId without a transactional id) and the partition leader epoch that
batches and responses carry.

Defect 4 (a fetch between the high watermark and the log end) needs the splitter held back,
so it is tested on the engine: tests/unit/storage/test_log_edges.py.
"""

from __future__ import annotations

import struct
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import ConfigResource

from .helpers import Msg, admin, create_topic, produce
from .rawclient import (
    RawConnection,
    build,
    build_batch,
    fetch_batches,
    ms,
    produce_raw,
    schema,
)

pytestmark = pytest.mark.timeout(120)

INVALID_TOPIC_EXCEPTION = 17
INVALID_REPLICATION_FACTOR = 38


def test_offsets_for_times_never_answers_below_the_log_start(module_broker) -> None:
    """Reproduced: after DeleteRecords, ListOffsets by timestamp answered an offset below the
    log start, where a fetch is out of range. Kafka searches from the log start."""
    b = module_broker.bootstrap
    topic = create_topic(b)
    base = int(time.time() * 1000) - 60_000
    msgs = [Msg(b"k%d" % i, b"v%d" % i, (), base + i * 10) for i in range(10)]
    produce(b, topic, msgs, acks="all")
    client = admin(b)  # referenced until its futures resolve
    futures = client.delete_records([TopicPartition(topic, 0, 5)])
    for future in futures.values():
        assert future.result(timeout=20).low_watermark == 5
    consumer = Consumer({"bootstrap.servers": b, "group.id": "edges"})
    try:
        for ts, expected in ((base, 5), (base + 30, 5), (base + 60, 6), (base + 95, 10)):
            (found,) = consumer.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=15)
            assert found.error is None
            want = expected if expected < 10 else -1  # past the last record: none
            assert found.offset == want, (ts, found.offset)
    finally:
        consumer.close()


def test_delete_records_on_the_internal_topic_is_refused(module_broker) -> None:
    """Reproduced: DeleteRecords on __consumer_offsets was accepted (Kafka refuses it with
    INVALID_TOPIC_EXCEPTION: "Cannot delete records of internal topic")."""
    b = module_broker.bootstrap
    produce(b, create_topic(b), [Msg(None, b"x")], acks="all")
    commit_some(b, "edges-group")
    client = admin(b)
    futures = client.delete_records([TopicPartition("__consumer_offsets", 0, -1)])
    for future in futures.values():
        with pytest.raises(Exception) as err:
            future.result(timeout=20)
        assert err.value.args[0].code() == INVALID_TOPIC_EXCEPTION


def test_delete_topics_on_the_internal_topic_is_refused_and_commits_go_on(module_broker) -> None:
    """Reproduced: DeleteTopics on __consumer_offsets was accepted and every commit failed
    until a restart."""
    b = module_broker.bootstrap
    topic = commit_some(b, "edges-delete")
    client = admin(b)
    futures = client.delete_topics(["__consumer_offsets"], operation_timeout=10)
    with pytest.raises(Exception) as err:
        futures["__consumer_offsets"].result(timeout=20)
    assert err.value.args[0].code() == INVALID_TOPIC_EXCEPTION
    assert committed(b, "edges-delete", topic) == 1
    commit_some(b, "edges-delete", topic, offset=1)
    assert committed(b, "edges-delete", topic) == 2


@pytest.mark.slow  # several seconds: the whole suite runs it, the fast set not
@pytest.mark.broker_settings(
    **{
        "log.retention.bytes": 1,
        "log.retention.check.interval.ms": 100,
        "offsets.topic.segment.bytes": 1024,
        "offsets.topic.num.partitions": 1,
    }
)
def test_broker_retention_never_deletes_committed_offsets(broker) -> None:
    """Reproduced: __consumer_offsets inherited a broker-wide log.retention.bytes, which
    deleted commits. Its retention is pinned to -1: the group coordinator trims it."""
    b = broker.bootstrap
    topic = create_topic(b)
    produce(b, topic, [Msg(None, b"v%d" % i) for i in range(3)], acks="all")
    for group in range(30):  # many commits: its segments roll
        commit_some(b, f"g{group}", topic, offset=group % 3)
    resource = ConfigResource(ConfigResource.Type.TOPIC, "__consumer_offsets")
    client = admin(b)
    described = client.describe_configs([resource])[resource].result(timeout=20)
    assert described["retention.bytes"].value == "-1"
    assert described["retention.ms"].value == "-1"
    time.sleep(1.0)  # several retention rounds
    broker.restart()
    for group in range(30):
        assert committed(b, f"g{group}", topic) == group % 3 + 1


def test_init_producer_id_without_transactional_id_allocates_a_fresh_id(module_broker) -> None:
    """Reproduced: a non-transactional InitProducerId that named a producer id bumped that
    id's epoch, so one client could fence another's producer. Kafka allocates a new id."""
    request = schema("init_producer_id", 4, "request").InitProducerIdRequest
    response = schema("init_producer_id", 4, "response").InitProducerIdResponse
    with RawConnection(module_broker.host, module_broker.port) as conn:

        def init(pid: int, epoch: int) -> tuple[int, int]:
            answer = conn.request(
                build(
                    request,
                    transactional_id=None,
                    transaction_timeout=ms(60000),
                    producer_id=pid,
                    producer_epoch=epoch,
                ),
                response,
            )
            assert answer.error_code == 0
            return answer.producer_id, answer.producer_epoch

        victim, epoch = init(-1, -1)
        assert epoch == 0
        other, other_epoch = init(victim, 0)  # another client names the victim's id
        assert other != victim and other_epoch == 0


def test_batches_carry_the_partition_leader_epoch_across_restarts(broker) -> None:
    """A single node has one fixed leader epoch (0) that survives restarts: the broker
    writes it into every batch (clients send -1), and Metadata and ListOffsets report it."""
    topic = create_topic(broker.bootstrap)
    batch = build_batch([(b"k", b"v")])
    struct.pack_into(">i", batch, 12, 7)  # a client's own value (librdkafka sends -1)
    with RawConnection(broker.host, broker.port) as conn:
        assert produce_raw(conn, topic, 0, bytes(batch)).error_code == 0
    for _ in range(2):
        (stored,) = fetch_batches(broker, topic, 0, 0, end=1)
        assert struct.unpack_from(">i", stored, 12)[0] == 0
        assert stored[16:] == batch[16:]  # nothing else changed: the CRC still holds
        assert metadata_leader_epoch(broker, topic) == 0
        broker.restart()


def metadata_v12(broker, topics: list[tuple[str | None, uuid.UUID]]) -> Any:  # type: ignore[no-untyped-def]
    """A Metadata v12 answer for ``topics`` (name, topic id), never auto-creating."""
    mod = schema("metadata", 12, "request")
    with RawConnection(broker.host, broker.port) as conn:
        return conn.request(
            build(
                mod.MetadataRequest,
                topics=tuple(
                    build(mod.MetadataRequestTopic, topic_id=i, name=n) for n, i in topics
                ),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            ),
            schema("metadata", 12, "response").MetadataResponse,
        )


def metadata_leader_epoch(broker, topic: str) -> int:  # type: ignore[no-untyped-def]
    answer = metadata_v12(broker, [(topic, uuid.UUID(int=0))])
    (partition,) = answer.topics[0].partitions
    return int(partition.leader_epoch)


def commit_some(bootstrap: str, group: str, topic: str | None = None, offset: int = 0) -> str:
    """Commit ``offset + 1`` for partition 0 of ``topic`` (a new one by default)."""
    if topic is None:
        topic = create_topic(bootstrap)
        produce(bootstrap, topic, [Msg(None, b"a"), Msg(None, b"b"), Msg(None, b"c")])
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, offset + 1)], asynchronous=False)
    finally:
        consumer.close()
    return topic


def committed(bootstrap: str, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=15)
        return tp.offset
    finally:
        consumer.close()


@pytest.mark.broker_settings(**{"default.replication.factor": 3})
def test_default_replication_factor_is_honoured(broker) -> None:
    """default.replication.factor was accepted and ignored. A single broker cannot hold three
    replicas: topics created without a factor get INVALID_REPLICATION_FACTOR, as from Kafka,
    an explicit factor of 1 works, and the broker says so at start."""
    from confluent_kafka.admin import NewTopic

    client = admin(broker.bootstrap)
    futures = client.create_topics([NewTopic("rf-default", num_partitions=1)])
    with pytest.raises(Exception) as err:
        futures["rf-default"].result(timeout=20)
    assert err.value.args[0].code() == INVALID_REPLICATION_FACTOR
    futures = client.create_topics([NewTopic("rf-one", num_partitions=1, replication_factor=1)])
    futures["rf-one"].result(timeout=20)
    assert "default.replication.factor=3 cannot be met" in broker.log()


def test_metadata_by_topic_id_echoes_an_unknown_id(module_broker) -> None:
    """Metadata v12+ by topic id: a known id answers its topic; an unknown one answers
    UNKNOWN_TOPIC_ID with a null name and the id it asked for, as Kafka's KafkaApis does (the
    id was answered null, so a client could not tell which of its ids was unknown)."""
    topic = create_topic(module_broker.bootstrap, partitions=2)
    known = topic_id_of(module_broker, topic)
    unknown = uuid.uuid4()
    answer = metadata_v12(module_broker, [(None, unknown), (None, known)])
    got = [(t.error_code, t.name, t.topic_id, len(t.partitions)) for t in answer.topics]
    assert got == [(100, None, unknown, 0), (0, topic, known, 2)]  # 100: UNKNOWN_TOPIC_ID


def topic_id_of(broker, topic: str) -> uuid.UUID:  # type: ignore[no-untyped-def]
    (entry,) = metadata_v12(broker, [(topic, uuid.UUID(int=0))]).topics
    return entry.topic_id


def test_list_offsets_naming_a_partition_twice_is_invalid_request(module_broker) -> None:
    """A ListOffsets naming one partition more than once (what librdkafka's offsets_for_times
    sends for a repeated partition, or ``kcat -Q -t t:0:-1 -t t:0:TS``) was answered entry by
    entry, which clients merge per partition into a confusing answer; Kafka answers
    INVALID_REQUEST for each (an independent fuzz campaign). Another partition is answered."""
    topic = create_topic(module_broker.bootstrap, partitions=2)
    produce(module_broker.bootstrap, topic, [Msg(None, b"a"), Msg(None, b"b")])
    mod = schema("list_offsets", 7, "request")
    entries = [(0, -1), (0, -2), (1, -1)]
    with RawConnection(module_broker.host, module_broker.port) as conn:
        answer = conn.request(
            build(
                mod.ListOffsetsRequest,
                replica_id=-1,
                isolation_level=0,
                topics=(
                    build(
                        mod.ListOffsetsTopic,
                        name=topic,
                        partitions=tuple(
                            build(
                                mod.ListOffsetsPartition,
                                partition_index=p,
                                current_leader_epoch=-1,
                                timestamp=ts,
                            )
                            for p, ts in entries
                        ),
                    ),
                ),
            ),
            schema("list_offsets", 7, "response").ListOffsetsResponse,
        )
    got = [(p.partition_index, p.error_code, p.offset) for p in answer.topics[0].partitions]
    assert got == [(0, 42, -1), (0, 42, -1), (1, 0, 0)]  # 42: INVALID_REQUEST
