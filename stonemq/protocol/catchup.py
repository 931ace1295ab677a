"""CatchUpPoint (internal key 1001): the sans-IO codec of the request by which a follower
behind its leader's journal start asks for the point it can copy the leader's state at
(../shared/design/cluster.md; the leader's side: handlers/catchup.py, the follower's:
replication/catchup.py).

Key ``CATCH_UP_KEY`` (1001: outside Kafka's keys, never advertised in ApiVersions), version 0,
Kafka's request header v1 and response header v0 around big-endian bodies::

    request   replica_id i32, journal_partition i32, leader_epoch i32
    response  error_code i16, leader_epoch i32, point i64, journal_start i64,
              epoch_count i32, epoch_count x [epoch i32, start i64],
              count i32, count x [topic_len i16, topic utf-8, partition i32,
                                  log_start_offset i64, end_offset i64]

``point`` (P) is a journal position of the leader's journal partition at or above its journal
start and at or below its split position: every journal entry below P is split into the
leader's queue logs, and each listed topic partition (every one routed to that journal
partition) ends at ``end_offset`` at P. The epochs are the leader's leader-epoch history
entries that start at or below P. Nothing here is a Kafka API: no Kafka API names the journal
(Fetch, ListOffsets and OffsetForLeaderEpoch name topic partitions, and the copy itself uses
Kafka's Fetch: stonemq.protocol.fetch_client). Every count and size is checked against the
bytes present before anything is built (:class:`MalformedCatchUp`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

CATCH_UP_KEY = 1001
CATCH_UP_VERSION = 0

_HEADER_V1 = struct.Struct(">hhih")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_REQUEST = struct.Struct(">iii")
_RESPONSE_HEAD = struct.Struct(">hiqqi")
_EPOCH = struct.Struct(">iq")
_PARTITION_TAIL = struct.Struct(">iqq")


class MalformedCatchUp(ValueError):
    """A CatchUpPoint body whose counts or sizes run past its bytes."""


@dataclass(frozen=True, slots=True)
class CatchUpRequest:
    replica_id: int
    journal_partition: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class CatchUpPartition:
    topic: str
    partition: int
    log_start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class CatchUpResponse:
    error_code: int
    leader_epoch: int
    point: int
    journal_start: int
    epochs: tuple[tuple[int, int], ...]
    partitions: tuple[CatchUpPartition, ...]


def encode_request(
    request: CatchUpRequest, correlation_id: int, client_id: str = "stonemq-catch-up"
) -> bytes:
    """The whole request frame (length prefix, header v1, body)."""
    cid = client_id.encode()
    body = (
        _HEADER_V1.pack(CATCH_UP_KEY, CATCH_UP_VERSION, correlation_id, len(cid))
        + cid
        + _REQUEST.pack(request.replica_id, request.journal_partition, request.leader_epoch)
    )
    return _I32.pack(len(body)) + body


def decode_request(frame: bytes | memoryview, pos: int) -> CatchUpRequest:
    """The body of a request frame from ``pos`` (after the request header)."""
    if len(frame) - pos < _REQUEST.size:
        raise MalformedCatchUp("request shorter than its fixed fields")
    return CatchUpRequest(*_REQUEST.unpack_from(frame, pos))


def encode_response(response: CatchUpResponse, correlation_id: int) -> list[bytes]:
    """The whole response frame as buffers to write in order."""
    chunks = [
        b"",
        _I32.pack(correlation_id),
        _RESPONSE_HEAD.pack(
            response.error_code,
            response.leader_epoch,
            response.point,
            response.journal_start,
            len(response.epochs),
        ),
    ]
    chunks.extend(_EPOCH.pack(epoch, start) for epoch, start in response.epochs)
    chunks.append(_I32.pack(len(response.partitions)))
    for p in response.partitions:
        name = p.topic.encode()
        chunks.append(_I16.pack(len(name)) + name)
        chunks.append(_PARTITION_TAIL.pack(p.partition, p.log_start_offset, p.end_offset))
    chunks[0] = _I32.pack(sum(len(c) for c in chunks))
    return chunks


def decode_response(frame: bytes | memoryview) -> tuple[int, CatchUpResponse]:
    """(correlation id, response) of a response frame without its length prefix."""
    view = memoryview(frame)
    n = len(view)
    if n < 4 + _RESPONSE_HEAD.size + 4:
        raise MalformedCatchUp("response shorter than its fixed fields")
    (correlation_id,) = _I32.unpack_from(view, 0)
    error, epoch, point, start, epoch_count = _RESPONSE_HEAD.unpack_from(view, 4)
    pos = 4 + _RESPONSE_HEAD.size
    if epoch_count < 0 or epoch_count * _EPOCH.size > n - pos - 4:
        raise MalformedCatchUp(f"{epoch_count} epochs do not fit in {n - pos} bytes")
    epochs = []
    for _ in range(epoch_count):
        epochs.append(_EPOCH.unpack_from(view, pos))
        pos += _EPOCH.size
    (count,) = _I32.unpack_from(view, pos)
    pos += 4
    smallest = _I16.size + _PARTITION_TAIL.size
    if count < 0 or count * smallest > n - pos:
        raise MalformedCatchUp(f"{count} partitions do not fit in {n - pos} bytes")
    partitions = []
    for _ in range(count):
        if n - pos < smallest:
            raise MalformedCatchUp("partition runs past the response")
        (size,) = _I16.unpack_from(view, pos)
        pos += _I16.size
        if size < 0 or size + _PARTITION_TAIL.size > n - pos:
            raise MalformedCatchUp(f"topic name of {size} bytes past the response")
        try:
            topic = bytes(view[pos : pos + size]).decode()
        except UnicodeDecodeError as exc:
            raise MalformedCatchUp(f"topic name not utf-8: {exc}") from exc
        pos += size
        partition, log_start, end = _PARTITION_TAIL.unpack_from(view, pos)
        pos += _PARTITION_TAIL.size
        partitions.append(CatchUpPartition(topic, partition, log_start, end))
    if pos != n:
        raise MalformedCatchUp(f"{n - pos} bytes after the last partition")
    return correlation_id, CatchUpResponse(
        error, epoch, point, start, tuple((e, s) for e, s in epochs), tuple(partitions)
    )
