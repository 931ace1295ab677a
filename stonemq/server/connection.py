"""One client connection: receive frames, dispatch them, send responses in request order.

Requests of one connection are handled concurrently (so pipelined produces share a group
commit) but answered strictly in the order they arrived, as Kafka clients require. A handler
starts in arrival order and does its ordering-sensitive work (offset assignment) before its
first await, so pipelined produces to one partition keep their order.

Back-pressure: at most ``queued.max.requests`` requests in flight per connection, at most
``queued.max.request.bytes`` of requests in flight over all connections (a
:class:`RequestBudget`; a client such as librdkafka keeps up to a million produce requests in
flight), and reading pauses while the transport's write buffer is above its high-water mark.
Nothing buffers without bound. A frame that cannot be decoded, an unknown API key or an
unsupported version (except ApiVersions, which gets Kafka's step-down answer) closes the
connection with a log line; it never affects other connections.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stonemq.handlers import REGISTRY
from stonemq.handlers.api_versions import unsupported_version_response
from stonemq.handlers.context import RequestContext
from stonemq.protocol.codec import (
    API_VERSIONS_KEY,
    RequestDecodeError,
    RequestHeader,
    decode_request,
    encode_response_chunks,
    parse_header_prefix,
)
from stonemq.protocol.framing import FrameDecoder, FrameError

if TYPE_CHECKING:
    from stonemq.broker import Broker

log = logging.getLogger("stonemq.server")


class RequestBudget:
    """Bytes of requests in flight over every connection (``queued.max.request.bytes``), and
    the splitter's lag (``splitter.max.lag.bytes``).

    A connection reads on while the total is under the limit; past it, connections pause
    reading and wait here until answered requests bring the total back under. A request in
    flight counts from its decoding until its response is handed to the transport. While
    more journal bytes than ``max_lag_bytes`` wait to be split, connections pause too, and
    :meth:`recheck` (called after each splitter step) lets them read again: a producer
    faster than the splitter then runs at the splitter's pace instead of growing the
    unsplit journal (how far consumers trail acknowledged data) without bound."""

    __slots__ = ("lag", "limit_bytes", "max_lag_bytes", "used_bytes", "waiting")

    def __init__(
        self,
        limit_bytes: int,
        lag: Callable[[], int] | None = None,
        max_lag_bytes: int = -1,
    ) -> None:
        self.limit_bytes = limit_bytes  # -1: no limit
        self.used_bytes = 0
        self.waiting: set[Connection] = set()
        self.lag = lag
        self.max_lag_bytes = max_lag_bytes  # -1: no limit

    @property
    def exhausted(self) -> bool:
        used = self.used_bytes
        if used > 0 and 0 <= self.limit_bytes <= used:  # nothing in flight: one may come
            return True
        return self.lag is not None and 0 <= self.max_lag_bytes < self.lag()

    def take(self, nbytes: int) -> None:
        self.used_bytes += nbytes

    def give_back(self, nbytes: int) -> None:
        self.used_bytes -= nbytes
        self.recheck()

    def recheck(self) -> None:
        """Let the waiting connections read again if the limits allow."""
        if self.waiting and not self.exhausted:
            waiting, self.waiting = self.waiting, set()
            for conn in waiting:
                conn.update_reading()


class _Pending:
    """A request in flight: its header, its size and, once handled, its encoded response."""

    __slots__ = ("done", "header", "response", "size")

    def __init__(self, header: RequestHeader, size: int = 0) -> None:
        self.header = header
        self.size = size
        self.response: list[bytes | bytearray | memoryview] | None = None
        self.done = False


class Connection(asyncio.BufferedProtocol):
    def __init__(
        self, broker: Broker, registry: set[Connection], budget: RequestBudget | None = None
    ) -> None:
        self._broker = broker
        self._registry = registry
        self._budget = budget if budget is not None else RequestBudget(-1)
        self._decoder = FrameDecoder(broker.settings.socket_request_max_bytes)
        self._transport: asyncio.Transport | None = None
        self._pending: collections.deque[_Pending] = collections.deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self._peer = "?"
        self._closing = False
        self._reading_paused = False
        self._writing_paused = False
        self.last_active = time.monotonic()

    # -- asyncio callbacks ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self._peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._registry.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._registry.discard(self)
        for task in self._tasks:
            task.cancel()
        budget = self._budget
        budget.waiting.discard(self)
        held = sum(p.size for p in self._pending)
        self._pending.clear()
        if held:
            budget.give_back(held)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self._decoder.buffer_updated(nbytes)
        self.last_active = time.monotonic()
        try:
            while not self._closing:
                frame = self._decoder.next_frame()
                if frame is None:
                    break
                self._dispatch(frame)
        except FrameError as exc:
            self.abort(f"bad frame: {exc}")

    def eof_received(self) -> bool:
        return False  # close our side too; unanswered requests die with the connection

    def pause_writing(self) -> None:
        self._writing_paused = True
        self.update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self.update_reading()

    # -- dispatch ---------------------------------------------------------------------------
    def _dispatch(self, frame: bytes) -> None:
        try:
            header, pos = parse_header_prefix(frame)
        except RequestDecodeError as exc:
            self.abort(f"bad request header: {exc}")
            return
        spec = REGISTRY.get(header.api_key)
        if spec is None:
            self.abort(f"unknown or unsupported api key {header.api_key}")
            return
        if not spec.min_version <= header.api_version <= spec.max_version:
            if header.api_key == API_VERSIONS_KEY:
                # Kafka's step-down: answer in the v0 body with UNSUPPORTED_VERSION + the list.
                pending = _Pending(header)
                pending.response = encode_response_chunks(
                    header, unsupported_version_response(), api_version=0
                )
                pending.done = True
                self._pending.append(pending)
                self._flush()
                return
            self.abort(
                f"api key {header.api_key} version {header.api_version} is not supported "
                f"({spec.min_version}..{spec.max_version})"
            )
            return
        try:
            request = decode_request(header, frame, pos)
        except RequestDecodeError as exc:
            self.abort(str(exc))
            return
        ctx = RequestContext(
            api_key=header.api_key,
            api_version=header.api_version,
            correlation_id=header.correlation_id,
            client_id=header.client_id,
            client_host=self._peer.rpartition(":")[0],
            broker=self._broker,
        )
        pending = _Pending(header, len(frame))
        self._pending.append(pending)
        self._budget.take(pending.size)
        task = asyncio.get_running_loop().create_task(
            self._run(spec.handler, ctx, request, pending)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self.update_reading()

    async def _run(
        self, handler: Any, ctx: RequestContext, request: Any, pending: _Pending
    ) -> None:
        try:
            response = await handler(ctx, request)
            if response is not None:
                pending.response = encode_response_chunks(pending.header, response)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "internal error handling api %d v%d from %s (client %s); closing connection",
                ctx.api_key,
                ctx.api_version,
                self._peer,
                ctx.client_id,
            )
            self.abort("internal error")
            return
        pending.done = True
        self._flush()

    def _flush(self) -> None:
        """Send every finished response at the head of the queue, in arrival order."""
        transport = self._transport
        answered = 0
        while self._pending and self._pending[0].done:
            pending = self._pending.popleft()
            answered += pending.size
            if pending.response is not None and transport is not None and not self._closing:
                transport.writelines(pending.response)
        self.last_active = time.monotonic()
        if answered:
            self._budget.give_back(answered)
        self.update_reading()

    def update_reading(self) -> None:
        """Pause or resume reading from the socket as the back-pressure limits say."""
        if self._transport is None or self._closing:
            return
        limit = self._broker.settings.queued_max_requests
        should_pause = self._writing_paused or len(self._pending) >= limit
        if not should_pause and self._budget.exhausted:
            should_pause = True
            self._budget.waiting.add(self)
        if should_pause and not self._reading_paused:
            self._transport.pause_reading()
            self._reading_paused = True
        elif not should_pause and self._reading_paused:
            self._transport.resume_reading()
            self._reading_paused = False

    # -- closing ----------------------------------------------------------------------------
    @property
    def idle(self) -> bool:
        return not self._pending

    def abort(self, reason: str) -> None:
        if self._closing:
            return
        log.warning("closing connection from %s: %s", self._peer, reason)
        self._closing = True
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        """Close after the responses already queued have been written."""
        if not self._closing:
            self._closing = True
            if self._transport is not None:
                self._transport.close()

    async def drain(self) -> None:
        """Wait for the requests in flight to be answered (used at shutdown)."""
        while self._pending and not self._closing:
            await asyncio.sleep(0.01)
