"""A minimal blocking Kafka wire client for tests that must send exact (or broken) bytes.

Requests and responses are encoded with kio's schemas; framing (4-byte length prefix) and
header choice are done here so tests can also send frames no real client would.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import io
import socket
import struct
import time
import uuid
from typing import Any

from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.api_versions.v0.request import ApiVersionsRequest as ApiVersionsRequestV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

API_VERSIONS_KEY = 18


def encode(entity: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def decode(entity_type: type, data: bytes | memoryview, offset: int = 0) -> tuple[Any, int]:
    """Decode one entity; returns it and the number of bytes it used."""
    value, size = entity_reader(entity_type)(data, offset)
    return value, size


def request_header(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None, flexible: bool
) -> bytes:
    header_type = RequestHeaderV2 if flexible else RequestHeaderV1
    return encode(
        header_type(
            request_api_key=i16(api_key),
            request_api_version=i16(api_version),
            correlation_id=i32(correlation_id),
            client_id=client_id,
        )
    )


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


class ConnectionClosed(Exception):
    pass


class RawConnection:
    def __init__(
        self,
        host: str,
        port: int,
        timeout: float = 10.0,
        client_id: str = "raw-test",
        source: str | None = None,
    ):
        """``source``: the local address to connect from (any 127.x.y.z on loopback)."""
        bind = (source, 0) if source is not None else None
        self.sock = socket.create_connection((host, port), timeout=timeout, source_address=bind)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.client_id = client_id
        self._correlation = 0

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def next_correlation_id(self) -> int:
        self._correlation += 1
        return self._correlation

    # -- bytes ---------------------------------------------------------------------------------
    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, payload: bytes) -> None:
        self.sock.sendall(frame(payload))

    def _recv_exact(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self.sock.recv(min(n, 1 << 20))
            if not chunk:
                raise ConnectionClosed("connection closed by the broker")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def recv_frame(self) -> bytes:
        (size,) = struct.unpack(">i", self._recv_exact(4))
        return self._recv_exact(size)

    def wait_closed(self, timeout: float = 10.0) -> bool:
        """True when the broker closes the connection within ``timeout`` (data is discarded)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return False
            except ConnectionResetError:
                return True
            if not chunk:
                return True

    # -- Kafka requests ------------------------------------------------------------------------
    def send_request(
        self,
        request: Any,
        *,
        api_version: int | None = None,
        correlation_id: int | None = None,
        flexible_header: bool | None = None,
    ) -> int:
        """Send a kio request entity; returns its correlation id."""
        cid = self.next_correlation_id() if correlation_id is None else correlation_id
        flexible = request.__flexible__ if flexible_header is None else flexible_header
        version = request.__version__ if api_version is None else api_version
        header = request_header(request.__api_key__, version, cid, self.client_id, flexible)
        self.send_frame(header + encode(request))
        return cid

    def recv_response(self, response_type: type, correlation_id: int) -> Any:
        data = self.recv_frame()
        header_type = response_type.__header_schema__
        header, used = decode(header_type, data)
        assert header.correlation_id == correlation_id, (
            f"correlation id {header.correlation_id} != {correlation_id}"
        )
        body, size = decode(response_type, data, used)
        assert used + size == len(data), (
            f"{response_type.__module__}: {len(data) - used - size} trailing bytes in response"
        )
        return body

    def request(self, request: Any, response_type: type) -> Any:
        self.sock.settimeout(self.timeout)
        cid = self.send_request(request)
        return self.recv_response(response_type, cid)

    def api_versions(self) -> dict[int, tuple[int, int]]:
        """ApiVersions v0: {api_key: (min, max)}."""
        resp = self.request(ApiVersionsRequestV0(), ApiVersionsResponseV0)
        assert resp.error_code == 0, resp
        return {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}


def response_header_type(flexible: bool) -> type:
    return ResponseHeaderV1 if flexible else ResponseHeaderV0


# -- typed requests used by several tests ------------------------------------------------------
def schema(api: str, version: int, kind: str) -> Any:
    """kio's module for ``api`` (e.g. "fetch") at ``version``; kind is "request"/"response"."""
    return importlib.import_module(f"kio.schema.{api}.v{version}.{kind}")


def build(cls: type, **kwargs: Any) -> Any:
    """Construct a kio entity from the kwargs its version has (others are dropped)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in kwargs.items() if k in names})


def ms(value: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=value))


def build_batch(
    records: list[tuple[bytes | None, bytes | None]],
    timestamp: int | None = None,
    compression: int = 0,
) -> bytearray:
    """A RecordBatch v2 (base offset 0, no producer id) built by kafka-python."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 24,
    )
    ts = timestamp if timestamp is not None else int(time.time() * 1000)
    for i, (key, value) in enumerate(records):
        builder.append(i, timestamp=ts, key=key, value=value, headers=[])
    return builder.build()


def produce_request(
    topic: str,
    partition: int,
    records: bytes,
    acks: int = -1,
    version: int = 7,
    topic_id: uuid.UUID | None = None,
) -> Any:
    return produce_request_to(topic, {partition: records}, acks, version, topic_id)


def produce_request_to(
    topic: str,
    records: dict[int, bytes],
    acks: int = -1,
    version: int = 7,
    topic_id: uuid.UUID | None = None,
) -> Any:
    """One Produce of ``records[partition]`` to each partition of ``topic`` (named by
    ``topic_id`` from v13, where requests carry ids instead of names)."""
    mod = schema("produce", version, "request")
    return build(
        mod.ProduceRequest,
        acks=i16(acks),
        timeout=ms(10000),
        topic_data=(
            build(
                mod.TopicProduceData,
                name=topic,
                topic_id=topic_id,
                partition_data=tuple(
                    build(mod.PartitionProduceData, index=i32(p), records=bytes(batch))
                    for p, batch in records.items()
                ),
            ),
        ),
    )


