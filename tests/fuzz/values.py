"""Random valid requests, seeded: a kio request entity of any advertised API and version built
from its dataclass schema, with values a broker takes seriously (known topics and groups,
small partition numbers, real record batches, short timeouts) or, with ``weird``, edge
values anywhere (negative partitions, extreme offsets, odd names).
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import random
import types
import typing
import uuid
from collections.abc import Callable
from typing import Any

from kio.index import load_request_schema
from kio.serial import entity_writer
from kio.static.primitive import Interval, Records, i32Timedelta, i64Timedelta

from stonemq.handlers import REGISTRY

ADVERTISED: list[tuple[int, int]] = [
    (spec.api_key, version)
    for spec in sorted(REGISTRY.values(), key=lambda s: s.api_key)
    for version in range(spec.min_version, spec.max_version + 1)
]

TOPIC_FIELDS = {"name", "topic", "topic_names", "resource_name"}
GROUP_FIELDS = {"group_id", "groups", "groups_names", "key", "coordinator_keys"}
PARTITION_FIELDS = {"partition", "partition_index", "index", "partitions", "partition_indexes"}
SMALL_INTS = {
    "num_partitions": (1, 3),
    "count": (1, 3),
    "replication_factor": (1, 1),
    "isolation_level": (0, 1),
    "key_type": (0, 1),
    "acks": (-1, 1),
    "replica_id": (-1, -1),
    "producer_id": (-1, -1),
    "producer_epoch": (-1, -1),
    "generation_id": (-1, 0),
    "session_id": (0, 0),
    "session_epoch": (-1, 0),
    "resource_type": (2, 4),
    "config_operation": (0, 3),
}
TIMEOUT_MS = {"session_timeout": (6000, 30000), "rebalance_timeout": (0, 300)}
STRING_VALUES = {"protocol_type": "consumer", "protocol_name": "range", "member_id": ""}


@dataclasses.dataclass
class Hints:
    """What the values draw from: names that exist on the broker, and a batch builder."""

    topics: list[str]
    groups: list[str]
    records: Callable[[random.Random], bytes]
    # the ids of ``topics`` (same order), once the broker has them: the versions that name
    # topics by id (Produce v13, Fetch v13+, OffsetCommit/OffsetFetch v10) reach them too
    topic_ids: list[uuid.UUID] = dataclasses.field(default_factory=list)


def encode(entity: Any) -> bytes:
    out = io.BytesIO()
    entity_writer(type(entity))(out, entity)
    return out.getvalue()


def produce_plain(version: int, request: Any) -> tuple[Any, ...]:
    """A Produce request as plain values, from kio's entity or from the broker's own decoder
    (stonemq.protocol.produce_request, whose timeout is in ms and records are views)."""
    timeout = getattr(request, "timeout_ms", None)
    if timeout is None:
        timeout = round(request.timeout.total_seconds() * 1000)
    return (
        request.transactional_id,
        request.acks,
        timeout,
        tuple(
            (
                t.topic_id if version >= 13 else t.name,
                tuple(
                    (p.index, None if p.records is None else bytes(p.records))
                    for p in t.partition_data
                ),
            )
            for t in request.topic_data
        ),
    )


def request_header(api_key: int, version: int, correlation_id: int, client_id: str | None) -> bytes:
    """Header v1, or v2 (an empty tag section after the client id) for flexible versions."""
    flexible = load_request_schema(api_key, version).__flexible__
    client = (
        b"\xff\xff" if client_id is None else len(client_id).to_bytes(2, "big") + client_id.encode()
    )
    head = api_key.to_bytes(2, "big") + version.to_bytes(2, "big", signed=True)
    return (
        head
        + correlation_id.to_bytes(4, "big", signed=True)
        + client
        + (b"\0" if flexible else b"")
    )


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


class Maker:
    """Builds one random entity of a request schema."""

    def __init__(self, rng: random.Random, hints: Hints, weird: bool = False) -> None:
        self.rng = rng
        self.hints = hints
        self.weird = weird

    def request(self, api_key: int, version: int) -> Any:
        return self.entity(load_request_schema(api_key, version), 0)

    def entity(self, cls: type, depth: int) -> Any:
        values = {}
        for field in dataclasses.fields(cls):
            if "tag" in field.metadata and self.rng.random() < 0.5:
                continue  # a tagged field left out takes its default
            values[field.name] = self.value(field, field.type, depth)
        return cls(**values)

    def value(self, field: dataclasses.Field[Any], annotation: Any, depth: int) -> Any:
        rng = self.rng
        if typing.get_origin(annotation) in (types.UnionType, typing.Union):
            (inner,) = (a for a in typing.get_args(annotation) if a is not type(None))
            if rng.random() < (0.3 if self.weird else 0.1):
                return None
            annotation = inner
        if typing.get_origin(annotation) is tuple:
            (element, _) = typing.get_args(annotation)
            count = rng.choice((0, 1, 1, 1, 2, 3)) if depth < 3 else rng.choice((0, 1))
            return tuple(self.value(field, element, depth + 1) for _ in range(count))
        if dataclasses.is_dataclass(annotation):
            return self.entity(annotation, depth + 1)  # type: ignore[arg-type]
        return self.leaf(field.name, field.metadata.get("kafka_type", ""), annotation)

    def leaf(self, name: str, kafka_type: str, annotation: Any) -> Any:
        rng = self.rng
        if kafka_type == "records":
            return Records(self.hints.records(rng))
        if annotation is bool:
            return rng.random() < 0.5
        if annotation is uuid.UUID:
            if name == "topic_id" and self.hints.topic_ids and rng.random() < 0.8:
                return rng.choice(self.hints.topic_ids)
            return uuid.UUID(int=rng.getrandbits(128))
        if isinstance(annotation, type) and issubclass(annotation, (i32Timedelta, i64Timedelta)):
            low, high = TIMEOUT_MS.get(name, (0, 1000))
            if self.weird and rng.random() < 0.3:
                low, high = (-(2**31), 2**31 - 1)
            return datetime.timedelta(milliseconds=rng.randint(low, high))
        if isinstance(annotation, type) and issubclass(annotation, Interval):
            return self.integer(name, annotation)
        if kafka_type == "bytes":
            return rng.randbytes(rng.choice((0, 4, 16, 100)))
        if kafka_type == "float64":  # AlterClientQuotas' values (found by a long run: a
            # string went to the float writer, so no quota value was ever fuzzed)
            if self.weird and rng.random() < 0.4:
                return rng.choice((float("nan"), float("inf"), -float("inf"), -1.0, 0.0, 1e308))
            return rng.choice((1.0, 50.0, 1024.0, 1e6, 1.5))
        return self.string(name)

    def integer(self, name: str, cls: type[Interval]) -> int:
        rng = self.rng
        low, high = cls.__low__, cls.__high__
        if self.weird and rng.random() < 0.4:
            return rng.choice((low, high, -1, 0, 1, rng.randint(low, high)))
        if name in PARTITION_FIELDS:
            return rng.choice((0, 0, 1, 2, 3))
        if name in SMALL_INTS:
            return rng.randint(*SMALL_INTS[name])
        if "offset" in name or name == "timestamp":
            return rng.choice((0, 1, 5, -1, -2))
        return rng.randint(max(low, -1), min(high, 1 << 20))

    def string(self, name: str) -> str:
        rng = self.rng
        if self.weird and rng.random() < 0.3:
            return rng.choice(("", ".", "..", "a" * 300, "caf\u00e9", "x/y", "__consumer_offsets"))
        if name in STRING_VALUES:
            return STRING_VALUES[name]
        if name in TOPIC_FIELDS and self.hints.topics:
            return rng.choice(self.hints.topics)
        if name in GROUP_FIELDS and self.hints.groups:
            return rng.choice(self.hints.groups)
        return "fuzz-" + "".join(rng.choice("abcdefghijklmnop") for _ in range(6))
