"""DeleteRecords (21) on the wire: confluent-kafka's AdminClient.delete_records and raw
requests at every version; the log start offset moves, survives a restart, and errors follow
Kafka (OFFSET_OUT_OF_RANGE past the high watermark, UNKNOWN_TOPIC_OR_PARTITION)."""

from __future__ import annotations

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from .helpers import (
    admin,
    consume,
    create_topic,
    low_watermark,
    produce,
    sample_messages,
    wait_high_watermark,
)
from .rawclient import RawConnection, build, ms, schema

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]  # restarts a broker

OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3


def raw_delete(port: int, version: int, topic: str, partition: int, offset: int) -> tuple[int, int]:
    req = schema("delete_records", version, "request")
    resp = schema("delete_records", version, "response")
    request = build(
        req.DeleteRecordsRequest,
        topics=(
            build(
                req.DeleteRecordsTopic,
                name=topic,
                partitions=(
                    build(req.DeleteRecordsPartition, partition_index=partition, offset=offset),
                ),
            ),
        ),
        timeout=ms(5000),
    )
    with RawConnection("127.0.0.1", port) as conn:
        response = conn.request(request, resp.DeleteRecordsResponse)
    part = response.topics[0].partitions[0]
    return int(part.error_code), part.low_watermark


def test_delete_records_with_admin_client_and_raw(broker) -> None:
    b = broker.bootstrap
    topic = create_topic(b, config={"segment.bytes": "2048"})
    msgs = sample_messages(200, tag="dr")
    produce(b, topic, msgs, acks="all")
    wait_high_watermark(b, topic, 200)

    client = admin(b)
    futures = client.delete_records([TopicPartition(topic, 0, 120)])
    result = futures[TopicPartition(topic, 0, 120)].result(timeout=10)
    assert result.low_watermark == 120
    assert low_watermark(b, topic) == 120
    rest = consume(b, topic, 80, offset=OFFSET_BEGINNING)
    assert [m.value for m in rest] == [m.value for m in msgs[120:]]

    for version in (0, 1, 2):
        assert raw_delete(broker.port, version, topic, 0, 201) == (OFFSET_OUT_OF_RANGE, -1)
        assert raw_delete(broker.port, version, topic, 0, 100) == (0, 120)  # never goes back
        assert raw_delete(broker.port, version, topic, 7, 0) == (UNKNOWN_TOPIC_OR_PARTITION, -1)
        assert raw_delete(broker.port, version, "no-such-topic", 0, 0)[0] == (
            UNKNOWN_TOPIC_OR_PARTITION
        )
    assert raw_delete(broker.port, 2, topic, 0, 150) == (0, 150)

    broker.restart()
    assert low_watermark(b, topic) == 150
    assert raw_delete(broker.port, 1, topic, 0, -1) == (0, 200)  # -1: the high watermark
    assert low_watermark(b, topic) == 200
    more = sample_messages(3, tag="after")
    assert produce(b, topic, more, acks="all") == [200, 201, 202]
