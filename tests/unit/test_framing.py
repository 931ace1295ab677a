"""FrameDecoder: frames come out whole and in order however the bytes are chunked."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stonemq.protocol.framing import FrameDecoder, FrameError, FrameTooLargeError


def _frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


@given(
    bodies=st.lists(st.binary(max_size=3000), max_size=20),
    cuts=st.lists(st.integers(min_value=1, max_value=5000), max_size=50),
)
def test_any_chunking_yields_the_same_frames(bodies: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(_frame(b) for b in bodies)
    decoder = FrameDecoder(max_frame_bytes=10_000)
    out: list[bytes] = []
    pos = 0
    for cut in [*cuts, len(stream)]:
        decoder.feed(stream[pos : pos + cut])
        pos += cut
        while (frame := decoder.next_frame()) is not None:
            out.append(frame)
        if pos >= len(stream):
            break
    assert out == bodies
    assert decoder.buffered_bytes == 0


def test_buffered_protocol_path_receives_into_the_buffer() -> None:
    decoder = FrameDecoder(max_frame_bytes=1 << 20)
    payload = _frame(b"x" * 200_000)  # larger than the initial buffer
    pos = 0
    frames = []
    while pos < len(payload):
        buf = decoder.get_buffer(65536)
        n = min(len(buf), len(payload) - pos)
        buf[:n] = payload[pos : pos + n]
        decoder.buffer_updated(n)
        pos += n
        while (frame := decoder.next_frame()) is not None:
            frames.append(frame)
    assert frames == [b"x" * 200_000]


def test_oversized_frame_is_refused_before_buffering() -> None:
    decoder = FrameDecoder(max_frame_bytes=1000)
    decoder.feed(struct.pack(">i", 2**31 - 1))
    with pytest.raises(FrameTooLargeError):
        decoder.next_frame()
    assert decoder.buffered_bytes == 4


def test_negative_length_is_a_frame_error() -> None:
    decoder = FrameDecoder(max_frame_bytes=1000)
    decoder.feed(struct.pack(">i", -5))
    with pytest.raises(FrameError):
        decoder.next_frame()


def test_frame_at_exactly_the_limit_is_accepted() -> None:
    decoder = FrameDecoder(max_frame_bytes=100)
    decoder.feed(_frame(b"a" * 100))
    assert decoder.next_frame() == b"a" * 100
