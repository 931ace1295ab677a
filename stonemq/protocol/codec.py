"""Request and response codecs, sans-IO: request headers v0-v2, kio bodies, response headers.

Produce bodies are read by :mod:`stonemq.protocol.produce_request` instead of kio
(:data:`NATIVE_DECODERS`): its record batches stay views of the frame.

Which header version a message uses follows Kafka: flexible API versions use request header
v2 and response header v1; others use request header v1 and response header v0; an
ApiVersions response always uses response header v0 so that a client can read it before it
knows the broker's versions.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from stonemq.protocol import guard, produce_request

API_VERSIONS_KEY = 18

_HEADER_FIXED = struct.Struct(">hhi")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class RequestDecodeError(Exception):
    """The frame is not a valid request: the connection must be closed."""


class RequestHeader(NamedTuple):
    """A request's header (a tuple: built once per request, it costs a third of a frozen
    dataclass)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


_HEADER_WITH_CLIENT_ID = struct.Struct(">hhih")


def parse_header_prefix(frame: bytes | memoryview) -> tuple[RequestHeader, int]:
    """Parse api key, version, correlation id and client id (the part common to v1 and v2).

    Returns the header and the position after the client id. Tagged fields of header v2 are
    skipped by :func:`body_offset` once the version is known to be flexible.
    """
    size = len(frame)
    if size < 10:
        if size < _HEADER_FIXED.size:
            raise RequestDecodeError(f"request of {size} bytes is shorter than a header")
        return RequestHeader(*_HEADER_FIXED.unpack_from(frame, 0), None), _HEADER_FIXED.size
    api_key, api_version, correlation_id, length = _HEADER_WITH_CLIENT_ID.unpack_from(frame, 0)
    if length < 0:
        return RequestHeader(api_key, api_version, correlation_id, None), 10
    end = 10 + length
    if end > size:
        raise RequestDecodeError("client id runs past the end of the request")
    try:
        client_id = str(frame[10:end], "utf-8")  # a frame may be a memoryview
    except UnicodeDecodeError as exc:
        raise RequestDecodeError("client id is not UTF-8") from exc
    return RequestHeader(api_key, api_version, correlation_id, client_id), end


NATIVE_DECODERS: dict[int, Callable[[bytes | memoryview, int, int], Any]] = {
    0: produce_request.decode,  # record batches kept as views of the frame
}
"""Requests read by the project's own decoders instead of kio's reader, by API key."""


@functools.cache
def _request_codec(api_key: int, api_version: int) -> tuple[Any, bool, guard.Step]:
    cls = load_request_schema(api_key, api_version)
    return entity_reader(cls), bool(cls.__flexible__), guard.compile_walker(cls)


@functools.cache
def _response_codec(api_key: int, api_version: int) -> tuple[Any, bool]:
    cls = load_response_schema(api_key, api_version)
    return entity_writer(cls), bool(cls.__flexible__)


def decode_request(header: RequestHeader, frame: bytes | memoryview, pos: int) -> Any:
    """Decode the request body of a version the caller has checked is supported.

    A body that is truncated or malformed raises :class:`RequestDecodeError`.
    """
    try:
        reader, flexible, walker = _request_codec(header.api_key, header.api_version)
    except Exception as exc:
        raise RequestDecodeError(
            f"no schema for api {header.api_key} v{header.api_version}"
        ) from exc
    native = NATIVE_DECODERS.get(header.api_key)
    try:
        if flexible:
            pos = guard.check(guard.skip_tagged_fields, frame, pos)  # header v2's tags
        if native is not None:  # checks every length itself
            return native(frame, pos, header.api_version)
        # No length is trusted beyond the frame, nor null where the schema forbids it, before
        # kio's native reader runs: it reserves an array's announced count first, and the
        # 20-byte Metadata v12 frame 0003000c00000001ffff00ffffffff0f00000000 (topics: a
        # compact count of 2^32 - 2) aborted the process (guard.ABORT_REPRODUCER).
        guard.check(walker, frame, pos)
    except guard.MalformedRequest as exc:
        raise RequestDecodeError(
            f"malformed api {header.api_key} v{header.api_version} body: {exc}"
        ) from exc
    try:
        body, _ = reader(frame, pos)
    except Exception as exc:  # kio raises several types for malformed input
        raise RequestDecodeError(
            f"malformed api {header.api_key} v{header.api_version} body: {exc}"
        ) from exc
    # Bytes after a complete body are ignored, as Kafka's own request parser does:
    # librdkafka 2.x appends three bytes after a Metadata v12 body, for one.
    return body


# a value at least this long (record batches a fetch read) is kept by reference in a response
BY_REFERENCE_BYTES = 16 * 1024


