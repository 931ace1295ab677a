"""Requests that killed, stalled or bloated the broker (issue 17's fuzzing campaign), over raw
sockets against a real broker. Each must get a Kafka error code or a closed connection and a
log line, and leave the process up and every other client served.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import random
import re
import socket
import struct
import time
import uuid
from typing import Any

import pytest
from fuzz import batches
from fuzz.layout import encode_uvarint, lengths
from fuzz.values import Hints, Maker, encode, frame, request_header
from kio.schema.metadata.v1.request import MetadataRequest as MetadataV1
from kio.schema.metadata.v1.response import MetadataResponse as MetadataResponseV1

from stonemq.protocol.guard import ABORT_REPRODUCER

from .helpers import create_topic
from .rawclient import RawConnection, build_batch, produce_raw, produce_request, schema

pytestmark = pytest.mark.timeout(120)

INVALID_REQUEST = 42
INVALID_TOPIC_EXCEPTION = 17
ALARMS = ("Traceback", "internal error", "memory allocation")


class LogWatch:
    """The broker's log from a point on."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.start = len(broker.log_path.read_bytes())

    def text(self) -> str:
        return self.broker.log_path.read_bytes()[self.start :].decode("utf-8", "replace")

    def wait_for(self, pattern: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.text()):
            assert time.monotonic() < deadline, f"no log line /{pattern}/:\n{self.text()}"
            time.sleep(0.05)
        return self.text()

    def assert_calm(self) -> None:
        text = self.text()
        assert not [alarm for alarm in ALARMS if alarm in text], text


@pytest.fixture(scope="module")
def topic(module_broker) -> str:
    return create_topic(module_broker.bootstrap, partitions=2)


def connect(broker: Any) -> RawConnection:
    return RawConnection(broker.host, broker.port, timeout=10)


def make_request(api_key: int, version: int, topic: str, wanted: str | None = None) -> Any:
    """A valid request; with ``wanted`` ("topics.0.partition_indexes"), one where that path
    exists (seeds are tried in turn)."""
    hints = Hints([topic], ["hostile-group"], lambda rng: batches.simple_batch(rng))
    for seed in range(200):
        entity = Maker(random.Random(seed), hints).request(api_key, version)
        if wanted is None or _has_path(entity, wanted.split(".")[:-1]):
            return entity
    raise AssertionError(f"no request of api {api_key} v{version} has {wanted}")


def _has_path(entity: Any, steps: list[str]) -> bool:
    for step in steps:
        entity = entity[int(step)] if step.isdigit() else getattr(entity, step)
        if entity is None or (isinstance(entity, tuple) and not entity):
            return False
    return True


def with_path(entity: Any, steps: list[str], value: Any) -> Any:
    """``entity`` with the value at ``steps`` replaced (through tuples and dataclasses)."""
    if not steps:
        return value
    head, rest = steps[0], steps[1:]
    if head.isdigit():
        i = int(head)
        return (*entity[:i], with_path(entity[i], rest, value), *entity[i + 1 :])
    return dataclasses.replace(entity, **{head: with_path(getattr(entity, head), rest, value)})


def send_and_expect_close(broker: Any, payload: bytes) -> None:
    with socket.create_connection((broker.host, broker.port), timeout=10) as sock:
        sock.sendall(payload)
        sock.settimeout(10)
        with contextlib.suppress(ConnectionResetError):
            while sock.recv(65536):
                pass  # the connection must be closed, with no answer expected


# -- 1: an array count of ~2^32 aborted the process -----------------------------------------
HUGE_COUNT_CASES = [(3, 12), (0, 9), (42, 2), (37, 2), (1, 12), (9, 7), (15, 5), (11, 9), (20, 4)]


def test_the_20_byte_metadata_reproducer_closes_only_its_connection(module_broker) -> None:
    watch = LogWatch(module_broker)
    with connect(module_broker) as bystander:
        bystander.api_versions()
        send_and_expect_close(module_broker, frame(ABORT_REPRODUCER))
        assert module_broker.alive, "broker process died"
        watch.wait_for(r"closing connection from .*malformed api 3 v12 body: array topics")
        assert bystander.api_versions()  # the other connection is still served
    watch.assert_calm()


