"""OffsetForLeaderEpoch (KIP-320) against a real broker: raw requests at every version, and a
librdkafka consumer whose positions carry leader epochs (it validates them with this API
before fetching)."""

from __future__ import annotations

import struct

import pytest
from confluent_kafka import Consumer, TopicPartition
from kio.schema.errors import ErrorCode

from . import rawclient
from .helpers import Msg, create_topic, produce
from .test_list_offsets_versions import list_offsets_partition

pytestmark = pytest.mark.timeout(90)

RECORD_COUNT_AT = 57  # a v2 record batch's record count (after base offset ... producer fields)


def _ask(broker, version: int, topic: str, partitions):  # type: ignore[no-untyped-def]
    """One OffsetForLeaderEpoch request: partitions are (index, current epoch, epoch)."""
    req = rawclient.schema("offset_for_leader_epoch", version, "request")
    resp = rawclient.schema("offset_for_leader_epoch", version, "response")
    extra = {"replica_id": -1} if version >= 3 else {}
    with rawclient.RawConnection(broker.host, broker.port) as conn:
        answer = conn.request(
            rawclient.build(
                req.OffsetForLeaderEpochRequest,
                topics=(
                    req.OffsetForLeaderTopic(
                        topic=topic,
                        partitions=tuple(
                            req.OffsetForLeaderPartition(
                                partition=p, current_leader_epoch=current, leader_epoch=epoch
                            )
                            for p, current, epoch in partitions
                        ),
                    ),
                ),
                **extra,
            ),
            resp.OffsetForLeaderEpochResponse,
        )
    (result,) = answer.topics
    assert result.topic == topic
    return [(p.partition, p.error_code, p.leader_epoch, p.end_offset) for p in result.partitions]


@pytest.mark.parametrize("version", [2, 3, 4])
def test_offset_for_leader_epoch_every_version(module_broker, version):
    topic = create_topic(module_broker.bootstrap, partitions=2)
    produce(module_broker.bootstrap, topic, [Msg(None, b"v%d" % i) for i in range(7)])
    answer = _ask(
        module_broker,
        version,
        topic,
        [
            (0, -1, 0),  # the current epoch: its end is the log end
            (0, 0, 0),
            (1, -1, 0),  # an empty partition
            (0, -1, 3),  # an epoch this partition never had
            (0, -1, -1),  # undefined
            (0, 1, 0),  # the client knows a newer leader epoch than the broker
            (0, -5, 0),  # or an older one
            (5, -1, 0),
        ],
    )
    assert answer == [
        (0, ErrorCode.none, 0, 7),
        (0, ErrorCode.none, 0, 7),
        (1, ErrorCode.none, 0, 0),
        (0, ErrorCode.none, -1, -1),
        (0, ErrorCode.none, -1, -1),
        (0, ErrorCode.unknown_leader_epoch, -1, -1),
        (0, ErrorCode.fenced_leader_epoch, -1, -1),
        (5, ErrorCode.unknown_topic_or_partition, -1, -1),
    ]
    assert _ask(module_broker, version, "no-such-topic", [(0, -1, 0)]) == [
        (0, ErrorCode.unknown_topic_or_partition, -1, -1)
    ]


def test_librdkafka_validates_positions_with_leader_epochs(module_broker):
    """A position with a leader epoch is validated (OffsetForLeaderEpoch) before librdkafka
    fetches from it: the consumer reads from there, no truncation is reported."""
    topic = create_topic(module_broker.bootstrap)
    values = [b"r%d" % i for i in range(10)]
    produce(module_broker.bootstrap, topic, [Msg(None, v) for v in values])
    consumer = Consumer(
        {
            "bootstrap.servers": module_broker.bootstrap,
            "group.id": f"g-{topic}",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 4, leader_epoch=0)])
        got = []
        for _ in range(100):
            msg = consumer.poll(0.2)
            if msg is None:
                if len(got) == 6:
                    break
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.offset(), msg.value(), msg.leader_epoch()))
        assert got == [(4 + i, v, 0) for i, v in enumerate(values[4:])]
    finally:
        consumer.close()


