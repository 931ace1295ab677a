"""Kafka's Fetch from the fetching side (sans-IO): the request a follower's catch-up copy and
the Spark source's range reads send, and the answer they read.

Fetch v11 (names topics; request header v1, response header v0), encoded and decoded with
kio's Fetch schemas. A follower's copy sends its broker id as the replica id, a consumer's
read -1. An answer that does not decode whole is refused (:class:`MalformedFetch`); its
records are returned as bytes for the record codec to validate.
"""

from __future__ import annotations

import datetime
import io
import struct
from dataclasses import dataclass
from typing import Any

FETCH_KEY = 1
FETCH_VERSION = 11
CONSUMER_REPLICA_ID = -1  # Kafka's replica id of a consumer's Fetch
READ_UNCOMMITTED = 0

_HEADER_V1 = struct.Struct(">hhih")
_I32 = struct.Struct(">i")


class MalformedFetch(ValueError):
    """A Fetch answer that does not decode whole."""


@dataclass(frozen=True, slots=True)
class FetchWant:
    """One topic partition of a Fetch."""

    topic: str
    partition: int
    fetch_offset: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class Fetched:
    """One topic partition of a Fetch answer."""

    topic: str
    partition: int
    error_code: int
    high_watermark: int
    log_start_offset: int
    records: bytes


def encode_fetch(
    replica_id: int,
    leader_epoch: int,
    wanted: list[FetchWant],
    max_bytes: int,
    correlation_id: int,
    client_id: str,
    max_wait_ms: int = 0,
    min_bytes: int = 0,
) -> bytes:
    """The whole frame of a Fetch v11 (read uncommitted, no fetch session) naming ``wanted``
    with ``leader_epoch`` as each one's current leader epoch (-1: not checked)."""
    from kio.schema.fetch.v11 import request as req
    from kio.serial import entity_writer
    from kio.static.primitive import i8, i32, i32Timedelta, i64

    topics: dict[str, list[Any]] = {}
    for w in wanted:
        topics.setdefault(w.topic, []).append(
            req.FetchPartition(
                partition=i32(w.partition),
                current_leader_epoch=i32(leader_epoch),
                fetch_offset=i64(w.fetch_offset),
                log_start_offset=i64(-1),
                partition_max_bytes=i32(w.max_bytes),
            )
        )
    request = req.FetchRequest(
        replica_id=i32(replica_id),  # type: ignore[arg-type]
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=max_wait_ms)),
        min_bytes=i32(min_bytes),
        max_bytes=i32(max_bytes),
        isolation_level=i8(READ_UNCOMMITTED),
        session_id=i32(0),
        session_epoch=i32(-1),
        topics=tuple(
            req.FetchTopic(topic=topic, partitions=tuple(parts))  # type: ignore[arg-type]
            for topic, parts in topics.items()
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    buf = io.BytesIO()
    entity_writer(req.FetchRequest)(buf, request)
    cid = client_id.encode()
    body = _HEADER_V1.pack(FETCH_KEY, FETCH_VERSION, correlation_id, len(cid)) + cid
    body += buf.getvalue()
    return _I32.pack(len(body)) + body


def decode_fetch(frame: bytes | memoryview) -> tuple[int, int, list[Fetched]]:
    """(correlation id, top-level error code, partitions) of a Fetch v11 response frame
    without its length prefix. MalformedFetch when it does not decode whole."""
    from kio.schema.fetch.v11 import response as resp
    from kio.serial import entity_reader

    if len(frame) < 4:
        raise MalformedFetch("Fetch response shorter than its header")
    (correlation_id,) = _I32.unpack_from(frame, 0)
    try:
        body, size = entity_reader(resp.FetchResponse)(memoryview(frame).toreadonly(), 4)
    except Exception as exc:  # kio raises several kinds on bad bytes
        raise MalformedFetch(f"Fetch response does not decode: {exc}") from exc
    if 4 + size != len(frame):
        raise MalformedFetch(f"{len(frame) - 4 - size} bytes after the Fetch response")
    out = [
        Fetched(
            topic.topic,
            int(p.partition_index),
            int(p.error_code),
            int(p.high_watermark),
            int(p.log_start_offset),
            bytes(p.records or b""),
        )
        for topic in body.responses
        for p in topic.partitions
    ]
    return correlation_id, int(body.error_code), out
