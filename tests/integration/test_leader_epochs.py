"""OffsetForLeaderEpoch (KIP-320) against a real broker: raw requests at every version, and a
librdkafka consumer whose positions carry leader epochs (it validates them with this API
before fetching)."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, TopicPartition
from kio.schema.errors import ErrorCode

from . import rawclient
from .helpers import Msg, create_topic, produce

pytestmark = pytest.mark.timeout(90)


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