@pytest.mark.parametrize("version", [9, 12, 13, 16])
def test_fetch_checks_the_current_leader_epoch(module_broker, version):
    """KIP-320: a Fetch naming the partition's leader epoch (0 on a single node) or none (-1)
    is served; an older one is FENCED_LEADER_EPOCH and a newer one UNKNOWN_LEADER_EPOCH, with
    no records, as Kafka's Partition.checkCurrentLeaderEpoch answers."""
    topic = create_topic(module_broker.bootstrap)
    produce(module_broker.bootstrap, topic, [Msg(None, b"e%d" % i) for i in range(3)])
    with rawclient.RawConnection(module_broker.host, module_broker.port) as conn:
        topic_id = rawclient.topic_id_of(conn, topic) if version >= 13 else None
        rawclient.wait_visible(conn, topic, 0, 3)  # split: a moment after the ack
        answers = {}
        for current in (-1, 0, 1, -5):
            part = rawclient.fetch_raw(
                conn, topic, 0, 0, version, topic_id=topic_id, current_leader_epoch=current
            )
            batches = rawclient.split_batches(part.records)
            records = sum(struct.unpack_from(">i", b, RECORD_COUNT_AT)[0] for b in batches)
            answers[current] = (part.error_code, records)
    assert answers == {
        -1: (ErrorCode.none, 3),
        0: (ErrorCode.none, 3),
        1: (ErrorCode.unknown_leader_epoch, 0),
        -5: (ErrorCode.fenced_leader_epoch, 0),
    }


def _list_offsets(broker, version: int, topic: str, current: int, target: int = -1):  # type: ignore[no-untyped-def]
    with rawclient.RawConnection(broker.host, broker.port) as conn:
        p = list_offsets_partition(conn, version, topic, target, current_leader_epoch=current)
    return p.error_code, p.offset, p.leader_epoch


@pytest.mark.parametrize("version", [4, 7, 11])
def test_list_offsets_checks_the_current_leader_epoch(module_broker, version):
    """KIP-320 for ListOffsets v4+: the latest offset is answered for the partition's leader
    epoch or none; an older epoch is fenced, a newer one unknown, with offset -1."""
    topic = create_topic(module_broker.bootstrap)
    produce(module_broker.bootstrap, topic, [Msg(None, b"l%d" % i) for i in range(4)])
    assert _list_offsets(module_broker, version, topic, -1) == (ErrorCode.none, 4, 0)
    assert _list_offsets(module_broker, version, topic, 0) == (ErrorCode.none, 4, 0)
    assert _list_offsets(module_broker, version, topic, 2) == (
        ErrorCode.unknown_leader_epoch,
        -1,
        -1,
    )
    assert _list_offsets(module_broker, version, topic, -3) == (
        ErrorCode.fenced_leader_epoch,
        -1,
        -1,
    )


def test_list_offsets_answers_the_epoch_of_the_offset_it_found(module_broker):
    """Reproduced (offsets audit): every answer carried the partition's current epoch, 0 here,
    also when nothing was found. Kafka answers -1 then (an empty max-timestamp lookup, a
    time past every record, latest-tiered of a topic that does not tier), and otherwise the
    epoch of the batch holding the offset (the multi-epoch case: test_replication.py's
    returning leader)."""
    topic = create_topic(module_broker.bootstrap)
    assert _list_offsets(module_broker, 9, topic, -1, -3) == (ErrorCode.none, -1, -1)
    assert _list_offsets(module_broker, 9, topic, -1, -2) == (ErrorCode.none, 0, 0)
    produce(module_broker.bootstrap, topic, [Msg(None, b"e%d" % i) for i in range(3)])
    assert _list_offsets(module_broker, 9, topic, -1, -2) == (ErrorCode.none, 0, 0)
    assert _list_offsets(module_broker, 9, topic, -1, 0) == (ErrorCode.none, 0, 0)
    assert _list_offsets(module_broker, 9, topic, -1, -3)[2] == 0
    assert _list_offsets(module_broker, 9, topic, -1, 2**62) == (ErrorCode.none, -1, -1)
    assert _list_offsets(module_broker, 9, topic, -1, -5) == (ErrorCode.none, -1, -1)
    assert _list_offsets(module_broker, 9, topic, -1, -1) == (ErrorCode.none, 3, 0)
