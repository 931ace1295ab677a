"""Produce (0) request bodies decoded by hand, versions 3-13, sans-IO.

The generic path (the bounds guard's walk, then kio's native reader building frozen
entities) cost about 9 µs for a one-partition Produce request here; librdkafka sends one
partition per request at thousands of partitions, so that was a cost per batch there. This
decoder reads the same fields with a few ``struct`` unpacks and builds three kinds of small
slotted objects with the attribute names the handler reads from kio's entities
(``transactional_id``, ``acks``, ``timeout_ms``, ``topic_data[].name`` / ``topic_id`` /
``partition_data[].index`` / ``records``).

It checks what the guard checks: every length against the bytes left (an array's count
before any element is read, so a count of 2^32 costs nothing), null only where the schema
allows it (``transactional_id``, ``records``), UTF-8 strings, varints of at most 5 bytes,
and tagged-field sections (Produce declares no tags: each is skipped by its size). Anything
else raises :class:`MalformedProduce`; bytes after a complete body are ignored, as Kafka's
parser does. ``tests/unit/test_produce_request.py`` holds it to kio's decoding over every
version, and to the guard's verdict on truncated and corrupted frames.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

FIRST_VERSION = 3
LAST_VERSION = 13
FLEXIBLE_VERSION = 9
TOPIC_IDS_VERSION = 13

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")
_NULL_UUID = bytes(16)


class MalformedProduce(ValueError):
    """The body is not a valid Produce request of its version."""


class PartitionData:
    """One partition's batch: ``records`` is None when the client sent null."""

    __slots__ = ("index", "records")

    def __init__(self, index: int, records: bytes | None) -> None:
        self.index = index
        self.records = records


class TopicData:
    """One topic's partitions, named by ``name`` (v3-12) or ``topic_id`` (v13; None for the
    all-zero id, as kio reads it)."""

    __slots__ = ("name", "partition_data", "topic_id")

    def __init__(
        self, name: str, topic_id: uuid.UUID | None, partition_data: list[PartitionData]
    ) -> None:
        self.name = name
        self.topic_id = topic_id
        self.partition_data = partition_data


class ProduceRequest:
    __slots__ = ("acks", "timeout_ms", "topic_data", "transactional_id")

    def __init__(
        self, transactional_id: str | None, acks: int, timeout_ms: int, topic_data: list[TopicData]
    ) -> None:
        self.transactional_id = transactional_id
        self.acks = acks
        self.timeout_ms = timeout_ms
        self.topic_data = topic_data


def _null_error(what: str, name: str) -> MalformedProduce:
    return MalformedProduce(f"null {what} for non-nullable field {name}")


