"""Kafka's Produce, InitProducerId and Metadata from the producing side (sans-IO): the
requests the Spark sink's producer sends and the answers it reads.

Non-flexible versions (request header v1, response header v0), encoded and decoded with
kio's schemas: Produce v8, InitProducerId v1, Metadata v8 (which may auto-create a topic,
as a producer's metadata request does), DescribeConfigs v1 (a topic's settings); the
Produce request itself is written with ``struct`` as pieces around the batches' own bytes,
held byte for byte to kio's. An answer that does not decode whole is refused
(:class:`MalformedResponse`).
"""

from __future__ import annotations

import datetime
import io
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PRODUCE_KEY, PRODUCE_VERSION = 0, 8
METADATA_KEY, METADATA_VERSION = 3, 8
INIT_PRODUCER_ID_KEY, INIT_PRODUCER_ID_VERSION = 22, 1
DESCRIBE_CONFIGS_KEY, DESCRIBE_CONFIGS_VERSION = 32, 1
TOPIC_RESOURCE = 2  # DescribeConfigs' resource type of a topic

_HEADER_V1 = struct.Struct(">hhih")
_I32 = struct.Struct(">i")


class MalformedResponse(ValueError):
    """An answer that does not decode whole."""


def _frame(api_key: int, version: int, correlation_id: int, client_id: str, entity: Any) -> bytes:
    from kio.serial import entity_writer

    buf = io.BytesIO()
    entity_writer(type(entity))(buf, entity)
    cid = client_id.encode()
    body = _HEADER_V1.pack(api_key, version, correlation_id, len(cid)) + cid + buf.getvalue()
    return _I32.pack(len(body)) + body


def _decode(schema: Any, frame: bytes | bytearray | memoryview) -> tuple[int, Any]:
    from kio.serial import entity_reader

    if len(frame) < 4:
        raise MalformedResponse(f"{schema.__name__} shorter than its header")
    (correlation_id,) = _I32.unpack_from(frame, 0)
    try:
        body, size = entity_reader(schema)(memoryview(frame).toreadonly(), 4)
    except Exception as exc:  # kio raises several kinds on bad bytes
        raise MalformedResponse(f"{schema.__name__} does not decode: {exc}") from exc
    if 4 + size != len(frame):
        raise MalformedResponse(f"{len(frame) - 4 - size} bytes after the {schema.__name__}")
    return correlation_id, body


def correlation_id_of(frame: bytes | bytearray | memoryview) -> int:
    if len(frame) < 4:
        raise MalformedResponse("a response shorter than its correlation id")
    return int(_I32.unpack_from(frame, 0)[0])


# -- InitProducerId --------------------------------------------------------------------------
def encode_init_producer_id(correlation_id: int, client_id: str) -> bytes:
    """An idempotent (not transactional) producer's InitProducerId."""
    from kio.schema.init_producer_id.v1 import request as req
    from kio.static.primitive import i32Timedelta

    entity = req.InitProducerIdRequest(
        transactional_id=None,
        transaction_timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=-1)),
    )
    return _frame(INIT_PRODUCER_ID_KEY, INIT_PRODUCER_ID_VERSION, correlation_id, client_id, entity)


def decode_init_producer_id(frame: bytes | bytearray | memoryview) -> tuple[int, int, int, int]:
    """(correlation id, error code, producer id, producer epoch)."""
    from kio.schema.init_producer_id.v1 import response as resp

    cid, body = _decode(resp.InitProducerIdResponse, frame)
    return cid, int(body.error_code), int(body.producer_id), int(body.producer_epoch)


# -- Metadata --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TopicLayout:
    """One topic of a Metadata answer: its error and each partition's (error, leader)."""

    error_code: int
    partitions: dict[int, tuple[int, int]]


@dataclass(frozen=True, slots=True)
class Layout:
    brokers: dict[int, tuple[str, int]]
    topics: dict[str, TopicLayout]


