"""The dispatcher: starts the requests connections have decoded, fairly across connections,
and holds back produces while the splitter lags.

Fairness: a connection queues its decoded requests and asks to be served; a round starts one
request of every connection that has one ready (or a run of its pipelined produces, up to
1 MiB, so that they share a journal write), and rounds run once per event-loop iteration,
after the loop has read what arrived. A connection pipelining hundreds of requests therefore
delays another's request by one round, not by hundreds of requests (Kafka serves one request
per connection at a time). A connection whose transport is write-paused (a client that does
not read its responses) is skipped until it drains, so the broker never buffers more than a
transport's high-water mark of its responses. Within a connection requests start in arrival
order, and several may be in flight at once: pipelined produces still share group commits and
are appended in order (a produce handler assigns offsets before its first await).

Split lag: while more than ``splitter.max.lag.bytes`` of journal wait to be split, a Produce
(api key 0) is not started: it stays queued, its connection is held (stops reading), and
:meth:`Dispatcher.recheck`, called after each splitter step, releases the held connections
once the lag is back under the bound. Every other request goes on: consumers, heartbeats and
admin requests never wait for the splitter.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Protocol

PRODUCE_KEY = 0
# a turn may start a run of pipelined produces up to this many bytes: their appends then share
# a journal write (group commit), and a turn still costs about one CRC pass over 1 MiB
PRODUCE_TURN_BYTES = 1 << 20


class Served(Protocol):
    """A connection as the dispatcher sees it."""

    def start_next(self) -> tuple[int, int] | None:
        """Start the next ready request if it may start now: its (api key, size), else None
        (nothing ready, or it must wait; the connection asks to be served again when it can)."""
        ...

    @property
    def next_api_key(self) -> int | None:
        """The api key of the next ready request, if any."""
        ...

    def release(self) -> None:
        """The split lag is back under its bound: a held connection may start and read again."""
        ...


class Dispatcher:
    __slots__ = ("_lag", "_loop", "_max_lag_bytes", "_queued", "_ring", "_scheduled", "held")

    def __init__(self, lag: Callable[[], int] | None = None, max_lag_bytes: int = -1) -> None:
        self._lag = lag
        self._max_lag_bytes = max_lag_bytes  # -1: no limit
        self._ring: collections.deque[Served] = collections.deque()
        self._queued: set[Served] = set()
        self._scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.held: set[Served] = set()

    @property
    def produce_held(self) -> bool:
        """More journal waits to be split than ``splitter.max.lag.bytes`` allows."""
        return self._lag is not None and 0 <= self._max_lag_bytes < self._lag()

    def ready(self, conn: Served) -> None:
        """``conn`` has a request ready to start: serve it in the next round."""
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
        self.held.add(conn)

    def forget(self, conn: Served) -> None:
        self.held.discard(conn)
        if conn in self._queued:
            self._queued.discard(conn)
            self._ring.remove(conn)

    def recheck(self) -> None:
        """Release the held connections if the split lag is back under its bound."""
        if self.held and not self.produce_held:
            held, self.held = self.held, set()
            for conn in held:
                conn.release()

    def _round(self) -> None:
        """A turn for each connection in the ring, in ring order; the ones with more ready go
        to the back for the next round."""
        self._scheduled = False
        ring, queued = self._ring, self._queued
        for _ in range(len(ring)):
            conn = ring.popleft()
            queued.discard(conn)
            if self._turn(conn):
                self.ready(conn)

    @staticmethod
    def _turn(conn: Served) -> bool:
        """Start one request of ``conn``, or a run of produces up to PRODUCE_TURN_BYTES;
        True if it has more ready to start."""
        left = PRODUCE_TURN_BYTES
        while (started := conn.start_next()) is not None:
            api_key, size = started
            left -= size
            if api_key != PRODUCE_KEY or left <= 0 or conn.next_api_key != PRODUCE_KEY:
                return conn.next_api_key is not None
        return False
