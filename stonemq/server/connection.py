"""One client connection: receive frames, decode them, hand them to the dispatcher, send the
responses in request order.

Frames are decoded as they arrive (a frame that cannot be decoded, an unknown API key or an
unsupported version, except ApiVersions which gets Kafka's step-down answer, closes the
connection with a log line; it never affects other connections) and wait in the connection's
ready queue; the broker-wide :class:`~stonemq.server.dispatcher.Dispatcher` starts them, one
per connection per round. Requests of one connection may be in flight together (so pipelined
produces share a group commit) but start in arrival order, and are answered strictly in that
order, as Kafka clients require. Any other request is in flight alone, as Kafka handles
every request of a connection (its answer, a Fetch's or a Metadata's, can be large and cannot
be sent before the ones ahead of it: one client pipelining hundreds and reading nothing
would hold them all).

Client quotas (KIP-13/124/219): when a quota of the client's is configured, a request that
takes its produce bytes or its handling time over the quota gets ``throttle_time_ms`` in its
response, which is sent at once, and the connection is muted for that long: no request is
read or started until the throttle time has passed (other connections go on). A fetch over
the consumer byte rate is throttled by its handler (it answers empty). With no quota
configured, a request costs three attribute reads here.

Back-pressure, so nothing buffers without bound: at most ``queued.max.requests`` requests
decoded and unanswered per connection (frames past that wait in the receive buffer); bytes of
requests in flight and of frames still arriving over all connections against
``queued.max.request.bytes`` (:class:`~stonemq.server.budget.RequestBudget`), except on a
follower's replica fetch connection: acks=all produces waiting for the ISR hold that budget,
and only the followers' fetches can release them (their requests are small, one per
connection at a time); reading stops
while the transport's write buffer is above its high-water mark, while more than 4 MiB of
finished answers wait behind an earlier request not answered yet (a client that pipelines
and reads nothing), and while a produce is held for the splitter's lag.

Zero-copy fetch responses: a response holding segment ranges (``storage/file_range.py``) is
sent by the connection itself, not the transport: once the transport's buffer has drained,
its bytes before a range go through the transport, the range goes with ``sendfile`` from the
segment file to the socket (non-blocking, at most ``SENDFILE_CALL_BYTES`` a call: a full
socket, or a call that sent its share, waits for a writability callback on a duplicate of the
socket's descriptor, then the send goes on where it stopped), and what
follows waits its turn in ``_out``. While more than 4 MiB wait there, the connection counts as
not writable (no request starts, reading pauses), as above the transport's high-water mark. A
send that fails after part of a response went out closes the connection with a log line; a
socket that cannot take ``sendfile`` at all (EINVAL, ENOTSUP: not a plain TCP socket) gets the
rest copied.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime
import errno
import logging
import os
import time
from collections.abc import Awaitable, Generator
from typing import TYPE_CHECKING, Any

from stonemq.handlers import REGISTRY
from stonemq.handlers.api_versions import unsupported_version_response
from stonemq.handlers.context import RequestContext, heavy_work
from stonemq.handlers.replica_fetch import INTERNAL
from stonemq.protocol.codec import (
    API_VERSIONS_KEY,
    NATIVE_DECODERS,
    Encoded,
    RequestDecodeError,
    RequestHeader,
    decode_request,
    encode_response_chunks,
    parse_header_prefix,
)
from stonemq.protocol.framing import FrameDecoder, FrameError
from stonemq.quotas.entity import ANONYMOUS_USER, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE
from stonemq.server.budget import OWNER_PROGRESS_BYTES, RequestBudget
from stonemq.server.collector import defer_full_collections, resume_full_collections
from stonemq.server.dispatcher import PRODUCE_KEY, Dispatcher
from stonemq.server.metrics import METRICS
from stonemq.storage.file_range import FileRange

if TYPE_CHECKING:
    from stonemq.broker import Broker
    from stonemq.handlers.registry import Handler

log = logging.getLogger("stonemq.server")


class _Pending:
    """A request in flight: its header, its size (and the memory it holds, ``held``: a frame
    handed out as a view holds its whole receive buffer) and, once handled, its encoded response and
    the bytes its handler already charged to the connection's turns (a fetch's records).
    Until the dispatcher starts it (it waits in the ready queue since ``queued_ns``), it also
    holds its handler, context and decoded request: one object per request, not two."""

    __slots__ = (
        "charged",
        "close_after",
        "ctx",
        "done",
        "handler",
        "header",
        "held",
        "queued_ns",
        "request",
        "response",
        "size",
        "waiting",
    )

    def __init__(
        self,
        header: RequestHeader,
        size: int = 0,
        handler: Handler | None = None,
        ctx: RequestContext | None = None,
        request: Any = None,
        held: int = 0,
    ) -> None:
        self.header = header
        self.size = size
        self.held = held
        self.response: list[bytes | bytearray | memoryview] | None = None
        self.done = False
        self.charged = 0
        self.handler = handler
        self.ctx = ctx
        self.request = request
        self.queued_ns = 0
        self.close_after: str | None = None  # the connection closes once this is flushed
        self.waiting = 0  # bytes of its response held behind an earlier unanswered request


# request handling time in ns, as a percentage of one thread for one second (Kafka's
# ClientRequestQuotaManager.NanosToPercentagePerSecond)
_NANOS_TO_PERCENTAGE = 100.0 / 1e9


_OUT_PAUSE_BYTES = 4 * 1024 * 1024
"""Bytes of responses waiting to be sent (behind a range being sent, ``_out``, or behind an
earlier request not answered yet) past which the connection starts no request and reads
nothing more, as it does above the transport's high-water mark."""

