"""Request header parsing (v1 and v2) and response encoding against kio's own schemas."""

import datetime
import io
import struct

import pytest
from kio.schema.api_versions.v0 import response as av0
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v1.request import MetadataRequest as MetadataV1
from kio.schema.metadata.v12.request import MetadataRequest as MetadataV12
from kio.schema.request_header.v1.header import RequestHeader as Header1
from kio.schema.request_header.v2.header import RequestHeader as Header2
from kio.serial import entity_reader, entity_writer

from stonemq.protocol import codec
from stonemq.protocol.codec import (
    BY_REFERENCE_BYTES,
    RequestDecodeError,
    decode_request,
    encode_response,
    encode_response_chunks,
    parse_header_prefix,
)


def _encode(header_cls, header, body_cls, body) -> bytes:
    out = io.BytesIO()
    entity_writer(header_cls)(out, header)
    entity_writer(body_cls)(out, body)
    return out.getvalue()


def test_flexible_request_with_header_v2() -> None:
    frame = _encode(
        Header2,
        Header2(request_api_key=3, request_api_version=12, correlation_id=9, client_id="c"),
        MetadataV12,
        MetadataV12(
            topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
        ),
    )
    header, pos = parse_header_prefix(frame)
    assert (header.api_key, header.api_version, header.correlation_id) == (3, 12, 9)
    assert header.client_id == "c"
    body = decode_request(header, frame, pos)
    assert body.allow_auto_topic_creation is False


def test_legacy_request_with_null_client_id() -> None:
    frame = _encode(
        Header1,
        Header1(request_api_key=3, request_api_version=1, correlation_id=1, client_id=None),
        MetadataV1,
        MetadataV1(topics=None),
    )
    header, pos = parse_header_prefix(frame)
    assert header.client_id is None
    assert decode_request(header, frame, pos).topics is None


def test_trailing_bytes_after_a_complete_body_are_ignored_like_kafka() -> None:
    # librdkafka 2.16 sends Metadata v12 with 3 extra bytes; Kafka's parser ignores them.
    frame = _encode(
        Header1,
        Header1(request_api_key=3, request_api_version=1, correlation_id=1, client_id="x"),
        MetadataV1,
        MetadataV1(topics=None),
    )
    header, pos = parse_header_prefix(frame + b"\x01\x00\x00")
    assert decode_request(header, frame + b"\x01\x00\x00", pos).topics is None


def test_truncated_body_is_rejected() -> None:
    frame = _encode(
        Header2,
        Header2(request_api_key=3, request_api_version=12, correlation_id=9, client_id="c"),
        MetadataV12,
        MetadataV12(
            topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False
        ),
    )
    header, pos = parse_header_prefix(frame[:-2])
    with pytest.raises(RequestDecodeError):
        decode_request(header, frame[:-2], pos)


@pytest.mark.parametrize("frame", [b"", b"\x00\x03", b"\x00\x03\x00\x01\x00\x00\x00\x01\x00\x09ab"])
def test_short_or_lying_headers_are_rejected(frame: bytes) -> None:
    with pytest.raises(RequestDecodeError):
        parse_header_prefix(frame)


def test_api_versions_response_uses_header_v0_even_when_flexible() -> None:
    header, _ = parse_header_prefix(struct.pack(">hhih", 18, 3, 77, -1))
    data = encode_response(
        header,
        av0.ApiVersionsResponse(error_code=ErrorCode.unsupported_version, api_keys=()),
        api_version=0,
    )
    (length, correlation_id) = struct.unpack_from(">ii", data)
    assert length == len(data) - 4 and correlation_id == 77
    body, _ = entity_reader(av0.ApiVersionsResponse)(data, 8)
    assert body.error_code == 35


