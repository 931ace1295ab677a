"""The Produce request decoder: kio's reader behind the guard is the reference, for every
version, for valid requests and for mutated ones; record batches are views of the frame."""

from __future__ import annotations

import datetime
import io
from typing import Any

import pytest
from fuzz.values import produce_plain
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.serial import entity_reader, entity_writer

from stonemq.protocol import guard, produce_request
from stonemq.protocol.codec import RequestDecodeError, RequestHeader, decode_request
from stonemq.protocol.framing import FrameDecoder

VERSIONS = range(3, 14)


def _module(version: int) -> Any:
    return __import__(load_request_schema(0, version).__module__, fromlist=["x"])


def _encode(version: int, request: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(load_request_schema(0, version))(buf, request)
    return buf.getvalue()


def _reference(version: int, body: bytes) -> Any:
    """What the broker decoded before: the guard's walk, then kio's reader."""
    cls = load_request_schema(0, version)
    guard.check(guard.compile_walker(cls), body, 0)
    try:
        request, _ = entity_reader(cls)(body, 0)
    except KeyError as exc:  # the guard walked the whole body: it is well formed
        if "Unknown tagged field" in str(exc):
            raise _UnknownTag from exc
        raise guard.MalformedRequest(str(exc)) from exc
    except Exception as exc:  # kio raises several types for malformed input
        raise guard.MalformedRequest(str(exc)) from exc
    return request


class _UnknownTag(Exception):
    """kio refuses a tagged field it does not know; Kafka skips it (KIP-482), and so do we."""


@st.composite
def _requests(draw: st.DrawFn) -> tuple[int, Any]:
    version = draw(st.sampled_from(VERSIONS))
    mod = _module(version)
    topics = []
    for _ in range(draw(st.integers(0, 3))):
        partitions = tuple(
            mod.PartitionProduceData(
                index=draw(st.integers(-(2**31), 2**31 - 1)),
                records=draw(st.none() | st.binary(max_size=300)),
            )
            for _ in range(draw(st.integers(0, 3)))
        )
        if version >= 13:
            topic_id = draw(st.none() | st.uuids())
            topics.append(mod.TopicProduceData(topic_id=topic_id, partition_data=partitions))
        else:
            name = draw(st.text(max_size=30))
            topics.append(mod.TopicProduceData(name=name, partition_data=partitions))
    request = load_request_schema(0, version)(
        transactional_id=draw(st.none() | st.text(max_size=20)),
        acks=draw(st.sampled_from([-1, 0, 1, 2, -32768])),
        timeout=datetime.timedelta(milliseconds=draw(st.integers(0, 2**31 - 1))),
        topic_data=tuple(topics),
    )
    return version, request


@settings(max_examples=300)
@given(_requests())
def test_a_valid_request_decodes_as_kio_decodes_it(case: tuple[int, Any]) -> None:
    version, request = case
    body = _encode(version, request)
    ours = produce_request.decode(body, 0, version)
    assert produce_plain(version, ours) == produce_plain(version, _reference(version, body))
    for topic in ours.topic_data:
        for partition in topic.partition_data:
            if partition.records:  # a view of the frame, not a copy (b"" when empty)
                assert isinstance(partition.records, memoryview)
                assert partition.records.readonly and partition.records.obj is body


@st.composite
def _mutated(draw: st.DrawFn) -> tuple[int, bytes]:
    version, request = draw(_requests())
    body = bytearray(_encode(version, request))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "byte", "cut", "insert", "length"]))
        at = draw(st.integers(0, max(len(body) - 1, 0)))
        if kind == "flip" and body:
            body[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte" and body:
            body[at] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]))
        elif kind == "cut":
            del body[at:]
        elif kind == "insert":
            body[at:at] = draw(st.binary(min_size=1, max_size=6))
        elif kind == "length" and len(body) >= at + 4:
            body[at : at + 4] = draw(st.sampled_from([-1, -2, 2**31 - 1, 0x7F, 0])).to_bytes(
                4, "big", signed=True
            )
    return version, bytes(body)


@settings(max_examples=600)
@given(_mutated())
def test_a_mutated_request_is_refused_or_decoded_as_kio_decodes_it(
    case: tuple[int, bytes],
) -> None:
    version, body = case
    unknown_tag = False
    try:
        expected = produce_plain(version, _reference(version, body))
    except (guard.MalformedRequest, UnicodeDecodeError):
        expected = None
    except _UnknownTag:
        expected, unknown_tag = None, True
    try:
        ours = produce_plain(version, produce_request.decode(body, 0, version))
    except guard.MalformedRequest:
        ours = None
    if unknown_tag:  # Kafka skips a tag it does not know (KIP-482); kio refuses it
        assert ours is not None
    else:
        assert ours == expected


@pytest.mark.parametrize("version", [7, 9, 13])
def test_null_arrays_and_overlong_counts_are_refused(version: int) -> None:
    empty = load_request_schema(0, version)(
        transactional_id=None, acks=1, timeout=datetime.timedelta(0), topic_data=()
    )
    body = bytearray(_encode(version, empty))
    if version >= 9:  # the topic array's compact count: 0 is null, 0xffffffff0f is 2^32 - 2
        for count in (b"\x00", b"\xff\xff\xff\xff\x0f"):
            bad = body[:7] + count + body[8:]
            with pytest.raises(guard.MalformedRequest):
                produce_request.decode(bytes(bad), 0, version)
    else:
        for count in (-1, 2**31 - 1):
            bad = body[:8] + count.to_bytes(4, "big", signed=True) + body[12:]
            with pytest.raises(guard.MalformedRequest):
                produce_request.decode(bytes(bad), 0, version)


def test_the_broker_path_decodes_produce_with_the_views_decoder() -> None:
    """decode_request answers Produce with this module's tuple, records read-only views of the
    frame the framing layer handed out without a copy."""
    version = 9
    mod = _module(version)
    batch = bytes(range(256)) * 400  # 100 KiB: larger than the first receive buffer
    request = load_request_schema(0, version)(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(
            mod.TopicProduceData(
                name="t", partition_data=(mod.PartitionProduceData(index=2, records=batch),)
            ),
        ),
    )
    client = b"rdkafka"
    head = (0).to_bytes(2, "big") + version.to_bytes(2, "big") + (5).to_bytes(4, "big")
    head += len(client).to_bytes(2, "big") + client + b"\x00"
    wire = head + _encode(version, request)
    decoder = FrameDecoder(max_frame_bytes=1 << 20)
    decoder.feed(len(wire).to_bytes(4, "big") + wire)
    frame = decoder.next_frame()
    assert isinstance(frame, memoryview) and frame.readonly and frame == wire
    pos = len(head) - 1  # the header's tags are skipped by decode_request
    decoded = decode_request(RequestHeader(0, version, 5, "rdkafka"), frame, pos)
    assert isinstance(decoded, produce_request.ProduceRequest)
    records = decoded.topic_data[0].partition_data[0].records
    assert records is not None and records == batch and records.obj is frame.obj
    assert decoded.timeout_ms == 30_000 and decoded.acks == -1
    with pytest.raises(RequestDecodeError):
        decode_request(RequestHeader(0, version, 5, "rdkafka"), frame[: pos + 12], pos)
