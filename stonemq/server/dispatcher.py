"""The dispatcher: shares the event loop fairly across connections, by requests and by bytes,
and holds back produces while the splitter lags.

Rounds: a connection queues its decoded requests and asks to be served; a round gives a turn
to every connection that has something ready, in ring order, and rounds run once per
event-loop iteration, after the loop has read what arrived. A turn starts one request (or a
run of pipelined produces, so that they share a journal write) and lets the connection's
handler steps that wait for a turn go on (a fetch reads its partitions in steps: see
:meth:`Served.wake_steps`). A connection pipelining hundreds of requests therefore delays
another's request by one round, not by hundreds of requests (Kafka serves one request per
connection at a time). A connection whose transport is write-paused (a client that does not
read its responses) is skipped until it drains, so the broker never buffers more than a
transport's high-water mark of its responses. Within a connection requests start in arrival
order, and several may be in flight at once: pipelined produces still share group commits and
are appended in order (a produce handler assigns offsets before its first await).

Bytes (deficit round robin): every turn gives the connection ``TURN_BYTES`` to spend, and
everything it moves is charged to it: the bytes of the requests it starts, the records its
fetches read (charged by the fetch handler as it reads, partition by partition) and the
bytes of its responses. A connection that spent more than its turn gave it (a fetch answered
with 4 MiB) is in debt and skips rounds until the debt is paid, one ``TURN_BYTES`` per round,
while the others are served; a connection's unspent allowance does not grow past one turn.
So a consumer catching up with several-MiB fetches gets the same bytes per round as a
producer sending 1 MiB of produces, and when nobody else has work, a connection in debt is
credited at once (the loop never idles for it). A follower's replica fetch connection is not
charged its responses (connection.py): its one fetch at a time moves the high watermark that
acks=all produces wait for.

Accounting: :attr:`Dispatcher.rounds` counts the rounds, and the most bytes one connection
moved within one round (:attr:`Dispatcher.most_in_a_round`, with its api key) is kept, and
logged at shutdown, so the bound can be checked on a running broker.

Split lag: while more than ``splitter.max.lag.bytes`` of journal wait to be split, a Produce
(api key 0) is not started: it stays queued, its connection is held (stops reading), and
:meth:`Dispatcher.recheck`, called after each splitter step, releases the held connections
once the lag is back under the bound. Every other request goes on: consumers, heartbeats and
admin requests never wait for the splitter.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import Protocol

from stonemq.server.metrics import METRICS

PRODUCE_KEY = 0
# bytes one turn gives a connection: a run of pipelined produces up to this many shares a
# journal write (group commit) and costs about one CRC pass over 1 MiB; a fetch reads about
# this much per turn
TURN_BYTES = 1 << 20


class Served(Protocol):
    """A connection as the dispatcher sees it."""

    # bytes it may still move in its current turn; negative: its debt
    allowance: int

    def start_next(self) -> tuple[int, int] | None:
        """Start the next ready request if it may start now: its (api key, size), else None
        (nothing ready, or it must wait; the connection asks to be served again when it can)."""
        ...

    @property
    def next_api_key(self) -> int | None:
        """The api key of the next ready request, if any."""
        ...

    def wake_steps(self) -> None:
        """Its turn came: the handler steps waiting for one (``Turns.wait``) go on."""
        ...

    def release(self) -> None:
        """The split lag is back under its bound: a held connection may start and read again."""
        ...


class Dispatcher:
    __slots__ = (
        "_in_round",
        "_lag",
        "_loop",
        "_max_lag_bytes",
        "_queued",
        "_ring",
        "_round_held",
        "_rounding",
        "_scheduled",
        "held",
        "most_in_a_round",
        "most_in_a_round_api",
        "rounds",
    )

    def __init__(self, lag: Callable[[], int] | None = None, max_lag_bytes: int = -1) -> None:
        self._lag = lag
        self._max_lag_bytes = max_lag_bytes  # -1: no limit
        self._ring: collections.deque[Served] = collections.deque()
        self._queued: set[Served] = set()
        self._scheduled = False
        self._rounding = False  # within _round
        self._round_held: bool | None = None  # produce_held as this round found it
        self._loop: asyncio.AbstractEventLoop | None = None
        # the connections held for split lag, with the monotonic ns each was held at
        self.held: dict[Served, int] = {}
        self.rounds = 0
        self._in_round: dict[Served, int] = {}  # bytes each connection moved this round
        self.most_in_a_round = 0  # the most bytes one connection moved within one round
        self.most_in_a_round_api = -1  # the api key of the request that moved the last of them

    @property
    def produce_held(self) -> bool:
        """More journal waits to be split than ``splitter.max.lag.bytes`` allows."""
        return self._lag is not None and 0 <= self._max_lag_bytes < self._lag()

    def produce_held_now(self) -> bool:
        """:attr:`produce_held`, looked at once per round (it sums the lag over the journal
        partitions) rather than once per Produce started: nothing a round does moves the
        lag, since the requests it starts run after it. Outside a round, looked at afresh."""
        if not self._rounding:
            return self.produce_held
        held = self._round_held
        if held is None:
            held = self._round_held = self.produce_held
        return held

    def ready(self, conn: Served) -> None:
        """``conn`` has a request or a handler step ready: serve it in the next round."""
        if conn in self._queued:
            return
        self._queued.add(conn)
        self._ring.append(conn)
        if not self._scheduled:
            self._scheduled = True
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self._round)

    def hold(self, conn: Served) -> None:
        """``conn``'s next request is a Produce and the splitter lags: wait for recheck()."""
        if conn not in self.held:
            self.held[conn] = time.monotonic_ns()
            METRICS.split_lag_holds += 1

    def forget(self, conn: Served) -> None:
        since = self.held.pop(conn, None)
        if since is not None:
            METRICS.split_lag_held_ns += time.monotonic_ns() - since
        self._in_round.pop(conn, None)
        if conn in self._queued:
            self._queued.discard(conn)
            self._ring.remove(conn)

    def recheck(self) -> None:
        """Release the held connections if the split lag is back under its bound."""
        if self.held and not self.produce_held:
            held, self.held = self.held, {}
            now = time.monotonic_ns()
            for conn, since in held.items():
                METRICS.split_lag_held_ns += now - since
                conn.release()

    def charge(self, conn: Served, nbytes: int, api_key: int) -> None:
        """``conn`` moved ``nbytes`` for a request of ``api_key``: taken from its allowance,
        and counted in what it moved within this round."""
        conn.allowance -= nbytes
        in_round = self._in_round.get(conn, 0) + nbytes
        self._in_round[conn] = in_round
        if in_round > self.most_in_a_round:
            self.most_in_a_round = in_round
            self.most_in_a_round_api = api_key

    def _round(self) -> None:
        """A turn for each connection in the ring that is not in debt, in ring order; the
        ones with more ready, and the ones still in debt, go to the back for the next round.
        When every one of them is in debt, they are credited again at once."""
        self._scheduled = False
        self._rounding = True
        try:
            self._rounds()
        finally:
            self._rounding = False
            self._round_held = None

    def _rounds(self) -> None:
        ring, queued = self._ring, self._queued
        waiting = len(ring)
        while waiting:
            self.rounds += 1
            self._in_round.clear()
            served = False
            for _ in range(waiting):
                conn = ring.popleft()
                queued.discard(conn)
                conn.allowance = min(conn.allowance + TURN_BYTES, TURN_BYTES)
                if conn.allowance <= 0:
                    self.ready(conn)  # still in debt: credited again next round
                elif self._turn(conn):
                    served = True
                    self.ready(conn)
                else:
                    served = True
            if served:
                return
            waiting = len(ring)  # nobody could go: no reason to wait a loop iteration

    def _turn(self, conn: Served) -> bool:
        """Wake ``conn``'s handler steps waiting for a turn and start one of its requests, or
        a run of produces while its allowance lasts; True if it has more ready to start."""
        conn.wake_steps()
        while conn.allowance > 0:
            started = conn.start_next()
            if started is None:
                return False  # nothing ready, or it must wait: it asks again itself
            api_key, size = started
            self.charge(conn, size, api_key)
            if api_key != PRODUCE_KEY or conn.next_api_key != PRODUCE_KEY:
                break
        return conn.next_api_key is not None
