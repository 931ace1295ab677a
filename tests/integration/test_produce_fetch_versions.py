"""Produce v3-13 and Fetch v4-18 over raw sockets: every version stores and serves records,
v13 of both names topics by topic id (KIP-516) and answers with it, and an id the broker
does not know is UNKNOWN_TOPIC_ID."""

from __future__ import annotations

import dataclasses
import logging
import re
import struct
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from .helpers import admin, create_topic, unique_topic
from .rawclient import (
    RawConnection,
    build,
    build_batch,
    fetch_raw,
    fetch_request,
    i16,
    i32,
    i64,
    ms,
    produce_raw,
    produce_request_to,
    schema,
    split_batches,
    topic_id_of,
    topic_metadata,
    wait_visible,
)

pytestmark = pytest.mark.timeout(60)

PRODUCE_VERSIONS = range(3, 14)
FETCH_VERSIONS = range(4, 19)
UNKNOWN_TOPIC_OR_PARTITION = 3
UNKNOWN_TOPIC_ID = 100
FETCH_SESSION_ID_NOT_FOUND = 70


@pytest.fixture(scope="module")
def topic(module_broker) -> tuple[str, uuid.UUID]:
    name = create_topic(module_broker.bootstrap, unique_topic("versions"), partitions=2)
    with RawConnection(module_broker.host, module_broker.port) as conn:
        return name, topic_id_of(conn, name)


def test_every_produce_version_appends_in_order(module_broker, topic):
    name, topic_id = topic
    with RawConnection(module_broker.host, module_broker.port) as conn:
        offsets = []
        for version in PRODUCE_VERSIONS:
            batch = bytes(build_batch([(None, b"produce-v%d" % version)]))
            part = produce_raw(conn, name, 0, batch, version=version, topic_id=topic_id)
            assert part.error_code == 0, (version, part)
            offsets.append(part.base_offset)
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
        end = offsets[-1] + 1
        wait_visible(conn, name, 0, end)
        stored = fetch_raw(conn, name, 0, offsets[0], version=13, topic_id=topic_id)
        values = [bytes(b) for b in split_batches(stored.records)]
        assert len(values) == len(PRODUCE_VERSIONS)
        for version, batch in zip(PRODUCE_VERSIONS, values, strict=True):
            assert batch.endswith(b"produce-v%d" % version + b"\x00")  # value, then 0 headers


def test_every_fetch_version_serves_the_records(module_broker, topic):
    name, topic_id = topic
    with RawConnection(module_broker.host, module_broker.port) as conn:
        batch = bytes(build_batch([(b"k", b"fetch-me")]))
        base = produce_raw(conn, name, 1, batch, version=11).base_offset
        wait_visible(conn, name, 1, base + 1)
        for version in FETCH_VERSIONS:
            part = fetch_raw(conn, name, 1, base, version=version, topic_id=topic_id)
            assert part.error_code == 0, (version, part)
            assert part.high_watermark >= base + 1
            (got,) = split_batches(part.records)[:1]
            assert struct.unpack_from(">q", got, 0)[0] == base
            assert got[17:] == batch[17:]  # the same batch from its CRC on
            if version >= 12:  # tagged current_leader: only set with NOT_LEADER_OR_FOLLOWER
                assert part.current_leader.leader_id == -1


@pytest.mark.parametrize("version", [9, 13])
def test_a_partition_named_twice_in_a_produce_is_appended_once_with_its_last_records(
    module_broker, version
):
    """Kafka's KafkaApis keeps a Produce's partitions in a map: a partition named again
    replaces its earlier records, and is appended and answered once (found by an independent
    hostile-client campaign: each copy was appended)."""
    name = create_topic(module_broker.bootstrap, unique_topic("twice"), partitions=2)
    mod = schema("produce", version, "request")
    with RawConnection(module_broker.host, module_broker.port) as conn:
        topic_id = topic_id_of(conn, name) if version >= 13 else None
        key = {"name": name, "topic_id": topic_id}

        def data(partition: int, value: bytes) -> Any:
            return build(
                mod.PartitionProduceData,
                index=i32(partition),
                records=bytes(build_batch([(None, value)])),
            )

        request = build(
            mod.ProduceRequest,
            acks=i16(-1),
            timeout=ms(10_000),
            topic_data=(
                build(mod.TopicProduceData, **key, partition_data=(data(0, b"a"), data(1, b"x"))),
                build(mod.TopicProduceData, **key, partition_data=(data(0, b"b"),)),
                build(mod.TopicProduceData, **key, partition_data=(data(0, b"last"),)),
            ),
        )
        answer = conn.request(request, schema("produce", version, "response").ProduceResponse)
        answered = [
            (p.index, p.error_code, p.base_offset)
            for t in answer.responses
            for p in t.partition_responses
        ]
        assert sorted(answered) == [(0, 0, 0), (1, 0, 0)]
        wait_visible(conn, name, 0, 1)
        part = fetch_raw(conn, name, 0, 0)
        assert part.high_watermark == 1
        (batch,) = split_batches(part.records)
        assert bytes(batch).endswith(b"last\x00")