class _Chunks:
    """The writable kio's encoders write a response into: small writes are gathered in one
    buffer, large values (a fetch's record batches) are kept as they are, so a fetch response
    is handed to the transport without copying its records into one big buffer."""

    __slots__ = ("_small", "chunks", "size")

    def __init__(self) -> None:
        self.chunks: list[bytes | bytearray | memoryview] = []
        self._small = bytearray()
        self.size = 0

    def write(self, data: Any) -> int:
        """``data``: bytes-like, or a FileRange of segment bytes (always by reference: the
        connection sends it with ``sendfile``)."""
        n = len(data)
        if n >= BY_REFERENCE_BYTES or not isinstance(data, bytes | bytearray | memoryview):
            if self._small:
                self.chunks.append(self._small)
                self._small = bytearray()
            self.chunks.append(data)
        else:
            self._small += data
        self.size += n
        return n

    def finish(self) -> list[bytes | bytearray | memoryview]:
        if self._small:
            self.chunks.append(self._small)
            self._small = bytearray()
        return self.chunks


def encode_response_chunks(
    header: RequestHeader, response: Any, api_version: int | None = None
) -> list[bytes | bytearray | memoryview]:
    """Length prefix + response header + body, for ``response`` of ``api_version``
    (default: the request's version), as buffers to write in order (``writelines``)."""
    version = header.api_version if api_version is None else api_version
    writer, flexible = _response_codec(header.api_key, version)
    out = _Chunks()
    out.write(b"\0\0\0\0")
    out.write(_I32.pack(header.correlation_id))
    if flexible and header.api_key != API_VERSIONS_KEY:
        out.write(b"\0")  # response header v1: no tagged fields
    writer(out, response)
    chunks = out.finish()
    first = chunks[0]
    assert isinstance(first, bytearray)  # the small header writes come first
    _I32.pack_into(first, 0, out.size - 4)
    return chunks


class Encoded:
    """A response a handler encoded itself, returned in place of a kio entity: the connection
    sends :meth:`chunks`, unless it must change the answer (a throttle time to set), when it
    asks ``entity()`` for the kio entity and encodes that."""

    __slots__ = ()

    entity: Callable[[], Any]

    def chunks(self, header: RequestHeader) -> list[bytes | bytearray | memoryview]:
        raise NotImplementedError


class EncodedOnce:
    """A response entity answered to many requests (a cached Metadata response): its body
    is encoded once, and each request gets it behind its own length and correlation id."""

    __slots__ = ("body", "response")

    def __init__(self, response: Any) -> None:
        self.response = response
        self.body: bytes | None = None  # everything after the correlation id

    def chunks(self, header: RequestHeader) -> list[bytes | bytearray | memoryview]:
        """The framed response to ``header`` (its api version must be the one it was built
        for: the cache is keyed by version)."""
        if self.body is None:
            self.body = b"".join(encode_response_chunks(header, self.response))[8:]
        return [_I32.pack(len(self.body) + 4) + _I32.pack(header.correlation_id), self.body]


def encode_response(header: RequestHeader, response: Any, api_version: int | None = None) -> bytes:
    """The whole response as one ``bytes`` (see ``encode_response_chunks``)."""
    return b"".join(encode_response_chunks(header, response, api_version))


# -- the requesting side: a broker forwarding a client's request to another broker ------------


class MalformedResponse(ValueError):
    """A response frame that does not decode whole (a peer's, never trusted beyond its
    bytes)."""


def encode_request(header: RequestHeader, body: Any) -> bytes:
    """Length prefix + request header (v2 for a flexible version, else v1) + ``body``, a kio
    request entity of ``header``'s api and version."""
    cls = load_request_schema(header.api_key, header.api_version)
    client_id = None if header.client_id is None else header.client_id.encode("utf-8")
    out = bytearray(b"\0\0\0\0")
    out += _HEADER_WITH_CLIENT_ID.pack(
        header.api_key,
        header.api_version,
        header.correlation_id,
        -1 if client_id is None else len(client_id),
    )
    out += client_id or b""
    if cls.__flexible__:
        out += b"\0"  # request header v2: no tagged fields
    writer = entity_writer(cls)
    chunks = _Chunks()
    writer(chunks, body)
    out += b"".join(chunks.finish())
    _I32.pack_into(out, 0, len(out) - 4)
    return bytes(out)


@functools.cache
def _response_reader(api_key: int, api_version: int) -> tuple[Any, bool, guard.Step]:
    cls = load_response_schema(api_key, api_version)
    return entity_reader(cls), bool(cls.__flexible__), guard.compile_walker(cls)


def decode_response(api_key: int, api_version: int, frame: bytes | memoryview) -> tuple[int, Any]:
    """(correlation id, kio response entity) of a response frame without its length prefix.
    Every length is checked against the frame first (the guard, as for requests: kio's reader
    trusts them); anything that does not decode raises :class:`MalformedResponse`."""
    reader, flexible, walker = _response_reader(api_key, api_version)
    if len(frame) < 4:
        raise MalformedResponse(f"response of {len(frame)} bytes")
    (correlation_id,) = _I32.unpack_from(frame, 0)
    try:
        pos = 4
        if flexible and api_key != API_VERSIONS_KEY:
            pos = guard.check(guard.skip_tagged_fields, frame, pos)  # response header v1
        guard.check(walker, frame, pos)
        body, _ = reader(frame, pos)
    except Exception as exc:  # the guard's, or kio's several types
        raise MalformedResponse(f"api {api_key} v{api_version} response: {exc}") from exc
    return correlation_id, body
