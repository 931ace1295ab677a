"""ReplicaFetch: StoneMQ's internal replica-fetch API (sans-IO codec), by which a follower
fetches journal partitions from their leader (../shared/design/cluster.md, section 4).

Key ``REPLICA_FETCH_KEY`` (1000: outside Kafka's keys, never advertised in ApiVersions), version
0, Kafka's request header v1 and response header v0 around big-endian bodies. It names journal
partitions only, never topic partitions (invariant 10)::

    request   replica_id i32, max_wait_ms i32, min_bytes i32, max_bytes i32,
              count i32, count x [journal_partition i32, leader_epoch i32,
                                  fetch_position i64, last_fetched_epoch i32,
                                  split_position i64, partition_max_bytes i32]
    response  error_code i16, count i32,
              count x [journal_partition i32, error_code i16, leader_epoch i32,
                       high_watermark i64, log_start i64,
                       diverging_epoch i32, diverging_end i64,
                       size i32, size bytes of whole journal entries]

``fetch_position`` is the follower's journal end (a journal byte position, the same on every
replica), ``last_fetched_epoch`` the epoch of its last entry (-1: none), ``split_position``
its split progress. ``diverging_epoch`` / ``diverging_end`` (-1 when none) tell a follower whose
history diverged from the leader's where its last epoch ends on the leader: it truncates
there (KIP-595's diverging epoch, the answer OffsetForLeaderEpoch gives, in the same round
trip). Every count and size is checked against the bytes present before anything is built
(:class:`MalformedReplicaFetch`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

REPLICA_FETCH_KEY = 1000
REPLICA_FETCH_VERSION = 0

_REQUEST_HEAD = struct.Struct(">iiiii")
_REQUEST_PART = struct.Struct(">iiqiqi")
_RESPONSE_HEAD = struct.Struct(">hi")
_RESPONSE_PART = struct.Struct(">ihiqqiqi")
_HEADER_V1 = struct.Struct(">hhih")
_I32 = struct.Struct(">i")


class MalformedReplicaFetch(ValueError):
    """A ReplicaFetch body whose counts or sizes run past its bytes."""


@dataclass(frozen=True, slots=True)
class FetchPartition:
    journal_partition: int
    leader_epoch: int
    fetch_position: int
    last_fetched_epoch: int
    split_position: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class ReplicaFetchRequest:
    replica_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    partitions: tuple[FetchPartition, ...]


@dataclass(frozen=True, slots=True)
class PartitionData:
    journal_partition: int
    error_code: int
    leader_epoch: int
    high_watermark: int
    log_start: int
    diverging_epoch: int
    diverging_end: int
    records: bytes | memoryview


@dataclass(frozen=True, slots=True)
class ReplicaFetchResponse:
    error_code: int
    partitions: tuple[PartitionData, ...]


def encode_request(
    request: ReplicaFetchRequest, correlation_id: int, client_id: str = "stonemq-replica"
) -> bytes:
    """The whole request frame (length prefix, header v1, body)."""
    cid = client_id.encode()
    parts = [
        _HEADER_V1.pack(REPLICA_FETCH_KEY, REPLICA_FETCH_VERSION, correlation_id, len(cid)),
        cid,
        _REQUEST_HEAD.pack(
            request.replica_id,
            request.max_wait_ms,
            request.min_bytes,
            request.max_bytes,
            len(request.partitions),
        ),
    ]
    for p in request.partitions:
        parts.append(
            _REQUEST_PART.pack(
                p.journal_partition,
                p.leader_epoch,
                p.fetch_position,
                p.last_fetched_epoch,
                p.split_position,
                p.max_bytes,
            )
        )
    body = b"".join(parts)
    return _I32.pack(len(body)) + body


def decode_request(frame: bytes | memoryview, pos: int) -> ReplicaFetchRequest:
    """The body of a request frame from ``pos`` (after the request header)."""
    n = len(frame)
    if n - pos < _REQUEST_HEAD.size:
        raise MalformedReplicaFetch("request shorter than its fixed fields")
    replica_id, max_wait_ms, min_bytes, max_bytes, count = _REQUEST_HEAD.unpack_from(frame, pos)
    pos += _REQUEST_HEAD.size
    if count < 0 or count * _REQUEST_PART.size > n - pos:
        raise MalformedReplicaFetch(f"{count} partitions do not fit in {n - pos} bytes")
    partitions = []
    for _ in range(count):
        partitions.append(FetchPartition(*_REQUEST_PART.unpack_from(frame, pos)))
        pos += _REQUEST_PART.size
    return ReplicaFetchRequest(replica_id, max_wait_ms, min_bytes, max_bytes, tuple(partitions))


def encode_response(
    response: ReplicaFetchResponse, correlation_id: int
) -> list[bytes | memoryview]:
    """The whole response frame as buffers to write in order (records by reference)."""
    chunks: list[bytes | memoryview] = [b"", _I32.pack(correlation_id)]
    chunks.append(_RESPONSE_HEAD.pack(response.error_code, len(response.partitions)))
    for p in response.partitions:
        chunks.append(
            _RESPONSE_PART.pack(
                p.journal_partition,
                p.error_code,
                p.leader_epoch,
                p.high_watermark,
                p.log_start,
                p.diverging_epoch,
                p.diverging_end,
                len(p.records),
            )
        )
        if len(p.records):
            chunks.append(p.records)
    size = sum(len(c) for c in chunks)
    chunks[0] = _I32.pack(size)
    return chunks


def decode_response(frame: bytes | memoryview) -> tuple[int, ReplicaFetchResponse]:
    """(correlation id, response) of a response frame without its length prefix; records
    are views of ``frame``."""
    view = memoryview(frame)
    n = len(view)
    if n < 4 + _RESPONSE_HEAD.size:
        raise MalformedReplicaFetch("response shorter than its fixed fields")
    (correlation_id,) = _I32.unpack_from(view, 0)
    error, count = _RESPONSE_HEAD.unpack_from(view, 4)
    pos = 4 + _RESPONSE_HEAD.size
    if count < 0 or count * _RESPONSE_PART.size > n - pos:
        raise MalformedReplicaFetch(f"{count} partitions do not fit in {n - pos} bytes")
    partitions = []
    for _ in range(count):
        if n - pos < _RESPONSE_PART.size:
            raise MalformedReplicaFetch("partition runs past the response")
        j, err, epoch, hw, start, div_epoch, div_end, size = _RESPONSE_PART.unpack_from(view, pos)
        pos += _RESPONSE_PART.size
        if size < 0 or size > n - pos:
            raise MalformedReplicaFetch(f"records of {size} bytes past the response")
        partitions.append(
            PartitionData(j, err, epoch, hw, start, div_epoch, div_end, view[pos : pos + size])
        )
        pos += size
    return correlation_id, ReplicaFetchResponse(error, tuple(partitions))