def test_fetch_sessions_as_kafkas_fetch_manager_reads_them(module_broker, topic):
    """No session is ever kept (every answer says session 0), and a request is read as
    Kafka's FetchManager reads it: epoch 0 or -1 is a full fetch, served whatever session it
    names (Kafka closes that session); any other epoch is incremental and finds no session,
    id 0 included: FETCH_SESSION_ID_NOT_FOUND (found by an independent hostile-client
    campaign: session 0 at epoch 5 was served, a session id at epoch 0 or -1 refused)."""
    name, _ = topic
    response = schema("fetch", 12, "response").FetchResponse
    with RawConnection(module_broker.host, module_broker.port) as conn:
        batch = bytes(build_batch([(b"k", b"sessions")]))
        base = produce_raw(conn, name, 1, batch, version=11).base_offset
        wait_visible(conn, name, 1, base + 1)
        plain = fetch_request(name, 1, base, version=12)
        for session_id, epoch, error in [
            (0, 0, 0),
            (0, -1, 0),
            (77, 0, 0),
            (77, -1, 0),
            (0, 5, FETCH_SESSION_ID_NOT_FOUND),
            (77, 3, FETCH_SESSION_ID_NOT_FOUND),
        ]:
            request = dataclasses.replace(
                plain, session_id=i32(session_id), session_epoch=i32(epoch)
            )
            answer = conn.request(request, response)
            assert (answer.error_code, answer.session_id) == (error, 0), (session_id, epoch)
            if error == 0:
                (part,) = answer.responses[0].partitions
                assert part.error_code == 0 and part.records, (session_id, epoch)
            else:
                assert answer.responses == ()


@pytest.mark.parametrize("version", [13, 14, 15, 16, 17, 18])
def test_fetch_by_unknown_topic_id(module_broker, topic, version):
    name, topic_id = topic
    unknown = uuid.uuid4()
    req = schema("fetch", version, "request")
    request = fetch_request(name, 0, 0, version=version, topic_id=unknown)
    known = build(
        req.FetchTopic,
        topic_id=topic_id,
        partitions=(
            build(
                req.FetchPartition,
                partition=i32(0),
                fetch_offset=i64(0),
                partition_max_bytes=i32(1 << 20),
            ),
        ),
    )
    request = build(
        req.FetchRequest,
        **{
            **{f: getattr(request, f) for f in request.__dataclass_fields__},
            "topics": (*request.topics, known),
        },
    )
    with RawConnection(module_broker.host, module_broker.port) as conn:
        # the known topic's partition holds a record whatever ran before (alone, or first)
        batch = bytes(build_batch([(None, b"beside-unknown-id-v%d" % version)]))
        part = produce_raw(conn, name, 0, batch, version=13, topic_id=topic_id)
        assert part.error_code == 0, part
        wait_visible(conn, name, 0, part.base_offset + 1)
        answer = conn.request(request, schema("fetch", version, "response").FetchResponse)
    assert answer.error_code == 0
    first, second = answer.responses
    assert first.topic_id == unknown
    (p0,) = first.partitions
    assert (p0.partition_index, p0.error_code) == (0, UNKNOWN_TOPIC_ID)
    assert p0.high_watermark == -1 and p0.records in (None, b"")
    # the other topic of the same request is served
    assert second.topic_id == topic_id
    assert second.partitions[0].error_code == 0
    assert second.partitions[0].records


