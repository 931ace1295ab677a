"""Produce requests (API 0, v3-v13) as the broker reads them, sans-IO: record batches stay views
of the frame.

kio's reader copies every partition's records out of the frame into new bytes, so a produced
batch lived twice in memory until its journal write (the frame, then the copy), and the heap
was left with holes the size of both (docs/benchmarks/analysis.md, "Process size, sixth
pass"). Here a partition's ``records`` is a read-only ``memoryview`` of the frame, which
stonemq.protocol.framing hands out without a copy when it is large: the request is one
allocation, freed whole once it is answered (the connection counts it in
``queued.max.request.bytes`` until then). Nothing may hold a batch past that: a stored
exception's traceback did (``JournalHealth.check_append``).

The decoder checks what stonemq.protocol.guard checks before kio's reader (which this module
replaces for Produce): no array count or length beyond the bytes left in the frame, no null
where Kafka's schema does not allow one (the topic and partition arrays, a topic name), valid
UTF-8 and tagged-field sections that fit. A request that breaks one raises
:class:`~stonemq.protocol.guard.MalformedRequest`; the tests hold every answer to kio's reader
behind the guard, for valid requests and for mutated ones.
"""

from __future__ import annotations

import struct
import uuid
from typing import NamedTuple

from stonemq.protocol.guard import (
    MalformedRequest,
    length_error,
    null_error,
    read_uvarint,
    skip_tagged_fields,
)

FLEXIBLE_VERSION = 9
"""From v9 the request is flexible: compact lengths and tagged fields (KIP-482)."""
TOPIC_ID_VERSION = 13
"""From v13 a topic is named by its id instead of its name (KIP-516)."""

_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from
_ACKS_TIMEOUT_COUNT = struct.Struct(">hii").unpack_from
_ACKS_TIMEOUT = struct.Struct(">hi").unpack_from
_PARTITION_HEAD = struct.Struct(">ii").unpack_from  # index, records length
_PARTITION_HEAD_FLEXIBLE = struct.Struct(">iB").unpack_from  # index, the length's first byte
_NULL_UUID = bytes(16)

# the fewest bytes an array element can take: a topic (a name or id, the partition array's
# length, tags) and a partition (index, records length, tags)
_TOPIC_MIN = {False: 2 + 4, True: 1 + 1 + 1}
_TOPIC_ID_MIN = 16 + 1 + 1
_PARTITION_MIN = {False: 4 + 4, True: 4 + 1 + 1}


class PartitionProduceData(NamedTuple):
    index: int
    records: memoryview | bytes | None  # a view of the frame; b"" when empty (a view costs
    # 184 bytes: a hostile request of many empty partitions would hold 4-5 times its size)


class TopicProduceData(NamedTuple):
    name: str  # "" from v13, where the topic is named by ``topic_id``
    topic_id: uuid.UUID | None  # None before v13, and for the all-zero id
    partition_data: tuple[PartitionProduceData, ...]


class ProduceRequest(NamedTuple):
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: tuple[TopicProduceData, ...]


_new = tuple.__new__  # a NamedTuple's own __new__ is a Python function: a frame per partition


def decode(frame: bytes | memoryview, pos: int, version: int) -> ProduceRequest:
    """The request body at ``pos`` (after the request header). Bytes after a complete body
    are ignored, as Kafka's parser ignores them."""
    view = memoryview(frame)
    if not view.readonly:  # a batch must not change under its validation and write
        view = view.toreadonly()
    try:
        if version >= FLEXIBLE_VERSION:
            return _decode_flexible(view, pos, version)
        return _decode_legacy(view, pos)
    except (IndexError, struct.error):
        raise MalformedRequest("request body runs past the end of the frame") from None
    except UnicodeDecodeError as exc:
        raise MalformedRequest(f"a string is not UTF-8: {exc}") from None


