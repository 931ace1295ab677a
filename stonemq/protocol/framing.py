"""Kafka framing, sans-IO: 4-byte big-endian length prefixes in, whole frames out.

The caller owns the socket. With asyncio's BufferedProtocol it receives straight into
:meth:`FrameDecoder.get_buffer` and reports with :meth:`FrameDecoder.buffer_updated`; tests call
:meth:`FrameDecoder.feed`. Work is linear in the bytes received: a frame is scanned once and
the buffer is compacted only when a frame has been taken out. A frame larger than
``max_frame_bytes`` (``socket.request.max.bytes``) is refused before any of it is buffered.
"""

from __future__ import annotations

import struct

_LENGTH = struct.Struct(">i")
_MIN_BUFFER = 64 * 1024


class FrameError(Exception):
    """The peer sent something that is not a valid frame; the connection must be closed."""


class FrameTooLargeError(FrameError):
    pass


class FrameDecoder:
    """Accumulates received bytes and yields complete frames (without their length prefix)."""

    __slots__ = ("_buf", "_end", "_max_frame_bytes", "_start")

    def __init__(self, max_frame_bytes: int) -> None:
        self._max_frame_bytes = max_frame_bytes
        self._buf = bytearray(_MIN_BUFFER)
        self._start = 0  # first unconsumed byte
        self._end = 0  # one past the last received byte

    @property
    def buffered_bytes(self) -> int:
        return self._end - self._start

    def get_buffer(self, size_hint: int = -1) -> memoryview:
        """A writable region to receive into; it always has room for at least one byte."""
        if self._end == len(self._buf):
            self._make_room(max(size_hint, 1))
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

    def next_frame(self) -> bytes | None:
        """The next complete frame, or None if more bytes are needed.

        Raises :class:`FrameTooLargeError` or :class:`FrameError` for a length that cannot be
        valid; the decoder is unusable afterwards.
        """
        available = self._end - self._start
        if available < 4:
            self._compact_if_empty()
            return None
        (length,) = _LENGTH.unpack_from(self._buf, self._start)
        if length < 0:
            raise FrameError(f"negative frame length {length}")
        if length > self._max_frame_bytes:
            raise FrameTooLargeError(
                f"frame of {length} bytes exceeds socket.request.max.bytes "
                f"({self._max_frame_bytes})"
            )
        if available < 4 + length:
            needed = 4 + length
            if self._start + needed > len(self._buf):
                self._make_room(needed - available)
            return None
        begin = self._start + 4
        frame = bytes(memoryview(self._buf)[begin : begin + length])
        self._start = begin + length
        self._compact_if_empty()
        return frame

    def _compact_if_empty(self) -> None:
        if self._start == self._end:
            self._start = self._end = 0
            if len(self._buf) > 4 * _MIN_BUFFER:
                self._buf = bytearray(_MIN_BUFFER)  # give a big frame's memory back

    def _make_room(self, extra: int) -> None:
        """Ensure room for ``extra`` more bytes after the buffered ones: compact, then grow.

        Growing allocates a new buffer rather than resizing in place: the event loop may
        still hold a view of the old one.
        """
        pending = self._end - self._start
        if len(self._buf) - pending >= extra:
            if self._start:
                self._buf[:pending] = self._buf[self._start : self._end]
                self._start, self._end = 0, pending
            return
        # Grow to what the pending frame needs (bounded by the frame limit + prefix).
        wanted = max(len(self._buf) * 2, pending + extra)
        wanted = min(wanted, max(self._max_frame_bytes + 4, pending + 1))
        grown = bytearray(wanted)
        grown[:pending] = self._buf[self._start : self._end]
        self._buf = grown
        self._start, self._end = 0, pending
