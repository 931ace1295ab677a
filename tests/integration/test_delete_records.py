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
from .rawclient import RawConnection, build, build_batch, ms, produce_request, schema

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]  # a broker per test or module

OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3


def delete_on(
    conn: RawConnection, version: int, topic: str, partition: int, offset: int
) -> tuple[int, int]:
    """One partition's DeleteRecords on ``conn``: (error code, low watermark)."""
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
    part = conn.request(request, resp.DeleteRecordsResponse).topics[0].partitions[0]
    return int(part.error_code), part.low_watermark


def raw_delete(port: int, version: int, topic: str, partition: int, offset: int) -> tuple[int, int]:
    with RawConnection("127.0.0.1", port) as conn:
        return delete_on(conn, version, topic, partition, offset)


def test_delete_records_with_admin_client_and_raw(broker) -> None:
    b = broker.bootstrap
    topic = create_topic(b, config={"internal.segment.bytes": "2048"})
    msgs = sample_messages(200, tag="dr")
    # batches under the topic's segment.bytes (a larger one is refused: RECORD_LIST_TOO_LARGE)
    produce(b, topic, msgs, acks="all", **{"batch.size": 1024})
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


def test_a_delete_up_to_what_was_just_acknowledged_covers_it(module_broker) -> None:
    """A produce is acknowledged once it is in the journal, before the splitter has moved it
    into its queue log; a DeleteRecords sent right after the acknowledgement checked its offset
    against the split end and answered OFFSET_OUT_OF_RANGE for the records just acknowledged
    (seen from Spark's tests), and -1 stopped short of them. As on a single Kafka broker, whose
    high watermark is its log end once a produce is acknowledged, both cover every record
    acknowledged before the request."""
    topic = create_topic(module_broker.bootstrap, partitions=8)
    batch = bytes(build_batch([(None, b"v" * 1000)] * 200))  # 200 records, ~200 KB
    rounds = 6
    produced = schema("produce", 7, "response").ProduceResponse
    with RawConnection(module_broker.host, module_broker.port) as conn:
        ids = [
            conn.send_request(produce_request(topic, p, batch, acks=1))
            for _ in range(rounds)
            for p in range(8)
        ]
        for correlation_id in ids:
            answer = conn.recv_response(produced, correlation_id)
            assert answer.responses[0].partition_responses[0].error_code == 0
        # the moment the last acknowledgement arrived: the odd partitions to -1 (the high
        # watermark), the even ones to their last offset acknowledged, each its own request
        answers = {
            p: delete_on(conn, 2, topic, p, -1 if p % 2 else rounds * 200)
            for p in reversed(range(8))
        }
    assert answers == {p: (0, rounds * 200) for p in range(8)}
