"""The hand-written Produce request decoder (stonemq/protocol/produce_request.py) against the
generic path it replaces (the bounds guard, then kio's reader): the same fields for every
request kio encodes, over every version the broker accepts, and the same verdict (decoded or
refused) on truncated and corrupted frames."""

from __future__ import annotations

import datetime
import importlib
import io
import struct
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.serial import entity_writer

from stonemq.protocol import guard
from stonemq.protocol.codec import (
    RequestDecodeError,
    RequestHeader,
    _request_codec,
    decode_request,
    parse_header_prefix,
)
from stonemq.protocol.produce_request import (
    FIRST_VERSION,
    FLEXIBLE_VERSION,
    LAST_VERSION,
    TOPIC_IDS_VERSION,
    MalformedProduce,
    decode,
)

_VERSIONS = st.integers(FIRST_VERSION, LAST_VERSION)
_records = st.one_of(st.none(), st.binary(max_size=300))
_partitions = st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), _records), max_size=4)
_topics = st.lists(
    st.tuples(st.text(max_size=20), st.one_of(st.uuids(), st.just(uuid.UUID(int=0))), _partitions),
    max_size=3,
)


def _request(version: int, transactional_id: str | None, acks: int, timeout_ms: int, topics: Any):
    cls = load_request_schema(0, version)
    module = importlib.import_module(cls.__module__)
    by_id = version >= TOPIC_IDS_VERSION
    return cls(
        transactional_id=transactional_id,
        acks=acks,
        timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=tuple(
            module.TopicProduceData(
                **({"topic_id": topic_id} if by_id else {"name": name}),
                partition_data=tuple(
                    module.PartitionProduceData(index=index, records=records)
                    for index, records in partitions
                ),
            )
            for name, topic_id, partitions in topics
        ),
    )


def _frame(version: int, body: Any, client_id: str | None = "c") -> bytes:
    """Header (v1, or v2 with an empty tag section from v9) and kio's encoding of ``body``."""
    head = struct.pack(">hhi", 0, version, 17)
    if client_id is None:
        head += struct.pack(">h", -1)
    else:
        raw = client_id.encode()
        head += struct.pack(">h", len(raw)) + raw
    if version >= FLEXIBLE_VERSION:
        head += b"\0"
    out = io.BytesIO()
    entity_writer(type(body))(out, body)
    return head + out.getvalue()


def _generic(frame: bytes) -> Any:
    """The path Produce took before: guard, then kio (RequestDecodeError when refused)."""
    header, pos = parse_header_prefix(frame)
    reader, flexible, walker = _request_codec(0, header.api_version)
    try:
        if flexible:
            pos = guard.check(guard.skip_tagged_fields, frame, pos)
        guard.check(walker, frame, pos)
        body, _ = reader(frame, pos)
    except Exception as exc:
        raise RequestDecodeError(str(exc)) from exc
    return body


def _same(ours: Any, kio: Any, version: int) -> None:
    assert ours.transactional_id == kio.transactional_id
    assert ours.acks == kio.acks
    assert ours.timeout_ms == kio.timeout // datetime.timedelta(milliseconds=1)
    assert len(ours.topic_data) == len(kio.topic_data)
    for mine, theirs in zip(ours.topic_data, kio.topic_data, strict=True):
        if version >= TOPIC_IDS_VERSION:
            assert mine.topic_id == theirs.topic_id
        else:
            assert mine.name == theirs.name
        assert [(p.index, p.records) for p in mine.partition_data] == [
            (p.index, p.records) for p in theirs.partition_data
        ]
        for p in mine.partition_data:
            assert p.records is None or type(p.records) is bytes


@settings(max_examples=300, deadline=None)
@given(
    version=_VERSIONS,
    transactional_id=st.one_of(st.none(), st.text(max_size=10)),
    acks=st.sampled_from([-1, 0, 1, 2, -32768, 32767]),
    timeout_ms=st.integers(0, 2**31 - 1),
    topics=_topics,
)
def test_the_same_fields_as_kio(
    version: int, transactional_id: str | None, acks: int, timeout_ms: int, topics: Any
) -> None:
    frame = _frame(version, _request(version, transactional_id, acks, timeout_ms, topics))
    header, pos = parse_header_prefix(frame)
    _same(decode_request(header, frame, pos), _generic(frame), version)


