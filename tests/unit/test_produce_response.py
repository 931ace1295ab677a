"""The Produce response encoder (stonemq/protocol/produce_response.py) against kio's own
encoding of the same response, byte for byte, over every version the broker answers."""

from __future__ import annotations

import datetime
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from stonemq.handlers.context import RequestContext, build, response_module
from stonemq.handlers.produce import _encoded_body, _PartitionResult, _response_entity
from stonemq.protocol.codec import RequestHeader, encode_response_chunks
from stonemq.protocol.produce_response import (
    FIRST_VERSION,
    LAST_VERSION,
    EncodedProduce,
    PartitionAnswer,
    TopicAnswer,
    encode_body,
)

_ERRORS = [e for e in ErrorCode if e.value >= -1]
_I32 = st.integers(-(2**31), 2**31 - 1)
_I64 = st.integers(-(2**63), 2**63 - 1)
_MS = st.one_of(st.just(-1), st.integers(0, 2**45))  # -1: CreateTime

_partitions = st.lists(
    st.tuples(
        _I32,
        st.sampled_from(_ERRORS).map(lambda e: e.value),
        _I64,
        _MS,
        _I64,
        st.one_of(st.none(), st.text(max_size=40)),
    ),
    max_size=5,
)
_topics = st.lists(
    st.tuples(st.text(max_size=30), st.one_of(st.none(), st.uuids()), _partitions),
    max_size=4,
)


def _kio_response(version: int, topics: list[TopicAnswer], throttle_ms: int) -> object:
    """The same response built as the handler builds it for kio."""
    module = response_module(0, version)

    def partition(p: PartitionAnswer) -> object:
        index, error, base, append_ms, log_start, message = p
        return build(
            module.PartitionProduceResponse,
            index=index,
            error_code=ErrorCode(error),
            base_offset=base,
            log_append_time=(
                None
                if append_ms < 0
                else datetime.datetime.fromtimestamp(append_ms / 1000, tz=datetime.UTC)
            ),
            log_start_offset=log_start,
            record_errors=(),
            error_message=message,
        )

    return build(
        module.ProduceResponse,
        responses=tuple(
            build(
                module.TopicProduceResponse,
                name=name,
                topic_id=topic_id,
                partition_responses=tuple(partition(p) for p in parts),
            )
            for name, topic_id, parts in topics
        ),
        throttle_time=throttle_ms,
    )


@settings(max_examples=300, deadline=None)
@given(
    version=st.integers(FIRST_VERSION, LAST_VERSION),
    topics=_topics,
    throttle_ms=st.integers(0, 2**31 - 1),
    correlation_id=_I32,
)
def test_the_same_bytes_as_kio(
    version: int, topics: list[TopicAnswer], throttle_ms: int, correlation_id: int
) -> None:
    if version < 8:  # error_message is a v8 field: older versions never carry it
        topics = [(n, i, [(*p[:5], None) for p in ps]) for n, i, ps in topics]
    if version < 13:  # named by topic id from v13 only
        topics = [(n, None, ps) for n, _, ps in topics]
    header = RequestHeader(0, version, correlation_id, "c")
    response = _kio_response(version, topics, throttle_ms)
    expected = b"".join(encode_response_chunks(header, response))
    ours = EncodedProduce(encode_body(version, topics, throttle_ms), lambda: response)
    assert b"".join(ours.chunks(header)) == expected


def test_a_one_partition_answer_at_v9() -> None:
    """The shape librdkafka gets at thousands of partitions, spelled out: size, correlation
    id, header tags, one topic, one partition, throttle time, tags."""
    body = encode_body(9, [("t", None, [(3, 0, 42, -1, 0, None)])])
    assert body == (
        b"\x02"  # one topic (compact array: n + 1)
        + b"\x02t"  # compact string "t"
        + b"\x02"  # one partition
        + (3).to_bytes(4, "big")
        + (0).to_bytes(2, "big")
        + (42).to_bytes(8, "big")
        + (-1).to_bytes(8, "big", signed=True)
        + (0).to_bytes(8, "big")
        + b"\x01"  # no record errors
        + b"\x00"  # null error message
        + b"\x00"  # partition tags
        + b"\x00"  # topic tags
        + (0).to_bytes(4, "big")  # throttle time
        + b"\x00"  # response tags
    )
    header = RequestHeader(0, 9, 7, None)
    framed = b"".join(EncodedProduce(body, lambda: None).chunks(header))
    assert framed[:4] == (len(framed) - 4).to_bytes(4, "big")
    assert framed[4:9] == (7).to_bytes(4, "big") + b"\0"


@pytest.mark.parametrize("version", [2, 14])
def test_versions_outside_the_range_are_refused(version: int) -> None:
    with pytest.raises(ValueError):
        encode_body(version, [])


def test_a_topic_id_at_v13() -> None:
    topic_id = uuid.uuid4()
    body = encode_body(13, [("ignored", topic_id, [])])
    assert body[1:17] == topic_id.bytes


_results = st.lists(
    st.tuples(
        _I32,
        st.sampled_from([e for e in _ERRORS if e != ErrorCode.not_leader_or_follower]),
        st.integers(0, 2**62),
        _MS,
        st.integers(0, 2**62),
        st.one_of(st.none(), st.text(max_size=20)),
    ),
    max_size=4,
)


@settings(max_examples=200, deadline=None)
@given(
    version=st.integers(FIRST_VERSION, LAST_VERSION),
    topics=st.lists(st.tuples(st.text(max_size=20), _results), max_size=3),
    correlation_id=_I32,
)
def test_the_handler_bytes_and_its_lazy_entity_agree(
    version: int,
    topics: list[tuple[str, list[tuple[int, ErrorCode, int, int, int, str | None]]]],
    correlation_id: int,
) -> None:
    """What the Produce handler answers (EncodedProduce: its own bytes) and the kio entity it
    builds only when the connection must change the answer (``entity()``), encoded by kio:
    the same bytes, so a throttled answer differs from an unthrottled one only by its
    throttle time."""
    ctx = RequestContext(
        api_key=0,
        api_version=version,
        correlation_id=correlation_id,
        client_id="c",
        client_host="h",
        broker=None,  # type: ignore[arg-type]  # no lookups: all results set
    )
    grouped = []
    for name, rows in topics:
        results = []
        for index, error, base, append_ms, log_start, message in rows:
            r = _PartitionResult(index)
            r.error, r.message = error, message
            r.base_offset, r.append_time, r.log_start = base, append_ms, log_start
            results.append(r)
        grouped.append((name, results))
    ids: list[uuid.UUID | None] = [uuid.uuid4() if version >= 13 else None for _ in grouped]
    if version < 8:  # no error_message field before v8: kio never sends one
        for _, results in grouped:
            for r in results:
                r.message = None
    answer = EncodedProduce(
        _encoded_body(ctx, grouped, ids), lambda: _response_entity(ctx, grouped, ids)
    )
    header = RequestHeader(0, version, correlation_id, "c")
    assert b"".join(answer.chunks(header)) == b"".join(
        encode_response_chunks(header, answer.entity())
    )