@pytest.mark.parametrize("sizes", [(0,), (100, BY_REFERENCE_BYTES), (70_000, 10, 1_048_576)])
def test_fetch_records_go_out_by_reference_and_the_bytes_are_kafkas(sizes: tuple[int, ...]) -> None:
    """A fetch response's record batches are written to the transport as the buffers that
    were read (no copy into one response buffer); the bytes are kio's encoding all the same."""
    from kio.schema.fetch.v12 import response as f12

    header, _ = parse_header_prefix(struct.pack(">hhih", 1, 12, 5, -1))
    records = [memoryview(bytes([i % 251]) * n) for i, n in enumerate(sizes)]
    partitions = tuple(
        f12.PartitionData(
            partition_index=i,
            error_code=ErrorCode.none,
            high_watermark=10,
            last_stable_offset=10,
            log_start_offset=0,
            aborted_transactions=(),
            preferred_read_replica=-1,
            records=r,
        )
        for i, r in enumerate(records)
    )
    response = f12.FetchResponse(
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.none,
        session_id=0,
        responses=(f12.FetchableTopicResponse(topic="t", partitions=partitions),),
    )
    chunks = encode_response_chunks(header, response)
    big = [r for r in records if len(r) >= BY_REFERENCE_BYTES]
    assert [c for c in chunks if isinstance(c, memoryview)] == big
    assert all(any(c is r for c in chunks) for r in big)  # the same objects: not copied
    data = b"".join(chunks)
    assert data == encode_response(header, response)
    expected = io.BytesIO()
    expected.write(struct.pack(">ii", len(data) - 4, 5) + b"\0")
    entity_writer(f12.FetchResponse)(expected, response)
    assert data == expected.getvalue()
    body, _ = entity_reader(f12.FetchResponse)(data, 9)
    got = [bytes(p.records) for p in body.responses[0].partitions]
    assert got == [bytes(r) for r in records]


# -- the requesting side (a broker forwarding a request: stonemq/cluster/forwarding.py) ------


def _elect_request(version: int):  # type: ignore[no-untyped-def]
    from kio.index import load_request_schema
    from kio.static.primitive import i32Timedelta

    module = __import__(load_request_schema(43, version).__module__, fromlist=["x"])
    return module.ElectLeadersRequest(
        election_type=0,
        topic_partitions=(module.TopicPartitions(topic="t", partitions=(0, 2)),),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
    )


@pytest.mark.parametrize("version", [1, 2])  # v2 is flexible (request header v2)
def test_an_encoded_request_is_what_the_broker_decodes(version: int) -> None:
    from stonemq.protocol.codec import encode_request, parse_header_prefix

    request = _elect_request(version)
    header = codec.RequestHeader(43, version, 7, "stonemq-forwarded-by-2")
    frame = encode_request(header, request)
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4
    got_header, pos = parse_header_prefix(frame[4:])
    assert got_header == header
    assert codec.decode_request(got_header, frame[4:], pos) == request


@pytest.mark.parametrize("version", [1, 2])
def test_a_response_decodes_and_one_that_lies_is_refused(version: int) -> None:
    from kio.index import load_response_schema

    from stonemq.protocol.codec import MalformedResponse, decode_response

    module = __import__(load_response_schema(43, version).__module__, fromlist=["x"])
    response = module.ElectLeadersResponse(
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.none,
        replica_election_results=(
            module.ReplicaElectionResult(
                topic="t",
                partition_result=(
                    module.PartitionResult(
                        partition_id=0, error_code=ErrorCode.none, error_message=None
                    ),
                ),
            ),
        ),
    )
    frame = codec.encode_response(codec.RequestHeader(43, version, 9, None), response)[4:]
    assert decode_response(43, version, frame) == (9, response)
    with pytest.raises(MalformedResponse):
        decode_response(43, version, frame[:-3])  # cut short
    # the results array announces 2^31 - 1 entries: refused before kio reserves them
    at = 4 + (1 if version >= 2 else 0) + 4 + 2  # correlation id, tags, throttle, error
    lying = bytearray(frame)
    if version >= 2:
        lying[at] = 0xFF  # a compact length of many more entries than bytes left
    else:
        struct.pack_into(">i", lying, at, 2**31 - 1)
    with pytest.raises(MalformedResponse):
        decode_response(43, version, bytes(lying))
