"""Malformed and hostile input over raw sockets.

Each case must get a Kafka error code or a closed connection, the broker process must stay
up, no stored data may change, and a normal client must still round-trip afterwards.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import struct
import time

import pytest
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from .helpers import (
    Msg,
    admin,
    assert_broker_healthy,
    assert_same,
    consume,
    create_topic,
    produce,
    sample_messages,
)
from .rawclient import (
    RawConnection,
    build_batch,
    encode,
    frame,
    produce_raw,
    produce_request,
    request_header,
)

pytestmark = pytest.mark.timeout(90)

CORRUPT_MESSAGE = 2
INVALID_TOPIC_EXCEPTION = 17
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
INVALID_RECORD = 87


@pytest.fixture(scope="module")
def canary(module_broker):
    """A topic with known records that no bad input may touch, and one for health checks."""
    b = module_broker.bootstrap
    topic = create_topic(b)
    ts = int(time.time() * 1000)
    msgs = [Msg(b"canary-%d" % i, os.urandom(100), (("c", b"1"),), ts + i) for i in range(5)]
    produce(b, topic, msgs, acks="all")
    return topic, msgs, create_topic(b)


@pytest.fixture
def healthy(module_broker, canary):
    """Run the test, then check the broker is alive, serves a new client and lost no data."""
    yield
    b = module_broker.bootstrap
    topic, msgs, health_topic = canary
    assert module_broker.alive, "broker process died"
    fresh = sample_messages(3, tag="health")
    offsets = produce(b, health_topic, fresh, acks="all")
    assert offsets == [offsets[0], offsets[0] + 1, offsets[0] + 2]
    assert_same(consume(b, health_topic, 3, offset=offsets[0]), fresh)
    assert_same(consume(b, topic, len(msgs)), msgs)
    assert module_broker.alive, "broker process died"


def connect(broker) -> RawConnection:
    return RawConnection(broker.host, broker.port, timeout=10)


def assert_untouched(broker, topic: str) -> None:
    """Nothing was appended to ``topic``: the next good batch lands at offset 0."""
    with connect(broker) as conn:
        part = produce_raw(conn, topic, 0, bytes(build_batch([(b"k", b"good")])))
        assert part.error_code == 0, part
        assert part.base_offset == 0, f"bad input was appended: next offset {part.base_offset}"


def produce_request_bytes(topic: str, records: bytes, version: int = 7) -> bytes:
    req = produce_request(topic, 0, records, acks=-1, version=version)
    return request_header(0, version, 1, "bad-input", req.__flexible__) + encode(req)


# -- framing ---------------------------------------------------------------------------------
def test_frame_of_random_bytes(module_broker, healthy):
    rng = random.Random(20240601)
    payload = bytearray(rng.randbytes(1024))
    payload[0] = 0xA5  # api key < 0: this can never be a valid request
    with connect(module_broker) as conn:
        conn.send_frame(bytes(payload))
        assert conn.wait_closed(10), "connection not closed after a frame of random bytes"


def test_stream_of_random_bytes(module_broker, healthy):
    rng = random.Random(7)
    for _ in range(20):
        # the broker may close while we are still writing
        with connect(module_broker) as conn, contextlib.suppress(ConnectionError):
            conn.send_raw(rng.randbytes(rng.randint(1, 70_000)))


@pytest.mark.parametrize(
    "length",
    [
        pytest.param(2**31 - 1, id="2GiB-1"),
        pytest.param(2**31, id="2GiB(negative)"),
        pytest.param(2**32 - 1, id="-1", marks=pytest.mark.slow),
        pytest.param(100 * 1024 * 1024 + 1, id="100MiB+1", marks=pytest.mark.slow),
    ],
)
def test_huge_length_prefix(module_broker, healthy, length):
    with connect(module_broker) as conn:
        conn.send_raw(struct.pack(">I", length) + b"\x00\x12\x00\x00")
        assert conn.wait_closed(10), f"connection not closed after a length prefix of {length}"


def test_zero_length_frame(module_broker, healthy):
    with connect(module_broker) as conn:
        conn.send_raw(struct.pack(">i", 0))
        assert conn.wait_closed(10), "connection not closed after an empty frame"


@pytest.mark.parametrize(
    "cut",
    [1, pytest.param(3, marks=pytest.mark.slow), pytest.param(10, marks=pytest.mark.slow), 30],
)
def test_truncated_frame_then_disconnect(module_broker, healthy, cut):
    topic = create_topic(module_broker.bootstrap)
    request = produce_request_bytes(topic, bytes(build_batch([(b"k", b"v")])))
    with connect(module_broker) as conn:
        conn.send_raw(frame(request)[: 4 + len(request) - cut])
    # the partial request must not have been applied
    assert_untouched(module_broker, topic)


def test_truncated_length_prefix_then_disconnect(module_broker, healthy):
    with connect(module_broker) as conn:
        conn.send_raw(b"\x00\x00")


# -- request headers ---------------------------------------------------------------------------
@pytest.mark.parametrize("api_key", [9999, pytest.param(32767, marks=pytest.mark.slow), 1000])
def test_unknown_api_key_closes_connection(module_broker, healthy, api_key):
    with connect(module_broker) as conn:
        conn.send_frame(request_header(api_key, 0, 1, "bad-input", False) + b"\x00" * 16)
        assert conn.wait_closed(10), f"connection not closed for api key {api_key}"


def test_unadvertised_api_closes_connection(module_broker, healthy):
    with connect(module_broker) as conn:
        advertised = conn.api_versions()
    # an API Kafka has but this broker does not advertise (here: Kafka's raft Vote)
    candidates = [k for k in (52, 53, 54, 57, 58, 62, 63) if k not in advertised]
    assert candidates, "broker advertises every candidate API"
    with connect(module_broker) as conn:
        conn.send_frame(request_header(candidates[0], 0, 1, "bad-input", False) + b"\x00" * 16)
        assert conn.wait_closed(10), f"connection not closed for api key {candidates[0]}"


@pytest.mark.parametrize("api_key", [0, pytest.param(1, marks=pytest.mark.slow), 3])
def test_unsupported_version_of_an_api_closes_connection(module_broker, healthy, api_key):
    with connect(module_broker) as conn:
        conn.send_frame(request_header(api_key, 999, 1, "bad-input", True) + b"\x00" * 16)
        assert conn.wait_closed(10), f"connection not closed for api {api_key} v999"


def test_garbage_body_closes_connection(module_broker, healthy):
    """A known API and version whose body does not parse."""
    with connect(module_broker) as conn:
        conn.send_frame(request_header(3, 1, 1, "bad-input", False) + b"\xff\xff\xff\x7f\x01")
        assert conn.wait_closed(10), "connection not closed after an unparsable Metadata body"


# -- record batches ------------------------------------------------------------------------------
def test_batch_with_bad_crc(module_broker, healthy):
    topic = create_topic(module_broker.bootstrap)
    batch = build_batch([(b"k1", b"v1"), (b"k2", b"v2")])
    batch[-1] ^= 0xFF  # inside the CRC-covered area
    with connect(module_broker) as conn:
        part = produce_raw(conn, topic, 0, bytes(batch))
        assert part.error_code == CORRUPT_MESSAGE, part
        # the connection stays usable and a good batch lands at offset 0
        good = produce_raw(conn, topic, 0, bytes(build_batch([(b"k", b"good")])))
        assert good.error_code == 0 and good.base_offset == 0, good


def test_batch_with_bad_crc_field(module_broker, healthy):
    topic = create_topic(module_broker.bootstrap)
    batch = build_batch([(b"k1", b"v1")])
    struct.pack_into(">I", batch, 17, struct.unpack_from(">I", batch, 17)[0] ^ 0x1)
    with connect(module_broker) as conn:
        part = produce_raw(conn, topic, 0, bytes(batch))
        assert part.error_code == CORRUPT_MESSAGE, part
    assert_untouched(module_broker, topic)


@pytest.mark.parametrize(
    "delta",
    [
        pytest.param(+100, id="+100"),
        pytest.param(+1, id="+1", marks=pytest.mark.slow),
        pytest.param(-1, id="-1"),
        pytest.param(-20, id="-20", marks=pytest.mark.slow),
    ],
)
def test_batch_whose_length_field_lies(module_broker, healthy, delta):
    topic = create_topic(module_broker.bootstrap)
    batch = build_batch([(b"k1", b"v1" * 20), (b"k2", b"v2" * 20)])
    (length,) = struct.unpack_from(">i", batch, 8)
    struct.pack_into(">i", batch, 8, length + delta)
    with connect(module_broker) as conn:
        try:
            part = produce_raw(conn, topic, 0, bytes(batch))
        except (ConnectionError, OSError):
            part = None  # a closed connection is an acceptable answer
        if part is not None:
            assert part.error_code in (CORRUPT_MESSAGE, INVALID_RECORD), part
    assert_untouched(module_broker, topic)


def test_records_field_with_trailing_garbage(module_broker, healthy):
    topic = create_topic(module_broker.bootstrap)
    batch = bytes(build_batch([(b"k", b"v")])) + b"\x00\x01\x02"
    with connect(module_broker) as conn:
        try:
            part = produce_raw(conn, topic, 0, batch)
        except (ConnectionError, OSError):
            part = None
        if part is not None:
            assert part.error_code in (CORRUPT_MESSAGE, INVALID_RECORD), part
    assert_untouched(module_broker, topic)


def test_legacy_message_format_rejected(module_broker, healthy):
    topic = create_topic(module_broker.bootstrap)
    builder = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    builder.append(0, timestamp=int(time.time() * 1000), key=b"k", value=b"v")
    with connect(module_broker) as conn:
        part = produce_raw(conn, topic, 0, bytes(builder.build()))
        assert part.error_code in (UNSUPPORTED_FOR_MESSAGE_FORMAT, INVALID_RECORD), part
    assert_untouched(module_broker, topic)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("bad topic", id="space"),
        pytest.param("bad/topic", id="slash"),
        pytest.param("caf\u00e9", id="non-ascii", marks=pytest.mark.slow),
        pytest.param("..", id="dotdot"),
        pytest.param(".", id="dot", marks=pytest.mark.slow),
        pytest.param("a" * 250, id="250-chars"),
        pytest.param("tab\there", id="tab", marks=pytest.mark.slow),
        pytest.param("star*", id="star", marks=pytest.mark.slow),
        pytest.param("", id="empty"),
    ],
)
def test_produce_to_bad_topic_name(module_broker, healthy, name):
    with connect(module_broker) as conn:
        part = produce_raw(conn, name, 0, bytes(build_batch([(b"k", b"v")])))
        assert part.error_code == INVALID_TOPIC_EXCEPTION, part
    assert name not in admin(module_broker.bootstrap).list_topics(timeout=10).topics


def test_produce_to_internal_topic_is_refused(module_broker, healthy):
    """Only the broker appends to __consumer_offsets; Kafka answers INVALID_TOPIC_EXCEPTION."""
    with connect(module_broker) as conn:
        part = produce_raw(conn, "__consumer_offsets", 0, bytes(build_batch([(b"k", b"v")])))
        assert part.error_code == INVALID_TOPIC_EXCEPTION, part


# -- connections -----------------------------------------------------------------------------
@pytest.mark.slow
def test_thousand_idle_connections(module_broker, healthy):
    socks = []
    try:
        for _ in range(1000):
            s = socket.create_connection((module_broker.host, module_broker.port), timeout=10)
            socks.append(s)
        # a normal client is served while they are all open
        assert_broker_healthy(module_broker, tag="while-idle")
        # and every one of them is a live connection the broker answers on
        with connect(module_broker) as conn:
            assert conn.api_versions()
        for s in socks[::100]:
            s.sendall(frame(request_header(18, 0, 5, "idle", False)))
            s.settimeout(10)
            (size,) = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))
            assert size > 6
    finally:
        for s in socks:
            s.close()
