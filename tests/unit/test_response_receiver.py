"""The follower's receive path (stonemq/replication/fetcher.py ``ResponseReceiver``): a
leader's responses are received straight into one buffer and handed out as views; the buffer
is written again only once no view of it is left, and grows with what arrives, not with what
a length announces."""

from __future__ import annotations

import asyncio
import struct

import pytest

from stonemq.protocol.replica_fetch import MalformedReplicaFetch
from stonemq.replication.fetcher import ResponseReceiver


def _frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def _feed(r: ResponseReceiver, data: bytes, step: int) -> None:
    """What the transport does: receive into get_buffer, at most ``step`` bytes a time."""
    view = memoryview(data)
    while view:
        target = r.get_buffer(-1)
        n = min(len(target), len(view), step)
        target[:n] = view[:n]
        r.buffer_updated(n)
        view = view[n:]


@pytest.mark.parametrize("step", [1, 997, 65_536, 1 << 22])
def test_frames_across_and_within_receives(step: int) -> None:
    big = 3_000 if step == 1 else 300_000
    bodies = [b"a" * 10, bytes(range(256)) * (big // 300), b"z", bytes(big)]

    async def run() -> None:
        r = ResponseReceiver(MalformedReplicaFetch)
        _feed(r, b"".join(_frame(b) for b in bodies), step)
        for body in bodies:
            got = await r.read_frame()
            assert got.readonly and bytes(got) == body
            del got

    asyncio.run(run())


def test_a_view_still_held_never_sees_its_bytes_change() -> None:
    """The buffer is reused for the next answer once the previous one's views are dropped
    (the steady state: no allocation, no copy); while a view lives, the next answer goes
    into a new buffer."""

    async def run() -> None:
        r = ResponseReceiver(MalformedReplicaFetch)
        first = bytes(range(200)) * 500
        _feed(r, _frame(first), 1 << 20)
        view = await r.read_frame()
        records = view[10:100]  # as decode_response slices the records
        del view
        _feed(r, _frame(b"\xff" * len(first)), 1 << 20)
        second = await r.read_frame()
        assert bytes(records) == first[10:100]  # untouched
        assert r.new_buffers == 1
        assert bytes(second) == b"\xff" * len(first)
        del records, second
        buf = r._buf
        _feed(r, _frame(b"x" * 1000), 1 << 20)
        assert bytes(await r.read_frame()) == b"x" * 1000
        assert r._buf is buf and r.new_buffers == 1  # reused: no view was left

    asyncio.run(run())


def test_the_buffer_follows_what_arrives_not_what_is_announced() -> None:
    async def run() -> None:
        r = ResponseReceiver(MalformedReplicaFetch)
        _feed(r, struct.pack(">i", 100 << 20) + bytes(70_000), 1 << 20)
        assert len(r._buf) <= 2 * 70_004 + 65_536
        r.connection_lost(None)
        with pytest.raises(asyncio.IncompleteReadError):
            await r.read_frame()

    asyncio.run(run())


@pytest.mark.parametrize("size", [0, -1, (1 << 30) + 1])
def test_a_length_out_of_range_is_refused(size: int) -> None:
    async def run() -> None:
        r = ResponseReceiver(MalformedReplicaFetch)
        _feed(r, struct.pack(">i", size) + b"abc", 100)
        with pytest.raises(MalformedReplicaFetch):
            await r.read_frame()

    asyncio.run(run())


def test_eof_before_a_whole_frame() -> None:
    async def run() -> None:
        r = ResponseReceiver(MalformedReplicaFetch)
        reading = asyncio.ensure_future(r.read_frame())
        await asyncio.sleep(0)
        _feed(r, _frame(b"abcdef")[:5], 100)
        await asyncio.sleep(0)
        assert not reading.done()
        r.eof_received()
        with pytest.raises(asyncio.IncompleteReadError):
            await reading

    asyncio.run(run())
