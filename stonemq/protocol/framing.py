"""Kafka framing, sans-IO: 4-byte big-endian length prefixes in, whole frames out.

The caller owns the socket. With asyncio's BufferedProtocol it receives straight into
:meth:`FrameDecoder.get_buffer` and reports with :meth:`FrameDecoder.buffer_updated`; tests call
:meth:`FrameDecoder.feed`. Work is linear in the bytes received: a frame is scanned once, the
buffer is compacted only when it is full and has a consumed head, and it grows geometrically.
A frame larger than ``max_frame_bytes`` (``socket.request.max.bytes``) is refused before any of
it is buffered.

Memory follows the bytes that arrive, not the length a peer announces: the buffer is made at
the first receive, at 64 KiB, and, full of one partly received frame, grows to at most twice
what it holds (or by one 64 KiB step), never past that frame's end. A length prefix announcing
100 MiB followed by a few bytes holds 64 KiB. What the buffer has grown beyond its first 64 KiB
is :attr:`FrameDecoder.reserved_bytes`, which the server counts against
``queued.max.request.bytes``; :attr:`FrameDecoder.needs_growth` says the next receive would grow.
A connection that has sent nothing holds no buffer, and :meth:`FrameDecoder.release_idle` gives
up an empty one (the server does so for connections quiet for a while): 20,000 idle
connections held 64 KiB each, 1.3 GB.
"""

from __future__ import annotations

import struct

_LENGTH = struct.Struct(">i")
_MIN_BUFFER = 64 * 1024
GROWTH_STEP = _MIN_BUFFER
_NO_BUFFER = bytearray()  # shared, never written: len 0, so get_buffer makes a real one


class FrameError(Exception):
    """The peer sent something that is not a valid frame; the connection must be closed."""


class FrameTooLargeError(FrameError):
    pass


class FrameDecoder:
    """Accumulates received bytes and yields complete frames (without their length prefix)."""

    __slots__ = ("_buf", "_end", "_max_frame_bytes", "_start")

    def __init__(self, max_frame_bytes: int) -> None:
        self._max_frame_bytes = max_frame_bytes
        self._buf = _NO_BUFFER  # made at the first receive (get_buffer)
        self._start = 0  # first unconsumed byte
        self._end = 0  # one past the last received byte

    @property
    def buffered_bytes(self) -> int:
        return self._end - self._start

    @property
    def reserved_bytes(self) -> int:
        """Bytes of buffer beyond the first 64 KiB (held for a frame larger than that)."""
        return max(0, len(self._buf) - _MIN_BUFFER)

    @property
    def holds_buffer(self) -> bool:
        return bool(self._buf)

    def release_idle(self) -> bool:
        """Give up the buffer if it holds nothing (the next receive makes a new one); True if
        one was given up."""
        if not self._buf or self._end != self._start:
            return False
        self._buf = _NO_BUFFER
        self._start = self._end = 0
        return True

    @property
    def needs_growth(self) -> bool:
        """The buffer is full of one frame still arriving: the next receive grows it."""
        if self._start or self._end < len(self._buf) or not self._buf:
            return False
        (length,) = _LENGTH.unpack_from(self._buf, 0)
        return 4 + length > self._end

    def get_buffer(self, size_hint: int = -1) -> memoryview:
        """A writable region to receive into; it always has room for at least one byte."""
        if self._end == len(self._buf):
            self._make_room()
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes

    def feed(self, data: bytes) -> None:
        """Copy ``data`` in (for callers that receive bytes objects, and for tests)."""
        view = memoryview(data)
        while view:
            target = self.get_buffer(len(view))
            n = min(len(target), len(view))
            target[:n] = view[:n]
            self.buffer_updated(n)
            view = view[n:]

    def next_frame(self) -> bytes | memoryview | None:
        """The next complete frame, or None if more bytes are needed.

        A frame that starts at the buffer's head and fills at least half of it (a frame the
        buffer grew for, or one of 32 KiB or more) is handed out without a copy: a read-only
        view of the buffer, which the decoder then gives up for a new one (the bytes after the
        frame are copied into it). Nothing writes into a given-up buffer again, so the view
        is immutable; a request's record batches can stay views of it until they are written
        (stonemq.protocol.produce_request), and the request is one allocation, freed whole.
        Smaller frames are copied out as ``bytes``.

        Raises :class:`FrameTooLargeError` or :class:`FrameError` for a length that cannot be
        valid; the decoder is unusable afterwards.
        """
        available = self._end - self._start
        if available < 4:
            self._release()
            return None
        length = self._frame_length()
        if available < 4 + length:
            return None
        begin = self._start + 4
        end = begin + length
        buf = self._buf
        if begin == 4 and 2 * end >= len(buf):
            rest = self._end - end
            # the next receive makes a new buffer when nothing follows the frame
            self._buf = bytearray(max(_MIN_BUFFER, rest + GROWTH_STEP)) if rest else _NO_BUFFER
            if rest:
                self._buf[:rest] = memoryview(buf)[end : self._end]
            self._start, self._end = 0, rest
            return memoryview(buf)[4:end].toreadonly()
        frame = bytes(memoryview(buf)[begin:end])
        self._start = end
        self._release()
        return frame

    def _frame_length(self) -> int:
        (length,) = _LENGTH.unpack_from(self._buf, self._start)
        if length < 0:
            raise FrameError(f"negative frame length {length}")
        if length > self._max_frame_bytes:
            raise FrameTooLargeError(
                f"frame of {length} bytes exceeds socket.request.max.bytes "
                f"({self._max_frame_bytes})"
            )
        return length

    def _release(self) -> None:
        """Rewind an empty buffer; give a grown buffer back once it is more than twice what it
        holds (plus a step), copying what it holds into one that fits: memory keeps following
        the bytes buffered, and the copies halve each time, so they stay linear."""
        pending = self._end - self._start
        if not pending:
            self._start = self._end = 0
        if len(self._buf) > max(_MIN_BUFFER, 2 * pending + GROWTH_STEP):
            small = bytearray(max(_MIN_BUFFER, pending + GROWTH_STEP))
            small[:pending] = memoryview(self._buf)[self._start : self._end]
            self._buf = small
            self._start, self._end = 0, pending

    def _make_room(self) -> None:
        """Room for more bytes in a full buffer: compact a consumed head away, else grow.

        Growing allocates a new buffer rather than resizing in place (the event loop may still
        hold a view of the old one), to at most twice what has arrived (at least one step
        more), and never past the end of the frame at the head once its length is known.
        """
        pending = self._end - self._start
        if not self._buf:  # the first receive, or the first since release_idle
            self._buf = bytearray(_MIN_BUFFER)
            self._start = self._end = 0
            return
        if self._start:
            self._buf[:pending] = memoryview(self._buf)[self._start : self._end]
            self._start, self._end = 0, pending
            return
        wanted = max(2 * pending, pending + GROWTH_STEP)
        if self.needs_growth:  # else complete frames wait to be taken: one step
            (length,) = _LENGTH.unpack_from(self._buf, 0)
            wanted = min(wanted, 4 + length)
        grown = bytearray(wanted)
        grown[:pending] = memoryview(self._buf)[:pending]
        self._buf = grown