_FETCH_KEY = 1

DECODE_OFF_LOOP_BYTES = 32 * 1024
"""A request frame at least this long (other than a Produce, whose own decoder reads only its
headers) is decoded in the heavy-work thread, not on the event loop: kio decodes a request of
many small entries at about 5 MB/s, and a 3 MiB IncrementalAlterConfigs of 100,000 resources
held the loop for 0.65 s. The request starts once decoded, in its turn."""


_COPY_BYTES = 256 * 1024
"""A step of the copying fallback (a socket that cannot take ``sendfile``)."""
SENDFILE_CALL_BYTES = 1024 * 1024
"""At most this much of a segment range goes out in one ``sendfile`` of the event loop; the
rest waits for the next writability callback, so other connections are served in between.
Copying from the page cache into a loopback socket ran at about 1.1 GB/s here: a fetch of 8
MiB (the Spark source's range reads), sent whole, held the loop for 7 ms or more, one MiB
holds it for about 1 ms."""


def _close_chunks(chunks: Any) -> None:
    """Close the segment ranges among a response's chunks (one that will not be sent)."""
    for chunk in chunks or ():
        if type(chunk) is FileRange:
            chunk.close()


class _Timed:
    """Awaits a coroutine and adds up the time its steps ran (the time the event loop spent
    on the request, not the time it waited for disk, other brokers or new data)."""

    __slots__ = ("_coro", "first_ns", "ns", "steps")

    def __init__(self, coro: Awaitable[Any]) -> None:
        self._coro = coro.__await__()
        self.ns = 0
        self.steps = 0
        self.first_ns = 0  # monotonic ns when its first step started

    def __await__(self) -> Generator[Any, Any, Any]:
        step = self._coro
        clock = time.perf_counter_ns
        value: Any = None
        error: BaseException | None = None
        self.first_ns = time.monotonic_ns()
        while True:
            started = clock()
            self.steps += 1
            try:
                yielded = step.send(value) if error is None else step.throw(error)
            except StopIteration as done:
                self.ns += clock() - started
                return done.value
            except BaseException:
                self.ns += clock() - started
                raise
            self.ns += clock() - started
            try:
                value, error = (yield yielded), None
            except BaseException as exc:  # cancellation: into the coroutine
                value, error = None, exc


