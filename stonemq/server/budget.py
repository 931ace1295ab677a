"""The request budget: bytes of requests held over every connection against
``queued.max.request.bytes``, with the rule that decides which connection may read on.

Two kinds of bytes count. Requests in flight count from their decoding until their response
is handed to the transport (a client such as librdkafka keeps up to a million produce
requests in flight). Buffer space held for a frame still arriving, beyond the 64 KiB every
connection receives into, counts as that connection's reservation (``FrameDecoder.
reserved_bytes``): a peer that announces 100 MiB and sends slowly is charged for what it
has sent, not for what it announced.

A connection with requests of its own in flight reads on while the requests in flight over
every connection are under the limit; one with none in flight always may read into the buffer
it has, so one client's backlog (say a throttled producer's pipelined requests) never stops the
others. Past the limit that lets in one receive (into 64 KiB, or what its buffer already
counts as reserved) and one request decoded from it per connection with nothing in flight
(Kafka's network threads read one request per connection at a time); the rest waits in the
buffer.

To grow its buffer for a frame still arriving, the reservations count too: past the limit only
the owner may grow. The owner is the connection whose partial frame started first, passing
over those the broker has paused for a while it bounds (throttled for a quota, held for split
lag, at ``queued.max.requests``: each ``yields`` meanwhile) as long as what they hold stays
under the limit; so the reservations past the limit stay under about twice the limit and one
frame. The others wait until the owner has its whole frame (it then goes to the back of the
line), or is closed, or the total falls back under the limit. An owner may always grow, unless
requests of its own are in flight past the limit (those are answered without any read), so
nothing deadlocks, and small requests (consumers, heartbeats, admin) are never held back by
partial frames alone. An owner whose peer stops sending (or sends a byte now and then), or
stops reading its responses so that the broker stops reading it, would still hold the others'
large requests back: one that has received less than ``OWNER_PROGRESS_BYTES`` in
``PARTIAL_STALL_S`` while others wait, and neither waits for the budget nor yields, is closed
(:meth:`RequestBudget.stalled_owner`; the listener checks every second).
The clock restarts when the connection may read again and when its client takes responses (a
slow reader of large responses is not silent).
"""

from __future__ import annotations

from typing import Protocol

PARTIAL_STALL_S = 5.0
OWNER_PROGRESS_BYTES = 64 * 1024
"""What a connection must receive for its clock to restart (``Reader.receiving_since``): a
peer that trickles a byte now and then into a frame past the limit holds the others' large
requests back as surely as a silent one (an independent campaign: 6 MiB of a 90 MiB frame,
then a byte every 2 s, stopped every other large produce for good)."""


class Reader(Protocol):
    """What the budget wakes: a connection that re-evaluates whether it may read."""

    # monotonic time its last OWNER_PROGRESS_BYTES were received by, or of when it last
    # resumed reading if later
    receiving_since: float

    @property
    def yields(self) -> bool:
        """Paused by the broker for a while the broker bounds (a quota's throttle, a split-lag
        hold, queued.max.requests): it gives up owning the growth past the limit meanwhile."""
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
        """Requests in flight are at the limit: connections with some of their own stop reading."""
        used = self.in_flight_bytes
        return used > 0 and 0 <= self.limit_bytes <= used

    @property
    def owner(self) -> Reader | None:
        """The first partial frame's connection that does not yield, passing over yielding ones
        only while what they hold stays under the limit (else connections that grow, then
        yield, could each hold a whole frame past it): then the yielding one stays the owner
        and the others wait until it reads again."""
        limit = self.limit_bytes
        passed = 0
        for conn, held in self.partials.items():
            if not conn.yields:
                return conn
            passed += held
            if 0 <= limit <= passed:
                return conn
        return None

    def may_read(self, conn: Reader, growing: bool, busy: bool) -> bool:
        """Whether ``conn`` may read on; ``growing``: its buffer is full of a frame still
        arriving, so its next receive grows the buffer (the frame counts as started from the
        first time it asks); ``busy``: it has requests of its own in flight."""
        if growing:
            self.partials.setdefault(conn, 0)
        if busy and self.exhausted:
            return False
        limit = self.limit_bytes
        if not growing or limit < 0 or self.used_bytes < limit:
            return True
        return self.owner is conn

    def frame_taken(self, conn: Reader) -> None:
        """``conn``'s frame at the head arrived whole: if it still holds buffer for the next
        one, that frame goes to the back of the line."""
        held = self.partials.pop(conn, None)
        if held is not None:
            self.partials[conn] = held
            self.recheck()  # the next in line may own now

    def stalled_owner(self, now: float, stall_s: float = PARTIAL_STALL_S) -> Reader | None:
        """The owner, if others wait, neither the budget nor a while of the broker's pauses it
        (it does not wait, nor yield), and it has received less than ``OWNER_PROGRESS_BYTES``
        in ``stall_s``."""
        owner = self.owner
        if owner is None or not self.waiting or owner in self.waiting or owner.yields:
            return None
        return owner if now - owner.receiving_since >= stall_s else None

    def reserve(self, conn: Reader, nbytes: int) -> None:
        """``conn`` now holds ``nbytes`` of buffer beyond its first 64 KiB (0: none)."""
        before = self.partials.get(conn, 0)
        self.reserved_bytes += nbytes - before
        left = False
        if nbytes:
            self.partials[conn] = nbytes  # an existing key keeps its place
        else:  # it leaves the line, whatever it held (maybe 0): the next may own now
            left = self.partials.pop(conn, None) is not None
        if left or nbytes < before:
            self.recheck()

    def forget(self, conn: Reader) -> None:
        """``conn`` is gone: drop its reservation and its place in line (the next may own now,
        even if ``conn`` held nothing yet past its first 64 KiB) and stop waking it."""
        self.waiting.discard(conn)
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