def _length_error(what: str, name: str, length: int) -> MalformedProduce:
    """The guard's wording (``guard._length_error``), so log lines read the same."""
    return MalformedProduce(f"{what} {name} of length {length} does not fit in the frame")


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes: (value, position after it)."""
    value = shift = 0
    end = len(buf)
    for i in range(pos, pos + 5):
        if i >= end:
            raise MalformedProduce("varint runs past the end of the frame")
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i + 1
        shift += 7
    raise MalformedProduce("varint longer than 5 bytes")


def _skip_tags(buf: bytes, pos: int) -> int:
    """A tagged-field section with no known tags: count, then (tag, size, value) each."""
    if pos < len(buf) and buf[pos] == 0:
        return pos + 1  # the usual empty section
    count, pos = _uvarint(buf, pos)
    if count > len(buf) - pos:
        raise _length_error("tagged fields", "section", count)
    for _ in range(count):
        _, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        pos += size
        if pos > len(buf):
            raise MalformedProduce("a tagged field runs past the end of the frame")
    return pos


def _string(buf: bytes, pos: int, flexible: bool, nullable: bool, what: str) -> tuple[Any, int]:
    if flexible:
        n, pos = _uvarint(buf, pos)
        n -= 1
    else:
        if pos + 2 > len(buf):
            raise MalformedProduce(f"{what} runs past the end of the frame")
        (n,) = _I16.unpack_from(buf, pos)
        pos += 2
    if n < 0:
        if n == -1 and nullable:
            return None, pos
        raise _null_error("value", what) if n == -1 else _length_error("value", what, n)
    end = pos + n
    if end > len(buf):
        raise _length_error("value", what, n)
    try:
        return buf[pos:end].decode("utf-8"), end
    except UnicodeDecodeError:
        raise MalformedProduce(f"{what} is not UTF-8") from None


def _count(buf: bytes, pos: int, flexible: bool, what: str, least: int) -> tuple[int, int]:
    """An array's element count (non-nullable), checked against the bytes left: each element
    takes at least ``least`` bytes."""
    if flexible:
        n, pos = _uvarint(buf, pos)
        n -= 1
    else:
        if pos + 4 > len(buf):
            raise MalformedProduce(f"{what} runs past the end of the frame")
        (n,) = _I32.unpack_from(buf, pos)
        pos += 4
    if n < 0:
        raise _null_error("array", what) if n == -1 else _length_error("array", what, n)
    if n * least > len(buf) - pos:
        raise _length_error("array", what, n)
    return n, pos


def decode(buf: bytes, pos: int, version: int) -> ProduceRequest:
    """The Produce request body of ``version`` starting at ``pos`` (after the request header
    and, from v9, its tagged fields)."""
    if not FIRST_VERSION <= version <= LAST_VERSION:
        raise MalformedProduce(f"Produce v{version} is not decoded here")
    flexible = version >= FLEXIBLE_VERSION
    by_id = version >= TOPIC_IDS_VERSION
    size = len(buf)
    transactional_id, pos = _string(buf, pos, flexible, True, "transactional_id")
    if pos + 6 > size:
        raise MalformedProduce("acks and timeout run past the end of the frame")
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(buf, pos)
    pos += 6
    # the least a topic takes: its name (or id), a partition count and, flexible, its tags
    least_topic = (16 if by_id else (1 if flexible else 2)) + (2 if flexible else 4)
    least_partition = 4 + (2 if flexible else 4)  # index, records length (, tags)
    n_topics, pos = _count(buf, pos, flexible, "topic_data", least_topic)
    topics: list[TopicData] = []
    for _ in range(n_topics):
        topic_id: uuid.UUID | None = None
        name = ""
        if by_id:
            if pos + 16 > size:
                raise MalformedProduce("topic_id runs past the end of the frame")
            raw = buf[pos : pos + 16]
            pos += 16
            if raw != _NULL_UUID:
                topic_id = uuid.UUID(bytes=bytes(raw))
        else:
            name, pos = _string(buf, pos, flexible, False, "name")
        n_partitions, pos = _count(buf, pos, flexible, "partition_data", least_partition)
        partitions: list[PartitionData] = []
        for _ in range(n_partitions):
            if pos + 4 > size:
                raise MalformedProduce("partition index runs past the end of the frame")
            (index,) = _I32.unpack_from(buf, pos)
            pos += 4
            if flexible:
                n, pos = _uvarint(buf, pos)
                n -= 1
            else:
                if pos + 4 > size:
                    raise MalformedProduce("records run past the end of the frame")
                (n,) = _I32.unpack_from(buf, pos)
                pos += 4
            records: bytes | None = None
            if n >= 0:
                end = pos + n
                if end > size:
                    raise _length_error("value", "records", n)
                records = bytes(buf[pos:end])
                pos = end
            elif n != -1:
                raise _length_error("value", "records", n)
            if flexible:
                pos = _skip_tags(buf, pos)
            partitions.append(PartitionData(index, records))
        if flexible:
            pos = _skip_tags(buf, pos)
        topics.append(TopicData(name, topic_id, partitions))
    if flexible:
        pos = _skip_tags(buf, pos)
    return ProduceRequest(transactional_id, acks, timeout_ms, topics)