@pytest.mark.parametrize(("api_key", "version"), HUGE_COUNT_CASES)
def test_a_compact_array_count_of_2_to_the_32_closes_only_its_connection(
    module_broker, topic, api_key, version
) -> None:
    entity = make_request(api_key, version, topic)
    body = encode(entity)
    found = next(f for f in lengths(type(entity), body)[0] if f.kind == "array")
    body = body[: found.offset] + encode_uvarint(2**32 - 1) + body[found.offset + found.width :]
    watch = LogWatch(module_broker)
    with connect(module_broker) as bystander:
        bystander.api_versions()
        send_and_expect_close(module_broker, frame(request_header(api_key, version, 9, "x") + body))
        assert module_broker.alive, "broker process died"
        watch.wait_for(
            rf"malformed api {api_key} v{version} body: array {found.name} of length 4294967294"
        )
        assert bystander.api_versions()
    watch.assert_calm()


# -- 2: null for a non-nullable array reached the handlers ------------------------------------
NULL_ARRAY_CASES = [
    (0, 9, "topic_data"),
    (0, 7, "topic_data.0.partition_data"),
    (20, 4, "topic_names"),
    (2, 7, "topics"),
    (14, 5, "assignments"),
    (15, 5, "groups"),
    (9, 7, "topics.0.partition_indexes"),
    (8, 8, "topics"),
    (11, 9, "protocols"),
    (10, 4, "coordinator_keys"),
    (42, 2, "groups_names"),
    (21, 2, "topics"),
]


@pytest.mark.parametrize(("api_key", "version", "path"), NULL_ARRAY_CASES)
def test_null_for_a_non_nullable_array_is_a_parse_error(
    module_broker, topic, api_key, version, path
) -> None:
    """Kafka cannot parse such a request and closes the connection; the handlers used to get
    None and fail with a TypeError traceback."""
    steps = path.split(".")
    entity = with_path(make_request(api_key, version, topic, path), steps, None)
    watch = LogWatch(module_broker)
    send_and_expect_close(
        module_broker, frame(request_header(api_key, version, 5, "x") + encode(entity))
    )
    watch.wait_for(rf"null array for non-nullable field {steps[-1]}")
    assert module_broker.alive
    watch.assert_calm()


# -- 3: Metadata v10/v11 with a null topic name --------------------------------------------------
def metadata_request(version: int, *topics: tuple[str | None, uuid.UUID | None]) -> Any:
    mod = schema("metadata", version, "request")
    fields = {f.name for f in dataclasses.fields(mod.MetadataRequest)}
    extra = {"include_cluster_authorized_operations": False}
    return mod.MetadataRequest(
        topics=tuple(mod.MetadataRequestTopic(name=n, topic_id=i) for n, i in topics),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
        **{k: v for k, v in extra.items() if k in fields},
    )


@pytest.mark.parametrize(
    ("version", "wanted", "message"),
    [
        (10, (None, None), "Topic name can not be null for version 10"),
        (11, (None, None), "Topic name can not be null for version 11"),
        (11, ("x", uuid.UUID(int=7)), "Topic IDs are not supported in requests for version 11"),
    ],
)
def test_metadata_entry_a_version_cannot_carry_answers_invalid_request(
    module_broker, topic, version, wanted, message
) -> None:
    """Kafka throws InvalidRequestException and answers its error response: no brokers, every
    requested topic with INVALID_REQUEST (a null name as ""). It used to be a traceback."""
    watch = LogWatch(module_broker)
    response_type = schema("metadata", version, "response").MetadataResponse
    with connect(module_broker) as conn:
        resp = conn.request(metadata_request(version, wanted, (topic, None)), response_type)
        assert [t.error_code for t in resp.topics] == [INVALID_REQUEST, INVALID_REQUEST]
        assert [t.name for t in resp.topics] == [wanted[0] or "", topic]
        assert resp.brokers == () and all(t.partitions == () for t in resp.topics)
        # the connection is still usable: a well-formed request on it is answered
        assert conn.request(MetadataV1(topics=None), MetadataResponseV1).brokers
    watch.wait_for(message)
    watch.assert_calm()


