"""Client quotas against a real broker: DescribeClientQuotas/AlterClientQuotas sent by
kafka-python (its own encoding of the requests, pinned to Kafka 2.8, 3.0, 3.7, 3.9 and 4.0; neither
kafka-python 3.0.12 nor confluent-kafka 2.16.1 has an admin method for them), quotas that
survive a restart, and enforcement measured with real clients: a confluent-kafka producer over
its producer_byte_rate is held to it (±20%) while another is not, likewise a consumer's
consumer_byte_rate; a quota set while a producer runs applies to its live connection;
``throttle_time_ms`` and the muted channel seen on the wire.

The brokers here keep ``quota.window.num=3`` samples: Kafka's default of 11 lets a new client
burst ten seconds' worth of its quota before the first throttle (its rate is taken over at
least num - 1 windows), which a 6-second measurement would see; the arithmetic is the same
(tests/unit/test_quotas.py), and the slow test at the end measures the default.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin.client_quotas import (
    AlterClientQuotasRequest,
    DescribeClientQuotasRequest,
)
from kio.static.primitive import i32

from .helpers import create_topic
from .rawclient import (
    RawConnection,
    build_batch,
    encode,
    fetch_request,
    frame,
    produce_request,
    request_header,
    schema,
    wait_visible,
)

QUOTA = 1_000_000  # bytes per second
WINDOW_NUM = 3
pytestmark = [pytest.mark.slow, pytest.mark.broker_settings(**{"quota.window.num": WINDOW_NUM})]

_Entry = AlterClientQuotasRequest.EntryData
_Component = DescribeClientQuotasRequest.ComponentData


# -- the admin calls, from kafka-python ----------------------------------------------------------
class QuotaAdmin:
    """AlterClientQuotas / DescribeClientQuotas through a kafka-python admin client."""

    def __init__(self, bootstrap: str, api_version: tuple[int, int] | None = None) -> None:
        kwargs: dict[str, Any] = {"bootstrap_servers": bootstrap}
        if api_version is not None:
            kwargs["api_version"] = api_version
        self.client = KafkaAdminClient(**kwargs)

    def close(self) -> None:
        self.client.close()

    def _send(self, request: Any) -> Any:
        manager = self.client._manager
        return manager.run(manager.send, request)

    def alter(
        self,
        entries: list[tuple[dict[str, str | None], dict[str, float | None]]],
        validate_only: bool = False,
    ) -> list[tuple[dict[str, str | None], int, str | None]]:
        request = AlterClientQuotasRequest(
            entries=[
                _Entry(
                    entity=[
                        _Entry.EntityData(entity_type=t, entity_name=n) for t, n in entity.items()
                    ],
                    ops=[
                        _Entry.OpData(key=k, value=v or 0.0, remove=v is None)
                        for k, v in ops.items()
                    ],
                )
                for entity, ops in entries
            ],
            validate_only=validate_only,
        )
        response = self._send(request)
        return [
            ({e.entity_type: e.entity_name for e in r.entity}, r.error_code, r.error_message)
            for r in response.entries
        ]

    def describe(
        self, components: list[tuple[str, int, str | None]], strict: bool = False
    ) -> tuple[int, str | None, dict[frozenset[tuple[str, str | None]], dict[str, float]] | None]:
        response = self._send(
            DescribeClientQuotasRequest(
                components=[
                    _Component(entity_type=t, match_type=m, match=s) for t, m, s in components
                ],
                strict=strict,
            )
        )
        if response.entries is None:
            return response.error_code, response.error_message, None
        found = {
            frozenset((e.entity_type, e.entity_name) for e in entry.entity): {
                v.key: v.value for v in entry.values
            }
            for entry in response.entries
        }
        return response.error_code, response.error_message, found


@pytest.fixture
def quota_admin(module_broker: Any) -> Iterator[QuotaAdmin]:
    admin = QuotaAdmin(module_broker.bootstrap)
    yield admin
    admin.close()


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


INVALID_REQUEST = 42
UNSUPPORTED_VERSION = 35


@pytest.mark.parametrize("api_version", [(2, 8), (3, 0), (3, 7), (3, 9), (4, 0)])
def test_alter_and_describe_from_pinned_kafka_python(
    module_broker: Any, api_version: tuple[int, int]
) -> None:
    admin = QuotaAdmin(module_broker.bootstrap, api_version)
    try:
        user, client = _id("user"), _id("client")
        results = admin.alter(
            [
                ({"client-id": client}, {"producer_byte_rate": 2048.0}),
                ({"user": user, "client-id": None}, {"request_percentage": 12.5}),
                ({"user": user}, {"consumer_byte_rate": 4096.0, "controller_mutation_rate": 3.0}),
                ({"client-id": _id("bad")}, {"no_such_quota": 1.0}),
                ({"group": "g"}, {"producer_byte_rate": 1.0}),
                ({"client-id": _id("frac")}, {"producer_byte_rate": 1.5}),
            ]
        )
        assert [r[1] for r in results] == [0, 0, 0, INVALID_REQUEST, INVALID_REQUEST, 42]
        assert results[3][2] == "Invalid configuration key no_such_quota"
        assert results[4][2] == "Unhandled client quota entity type: group"
        assert results[5][2] == "producer_byte_rate cannot be a fractional value."
        assert results[1][0] == {"user": user, "client-id": None}

        assert admin.describe([("client-id", 0, client)], strict=True) == (
            0,
            None,
            {frozenset({("client-id", client)}): {"producer_byte_rate": 2048.0}},
        )
        error, _, found = admin.describe([("user", 0, user)])
        assert error == 0 and found == {
            frozenset({("user", user), ("client-id", None)}): {"request_percentage": 12.5},
            frozenset({("user", user)}): {
                "consumer_byte_rate": 4096.0,
                "controller_mutation_rate": 3.0,
            },
        }
        _, _, strict = admin.describe([("user", 0, user)], strict=True)
        assert strict == {
            frozenset({("user", user)}): {
                "consumer_byte_rate": 4096.0,
                "controller_mutation_rate": 3.0,
            }
        }
        _, _, defaults = admin.describe([("user", 0, user), ("client-id", 1, None)])
        assert list(defaults or {}) == [frozenset({("user", user), ("client-id", None)})]
        _, _, specified = admin.describe([("client-id", 2, None)])
        assert frozenset({("client-id", client)}) in (specified or {})
        assert all(any(t == "client-id" for t, _ in entity) for entity in specified or {})

        # validate_only checks and changes nothing; removing a key; removing the last key
        assert admin.alter(
            [({"client-id": client}, {"producer_byte_rate": 99.0})], validate_only=True
        ) == [({"client-id": client}, 0, None)]
        assert admin.alter(
            [({"client-id": client}, {"producer_byte_rate": -1.0})], validate_only=True
        )[0][1:] == (INVALID_REQUEST, "Quota producer_byte_rate must be greater than 0")
        admin.alter(
            [
                ({"user": user}, {"controller_mutation_rate": None}),
                ({"user": user, "client-id": None}, {"request_percentage": None}),
            ]
        )
        _, _, after = admin.describe([("user", 0, user)])
        assert after == {frozenset({("user", user)}): {"consumer_byte_rate": 4096.0}}
        _, _, still = admin.describe([("client-id", 0, client)])
        assert still == {frozenset({("client-id", client)}): {"producer_byte_rate": 2048.0}}
        admin.alter(
            [
                ({"user": user}, {"consumer_byte_rate": None}),
                ({"client-id": client}, {"producer_byte_rate": None}),
            ]
        )
        assert admin.describe([("user", 0, user)])[2] == {}
    finally:
        admin.close()


def test_bad_filters_get_kafkas_errors(quota_admin: QuotaAdmin) -> None:
    assert quota_admin.describe([("user", 0, None)]) == (
        INVALID_REQUEST,
        "Request specified MATCH_TYPE_EXACT, but set match string to null.",
        None,
    )
    assert quota_admin.describe([("user", 2, None), ("user", 1, None)])[0] == INVALID_REQUEST
    assert quota_admin.describe([("topic", 2, None)]) == (
        UNSUPPORTED_VERSION,
        "Unsupported entity type topic",
        None,
    )
    assert quota_admin.describe([("ip", 2, None), ("client-id", 2, None)])[0] == INVALID_REQUEST


def test_entity_and_key_errors_are_per_entry(quota_admin: QuotaAdmin) -> None:
    good = _id("good")
    results = quota_admin.alter(
        [
            ({}, {"producer_byte_rate": 1.0}),
            ({"ip": "127.0.0.1", "user": "u"}, {"connection_creation_rate": 1.0}),
            ({"client-id": ""}, {"producer_byte_rate": 1.0}),
            ({"client-id": good}, {"producer_byte_rate": 5.0}),
            ({"client-id": good}, {"producer_byte_rate": 6.0}),
        ]
    )
    assert [r[1] for r in results] == [INVALID_REQUEST] * 3 + [0, INVALID_REQUEST]
    assert results[0][2] == "Invalid empty client quota entity"
    assert results[4][2].startswith("Ignoring duplicate entity")
    assert quota_admin.describe([("client-id", 0, good)])[2] == {
        frozenset({("client-id", good)}): {"producer_byte_rate": 5.0}
    }
    quota_admin.alter([({"client-id": good}, {"producer_byte_rate": None})])


def test_quotas_survive_a_restart(broker: Any) -> None:
    admin = QuotaAdmin(broker.bootstrap)
    admin.alter([({"user": None}, {"producer_byte_rate": 1e6})])
    admin.close()
    broker.restart()
    admin = QuotaAdmin(broker.bootstrap)
    try:
        assert admin.describe([("user", 1, None)], strict=True)[2] == {
            frozenset({("user", None)}): {"producer_byte_rate": 1e6}
        }
    finally:
        admin.close()


# -- enforcement ---------------------------------------------------------------------------------
class _Flood:
    """A confluent-kafka producer sending as fast as it can for a while, in a thread: the bytes
    delivered and the throttle times librdkafka reported (its throttle_cb)."""

    def __init__(self, bootstrap: str, topic: str, client_id: str, seconds: float) -> None:
        self.delivered = 0
        self.throttles: list[float] = []
        self.rate = 0.0
        self.seconds = seconds
        self.topic = topic
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": client_id,
                "linger.ms": 5,
                "batch.size": 65536,
                "acks": 1,
                "compression.type": "none",
                "throttle_cb": lambda event: self.throttles.append(event.throttle_time),
            }
        )
        self.thread = threading.Thread(target=self._run)
        self.samples: list[tuple[float, int]] = []

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            self.delivered += len(msg.value())

    def _run(self) -> None:
        value = b"q" * 10_000
        start = time.monotonic()
        while (now := time.monotonic()) - start < self.seconds:
            try:
                self.producer.produce(self.topic, value, on_delivery=self._delivered)
            except BufferError:
                self.producer.poll(0.01)
            self.producer.poll(0)
            self.samples.append((now - start, self.delivered))
        self.rate = self.delivered / (time.monotonic() - start)
        self.producer.purge()
        self.producer.flush(10)

    def delivered_between(self, t0: float, t1: float) -> int:
        before = max((d for t, d in self.samples if t <= t0), default=0)
        upto = max((d for t, d in self.samples if t <= t1), default=0)
        return upto - before


def _flood_both(bootstrap: str, throttled: str, free: str, seconds: float) -> tuple[_Flood, _Flood]:
    topic = _id("quota")
    create_topic(bootstrap, topic, 2)
    floods = (_Flood(bootstrap, topic, throttled, seconds), _Flood(bootstrap, topic, free, seconds))
    for flood in floods:
        flood.thread.start()
    for flood in floods:
        flood.thread.join()
    return floods


def test_a_producer_over_its_byte_rate_is_held_to_it_and_others_are_not(
    module_broker: Any, quota_admin: QuotaAdmin
) -> None:
    a, b = _id("A"), _id("B")
    quota_admin.alter([({"client-id": a}, {"producer_byte_rate": float(QUOTA)})])
    flood_a, flood_b = _flood_both(module_broker.bootstrap, a, b, 6.0)
    assert 0.8 * QUOTA <= flood_a.rate <= 1.2 * QUOTA, flood_a.rate
    assert flood_b.rate > 5 * QUOTA, flood_b.rate
    assert flood_a.throttles and max(flood_a.throttles) > 0  # throttle_time_ms, as librdkafka saw
    assert not flood_b.throttles


def _a_limited_client(
    broker_factory: Any, budget_bytes: int, quota: str
) -> tuple[Any, str, str, str]:
    """A broker with ``queued.max.request.bytes`` of ``budget_bytes``, a client id held to
    10,000 bytes/s of ``quota``, another client id with no quota, and a one-partition topic."""
    broker = broker_factory(queued_max_request_bytes=budget_bytes)
    admin = QuotaAdmin(broker.bootstrap)
    a, b = _id("A"), _id("B")
    admin.alter([({"client-id": a}, {quota: 10_000.0})])
    admin.close()
    topic = _id("limited")
    create_topic(broker.bootstrap, topic, 1)
    return broker, a, b, topic


def test_a_throttled_backlog_does_not_stop_another_client(broker_factory: Any) -> None:
    """A producer far over its quota pipelines 20 KB produces, several to a receive, without
    reading: one of the first mutes it for seconds, and the broker had already read some of
    the others, which wait in flight past queued.max.request.bytes (16 KiB here). A client with
    nothing in flight still reads and is answered at once, a request that needs its buffer
    grown included. Before, past the limit the budget stopped every connection but the owner
    of the growth past it until the throttle ended."""
    broker, a, b, topic = _a_limited_client(broker_factory, 16 * 1024, "producer_byte_rate")
    response_type = schema("produce", 7, "response").ProduceResponse
    piece = produce_request(topic, 0, build_batch([(None, b"x" * 20_000)]), acks=1)
    large = produce_request(topic, 0, build_batch([(None, b"x" * 100_000)]), acks=1)
    small = produce_request(topic, 0, build_batch([(None, b"y")]), acks=1)
    with RawConnection(broker.host, broker.port, client_id=a) as flood:
        cids = [flood.next_correlation_id() for _ in range(10)]
        flood.send_raw(  # one send: the broker decodes several per receive before one is handled
            b"".join(frame(request_header(0, 7, cid, a, False) + encode(piece)) for cid in cids)
        )
        took: list[float] = []
        with RawConnection(broker.host, broker.port, client_id=b) as other:
            end = time.monotonic() + 6.0  # A is muted for 2 s, then 4 s, ... in this time
            while time.monotonic() < end:
                for request in (small, large):
                    began = time.monotonic()
                    response = other.request(request, response_type)
                    took.append(time.monotonic() - began)
                    assert response.responses[0].partition_responses[0].error_code == 0
                time.sleep(0.05)
        assert max(took) < 1.0, f"answered after {max(took):.1f} s behind the throttled backlog"
        first = flood.recv_response(response_type, cids[0])
        second = flood.recv_response(response_type, cids[1])
    assert max(first.throttle_time, second.throttle_time).total_seconds() > 1  # A was throttled


def test_a_throttled_client_midway_through_a_large_frame_does_not_hold_back_another(
    broker_factory: Any,
) -> None:
    """A consumer over its quota long-polls a Fetch and, in the same send, starts a 300 KB
    produce: its first 150 KB. While the Fetch waits the broker reads that part into a grown
    buffer, so this connection's partial frame started first and owns the growth past
    queued.max.request.bytes (256 KiB here). Records then arrive, the Fetch answers them and
    the quota mutes the connection for seconds. Muted, it yields the growth to the next in
    line: another client's 300 KB requests (which need the same growth) are answered at once.
    Nor is the muted client closed as stalled: when the throttle ends it sends the rest of its
    frame and is answered. Before, the others' large requests waited the throttle out, or until
    the silent owner was closed."""
    broker, a, b, topic = _a_limited_client(broker_factory, 256 * 1024, "consumer_byte_rate")
    produce_response = schema("produce", 7, "response").ProduceResponse
    fetch_response = schema("fetch", 12, "response").FetchResponse
    records = produce_request(topic, 0, build_batch([(None, b"x" * 100_000)]), acks=1)
    large = produce_request(topic, 0, build_batch([(None, b"z" * 300_000)]), acks=1)
    with RawConnection(broker.host, broker.port, client_id=a, timeout=60) as muted:
        fetch_cid, produce_cid = muted.next_correlation_id(), muted.next_correlation_id()
        poll = fetch_request(topic, 0, 0, max_wait_ms=5_000)
        produce = frame(request_header(0, 7, produce_cid, a, False) + encode(large))
        muted.send_raw(
            frame(request_header(1, 12, fetch_cid, a, True) + encode(poll)) + produce[:150_000]
        )
        time.sleep(0.5)  # the Fetch waits; the broker reads the 150 KB meanwhile
        with RawConnection(broker.host, broker.port, client_id=_id("C")) as feeder:
            fed = feeder.request(records, produce_response)
            assert fed.responses[0].partition_responses[0].error_code == 0
        fetched = muted.recv_response(fetch_response, fetch_cid)
        # the 100 KB put it over its quota: answered empty, with the throttle (as in Kafka)
        assert fetched.error_code == 0 and not fetched.responses
        assert fetched.throttle_time.total_seconds() > 1, fetched.throttle_time
        took: list[float] = []
        with RawConnection(broker.host, broker.port, client_id=b) as other:
            for _ in range(5):
                began = time.monotonic()
                response = other.request(large, produce_response)
                took.append(time.monotonic() - began)
                assert response.responses[0].partition_responses[0].error_code == 0
        assert max(took) < 1.0, f"answered after {max(took):.1f} s behind the muted partial frame"
        muted.send_raw(produce[150_000:])
        rest = muted.recv_response(produce_response, produce_cid)
    assert rest.responses[0].partition_responses[0].error_code == 0
    assert "nothing received for" not in broker.log(since_start=True)


def test_a_default_client_quota_applies_to_each_client_on_its_own(
    module_broker: Any, quota_admin: QuotaAdmin
) -> None:
    """<default> client-id: every client gets the quota, on its own rate (Kafka's tags)."""
    user = "ANONYMOUS"  # no SASL: Kafka's anonymous principal
    quota_admin.alter([({"user": user, "client-id": None}, {"producer_byte_rate": float(QUOTA)})])
    try:
        flood_a, flood_b = _flood_both(module_broker.bootstrap, _id("D1"), _id("D2"), 6.0)
    finally:
        quota_admin.alter([({"user": user, "client-id": None}, {"producer_byte_rate": None})])
    for flood in (flood_a, flood_b):
        assert 0.8 * QUOTA <= flood.rate <= 1.2 * QUOTA, flood.rate


def test_a_quota_set_while_producing_applies_to_the_live_connection(
    module_broker: Any, quota_admin: QuotaAdmin
) -> None:
    client = _id("live")
    topic = _id("live")
    create_topic(module_broker.bootstrap, topic, 1)
    flood = _Flood(module_broker.bootstrap, topic, client, 9.0)
    flood.thread.start()
    time.sleep(2.0)
    quota_admin.alter([({"client-id": client}, {"producer_byte_rate": float(QUOTA)})])
    set_at = 2.0
    flood.thread.join()
    before = flood.delivered_between(0.5, set_at)
    assert before / (set_at - 0.5) > 5 * QUOTA
    # from a second after the change: the quota holds (the samples of the fast seconds count
    # against it first, so the rate is at most the quota, often below)
    after = flood.delivered_between(set_at + 1.0, 9.0) / (9.0 - set_at - 1.0)
    assert after <= 1.2 * QUOTA, after
    assert flood.throttles


def _fill(bootstrap: str, topic: str, total: int) -> None:
    # batches of at most 64 KiB: a fetch returns whole batches, and its size is the
    # granularity the consumer quota is enforced at
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": 1, "batch.size": 65536}
    )
    value = b"c" * 10_000
    for _ in range(total // len(value)):
        while True:
            try:
                producer.produce(topic, value)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0


def _consume(bootstrap: str, topic: str, client_id: str, seconds: float, out: dict) -> None:
    """Read the partition from its start for ``seconds``, or until everything is read;
    ``out["rate"]``: bytes per second since the consumer was made."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "group.id": _id("g"),
            "enable.auto.commit": False,
            "max.partition.fetch.bytes": 131072,
            "throttle_cb": lambda event: out.setdefault("throttles", []).append(1),
        }
    )
    start = time.monotonic()
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got = 0
    while (now := time.monotonic()) - start < seconds and got < FILL_BYTES:
        msg = consumer.poll(0.05)
        if msg is not None and not msg.error():
            got += len(msg.value())
    out["rate"] = got / (now - start)
    consumer.close()


FILL_BYTES = 15_000_000


def test_a_consumer_over_its_byte_rate_is_held_to_it_and_others_are_not(
    module_broker: Any, quota_admin: QuotaAdmin
) -> None:
    topic = _id("cq")
    create_topic(module_broker.bootstrap, topic, 1)
    _fill(module_broker.bootstrap, topic, FILL_BYTES)
    slow, fast = _id("C"), _id("F")
    quota_admin.alter([({"client-id": slow}, {"consumer_byte_rate": float(QUOTA)})])
    results: dict[str, dict] = {slow: {}, fast: {}}
    threads = [
        threading.Thread(target=_consume, args=(module_broker.bootstrap, topic, c, 6.0, r))
        for c, r in results.items()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 0.8 * QUOTA <= results[slow]["rate"] <= 1.2 * QUOTA, results
    assert results[fast]["rate"] > 5 * QUOTA, results
    assert results[slow].get("throttles") and not results[fast].get("throttles")


# -- the wire: throttle_time_ms and the muted channel ---------------------------------------
def test_throttle_time_is_answered_and_the_channel_muted(
    module_broker: Any, quota_admin: QuotaAdmin
) -> None:
    client = _id("raw")
    topic = _id("raw")
    create_topic(module_broker.bootstrap, topic, 1)
    quota_admin.alter([({"client-id": client}, {"producer_byte_rate": 10_000.0})])
    host, port = module_broker.host, module_broker.port
    response_type = schema("produce", 9, "response").ProduceResponse
    versions_type = schema("api_versions", 3, "response").ApiVersionsResponse
    versions_request = schema("api_versions", 3, "request").ApiVersionsRequest(
        client_software_name="raw", client_software_version="1"
    )
    batch = build_batch([(None, b"x" * 100_000)])
    with RawConnection(host, port, client_id=client) as conn, RawConnection(host, port) as other:
        response = conn.request(produce_request(topic, 0, batch, version=9), response_type)
        # 100 kB against 10 kB/s over the minimum window of (3 - 1) s: (5 - 1) / 1 * 2 s
        throttle_ms = response.throttle_time.total_seconds() * 1000
        assert 7000 <= throttle_ms <= 8100, throttle_ms
        assert response.responses[0].partition_responses[0].error_code == 0
        started = time.monotonic()
        cid = conn.send_request(versions_request)
        # another connection is served at once
        assert other.request(versions_request, versions_type).error_code == 0
        assert time.monotonic() - started < 1.0
        conn.sock.settimeout(15)
        assert conn.recv_response(versions_type, cid).error_code == 0
        waited = time.monotonic() - started
        assert throttle_ms / 1000 - 0.5 <= waited <= throttle_ms / 1000 + 2.0, waited
    quota_admin.alter([({"client-id": client}, {"producer_byte_rate": None})])


def test_a_request_percentage_quota_throttles_a_busy_client(
    module_broker: Any, quota_admin: QuotaAdmin
) -> None:
    """request_percentage: the event-loop time of a client's requests against its share of
    one thread; Metadata requests in a loop go over 0.01% within a few requests."""
    client = _id("busy")
    quota_admin.alter([({"client-id": client}, {"request_percentage": 0.01})])
    request_type = schema("metadata", 12, "request").MetadataRequest
    response_type = schema("metadata", 12, "response").MetadataResponse
    request = request_type(
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    throttles = []
    with RawConnection(module_broker.host, module_broker.port, client_id=client) as conn:
        for _ in range(50):
            response = conn.request(request, response_type)
            throttles.append(response.throttle_time.total_seconds() * 1000)
            if throttles[-1] > 0:
                break
    quota_admin.alter([({"client-id": client}, {"request_percentage": None})])
    assert throttles[-1] > 0, throttles
    # Kafka bounds a request-quota throttle to one quota window
    assert throttles[-1] <= 1000
    with RawConnection(module_broker.host, module_broker.port, client_id=_id("idle")) as conn:
        assert conn.request(request, response_type).throttle_time.total_seconds() == 0


@pytest.mark.slow
@pytest.mark.broker_settings(**{"quota.window.num": 11})
def test_kafkas_default_window_holds_a_producer_to_its_quota(broker: Any) -> None:
    """With Kafka's 11 samples a new client first bursts (num - 1) seconds of quota; over 40 s
    the average comes back to the quota, and the second half runs at it."""
    admin = QuotaAdmin(broker.bootstrap)
    a, b = _id("A"), _id("B")
    admin.alter([({"client-id": a}, {"producer_byte_rate": float(QUOTA)})])
    admin.close()
    flood_a, flood_b = _flood_both(broker.bootstrap, a, b, 40.0)
    assert 0.8 * QUOTA <= flood_a.rate <= 1.2 * QUOTA, flood_a.rate
    late = flood_a.delivered_between(20.0, 40.0) / 20.0
    assert 0.8 * QUOTA <= late <= 1.2 * QUOTA, late
    assert flood_b.rate > 5 * QUOTA


# -- a cluster: every broker follows a change ----------------------------------------------------
@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_every_broker_of_a_cluster_applies_a_quota_change(
    broker_factory: Any, zookeeper: Any
) -> None:
    """A quota set through one broker is described by another within a second and throttles
    there soon after (the broker takes it from a ZooKeeper watch, which a describe, read from
    ZooKeeper, does not wait for); a removal through the other is seen by the first."""
    chroot = f"{zookeeper.connect}/stonemq-quotas-{uuid.uuid4().hex[:8]}"
    one, two = (
        broker_factory(
            zookeeper_connect=chroot,
            broker_id=b,
            journal_partitions=2,
            quota_window_num=WINDOW_NUM,
        )
        for b in (1, 2)
    )
    client = _id("zk")
    admin_one, admin_two = QuotaAdmin(one.bootstrap), QuotaAdmin(two.bootstrap)
    try:
        admin_one.alter([({"client-id": client}, {"producer_byte_rate": 10_000.0})])
        deadline = time.monotonic() + 1.0
        while admin_two.describe([("client-id", 0, client)])[2] == {}:
            assert time.monotonic() < deadline, "broker 2 did not see the quota within 1 s"
            time.sleep(0.05)
        topic = _id("zk")
        create_topic(one.bootstrap, topic, 4)
        response_type = schema("produce", 9, "response").ProduceResponse
        batch = build_batch([(None, b"z" * 100_000)])
        for broker in (one, two):  # a partition each broker leads
            # the broker that took the change applies it before answering; the other when
            # its watch fires: 100 KB a try at 10 KB/s is over the quota once it is applied
            deadline = time.monotonic() + 10.0
            tries = 0
            while True:
                tries += 1
                for partition in range(4):
                    with RawConnection(broker.host, broker.port, client_id=client) as conn:
                        response = conn.request(
                            produce_request(topic, partition, batch, version=9), response_type
                        )
                    if response.responses[0].partition_responses[0].error_code == 0:
                        break
                else:
                    raise AssertionError(f"broker {broker.port} leads none of the 4 partitions")
                if response.throttle_time.total_seconds() > 0:
                    break
                assert time.monotonic() < deadline, f"broker {broker.port}: {tries} not throttled"
            if broker is one:
                assert tries == 1, "the broker that took the change did not apply it at once"
        admin_two.alter([({"client-id": client}, {"producer_byte_rate": None})])
        time.sleep(1.0)
        assert admin_one.describe([("client-id", 0, client)])[2] == {}
    finally:
        admin_one.close()
        admin_two.close()


def test_a_fetch_over_the_consumer_quota_is_empty_and_a_followers_is_not_throttled(
    module_broker: Any, quota_admin: QuotaAdmin
) -> None:
    client = _id("rawc")
    topic = _id("rawc")
    create_topic(module_broker.bootstrap, topic, 1)
    response_type = schema("produce", 9, "response").ProduceResponse
    with RawConnection(module_broker.host, module_broker.port) as conn:
        for _ in range(3):
            batch = build_batch([(None, b"f" * 50_000)])
            produced = conn.request(produce_request(topic, 0, batch, version=9), response_type)
            assert produced.responses[0].partition_responses[0].error_code == 0
        wait_visible(conn, topic, 0, 3)  # split: a moment after the acks
    quota_admin.alter([({"client-id": client}, {"consumer_byte_rate": 10_000.0})])
    fetch_type = schema("fetch", 12, "response").FetchResponse
    request = fetch_request(topic, 0, 0, version=12)
    follower = dataclasses.replace(request, replica_id=i32(1))
    try:
        with RawConnection(module_broker.host, module_broker.port, client_id=client) as conn:
            # the quota window holds (3 - 1) s * 10 kB/s: one 50 kB batch (a fetch returns at
            # least one), which goes over: the answer is empty with the throttle time
            response = conn.request(request, fetch_type)
            assert response.responses == ()
            assert response.throttle_time.total_seconds() > 0
        with RawConnection(module_broker.host, module_broker.port, client_id=client) as conn:
            response = conn.request(follower, fetch_type)
            assert response.throttle_time.total_seconds() == 0
            assert len(response.responses[0].partitions[0].records) >= 150_000
    finally:
        quota_admin.alter([({"client-id": client}, {"consumer_byte_rate": None})])


def test_version_0_of_both_calls(module_broker: Any) -> None:
    """v0 (not flexible; no client sends it any more) answers as v1 does."""
    alter_req = schema("alter_client_quotas", 0, "request")
    alter_resp = schema("alter_client_quotas", 0, "response")
    describe_req = schema("describe_client_quotas", 0, "request")
    describe_resp = schema("describe_client_quotas", 0, "response")
    client = _id("v0")
    with RawConnection(module_broker.host, module_broker.port) as conn:
        altered = conn.request(
            alter_req.AlterClientQuotasRequest(
                entries=(
                    alter_req.EntryData(
                        entity=(alter_req.EntityData(entity_type="client-id", entity_name=client),),
                        ops=(alter_req.OpData(key="producer_byte_rate", value=64.0, remove=False),),
                    ),
                ),
                validate_only=False,
            ),
            alter_resp.AlterClientQuotasResponse,
        )
        assert [e.error_code for e in altered.entries] == [0]
        described = conn.request(
            describe_req.DescribeClientQuotasRequest(
                components=(
                    describe_req.ComponentData(entity_type="client-id", match_type=0, match=client),
                ),
                strict=True,
            ),
            describe_resp.DescribeClientQuotasResponse,
        )
    assert described.error_code == 0
    (entry,) = described.entries
    assert [(e.entity_type, e.entity_name) for e in entry.entity] == [("client-id", client)]
    assert [(v.key, v.value) for v in entry.values] == [("producer_byte_rate", 64.0)]