class Connection(asyncio.BufferedProtocol):
    def __init__(
        self,
        broker: Broker,
        registry: set[Connection],
        budget: RequestBudget | None = None,
        dispatcher: Dispatcher | None = None,
        listener: str = "PLAINTEXT",
    ) -> None:
        self._broker = broker
        self._listener = listener
        self._registry = registry
        self._budget = budget if budget is not None else RequestBudget(-1)
        self._dispatcher = dispatcher if dispatcher is not None else Dispatcher()
        self._max_requests = broker.settings.queued_max_requests
        self._decoder = FrameDecoder(broker.settings.socket_request_max_bytes)
        self._reserved = 0  # the decoder's reserved_bytes, as the budget knows them
        self._admitted = False  # counted in the broker's connection limits
        self._transport: asyncio.Transport | None = None
        self._pending: collections.deque[_Pending] = collections.deque()
        self._ready: collections.deque[_Pending] = collections.deque()  # not started yet
        self._loop: asyncio.AbstractEventLoop | None = None
        self._host = "?"  # the peer's address without its port (RequestContext.client_host)
        self._tasks: set[asyncio.Task[None]] = set()
        self._peer = "?"
        self._closing = False
        self._taking = False
        self._held = False
        self._reading_paused = False
        self._writing_paused = False
        self._yielding = False  # as update_reading last saw it (budget.py: Reader.yields)
        self._quotas = broker.quotas
        # each request's loop time is measured (about 1.3 µs a request) only when someone can
        # read it: the metrics endpoint is served, or request quotas charge it
        self._timing = broker.settings.metrics_listen is not None
        self._user = ANONYMOUS_USER  # the principal, for quotas (no SASL: Kafka's anonymous)
        self._throttled = False  # muted for a quota (KIP-219)
        # a follower's replica fetch connection (it sent a ReplicaFetch): read whatever the
        # request budget says, since its fetches are what move the HW that acks=all produces
        # holding the budget wait for
        self._replica_link = False
        self._throttled_until = 0.0
        self._unmute: asyncio.TimerHandle | None = None
        self.last_active = self.receiving_since = time.monotonic()
        self._progress_bytes = 0  # received since receiving_since last moved on receipt
        # the dispatcher's share by bytes (dispatcher.py): what this connection may still move
        # in its turn (negative: its debt), and its handler steps waiting for a turn
        self.allowance = 0
        self._turn_waiters: list[asyncio.Future[None]] = []
        # zero-copy responses: chunks (bytes-like or FileRange) behind a range being sent,
        # the socket's descriptor duplicated for sendfile and writability callbacks (-1: not
        # made yet), and whether a writability callback is registered
        self._out: collections.deque[Any] = collections.deque()
        self._out_bytes = 0
        # bytes of finished responses held behind an earlier unanswered request, and whether
        # a request other than Produce is in flight (one at a time: see the module doc)
        self._waiting_bytes = 0
        self._serial = False
        self._send_fd = -1
        self._send_waiting = False
        self._sendfile_ok = True
        self._close_when_sent = False

    # -- asyncio callbacks ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self._peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._host = self._peer.rpartition(":")[0]
        self._loop = asyncio.get_running_loop()
        if not self._broker.connection_limits.admit(self._host):
            # Kafka's max.connections (past the open-file limit's room the storage could not
            # open a journal segment or a file to fsync) and max.connections.per.ip
            self._closing = True
            transport.abort()
            return
        self._admitted = True
        self._registry.add(self)
        sock = transport.get_extra_info("socket")
        self._sendfile_ok = (
            sock is not None
            and transport.get_extra_info("sslcontext") is None
            and self._broker.settings.fetch_zero_copy
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._registry.discard(self)
        if self._admitted:
            self._admitted = False
            self._broker.connection_limits.release(self._host)
        if self._unmute is not None:
            self._unmute.cancel()
        for task in self._tasks:
            task.cancel()
        self._dispatcher.forget(self)
        self._drop_out()
        budget = self._budget
        budget.forget(self)
        held = sum(p.held for p in self._pending)
        for item in self._ready:  # never started: their deferral ends here
            if item.ctx is not None and item.ctx.defers_collections:
                resume_full_collections()
        self._pending.clear()
        self._ready.clear()
        if held:
            budget.give_back(held)

    def get_buffer(self, sizehint: int) -> memoryview:
        buffer = self._decoder.get_buffer(sizehint)
        self._sync_reservation()
        return buffer

    def buffer_updated(self, nbytes: int) -> None:
        self._decoder.buffer_updated(nbytes)
        self.last_active = now = time.monotonic()
        progress = self._progress_bytes + nbytes
        if progress >= OWNER_PROGRESS_BYTES:  # a trickle is no progress (budget.py)
            progress = 0
            self.receiving_since = now
        self._progress_bytes = progress
        self._take_frames()
        self.update_reading()

    def eof_received(self) -> bool:
        return False  # close our side too; unanswered requests die with the connection

    def pause_writing(self) -> None:
        self._writing_paused = True
        self.update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self.receiving_since = time.monotonic()  # its client takes responses: not silent
        self.update_reading()
        if self._ready:
            self._dispatcher.ready(self)

    # -- decoding ---------------------------------------------------------------------------
    def _take_frames(self) -> None:
        """Decode the buffered frames into the ready queue, up to ``queued.max.requests``
        unanswered; the rest wait in the receive buffer."""
        if self._taking:
            return
        self._taking = True
        taken = False
        budget = self._budget
        try:
            while not self._closing and len(self._pending) < self._max_requests:
                if self._pending and budget.exhausted and not self._replica_link:
                    break  # past queued.max.request.bytes: one at a time (budget.py)
                frame = self._decoder.next_frame()
                if frame is None:
                    break
                taken = True
                self._accept(frame)
        except FrameError as exc:
            self.abort(f"bad frame: {exc}")
        finally:
            self._taking = False
        if taken:
            budget.frame_taken(self)
        self._sync_reservation()
        if self._ready and not self._closing:
            self._dispatcher.ready(self)

    def _accept(self, frame: bytes | memoryview) -> None:
        try:
            header, pos = parse_header_prefix(frame)
        except RequestDecodeError as exc:
            self.abort(f"bad request header: {exc}")
            return
        spec = REGISTRY.get(header.api_key)
        if spec is None:
            self._accept_internal(header, frame, pos)
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
        if len(frame) >= DECODE_OFF_LOOP_BYTES and header.api_key not in NATIVE_DECODERS:
            loop = self._loop or asyncio.get_running_loop()
            decoding = loop.run_in_executor(heavy_work(), decode_request, header, frame, pos)
            ctx = self._queue(header, frame, spec.handler, decoding)
            ctx.defers_collections = True  # until its task ends (start_next), or its connection
            defer_full_collections()
            decoding.add_done_callback(self._decoded)
            return
        try:
            request = decode_request(header, frame, pos)
        except RequestDecodeError as exc:
            self.abort(str(exc))
            return
        self._queue(header, frame, spec.handler, request)

    def _decoded(self, decoding: asyncio.Future[Any]) -> None:
        """A large request was decoded in the heavy-work thread: it may start in its turn."""
        if not self._closing and self._ready:
            self._dispatcher.ready(self)

    def _accept_internal(self, header: Any, frame: bytes | memoryview, pos: int) -> None:
        """StoneMQ's internal APIs between brokers (handlers/replica_fetch.py: ReplicaFetch),
        beside Kafka's keys; their handlers answer with the encoded response's buffers."""
        internal = INTERNAL.get(header.api_key)
        if internal is None or self._broker.replicas is None:
            self.abort(f"unknown or unsupported api key {header.api_key}")
            return
        low, high, decode, handler = internal
        if not low <= header.api_version <= high:
            self.abort(f"internal api {header.api_key} v{header.api_version} is not supported")
            return
        try:
            request = decode(frame, pos)
        except ValueError as exc:
            self.abort(f"malformed internal api {header.api_key} body: {exc}")
            return
        self._replica_link = True
        self._queue(header, frame, handler, request)

    def _queue(
        self, header: Any, frame: bytes | memoryview, handler: Any, request: Any
    ) -> RequestContext:
        """A decoded request joins the connection's queue, its bytes counted in the budget."""
        ctx = RequestContext(
            api_key=header.api_key,
            api_version=header.api_version,
            correlation_id=header.correlation_id,
            client_id=header.client_id,
            client_host=self._host,
            broker=self._broker,
            listener=self._listener,
            user=self._user,
            turns=self,
            file_ranges=self._sendfile_ok,
        )
        # a view holds the buffer it was handed out of (up to twice the frame: framing.py)
        held = len(frame.obj) if isinstance(frame, memoryview) else len(frame)  # type: ignore[arg-type]
        pending = _Pending(header, len(frame), handler, ctx, request, held)
        pending.queued_ns = time.monotonic_ns()
        self._pending.append(pending)
        self._ready.append(pending)
        self._budget.take(held)
        return ctx

    def _sync_reservation(self) -> None:
        """Tell the budget what the receive buffer holds beyond its first 64 KiB."""
        reserved = self._decoder.reserved_bytes
        if reserved != self._reserved:
            self._reserved = reserved
            self._budget.reserve(self, reserved)

    # -- starting (called by the dispatcher) -------------------------------------------------
    def start_next(self) -> tuple[int, int] | None:
        """Start the next ready request unless the connection is closing, its client is not
        reading responses, or it is a Produce while the splitter lags (then hold)."""
        if (
            self._closing
            or self._writing_paused
            or self._out_bytes + self._waiting_bytes > _OUT_PAUSE_BYTES
            or self._throttled
            or not self._ready
        ):
            return None
        item = self._ready[0]
        if self._serial and item.header.api_key != PRODUCE_KEY:
            return None  # the one in flight asks for a turn when it is answered
        if isinstance(item.request, asyncio.Future):  # decoded in the heavy-work thread
            decoding = item.request
            if not decoding.done():
                return None  # _decoded asks for a turn
            error = decoding.exception()
            if error is not None:
                self.abort(str(error) if isinstance(error, RequestDecodeError) else repr(error))
                return None
            item.request = decoding.result()
        ctx = item.ctx
        assert ctx is not None and item.handler is not None
        api_key = ctx.api_key
        if api_key == PRODUCE_KEY and self._dispatcher.produce_held_now():
            self._held = True
            self._dispatcher.hold(self)
            self.update_reading()
            return None
        self._ready.popleft()
        if api_key != PRODUCE_KEY:
            self._serial = True
        started_ns = 0
        if api_key == PRODUCE_KEY:
            started_ns = time.monotonic_ns()
            METRICS.produce_requests_started += 1
            METRICS.produce_queued_ns += started_ns - item.queued_ns
            if self._quotas.produce_active:
                self._record_produce(ctx, item.size)
        loop = self._loop or asyncio.get_running_loop()
        task = loop.create_task(self._run(item.handler, ctx, item.request, item, started_ns))
        item.handler = item.ctx = item.request = None  # the task holds them while it runs
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if ctx.defers_collections:
            task.add_done_callback(resume_full_collections)
        return api_key, item.size

    @property
    def next_api_key(self) -> int | None:
        return self._ready[0].header.api_key if self._ready else None

    def charge(self, nbytes: int, api_key: int) -> None:
        """Take ``nbytes`` moved for a request of ``api_key`` from this connection's turn."""
        self._dispatcher.charge(self, nbytes, api_key)

    def next_turn(self) -> asyncio.Future[None]:
        """A future done at this connection's next turn (a handler step that waits for it)."""
        future = asyncio.get_running_loop().create_future()
        self._turn_waiters.append(future)
        if not self._closing:
            self._dispatcher.ready(self)
        return future

    def wake_steps(self) -> None:
        waiters = self._turn_waiters
        if waiters:
            self._turn_waiters = []
            for future in waiters:
                if not future.done():
                    future.set_result(None)

    def release(self) -> None:
        self._held = False
        if not self._closing:
            self.update_reading()
            self._dispatcher.ready(self)

    async def _run(
        self,
        handler: Handler,
        ctx: RequestContext,
        request: Any,
        pending: _Pending,
        started_ns: int = 0,
    ) -> None:
        """Handle one request and queue its encoded response; ``started_ns``: when a Produce
        started (its handling time is counted in the metrics), else 0."""
        quotas = self._quotas
        clock = time.perf_counter_ns
        timed = (
            _Timed(handler(ctx, request))
            if self._timing or (quotas.request_active and ctx.api_key not in INTERNAL)
            else None
        )
        after_ns = 0
        try:
            response = await (handler(ctx, request) if timed is None else timed)
            after_ns = clock()
            if type(response) is list:  # an internal API's encoded response: no client quota
                pending.response = response
                response = None
            elif quotas.request_active and ctx.api_key not in INTERNAL:
                response = self._throttle(ctx, pending, response, timed)
            elif ctx.throttle_ms:
                response = self._throttle(ctx, pending, response, None)
            reuse = ctx.reuse
            if isinstance(response, Encoded):  # encoded by the handler, not changed
                pending.response = response.chunks(pending.header)
            elif response is not None and reuse is not None and response is reuse.response:
                pending.response = reuse.chunks(pending.header)  # not throttled: as it was
            elif response is not None and ctx.encode_in_thread:
                pending.response = await asyncio.get_running_loop().run_in_executor(
                    heavy_work(), encode_response_chunks, pending.header, response
                )
            elif response is not None:
                pending.response = encode_response_chunks(pending.header, response)
        except asyncio.CancelledError:
            raise
        except Exception:
            _close_chunks(pending.response)
            log.exception(
                "internal error handling api %d v%d from %s (client %s); closing connection",
                ctx.api_key,
                ctx.api_version,
                self._peer,
                ctx.client_id,
            )
            self.abort("internal error")
            return
        pending.charged = ctx.charged
        pending.close_after = ctx.close_reason
        pending.done = True
        api_key = ctx.api_key
        if self._pending and self._pending[0] is not pending and pending.response is not None:
            pending.waiting = sum(map(len, pending.response))  # held until the earlier go
            self._waiting_bytes += pending.waiting
        if api_key != PRODUCE_KEY:
            self._serial = False
            if self._ready and not self._closing:
                self._dispatcher.ready(self)
        if started_ns:
            METRICS.produce_handled_ns += time.monotonic_ns() - started_ns
        if timed is None:
            self._flush()
            return
        if started_ns:
            METRICS.produce_loop_ns += timed.ns
            METRICS.produce_start_wait_ns += timed.first_ns - started_ns
            METRICS.produce_steps += timed.steps
        self._flush()
        loop_ns = timed.ns + clock() - after_ns
        by_api = METRICS.request_loop_ns
        by_api[api_key] = by_api.get(api_key, 0) + loop_ns
        counts = METRICS.request_count
        counts[api_key] = counts.get(api_key, 0) + 1

    # -- quotas -------------------------------------------------------------------------------
    def _record_produce(self, ctx: RequestContext, size: int) -> None:
        """Record a produce's bytes as it starts: Kafka handles one request of a connection
        at a time, so the one that goes over the quota mutes the connection before the next
        starts; here pipelined produces run together, so the mute must come at the start."""
        throttle = self._quotas.record(
            PRODUCER_BYTE_RATE, self._user, ctx.client_id or "", size, time.monotonic() * 1000
        )
        if throttle > 0:
            ctx.throttle_ms = throttle
            self.mute(throttle)

    def _throttle(
        self, ctx: RequestContext, pending: _Pending, response: Any, timed: _Timed | None
    ) -> Any:
        """Record the request's handling time against the client's request quota; if it, or
        the produce or fetch quota, went over, mute the connection for the throttle time and
        put it in the response's ``throttle_time_ms``."""
        quotas = self._quotas
        now_ms = time.monotonic() * 1000
        client_id = ctx.client_id or ""
        throttle = ctx.throttle_ms
        if timed is not None:
            percentage = timed.ns * _NANOS_TO_PERCENTAGE
            used = quotas.record(REQUEST_PERCENTAGE, self._user, client_id, percentage, now_ms)
            throttle = max(throttle, used)
        if throttle <= 0:
            return response
        self.mute(throttle)
        if isinstance(response, Encoded):  # the throttle time goes in: kio encodes it
            response = response.entity()
        if response is not None and hasattr(response, "throttle_time"):
            response = dataclasses.replace(
                response, throttle_time=datetime.timedelta(milliseconds=throttle)
            )
        return response

    def mute(self, throttle_ms: int) -> None:
        """Read and start nothing more of this connection for ``throttle_ms`` (KIP-219)."""
        until = time.monotonic() + throttle_ms / 1000
        if self._closing or until <= self._throttled_until:
            return
        self._throttled_until = until
        self._throttled = True
        if self._unmute is not None:
            self._unmute.cancel()
        self._unmute = asyncio.get_running_loop().call_later(throttle_ms / 1000, self._unmuted)
        self.update_reading()

    def _unmuted(self) -> None:
        self._unmute = None
        self._throttled = False
        if self._closing:
            return
        self.update_reading()
        if self._ready:
            self._dispatcher.ready(self)

    @property
    def throttled(self) -> bool:
        return self._throttled

    # -- responses and back-pressure ------------------------------------------------------------
    def _flush(self) -> None:
        """Send every finished response at the head of the queue, in arrival order."""
        transport = self._transport
        answered = released = 0
        while self._pending and self._pending[0].done:
            pending = self._pending.popleft()
            answered += pending.held
            released += pending.waiting
            if (
                pending.response is not None
                and transport is not None
                and not self._closing
                and not self._close_when_sent  # hung up: nothing after that request goes
            ):
                self._write(transport, pending.response)
                if not self._replica_link:  # a follower's fetch never waits out a debt:
                    # it moves the HW acks=all produces wait for (one request at a time)
                    uncharged = sum(map(len, pending.response)) - pending.charged
                    if uncharged > 0:
                        self.charge(uncharged, pending.header.api_key)
            elif pending.response is not None:
                _close_chunks(pending.response)
            if pending.close_after is not None:
                self.hang_up(pending.close_after)
        self.last_active = time.monotonic()
        if answered:
            self._budget.give_back(answered)
        if released:
            self._waiting_bytes -= released
            if self._ready and not self._closing:
                self._dispatcher.ready(self)  # it may start again (start_next)
        if self._decoder.buffered_bytes and not self._closing:
            self._take_frames()  # frames held back by queued.max.requests
        self.update_reading()

    # -- zero-copy sends ------------------------------------------------------------------------
    def _write(self, transport: asyncio.Transport, chunks: list[Any]) -> None:
        """Write a response's chunks in order: through the transport, or, once one is a
        segment range, through ``_out`` and ``_send_out``."""
        if not self._out:
            for i, chunk in enumerate(chunks):
                if type(chunk) is FileRange:
                    if i:
                        transport.writelines(chunks[:i])
                    chunks = chunks[i:]
                    break
            else:
                transport.writelines(chunks)
                return
        self._out.extend(chunks)
        self._out_bytes += sum(map(len, chunks))
        self._send_out()

    def _send_out(self) -> None:
        """Send what waits in ``_out``: bytes through the transport, a range with
        ``sendfile`` once the transport has nothing buffered (else wait for the socket to be
        writable and look again)."""
        transport = self._transport
        out = self._out
        while out:
            if self._closing or transport is None or transport.is_closing():
                self._drop_out()
                return
            item = out[0]
            if type(item) is not FileRange:
                plain = []
                while out and type(out[0]) is not FileRange:
                    chunk = out.popleft()
                    self._out_bytes -= len(chunk)
                    plain.append(chunk)
                transport.writelines(plain)
                continue
            if transport.get_write_buffer_size():
                self._wait_writable()  # the bytes before the range go first
                return
            before = item.sent
            try:
                if self._sendfile_ok:
                    if not item.send(self._socket_fd(), SENDFILE_CALL_BYTES):
                        self._count_zero_copy(item, before)  # the rest after other clients
                        self._wait_writable()
                        return
                else:
                    transport.write(item.read_rest(_COPY_BYTES))
                    METRICS.fetch_bytes_sent_copied += item.sent - before
                    self._out_bytes -= item.sent - before
                    if item.sent < item.length:
                        continue  # the transport's buffer tells when to go on
            except BlockingIOError:
                self._count_zero_copy(item, before)
                self._wait_writable()
                return
            except OSError as exc:
                self._count_zero_copy(item, before)
                if exc.errno in (errno.EINVAL, errno.ENOTSUP, errno.ENOSYS) and item.sent == 0:
                    log.info("sendfile to %s not possible (%s): copying", self._peer, exc)
                    self._sendfile_ok = False
                    continue
                if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                    log.info("client %s went away while records were sent: %s", self._peer, exc)
                else:
                    log.error("sending fetched records to %s failed: %s", self._peer, exc)
                self.abort("sending a fetch response failed")
                return
            if self._sendfile_ok:
                self._count_zero_copy(item, before)
            out.popleft()
            item.close()
        self._stop_waiting()
        self._release_send_fd()  # a descriptor per connection only while it sends
        if self._close_when_sent:
            self.close()
        else:
            self.update_reading()
            if self._ready:
                self._dispatcher.ready(self)

    def _send_writable(self) -> None:
        """The socket can take more of a range being sent (the loop's writability callback):
        send on, its time counted as the fetch's."""
        started = time.perf_counter_ns()
        self.receiving_since = time.monotonic()  # its client takes responses: not silent
        self._send_out()
        by_api = METRICS.request_loop_ns
        by_api[_FETCH_KEY] = by_api.get(_FETCH_KEY, 0) + time.perf_counter_ns() - started

    def _count_zero_copy(self, item: FileRange, before: int) -> None:
        moved = item.sent - before
        if moved and self._sendfile_ok:
            METRICS.fetch_bytes_sent_zero_copy += moved
            self._out_bytes -= moved

    def _socket_fd(self) -> int:
        """A duplicate of the socket's descriptor: ``sendfile`` goes to it, and the loop
        watches it for writability (the transport's own descriptor is the transport's; the
        duplicate is never reused for another file while this connection holds it)."""
        if self._send_fd < 0:
            assert self._transport is not None
            sock = self._transport.get_extra_info("socket")
            self._send_fd = os.dup(sock.fileno())
        return self._send_fd

    def _wait_writable(self) -> None:
        if not self._send_waiting:
            asyncio.get_running_loop().add_writer(self._socket_fd(), self._send_writable)
            self._send_waiting = True
        self.update_reading()

    def _stop_waiting(self) -> None:
        if self._send_waiting:
            self._send_waiting = False
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_writer(self._send_fd)

    def _drop_out(self) -> None:
        """The connection is gone: close the ranges that were still to be sent and the
        duplicate descriptor."""
        self._stop_waiting()
        _close_chunks(self._out)
        self._out.clear()
        self._out_bytes = 0
        self._release_send_fd()

    def _release_send_fd(self) -> None:
        """Close the socket's duplicate once nothing waits to be sent through it (no
        writability callback is registered on it then): an idle consumer's connection holds
        one descriptor, not two (the next range sent duplicates it again)."""
        if self._send_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._send_fd)
            self._send_fd = -1

    def update_reading(self) -> None:
        """Pause or resume reading from the socket as the back-pressure limits say."""
        if self._transport is None or self._closing:
            return
        budget = self._budget
        yields = self.yields
        should_pause = (
            yields
            or self._writing_paused
            or self._out_bytes + self._waiting_bytes > _OUT_PAUSE_BYTES
        )
        if (
            not should_pause
            and not self._replica_link
            and not budget.may_read(self, self._decoder.needs_growth, bool(self._pending))
        ):
            should_pause = True
            budget.waiting.add(self)
        elif self in budget.waiting:  # no longer waits for the budget: its silence is its own
            budget.waiting.discard(self)  # from now (budget.stalled_owner)
            self.receiving_since = time.monotonic()
        if yields != self._yielding:
            self._yielding = yields
            if yields and self in budget.partials:
                budget.recheck()  # it gives up owning the growth past the limit meanwhile
        if should_pause and not self._reading_paused:
            self._transport.pause_reading()
            self._reading_paused = True
        elif not should_pause and self._reading_paused:
            self._transport.resume_reading()
            self._reading_paused = False
            self.receiving_since = time.monotonic()

    @property
    def yields(self) -> bool:
        """Paused by the broker for a while it bounds: throttled for a quota, its produce held
        for split lag, or at queued.max.requests (budget.py: it does not own growth then)."""
        return self._held or self._throttled or len(self._pending) >= self._max_requests

    # -- closing ----------------------------------------------------------------------------
    @property
    def idle(self) -> bool:
        return not self._pending

    def release_buffer(self) -> None:
        """Give up the receive buffer if it holds nothing (a quiet connection: the listener's
        sweep); the next receive makes a new one."""
        if self._decoder.release_idle():
            self._sync_reservation()

    def abort(self, reason: str) -> None:
        if self._closing:
            return
        log.warning("closing connection from %s: %s", self._peer, reason)
        self._closing = True
        self._drop_out()
        if self._transport is not None:
            self._transport.abort()

    def hang_up(self, reason: str) -> None:
        """Close the connection as Kafka answers a request it will not answer otherwise (an
        acks=0 produce that failed: closing is the producer's only sign), once the responses
        written before are sent; logged."""
        if not self._closing:
            log.warning("closing connection from %s: %s", self._peer, reason)
        self.close()

    def close(self) -> None:
        """Close after the responses already queued have been written."""
        if self._out and not self._closing:
            self._close_when_sent = True  # a range is still being sent: close after it
            return
        if not self._closing:
            self._closing = True
            if self._transport is not None:
                self._transport.close()

    async def drain(self) -> None:
        """Wait for the requests in flight to be answered (used at shutdown)."""
        while (self._pending or self._out) and not self._closing:
            await asyncio.sleep(0.01)