def _decode_legacy(view: memoryview, pos: int) -> ProduceRequest:
    size = len(view)
    (n,) = _I16(view, pos)
    pos += 2
    transactional_id = None
    if n >= 0:
        transactional_id = _text(view, pos, n, "transactional_id")
        pos += n
    elif n != -1:
        raise _length("transactional_id", n)
    acks, timeout_ms, count = _ACKS_TIMEOUT_COUNT(view, pos)
    pos += 10
    _check_count(count, _TOPIC_MIN[False], size - pos, "topic_data")
    topics = []
    for _ in range(count):
        (n,) = _I16(view, pos)
        pos += 2
        if n < 0:
            raise _null_or_length("name", n)
        name = _text(view, pos, n, "name")
        pos += n
        (parts,) = _I32(view, pos)
        pos += 4
        _check_count(parts, _PARTITION_MIN[False], size - pos, "partition_data")
        partitions = []
        add = partitions.append
        for _ in range(parts):
            index, n = _PARTITION_HEAD(view, pos)
            pos += 8
            if n > 0:
                end = pos + n
                if end > size:
                    raise _length("records", n)
                add(_new(PartitionProduceData, (index, view[pos:end])))
                pos = end
            elif n == 0 or n == -1:
                add(_new(PartitionProduceData, (index, b"" if n == 0 else None)))
            else:
                raise _length("records", n)
        topics.append(TopicProduceData(name, None, tuple(partitions)))
    return ProduceRequest(transactional_id, acks, timeout_ms, tuple(topics))


def _decode_flexible(view: memoryview, pos: int, version: int) -> ProduceRequest:
    size = len(view)
    n, pos = _uvarint(view, pos)
    transactional_id = None
    if n:
        transactional_id = _text(view, pos, n - 1, "transactional_id")
        pos += n - 1
    acks, timeout_ms = _ACKS_TIMEOUT(view, pos)
    pos += 6
    count, pos = _uvarint(view, pos)
    by_id = version >= TOPIC_ID_VERSION
    _check_count(count - 1, _TOPIC_ID_MIN if by_id else _TOPIC_MIN[True], size - pos, "topic_data")
    topics = []
    for _ in range(count - 1):
        name, topic_id = "", None
        if by_id:
            raw = view[pos : pos + 16]
            if len(raw) < 16:
                raise MalformedRequest("topic_id runs past the end of the frame")
            if raw != _NULL_UUID:
                topic_id = uuid.UUID(bytes=bytes(raw))
            pos += 16
        else:
            n, pos = _uvarint(view, pos)
            if not n:
                raise null_error("value", "name")
            name = _text(view, pos, n - 1, "name")
            pos += n - 1
        parts, pos = _uvarint(view, pos)
        _check_count(parts - 1, _PARTITION_MIN[True], size - pos, "partition_data")
        partitions = []
        add = partitions.append
        for _ in range(parts - 1):
            index, n = _PARTITION_HEAD_FLEXIBLE(view, pos)  # n: the length's first byte
            if n < 0x80:
                pos += 5
            else:
                n, pos = read_uvarint(view, pos + 4)  # type: ignore[arg-type]
            records: memoryview | bytes | None = None
            if n > 1:
                end = pos + n - 1
                if end > size:
                    raise _length("records", n - 1)
                records = view[pos:end]
                pos = end
            elif n == 1:
                records = b""
            add(_new(PartitionProduceData, (index, records)))
            if view[pos]:  # tagged fields: Produce defines none, each is skipped by its size
                pos = skip_tagged_fields(view, pos)  # type: ignore[arg-type]
            else:
                pos += 1
        topics.append(TopicProduceData(name, topic_id, tuple(partitions)))
        pos = _tags(view, pos)
    _tags(view, pos)
    return ProduceRequest(transactional_id, acks, timeout_ms, tuple(topics))


def _uvarint(view: memoryview, pos: int) -> tuple[int, int]:
    n = view[pos]
    if n < 0x80:
        return n, pos + 1
    return read_uvarint(view, pos)  # type: ignore[arg-type]


def _tags(view: memoryview, pos: int) -> int:
    """Skip a tagged-field section (Produce defines no tags: each is skipped by its size)."""
    if not view[pos]:
        return pos + 1
    return skip_tagged_fields(view, pos)  # type: ignore[arg-type]


def _text(view: memoryview, pos: int, n: int, name: str) -> str:
    if pos + n > len(view):
        raise _length(name, n)
    return str(view[pos : pos + n], "utf-8")


def _check_count(count: int, least: int, left: int, name: str) -> None:
    """An array's count, checked against the bytes left before any element is read."""
    if count < 0:
        raise null_error("array", name) if count == -1 else length_error("array", name, count)
    if count * least > left:
        raise length_error("array", name, count)


def _null_or_length(name: str, n: int) -> MalformedRequest:
    return null_error("value", name) if n == -1 else length_error("value", name, n)


def _length(name: str, n: int) -> MalformedRequest:
    return length_error("value", name, n)
