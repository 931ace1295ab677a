"""FrameDecoder: frames come out whole and in order however the bytes are chunked."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stonemq.protocol.framing import GROWTH_STEP, FrameDecoder, FrameError, FrameTooLargeError


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


def test_an_announced_length_reserves_nothing_until_its_bytes_arrive() -> None:
    """A prefix announcing 100 MiB and a few bytes: the buffer stays at its first 64 KiB
    (it used to be grown to the announced size at once)."""
    decoder = FrameDecoder(max_frame_bytes=200 << 20)
    decoder.feed(struct.pack(">i", 100 << 20) + b"\x00\x03\x00\x0c")
    assert decoder.next_frame() is None
    decoder.get_buffer()
    assert decoder.reserved_bytes == 0 and not decoder.needs_growth


@given(
    lengths=st.lists(st.integers(0, 400_000), min_size=1, max_size=6),
    cuts=st.lists(st.integers(1, 150_000), max_size=60),
)
def test_the_buffer_follows_the_bytes_that_arrived(lengths: list[int], cuts: list[int]) -> None:
    """Whatever the frame sizes and chunking: never more than twice the bytes held plus a
    step (or the first 64 KiB), never grown past the frame at its head, frames intact."""
    bodies = [bytes([i % 251]) * n for i, n in enumerate(lengths)]
    stream = b"".join(_frame(b) for b in bodies)
    decoder = FrameDecoder(max_frame_bytes=1 << 20)
    out: list[bytes] = []
    pos = 0
    for cut in [*cuts, len(stream)]:
        chunk = stream[pos : pos + cut]
        pos += len(chunk)
        decoder.feed(chunk)
        while (frame := decoder.next_frame()) is not None:
            out.append(frame)
        held = decoder.buffered_bytes
        size = decoder.reserved_bytes + 64 * 1024
        assert size <= max(64 * 1024, 2 * held + GROWTH_STEP), (size, held)
        if pos >= len(stream):
            break
    assert out == bodies
    assert decoder.reserved_bytes == 0


def test_a_full_buffer_of_one_frame_needs_growth_and_grows_geometrically() -> None:
    size = 4 + (5 << 20)
    decoder = FrameDecoder(max_frame_bytes=10 << 20)
    decoder.feed(struct.pack(">i", size - 4))
    sizes = []
    frame = None
    while frame is None:
        view = decoder.get_buffer()
        sizes.append(decoder.reserved_bytes + 64 * 1024)
        decoder.buffer_updated(min(len(view), size - decoder.buffered_bytes))
        assert decoder.needs_growth == (decoder.buffered_bytes < size)
        frame = decoder.next_frame()
    assert len(frame) == size - 4 and decoder.reserved_bytes == 0
    distinct = sorted(set(sizes))
    assert distinct[-1] == size  # never past the frame's end
    assert len(distinct) <= 8  # doubling: 64 KiB .. 5 MiB in a few steps


@given(
    lengths=st.lists(st.integers(0, 300_000), min_size=2, max_size=6),
    cuts=st.lists(st.integers(1, 150_000), max_size=60),
)
def test_a_frame_handed_out_without_a_copy_never_changes(
    lengths: list[int], cuts: list[int]
) -> None:
    """A frame filling at least half the buffer from its head comes out as a read-only view of
    a buffer the decoder gives up: receiving the frames after it never writes into it."""
    bodies = [bytes([(i * 37 + 1) % 251]) * n for i, n in enumerate(lengths)]
    stream = b"".join(_frame(b) for b in bodies)
    decoder = FrameDecoder(max_frame_bytes=1 << 20)
    out: list[bytes | memoryview] = []
    pos = 0
    for cut in [*cuts, len(stream)]:
        view = decoder.get_buffer()
        chunk = stream[pos : pos + min(cut, len(view))]
        view[: len(chunk)] = chunk
        decoder.buffer_updated(len(chunk))
        pos += len(chunk)
        while (frame := decoder.next_frame()) is not None:
            out.append(frame)
        if pos >= len(stream):
            if decoder.buffered_bytes:
                continue
            break
    while pos < len(stream):  # the cuts ran out: the rest in buffer-sized receives
        view = decoder.get_buffer()
        chunk = stream[pos : pos + len(view)]
        view[: len(chunk)] = chunk
        decoder.buffer_updated(len(chunk))
        pos += len(chunk)
        while (frame := decoder.next_frame()) is not None:
            out.append(frame)
    assert out == bodies
    views = [f for f in out if isinstance(f, memoryview)]
    assert all(v.readonly for v in views)
    assert len({id(v.obj) for v in views}) == len(views)  # each its own buffer
    if any(n > 64 * 1024 for n in lengths):
        assert views  # a frame larger than the first buffer is never copied out


def test_a_buffer_is_made_at_the_first_receive_and_an_empty_one_can_be_given_up() -> None:
    """A decoder holds no buffer until it receives; release_idle gives up an empty buffer (not
    one holding part of a frame), and decoding goes on as before with a new one."""
    dec = FrameDecoder(1 << 20)
    assert not dec.holds_buffer and dec.reserved_bytes == 0 and not dec.needs_growth
    assert dec.next_frame() is None
    dec.feed(_frame(b"one") + _frame(b"tw"))
    assert dec.holds_buffer
    assert dec.release_idle() is False  # holds two frames
    assert bytes(dec.next_frame() or b"") == b"one"
    assert bytes(dec.next_frame() or b"") == b"tw"
    assert dec.release_idle() is True and not dec.holds_buffer
    dec.feed(_frame(b"x" * 100)[:50])  # part of a frame: kept
    assert dec.release_idle() is False and dec.holds_buffer
    dec.feed(_frame(b"x" * 100)[50:])
    assert bytes(dec.next_frame() or b"") == b"x" * 100
    big = _frame(b"y" * 200_000)  # handed out as a view: nothing left, no buffer kept
    dec.feed(big)
    assert bytes(dec.next_frame() or b"") == b"y" * 200_000
    assert not dec.holds_buffer
    dec.feed(_frame(b"after"))
    assert bytes(dec.next_frame() or b"") == b"after"
