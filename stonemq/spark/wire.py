"""The blocking sockets of the Spark source's and sink's own Kafka clients (the Fetch range
read, the sink's producer): a connection with Nagle off, and one response frame read whole."""

from __future__ import annotations

import socket
import struct

_I32 = struct.Struct(">i")


def connect(address: tuple[str, int], timeout_s: float) -> socket.socket:
    sock = socket.create_connection(address, timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_exactly(sock: socket.socket, n: int) -> bytearray:
    """``n`` bytes; OSError when the broker closes the connection first."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if not k:
            raise OSError("the broker closed the connection")
        got += k
    return buf


def read_frame(sock: socket.socket) -> bytearray:
    """One response frame without its length prefix; OSError for a length below 4 (no
    correlation id)."""
    (size,) = _I32.unpack(read_exactly(sock, 4))
    if size < 4:
        raise OSError(f"a response frame of {size} bytes")
    return read_exactly(sock, size)
