"""The ReplicaFetch codec (stonemq/protocol/replica_fetch.py): round trips of every field,
and bodies whose counts or sizes run past their bytes refused before anything is built."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stonemq.protocol.codec import parse_header_prefix
from stonemq.protocol.replica_fetch import (
    REPLICA_FETCH_KEY,
    FetchPartition,
    MalformedReplicaFetch,
    PartitionData,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)

i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
i16 = st.integers(-(2**15), 2**15 - 1)

fetch_partitions = st.builds(FetchPartition, i32, i32, i64, i32, i64, i32)
requests = st.builds(
    ReplicaFetchRequest, i32, i32, i32, i32, st.lists(fetch_partitions, max_size=8).map(tuple)
)
partition_data = st.builds(
    PartitionData, i32, i16, i32, i64, i64, i32, i64, st.binary(max_size=300)
)
responses = st.builds(ReplicaFetchResponse, i16, st.lists(partition_data, max_size=8).map(tuple))


@pytest.mark.slow  # a property run of several seconds: in the full suite, not the fast set
@settings(max_examples=200, deadline=None)
@given(requests, i32)
def test_request_round_trip(request, correlation_id):
    frame = encode_request(request, correlation_id)
    (size,) = struct.unpack_from(">i", frame, 0)
    assert size == len(frame) - 4
    header, pos = parse_header_prefix(frame[4:])
    assert (header.api_key, header.api_version, header.correlation_id) == (
        REPLICA_FETCH_KEY,
        0,
        correlation_id,
    )
    assert decode_request(frame[4:], pos) == request


@pytest.mark.slow  # a property run of several seconds: in the full suite, not the fast set
@settings(max_examples=200, deadline=None)
@given(responses, i32)
def test_response_round_trip(response, correlation_id):
    frame = b"".join(encode_response(response, correlation_id))
    (size,) = struct.unpack_from(">i", frame, 0)
    assert size == len(frame) - 4
    got_id, got = decode_response(frame[4:])
    assert got_id == correlation_id
    assert got.error_code == response.error_code
    assert [_fields(p) for p in got.partitions] == [_fields(p) for p in response.partitions]


def _fields(p: PartitionData) -> tuple[object, ...]:
    return (
        p.journal_partition,
        p.error_code,
        p.leader_epoch,
        p.high_watermark,
        p.log_start,
        p.diverging_epoch,
        p.diverging_end,
        bytes(p.records),
    )


@pytest.mark.slow  # a property run of several seconds: in the full suite, not the fast set
@settings(max_examples=200, deadline=None)
@given(requests.filter(lambda r: r.partitions), st.data())
def test_truncated_request_is_refused(request, data):
    frame = encode_request(request, 7)[4:]
    _, pos = parse_header_prefix(frame)
    cut = data.draw(st.integers(pos, len(frame) - 1))
    with pytest.raises(MalformedReplicaFetch):
        decode_request(frame[:cut], pos)


@pytest.mark.slow  # a property run of several seconds: in the full suite, not the fast set
@settings(max_examples=200, deadline=None)
@given(responses.filter(lambda r: r.partitions), st.data())
def test_truncated_response_is_refused(response, data):
    frame = b"".join(encode_response(response, 7))[4:]
    cut = data.draw(st.integers(0, len(frame) - 1))
    with pytest.raises(MalformedReplicaFetch):
        decode_response(frame[:cut])


def test_announced_counts_are_checked_against_the_bytes():
    # a count of 2^31 - 1 partitions in a 20-byte body is refused, not reserved
    body = struct.pack(">iiiii", 1, 500, 1, 1 << 20, 2**31 - 1)
    with pytest.raises(MalformedReplicaFetch):
        decode_request(body, 0)
    head = struct.pack(">ihi", 1, 0, 1) + struct.pack(">ihiqqiqi", 0, 0, 1, 0, 0, -1, -1, 1 << 30)
    with pytest.raises(MalformedReplicaFetch):
        decode_response(head)
    negative = struct.pack(">ihi", 1, 0, -1)
    with pytest.raises(MalformedReplicaFetch):
        decode_response(negative)