def encode_metadata(correlation_id: int, client_id: str, topics: list[str]) -> bytes:
    """A producer's Metadata of ``topics`` (auto-creation allowed, as Kafka's producer asks)."""
    from kio.schema.metadata.v8 import request as req

    entity = req.MetadataRequest(
        topics=tuple(req.MetadataRequestTopic(name=t) for t in topics),  # type: ignore[arg-type]
        allow_auto_topic_creation=True,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    return _frame(METADATA_KEY, METADATA_VERSION, correlation_id, client_id, entity)


def decode_metadata(frame: bytes | bytearray | memoryview) -> tuple[int, Layout]:
    from kio.schema.metadata.v8 import response as resp

    cid, body = _decode(resp.MetadataResponse, frame)
    brokers = {int(b.node_id): (str(b.host), int(b.port)) for b in body.brokers}
    topics = {
        str(t.name): TopicLayout(
            int(t.error_code),
            {int(p.partition_index): (int(p.error_code), int(p.leader_id)) for p in t.partitions},
        )
        for t in body.topics
    }
    return cid, Layout(brokers, topics)


# -- DescribeConfigs -------------------------------------------------------------------------
def encode_describe_topic_configs(
    correlation_id: int, client_id: str, topic: str, names: list[str]
) -> bytes:
    from kio.schema.describe_configs.v1 import request as req
    from kio.static.primitive import i8

    entity = req.DescribeConfigsRequest(
        resources=(
            req.DescribeConfigsResource(
                resource_type=i8(TOPIC_RESOURCE),
                resource_name=topic,
                configuration_keys=tuple(names),
            ),
        ),
        include_synonyms=False,
    )
    return _frame(DESCRIBE_CONFIGS_KEY, DESCRIBE_CONFIGS_VERSION, correlation_id, client_id, entity)


def decode_describe_configs(
    frame: bytes | bytearray | memoryview,
) -> tuple[int, int, dict[str, str | None]]:
    """(correlation id, the first resource's error code, its settings by name)."""
    from kio.schema.describe_configs.v1 import response as resp

    cid, body = _decode(resp.DescribeConfigsResponse, frame)
    if not body.results:
        raise MalformedResponse("a DescribeConfigs answer without results")
    result = body.results[0]
    return cid, int(result.error_code), {c.name: c.value for c in result.configs}


# -- Produce ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Produced:
    """One topic partition of a Produce answer."""

    topic: str
    partition: int
    error_code: int
    base_offset: int
    error_message: str | None


_PRODUCE_HEAD = struct.Struct(">hhi")  # transactional id null (-1), acks, timeout
_PARTITION_HEAD = struct.Struct(">ii")  # index, records' length


def encode_produce(
    correlation_id: int,
    client_id: str,
    acks: int,
    timeout_ms: int,
    batches: dict[tuple[str, int], Sequence[bytes | bytearray | memoryview]],
) -> list[bytes | bytearray | memoryview]:
    """A Produce v8 of one batch per topic partition (Kafka takes one RecordBatch v2 per
    partition in a request), each batch given as its pieces (a header and its records), as
    the pieces of the frame to write back to back: the batches' bytes are not copied.

    Written with ``struct`` (not kio's writer, which copies every batch twice), byte for byte
    what kio writes for the same request (tests/unit/test_produce_client.py)."""
    topics: dict[str, list[tuple[int, Sequence[bytes | bytearray | memoryview]]]] = {}
    for (topic, partition), pieces in batches.items():
        topics.setdefault(topic, []).append((partition, pieces))
    cid = client_id.encode()
    head = bytearray(_HEADER_V1.pack(PRODUCE_KEY, PRODUCE_VERSION, correlation_id, len(cid)))
    head += cid
    head += _PRODUCE_HEAD.pack(-1, acks, timeout_ms)
    head += _I32.pack(len(topics))
    out: list[bytes | bytearray | memoryview] = [b"", head]
    size = len(head)
    for topic, parts in topics.items():
        name = topic.encode()
        prefix = struct.pack(">h", len(name)) + name + _I32.pack(len(parts))
        out.append(prefix)
        size += len(prefix)
        for partition, pieces in parts:
            length = sum(len(p) for p in pieces)
            out.append(_PARTITION_HEAD.pack(partition, length))
            out.extend(pieces)
            size += _PARTITION_HEAD.size + length
    out[0] = _I32.pack(size)
    return out


def decode_produce(frame: bytes | bytearray | memoryview) -> tuple[int, list[Produced]]:
    from kio.schema.produce.v8 import response as resp

    cid, body = _decode(resp.ProduceResponse, frame)
    return cid, [
        Produced(
            str(t.name),
            int(p.index),
            int(p.error_code),
            int(p.base_offset),
            p.error_message,
        )
        for t in body.responses
        for p in t.partition_responses
    ]