def test_metadata_v12_null_name_without_id_is_that_topics_error(module_broker, topic) -> None:
    response_type = schema("metadata", 12, "response").MetadataResponse
    with connect(module_broker) as conn:
        resp = conn.request(metadata_request(12, (None, None), (topic, None)), response_type)
    assert [t.error_code for t in resp.topics] == [INVALID_TOPIC_EXCEPTION, 0]


def test_metadata_naming_a_topic_twice_answers_it_once(module_broker, topic) -> None:
    """Kafka reads the names as a set (found by an independent hostile-client campaign: each
    repeat was answered, so one request could ask for a topic's metadata many times over)."""
    response_type = schema("metadata", 12, "response").MetadataResponse
    with connect(module_broker) as conn:
        resp = conn.request(
            metadata_request(
                12, (topic, None), (topic, None), ("missing", None), ("missing", None)
            ),
            response_type,
        )
    assert [t.name for t in resp.topics] == [topic, "missing"]


# -- a connection closed while its produces wait for their turn --------------------------------
def test_a_connection_closed_with_produces_in_flight_leaves_no_traceback(module_broker) -> None:
    """Found by the long fuzz run: a produce validated in a thread, whose connection closed
    meanwhile, had its outcome future cancelled with the request; when the validator then
    refused the batch, the refusal set a result on it (InvalidStateError traceback)."""
    name = create_topic(module_broker.bootstrap, partitions=1)
    # 48 MiB of zeros in a 50 KB gzip batch whose records all say offset delta 0 (refused
    # once decompressed in the validator thread, long after the connection went)
    records = batches.record(0, None, bytes(1 << 20)) * 48
    batch = batches.batch(records, 48, codec=batches.GZIP)
    payload = frame(request_header(0, 7, 1, "hostile") + encode(produce_request(name, 0, batch)))
    watch = LogWatch(module_broker)
    for delay in (0.01, 0.03, 0.06):
        with socket.create_connection((module_broker.host, module_broker.port)) as sock:
            sock.sendall(payload)
            time.sleep(delay)
            # an abortive close (RST) while the produce waits for its validation
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with connect(module_broker) as conn:
        part = produce_raw(conn, name, 0, bytes(build_batch([(b"k", b"after")])))
        assert part.error_code == 0
    time.sleep(1.0)  # the deferred appends of the closed connections finish
    assert module_broker.alive
    watch.assert_calm()


def test_an_error_message_echoing_a_huge_name_is_cut_short(module_broker) -> None:
    """A topic or resource name of 32,767 characters in a non-flexible version: the error
    message echoing it outgrew what a string holds there (32,767 bytes), the answer failed
    to encode and the connection closed with an internal error logged (an independent fuzz
    campaign, on DescribeConfigs v2, CreateTopics v3, CreatePartitions v1, AlterConfigs v1).
    Now the message is cut short and each is answered with the topic's error."""
    name = "x" * 32767
    watch = LogWatch(module_broker)
    cases = []
    mod = schema("describe_configs", 2, "request")
    cases.append(
        (
            mod.DescribeConfigsRequest(
                resources=(
                    mod.DescribeConfigsResource(
                        resource_type=2, resource_name=name, configuration_keys=None
                    ),
                ),
                include_synonyms=False,
            ),
            schema("describe_configs", 2, "response").DescribeConfigsResponse,
            lambda r: [(x.error_code, len(x.error_message or "")) for x in r.results],
        )
    )
    mod = schema("create_topics", 3, "request")
    cases.append(
        (
            mod.CreateTopicsRequest(
                topics=(
                    mod.CreatableTopic(
                        name=name,
                        num_partitions=1,
                        replication_factor=1,
                        assignments=(),
                        configs=(),
                    ),
                ),
                timeout=datetime.timedelta(seconds=5),
                validate_only=False,
            ),
            schema("create_topics", 3, "response").CreateTopicsResponse,
            lambda r: [(x.error_code, len(x.error_message or "")) for x in r.topics],
        )
    )
    for request, response_type, errors in cases:
        with connect(module_broker) as conn:
            answer = conn.request(request, response_type)
        ((code, length),) = errors(answer)
        # INVALID_TOPIC_EXCEPTION, or UNKNOWN_TOPIC_OR_PARTITION for a described resource
        assert code in (17, 3) and 0 < length <= 1024
    watch.assert_calm()