def produce_raw(
    conn: RawConnection,
    topic: str,
    partition: int,
    records: bytes,
    acks: int = -1,
    version: int = 7,
    topic_id: uuid.UUID | None = None,
) -> Any:
    """One Produce; returns the single partition response."""
    resp = conn.request(
        produce_request(topic, partition, records, acks, version, topic_id),
        schema("produce", version, "response").ProduceResponse,
    )
    (topic_resp,) = resp.responses
    if version >= 13:
        assert topic_resp.topic_id == topic_id
    else:
        assert topic_resp.name == topic
    (part,) = topic_resp.partition_responses
    assert part.index == partition
    return part


def fetch_request(
    topic: str,
    partition: int,
    offset: int,
    version: int = 12,
    max_wait_ms: int = 0,
    partition_max_bytes: int = 1 << 24,
    topic_id: uuid.UUID | None = None,
    current_leader_epoch: int = -1,
    more_partitions: tuple[int, ...] = (),
) -> Any:
    """A Fetch of one partition, and of ``more_partitions`` from the same offset (named by
    ``topic_id`` from v13; ``current_leader_epoch`` from v9, -1: not given)."""
    req_mod = schema("fetch", version, "request")
    return build(
        req_mod.FetchRequest,
        replica_id=i32(-1),
        max_wait=ms(max_wait_ms),
        min_bytes=i32(1),
        max_bytes=i32(1 << 26),
        isolation_level=i8(0),
        session_id=i32(0),
        session_epoch=i32(-1),
        topics=(
            build(
                req_mod.FetchTopic,
                topic=topic,
                topic_id=topic_id,
                partitions=tuple(
                    build(
                        req_mod.FetchPartition,
                        partition=i32(number),
                        current_leader_epoch=i32(current_leader_epoch),
                        fetch_offset=i64(offset),
                        partition_max_bytes=i32(partition_max_bytes),
                    )
                    for number in (partition, *more_partitions)
                ),
            ),
        ),
        forgotten_topics_data=(),
    )


def fetch_raw(
    conn: RawConnection,
    topic: str,
    partition: int,
    offset: int,
    version: int = 12,
    max_wait_ms: int = 0,
    partition_max_bytes: int = 1 << 24,
    topic_id: uuid.UUID | None = None,
    current_leader_epoch: int = -1,
) -> Any:
    """One Fetch of one partition; returns the partition data."""
    request = fetch_request(
        topic,
        partition,
        offset,
        version,
        max_wait_ms,
        partition_max_bytes,
        topic_id,
        current_leader_epoch,
    )
    resp = conn.request(request, schema("fetch", version, "response").FetchResponse)
    (topic_resp,) = resp.responses
    if version >= 13:
        assert topic_resp.topic_id == topic_id
    else:
        assert topic_resp.topic == topic
    (part,) = topic_resp.partitions
    return part


def topic_metadata(conn: RawConnection, topic: str) -> Any:
    """Metadata v12 of one topic: its answer (error, topic id, partitions with leader and
    leader epoch)."""
    req = schema("metadata", 12, "request")
    resp = conn.request(
        req.MetadataRequest(
            topics=(req.MetadataRequestTopic(name=topic, topic_id=None),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        ),
        schema("metadata", 12, "response").MetadataResponse,
    )
    (answer,) = resp.topics
    return answer


def leader_epochs_of(conn: RawConnection, topic: str) -> dict[int, int]:
    """Each partition's leader epoch, from Metadata v12 (what KIP-320 clients send back)."""
    answer = topic_metadata(conn, topic)
    assert answer.error_code == 0, answer
    return {p.partition_index: p.leader_epoch for p in answer.partitions}


def topic_id_of(conn: RawConnection, topic: str) -> uuid.UUID:
    """The topic's id, from Metadata v12."""
    answer = topic_metadata(conn, topic)
    assert answer.error_code == 0 and answer.topic_id is not None, answer
    return answer.topic_id


def split_batches(records: bytes | None) -> list[bytes]:
    """Split a records field into whole batches (a partial batch at the end is dropped)."""
    out = []
    data = bytes(records or b"")
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from(">i", data, pos + 8)
        end = pos + 12 + length
        if end > len(data):
            break
        out.append(data[pos:end])
        pos = end
    return out


def wait_visible(
    conn: RawConnection, topic: str, partition: int, end: int, timeout: float = 10.0
) -> Any:
    """Fetch from offset 0 until the high watermark reaches ``end`` (records are visible once
    split, a moment after the ack); returns that fetch's partition data."""
    deadline = time.monotonic() + timeout
    while True:
        part = fetch_raw(conn, topic, partition, 0, max_wait_ms=100)
        if part.error_code != 0 or part.high_watermark >= end or time.monotonic() > deadline:
            return part
        time.sleep(0.02)


def fetch_batches(
    broker: Any, topic: str, partition: int, offset: int, end: int | None = None
) -> list[bytes]:
    """Every whole batch from ``offset`` up to ``end`` (default: the high watermark)."""
    batches: list[bytes] = []
    with RawConnection(broker.host, broker.port) as conn:
        if end is not None:
            wait_visible(conn, topic, partition, end)
        while True:
            part = fetch_raw(conn, topic, partition, offset)
            assert part.error_code == 0, part.error_code
            got = split_batches(part.records)
            if not got:
                return batches
            batches.extend(got)
            last = got[-1]
            (base,) = struct.unpack_from(">q", last, 0)
            (last_delta,) = struct.unpack_from(">i", last, 23)
            offset = base + last_delta + 1
            if offset >= (part.high_watermark if end is None else end):
                return batches