@settings(max_examples=400, deadline=None)
@given(
    version=_VERSIONS,
    topics=_topics,
    cut=st.integers(0, 10_000),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
    tail=st.binary(max_size=3),
)
def test_the_same_verdict_as_the_guard_and_kio(
    version: int, topics: Any, cut: int, flips: list[tuple[int, int]], tail: bytes
) -> None:
    """A truncated or corrupted body: refused by both paths, or decoded the same by both
    (bytes after a complete body are ignored by both)."""
    whole = bytearray(_frame(version, _request(version, None, 1, 1000, topics)))
    header_end = parse_header_prefix(bytes(whole))[1]
    for at, value in flips:
        whole[header_end + at % max(len(whole) - header_end, 1)] = value
    frame = bytes(whole[: max(header_end, len(whole) - cut % (len(whole) - header_end + 1))])
    frame += tail
    header, pos = parse_header_prefix(frame)
    try:
        expected = _generic(frame)
    except RequestDecodeError:
        with pytest.raises(RequestDecodeError):
            decode_request(header, frame, pos)
        return
    _same(decode_request(header, frame, pos), expected, version)


def test_a_huge_announced_count_is_refused_at_once() -> None:
    """A topic count of 2^32 - 2 (compact) or 2^31 - 1 (legacy) in a few bytes: refused
    before any element is read."""
    flexible = b"\0" + struct.pack(">hi", 1, 1000) + b"\xff\xff\xff\xff\x0f"
    with pytest.raises(MalformedProduce, match="array topic_data of length 4294967294"):
        decode(flexible, 0, 9)
    legacy = struct.pack(">hhii", -1, 1, 1000, 2**31 - 1)
    with pytest.raises(MalformedProduce, match="array topic_data of length 2147483647"):
        decode(legacy, 0, 8)


@pytest.mark.parametrize(
    ("version", "body", "why"),
    [
        (8, struct.pack(">hhii", -1, 1, 1000, -1), "null array for non-nullable field topic_data"),
        (
            8,
            struct.pack(">hhiihi", -1, 1, 1000, 1, -1, 0),
            "null value for non-nullable field name",
        ),
        (
            9,
            b"\0" + struct.pack(">hi", 1, 1000) + b"\x02\x00\x01\x00",
            "null value for non-nullable field name",
        ),
        (9, b"\0" + struct.pack(">hi", 1, 1000) + b"\x02\x02\xff\x01\x00", "UTF-8"),
        (9, b"\0" + struct.pack(">hi", 1, 1000) + b"\x80\x80\x80\x80\x80\x01", "5 bytes"),
        (2, b"", "not decoded"),
        (14, b"", "not decoded"),
    ],
)
def test_malformed_bodies(version: int, body: bytes, why: str) -> None:
    with pytest.raises(MalformedProduce, match=why):
        decode(body, 0, version)


def test_a_v13_zero_topic_id_reads_as_none_and_an_id_as_itself() -> None:
    topic_id = uuid.uuid4()
    frame = _frame(13, _request(13, None, -1, 5, [("", topic_id, [(0, b"x")])]))
    header, pos = parse_header_prefix(frame)
    assert decode_request(header, frame, pos).topic_data[0].topic_id == topic_id
    frame = _frame(13, _request(13, None, -1, 5, [("", uuid.UUID(int=0), [])]))
    header, pos = parse_header_prefix(frame)
    assert decode_request(header, frame, pos).topic_data[0].topic_id is None


def test_header_tags_are_skipped_before_the_body() -> None:
    """A request header v2 with one (unknown) tagged field before a v9 body."""
    plain = _frame(9, _request(9, "tx", 1, 7, [("t", None, [(2, b"abc")])]), client_id=None)
    _, pos = parse_header_prefix(plain)
    tagged = plain[:pos] + b"\x01\x05\x02hi" + plain[pos + 1 :]
    request = decode_request(RequestHeader(0, 9, 17, None), tagged, pos)
    assert request.transactional_id == "tx"
    assert [(p.index, p.records) for p in request.topic_data[0].partition_data] == [(2, b"abc")]
