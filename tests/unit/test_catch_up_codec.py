"""The CatchUpPoint codec (stonemq/protocol/catchup.py) and the catch-up's Fetch v11 frames
(stonemq/protocol/fetch_client.py): round trips of every field, Kafka's own Fetch schema
reading what the follower sends and writing what it reads, and bodies whose counts or sizes
run past their bytes refused (MalformedCatchUp, MalformedFetch) before anything is built."""

from __future__ import annotations

import contextlib
import datetime
import io
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v11 import request as fetch_req
from kio.schema.fetch.v11 import response as fetch_resp
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32 as ki32
from kio.static.primitive import i32Timedelta
from kio.static.primitive import i64 as ki64

from stonemq.protocol.catchup import (
    CATCH_UP_KEY,
    CatchUpPartition,
    CatchUpRequest,
    CatchUpResponse,
    MalformedCatchUp,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from stonemq.protocol.codec import parse_header_prefix
from stonemq.protocol.fetch_client import (
    FETCH_KEY,
    FETCH_VERSION,
    FetchWant,
    MalformedFetch,
    decode_fetch,
    encode_fetch,
)

i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
i16 = st.integers(-(2**15), 2**15 - 1)
topics = st.text(min_size=1, max_size=40)

requests = st.builds(CatchUpRequest, i32, i32, i32)
partitions = st.builds(CatchUpPartition, topics, i32, i64, i64)
responses = st.builds(
    CatchUpResponse,
    i16,
    i32,
    i64,
    i64,
    st.lists(st.tuples(i32, i64), max_size=6).map(tuple),
    st.lists(partitions, max_size=8).map(tuple),
)


@settings(max_examples=60, deadline=None)
@given(requests, i32)
def test_request_round_trip(request: CatchUpRequest, correlation_id: int) -> None:
    frame = encode_request(request, correlation_id)
    (size,) = struct.unpack_from(">i", frame, 0)
    assert size == len(frame) - 4
    header, pos = parse_header_prefix(frame[4:])
    assert (header.api_key, header.api_version, header.correlation_id) == (
        CATCH_UP_KEY,
        0,
        correlation_id,
    )
    assert decode_request(frame[4:], pos) == request
    with pytest.raises(MalformedCatchUp):
        decode_request(frame[4:-1], pos)


@settings(max_examples=60, deadline=None)
@given(responses, i32)
def test_response_round_trip_and_every_cut_refused(
    response: CatchUpResponse, correlation_id: int
) -> None:
    frame = b"".join(encode_response(response, correlation_id))
    (size,) = struct.unpack_from(">i", frame, 0)
    assert size == len(frame) - 4
    assert decode_response(frame[4:]) == (correlation_id, response)
    body = frame[4:]
    for cut in range(len(body)):  # every prefix: refused, never another exception
        with pytest.raises(MalformedCatchUp):
            decode_response(body[:cut])
    with pytest.raises(MalformedCatchUp):
        decode_response(body + b"\0")


@given(st.binary(max_size=200))
def test_garbage_responses_are_refused_or_decoded(data: bytes) -> None:
    with contextlib.suppress(MalformedCatchUp):
        decode_response(data)


def test_counts_past_the_bytes_are_refused_before_anything_is_built() -> None:
    head = struct.pack(">ihiqqi", 7, 0, 1, 10, 0, 2**31 - 1)  # 2**31 - 1 epochs
    with pytest.raises(MalformedCatchUp, match="epochs"):
        decode_response(head + struct.pack(">i", 0))
    head = struct.pack(">ihiqqi", 7, 0, 1, 10, 0, 0) + struct.pack(">i", 10**6)
    with pytest.raises(MalformedCatchUp, match="partitions"):
        decode_response(head)


def test_the_copy_fetch_is_kafkas_fetch_v11_with_the_replica_id() -> None:
    wanted = [FetchWant("a", 0, 5, 1000), FetchWant("b", 3, 0, 2000), FetchWant("a", 1, 9, 1000)]
    frame = encode_fetch(2, 7, wanted, 1 << 20, 42, "stonemq-catch-up")
    (size,) = struct.unpack_from(">i", frame, 0)
    assert size == len(frame) - 4
    header, pos = parse_header_prefix(frame[4:])
    assert (header.api_key, header.api_version, header.correlation_id) == (
        FETCH_KEY,
        FETCH_VERSION,
        42,
    )
    request, used = entity_reader(fetch_req.FetchRequest)(frame[4:], pos)
    assert pos + used == len(frame) - 4
    assert request.replica_id == 2 and request.max_bytes == 1 << 20
    got = [
        (t.topic, p.partition, p.fetch_offset, p.partition_max_bytes, p.current_leader_epoch)
        for t in request.topics
        for p in t.partitions
    ]
    assert sorted(got) == sorted(
        (w.topic, w.partition, w.fetch_offset, w.max_bytes, 7) for w in wanted
    )


def _fetch_response(parts: list[tuple[str, int, int, bytes | None]]) -> bytes:
    response = fetch_resp.FetchResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        error_code=ErrorCode.none,
        session_id=ki32(0),
        responses=tuple(
            fetch_resp.FetchableTopicResponse(
                topic=topic,  # type: ignore[arg-type]
                partitions=(
                    fetch_resp.PartitionData(
                        partition_index=ki32(partition),
                        error_code=ErrorCode(error),
                        high_watermark=ki64(100),
                        last_stable_offset=ki64(100),
                        log_start_offset=ki64(3),
                        aborted_transactions=None,
                        preferred_read_replica=ki32(-1),  # type: ignore[arg-type]
                        records=records,
                    ),
                ),
            )
            for topic, partition, error, records in parts
        ),
    )
    buf = io.BytesIO()
    entity_writer(fetch_resp.FetchResponse)(buf, response)
    return struct.pack(">i", 42) + buf.getvalue()


def test_a_fetch_answer_decodes_and_a_cut_one_is_refused() -> None:
    body = _fetch_response([("a", 0, 0, b"xyz"), ("b", 3, 1, None)])
    cid, error, parts = decode_fetch(body)
    assert (cid, error) == (42, 0)
    assert [
        (p.topic, p.partition, p.error_code, p.high_watermark, p.log_start_offset) for p in parts
    ] == [
        ("a", 0, 0, 100, 3),
        ("b", 3, 1, 100, 3),
    ]
    assert parts[0].records == b"xyz" and parts[1].records == b""
    for cut in range(len(body)):
        with pytest.raises(MalformedFetch):
            decode_fetch(body[:cut])
    with pytest.raises(MalformedFetch):
        decode_fetch(body + b"\0")
