"""ListOffsets v1-11 over raw sockets: every version answers, and the special timestamps of
v8+ (earliest-local -4), v9+ (latest-tiered -5) and v11 (earliest-pending-upload -6) get
Kafka's answers for a topic that does not tier."""

from __future__ import annotations

import datetime

import pytest
from kio.schema.errors import ErrorCode

from .helpers import Msg, create_topic, produce, unique_topic
from .rawclient import RawConnection, build, build_batch, produce_request, schema

pytestmark = pytest.mark.timeout(60)


def list_offsets_partition(
    conn: RawConnection,
    version: int,
    topic: str,
    timestamp: int,
    current_leader_epoch: int = -1,
    partition: int = 0,
):
    """One ListOffsets of one partition (``current_leader_epoch`` from v4, -1: not given);
    the partition's answer."""
    req = schema("list_offsets", version, "request")
    resp = schema("list_offsets", version, "response")
    request = build(
        req.ListOffsetsRequest,
        replica_id=-1,
        isolation_level=0,
        timeout=datetime.timedelta(seconds=5),
        topics=(
            req.ListOffsetsTopic(
                name=topic,
                partitions=(
                    build(
                        req.ListOffsetsPartition,
                        partition_index=partition,
                        current_leader_epoch=current_leader_epoch,
                        timestamp=timestamp,
                    ),
                ),
            ),
        ),
    )
    answer = conn.request(request, resp.ListOffsetsResponse)
    (p,) = answer.topics[0].partitions
    return p


def list_offset(conn: RawConnection, version: int, topic: str, timestamp: int):
    p = list_offsets_partition(conn, version, topic, timestamp)
    assert p.error_code == 0, p
    return p.offset


@pytest.mark.parametrize("version", range(1, 12))
def test_every_version_special_timestamps(module_broker, version):
    topic = unique_topic("lo-versions")
    create_topic(module_broker.bootstrap, topic, partitions=1)
    produce(
        module_broker.bootstrap,
        topic,
        [Msg(key=None, value=b"x%d" % i) for i in range(5)],
        partition=0,
    )
    with RawConnection(module_broker.host, module_broker.port) as conn:
        assert list_offset(conn, version, topic, -2) == 0
        assert list_offset(conn, version, topic, -1) == 5
        if version >= 8:
            assert list_offset(conn, version, topic, -4) == 0
        if version >= 9:
            assert list_offset(conn, version, topic, -5) == -1
        if version >= 11:
            assert list_offset(conn, version, topic, -6) == -1
        # a special target older than this version, or a negative one that is none of
        # them: UNSUPPORTED_VERSION, as Kafka's ReplicaManager (it was a search by time from
        # the first record: offset 0 for -7, -100 and -3 at v6, say)
        since = {-3: 7, -4: 8, -5: 9, -6: 11, -7: 1 << 15, -100: 1 << 15}
        for target, first in since.items():
            p = list_offsets_partition(conn, version, topic, target)
            want = ErrorCode.none if version >= first else ErrorCode.unsupported_version
            assert p.error_code == want, (target, p)
            if want != ErrorCode.none:
                assert (p.offset, p.timestamp) == (-1, -1), (target, p)


def test_latest_covers_what_was_acknowledged(module_broker):
    """A produce's acknowledgement comes before the splitter has split it; a ListOffsets for
    latest sent right after the acknowledgement answered the split end, below the acknowledged
    offsets (seek-to-end and consumer lag missed the client's own records; a CI flake of the
    test above). Latest, like a single Kafka broker's high watermark, covers every record
    acknowledged before the request."""
    topic = unique_topic("lo-acked")
    create_topic(module_broker.bootstrap, topic, partitions=8)
    batch = bytes(build_batch([(None, b"v" * 1000)] * 200))  # 200 records, ~200 KB
    rounds = 6
    with RawConnection(module_broker.host, module_broker.port) as conn:
        ids = [
            conn.send_request(produce_request(topic, p, batch, acks=1))
            for _ in range(rounds)
            for p in range(8)
        ]
        response = schema("produce", 7, "response").ProduceResponse
        for correlation_id in ids:
            answer = conn.recv_response(response, correlation_id)
            assert answer.responses[0].partition_responses[0].error_code == 0
        # every partition's latest, asked the moment the last acknowledgement arrived
        ends = [list_offset_of(conn, 7, topic, p, -1) for p in reversed(range(8))]
    assert ends == [rounds * 200] * 8


def list_offset_of(conn: RawConnection, version: int, topic: str, partition: int, ts: int):
    req = schema("list_offsets", version, "request")
    request = build(
        req.ListOffsetsRequest,
        replica_id=-1,
        isolation_level=0,
        topics=(
            req.ListOffsetsTopic(
                name=topic,
                partitions=(
                    build(req.ListOffsetsPartition, partition_index=partition, timestamp=ts),
                ),
            ),
        ),
    )
    answer = conn.request(request, schema("list_offsets", version, "response").ListOffsetsResponse)
    (p,) = answer.topics[0].partitions
    assert p.error_code == 0, p
    return p.offset
