"""Forwarding a client's request to the controller, as a Kafka 4 broker forwards the requests
only its controller can answer (Kafka's ForwardingManager): the client's request, at its own
version, sent by this broker to the controller's listener, and the controller's answer
returned as this broker's.

Used for ElectLeaders: clients send it to the controller Metadata names, and a client whose
metadata is older than a controller change reached a broker that is not the controller any
more; a ZooKeeper-mode Kafka broker answered NOT_CONTROLLER there, which librdkafka hands to
the application instead of asking again. A forwarded request carries the client id
``FORWARDED_CLIENT_ID_PREFIX`` + this broker's id, and a broker never forwards such a request
again (it answers NOT_CONTROLLER), so a request crosses at most one hop whatever the
controller does meanwhile. Nothing is forwarded when no other broker is known to be the
controller, or when the controller cannot be reached or answers what does not decode: the
caller answers by itself then.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any

from stonemq.cluster.routing import SingleNodeRouting
from stonemq.protocol.codec import MalformedResponse, RequestHeader, decode_response, encode_request

log = logging.getLogger(__name__)

FORWARDED_CLIENT_ID_PREFIX = "stonemq-forwarded-by-"
MAX_RESPONSE_BYTES = 16 << 20
"""The largest answer taken from the controller (an ElectLeaders answer of every partition
of a large cluster is a few MB)."""
_CORRELATION_ID = 1
_LENGTH = struct.Struct(">i")


def forwarded(client_id: str | None) -> bool:
    """Was this request forwarded here by another broker?"""
    return client_id is not None and client_id.startswith(FORWARDED_CLIENT_ID_PREFIX)


async def to_controller(
    routing: SingleNodeRouting,
    broker_id: int,
    api_key: int,
    api_version: int,
    request: Any,
    timeout_s: float,
) -> Any | None:
    """The controller's answer to ``request`` (a kio entity of ``api_key`` v``api_version``),
    or None when this broker is the controller, no other is known, or it gave no answer that
    decodes within ``timeout_s``."""
    controller = routing.controller_id()
    if controller < 0 or controller == broker_id:
        return None
    endpoint = routing.broker(controller)
    if endpoint is None:
        return None
    header = RequestHeader(
        api_key, api_version, _CORRELATION_ID, f"{FORWARDED_CLIENT_ID_PREFIX}{broker_id}"
    )
    writer = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
            writer.write(encode_request(header, request))
            (size,) = _LENGTH.unpack(await reader.readexactly(4))
            if not 4 <= size <= MAX_RESPONSE_BYTES:
                raise MalformedResponse(f"response of {size} bytes")
            frame = await reader.readexactly(size)
        correlation_id, answer = decode_response(api_key, api_version, frame)
        if correlation_id != _CORRELATION_ID:
            raise MalformedResponse(f"correlation id {correlation_id}")
        return answer
    except (OSError, TimeoutError, asyncio.IncompleteReadError, MalformedResponse) as exc:
        log.warning(
            "api %d v%d: could not forward to controller %d at %s:%d (%s); answering here",
            api_key,
            api_version,
            controller,
            endpoint.host,
            endpoint.port,
            exc or type(exc).__name__,
        )
        return None
    finally:
        if writer is not None:
            writer.close()
