"""The request budget: bytes of requests held over every connection against
``queued.max.request.bytes``, with the rule that decides which connection may read on.

Two kinds of bytes count. Requests in flight count from their decoding until their response
is handed to the transport (a client such as librdkafka keeps up to a million produce
requests in flight). Buffer space held for a frame still arriving, beyond the 64 KiB every
connection receives into, counts as that connection's reservation (``FrameDecoder.
reserved_bytes``): a peer that announces 100 MiB and sends slowly is charged for what it
has sent, not for what it announced.

A connection reads into the buffer it has while the requests in flight are under the limit
(with nothing in flight one request is always let in). To grow its buffer for a frame still
arriving, the reservations count too: past the limit only the connection whose partial frame
started first (the owner) may read on, and the others wait until it has its whole frame or
the total falls back under the limit. The owner always may read, so nothing deadlocks, and
small requests (consumers, heartbeats, admin) are never held back by partial frames alone.
An owner whose peer stops sending would still hold the others' large requests back: one that
has received nothing for ``PARTIAL_STALL_S`` since it last could read, while others wait, is
closed (:meth:`RequestBudget.stalled_owner`; the listener checks every second).
"""

from __future__ import annotations

from typing import Protocol

PARTIAL_STALL_S = 5.0


class Reader(Protocol):
    """What the budget wakes: a connection that re-evaluates whether it may read."""

    # monotonic time of its last receive, or of when it last resumed reading if later
    receiving_since: float

    @property
    def reading(self) -> bool:
        """Not paused by the broker (for any reason): silence is then the peer's."""
        ...

    def update_reading(self) -> None: ...


class RequestBudget:
    __slots__ = ("in_flight_bytes", "limit_bytes", "partials", "reserved_bytes", "waiting")

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes  # -1: no limit
        self.in_flight_bytes = 0
        self.reserved_bytes = 0
        # connections whose partial frame needs (or holds) more than their first 64 KiB, in
        # the order those frames started (dicts keep insertion order): the first is the owner
        self.partials: dict[Reader, int] = {}
        self.waiting: set[Reader] = set()

    @property
    def used_bytes(self) -> int:
        return self.in_flight_bytes + self.reserved_bytes

    @property
    def exhausted(self) -> bool:
        """Requests in flight are at the limit: connections stop reading (one always may)."""
        used = self.in_flight_bytes
        return used > 0 and 0 <= self.limit_bytes <= used

    @property
    def owner(self) -> Reader | None:
        return next(iter(self.partials), None)

    def may_read(self, conn: Reader, growing: bool) -> bool:
        """Whether ``conn`` may read on; ``growing``: its buffer is full of a frame still
        arriving, so its next receive grows the buffer (the frame counts as started from the
        first time it asks). The owner always may."""
        if growing:
            self.partials.setdefault(conn, 0)
        if self.owner is conn:
            return True
        if self.exhausted:
            return False
        limit = self.limit_bytes
        return not growing or limit < 0 or self.used_bytes < limit

    def stalled_owner(self, now: float, stall_s: float = PARTIAL_STALL_S) -> Reader | None:
        """The owner, if others wait and it has been free to read for ``stall_s`` but has
        received nothing."""
        owner = self.owner
        if owner is None or not self.waiting or not owner.reading:
            return None
        return owner if now - owner.receiving_since >= stall_s else None

    def reserve(self, conn: Reader, nbytes: int) -> None:
        """``conn`` now holds ``nbytes`` of buffer beyond its first 64 KiB (0: none)."""
        before = self.partials.get(conn, 0)
        self.reserved_bytes += nbytes - before
        if nbytes:
            self.partials[conn] = nbytes  # an existing key keeps its place
        else:
            self.partials.pop(conn, None)
        if nbytes < before:
            self.recheck()

    def forget(self, conn: Reader) -> None:
        """``conn`` is gone: drop its reservation and stop waking it."""
        self.waiting.discard(conn)
        if conn in self.partials:
            self.reserve(conn, 0)

    def take(self, nbytes: int) -> None:
        self.in_flight_bytes += nbytes

    def give_back(self, nbytes: int) -> None:
        self.in_flight_bytes -= nbytes
        self.recheck()

    def recheck(self) -> None:
        """Wake the waiting connections if the limits may now let them read (each looks again
        and waits anew if not); the owner, if it waits, whatever the totals say."""
        if not self.waiting:
            return
        if not self.exhausted:
            waiting, self.waiting = self.waiting, set()
            for conn in waiting:
                conn.update_reading()
            return
        owner = self.owner
        if owner is not None and owner in self.waiting:
            self.waiting.discard(owner)
            owner.update_reading()