def test_produce_by_unknown_topic_id(module_broker, topic):
    name, topic_id = topic
    batch = bytes(build_batch([(None, b"lost")]))
    unknown = uuid.uuid4()
    with RawConnection(module_broker.host, module_broker.port) as conn:
        part = produce_raw(conn, name, 0, batch, version=13, topic_id=unknown)
        assert part.error_code == UNKNOWN_TOPIC_ID
        assert part.base_offset == -1 and part.log_start_offset == -1
        # a zero id names no topic either (and nothing is auto-created by id)
        zero = uuid.UUID(int=0)
        request = produce_request_to(name, {0: batch}, version=13, topic_id=zero)
        answer = conn.request(request, schema("produce", 13, "response").ProduceResponse)
        (p,) = answer.responses[0].partition_responses
        assert p.error_code == UNKNOWN_TOPIC_ID
        # a partition the known topic lacks is UNKNOWN_TOPIC_OR_PARTITION, as by name
        part = produce_raw(conn, name, 7, batch, version=13, topic_id=topic_id)
        assert part.error_code == UNKNOWN_TOPIC_OR_PARTITION


def test_a_produce_never_creates_a_topic(module_broker):
    """As in Kafka (KafkaApis answers a produce to a topic its metadata lacks, and only a
    Metadata request auto-creates): UNKNOWN_TOPIC_OR_PARTITION, and no topic made. A produce
    started the auto-creation in the background before."""
    name = unique_topic("never-made")
    with RawConnection(module_broker.host, module_broker.port) as conn:
        part = produce_raw(conn, name, 0, bytes(build_batch([(None, b"nowhere")])))
        assert part.error_code == UNKNOWN_TOPIC_OR_PARTITION
        time.sleep(1)
        assert topic_metadata(conn, name).error_code == UNKNOWN_TOPIC_OR_PARTITION


def test_produce_v13_to_a_deleted_topics_id(module_broker):
    name = create_topic(module_broker.bootstrap, unique_topic("gone"), partitions=1)
    batch = bytes(build_batch([(None, b"x")]))
    with RawConnection(module_broker.host, module_broker.port) as conn:
        old_id = topic_id_of(conn, name)
        assert produce_raw(conn, name, 0, batch, version=13, topic_id=old_id).error_code == 0
        client = admin(module_broker.bootstrap)
        client.delete_topics([name])[name].result(20)
        create_topic(module_broker.bootstrap, name, partitions=1)
        new_id = topic_id_of(conn, name)
        assert new_id != old_id
        # the old incarnation's id is unknown now: its records cannot land in the new topic
        assert produce_raw(conn, name, 0, batch, version=13, topic_id=old_id).error_code == (
            UNKNOWN_TOPIC_ID
        )
        assert fetch_raw(conn, name, 0, 0, version=13, topic_id=old_id).error_code == (
            UNKNOWN_TOPIC_ID
        )
        assert produce_raw(conn, name, 0, batch, version=13, topic_id=new_id).base_offset == 0


class _Sent(logging.Handler):
    """Collects the "Sent <Api>Request (vN" lines of librdkafka's protocol debug log."""

    def __init__(self) -> None:
        super().__init__()
        self.versions: dict[str, set[int]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        for api, version in re.findall(r"Sent (\w+)Request \(v(\d+)", record.getMessage()):
            self.versions.setdefault(api, set()).add(int(version))


@pytest.mark.slow  # several seconds: the whole suite runs it, the fast set not
def test_librdkafka_produces_and_fetches_at_its_newest_versions(module_broker):
    """librdkafka asks for the newest versions both sides know: Fetch v16 (topics by id) and
    Produce v10 (KIP-951 hints) for the librdkafka installed; the records round-trip."""
    name = create_topic(module_broker.bootstrap, unique_topic("rdk-versions"), partitions=1)
    sent = _Sent()
    logger = logging.getLogger(f"rdkafka-{name}")
    logger.addHandler(sent)
    logger.setLevel(logging.DEBUG)
    debug = {"debug": "protocol", "logger": logger}
    producer = Producer({"bootstrap.servers": module_broker.bootstrap, **debug})
    for i in range(20):
        producer.produce(name, value=b"r%d" % i, partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": module_broker.bootstrap,
            "group.id": f"g-{name}",
            "auto.offset.reset": "earliest",
            **debug,
        }
    )
    consumer.subscribe([name])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < 20 and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            got.append(msg.value())
    consumer.close()
    assert got == [b"r%d" % i for i in range(20)]
    assert max(sent.versions["Fetch"]) >= 16, sent.versions
    assert max(sent.versions["Produce"]) >= 10, sent.versions
