"""Long-polling fetches waiting for the splitter: one waiter per waiting fetch, registered once
for its whole long poll and indexed by the partitions it reads, woken when the splitter
advances any of them (no timer per partition) with the set of those it advanced, so the fetch
measures only them; and the wait of a request that must see every acknowledged record
(:meth:`FetchWaiters.until_split`).

A single Kafka broker's high watermark is its log end as soon as a produce is acknowledged.
Here the splitter trails the journal by milliseconds, so a request that answers from the high
watermark (ListOffsets for latest, max timestamp or a time; DeleteRecords, whose bound and
whose -1 are the high watermark) first waits, at most ``ACKNOWLEDGED_WAIT_S`` for the whole
request, until the split reaches what was acknowledged when it arrived: a client that
produces and then asks for the end or deletes up to it sees its own records, as with Kafka.
A stalled splitter delays such an answer, never withholds it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stonemq.storage.engine import StorageEngine

ACKNOWLEDGED_WAIT_S = 1.0
"""Bound on a request's wait for the split to reach what was acknowledged (all its
partitions together)."""


class Waiter:
    """A waiting fetch's registration: the partitions it reads, and those the splitter advanced
    since it last looked (:meth:`FetchWaiters.woken`)."""

    __slots__ = ("future", "keys", "woken")

    def __init__(self, keys: list[tuple[str, int]]) -> None:
        self.keys = keys
        self.woken: set[tuple[str, int]] = set()
        self.future: asyncio.Future[None] | None = None

    def wake(self, key: tuple[str, int] | None) -> None:
        if key is not None:
            self.woken.add(key)
        future = self.future
        if future is not None and not future.done():
            future.set_result(None)


class FetchWaiters:
    def __init__(self) -> None:
        self._by_partition: dict[tuple[str, int], set[Waiter]] = {}
        self.closed = False

    def register(self, partitions: Iterable[tuple[str, int]]) -> Waiter:
        """A waiter for ``partitions``, registered until :meth:`unregister` (once for a
        whole long poll, however many times it wakes)."""
        waiter = Waiter(list(dict.fromkeys(partitions)))
        for key in waiter.keys:
            self._by_partition.setdefault(key, set()).add(waiter)
        return waiter

    def unregister(self, waiter: Waiter) -> None:
        for key in waiter.keys:
            waiters = self._by_partition.get(key)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._by_partition[key]

    async def woken(self, waiter: Waiter, timeout_s: float) -> set[tuple[str, int]]:
        """The partitions of ``waiter`` advanced since the last call, waiting up to
        ``timeout_s`` for one when none has (empty: the time passed, or shutdown)."""
        if not waiter.woken and not self.closed and timeout_s > 0:
            future = waiter.future = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(future, timeout_s)
            except TimeoutError:
                pass
            finally:
                waiter.future = None
        woken, waiter.woken = waiter.woken, set()
        return woken

    async def wait(self, partitions: Iterable[tuple[str, int]], timeout_s: float) -> None:
        """Return when one of ``partitions`` advances, at shutdown, or after ``timeout_s``."""
        if self.closed or timeout_s <= 0:
            return
        waiter = self.register(partitions)
        try:
            await self.woken(waiter, timeout_s)
        finally:
            self.unregister(waiter)

    async def until_split(
        self, storage: StorageEngine, topic: str, partition: int, deadline: float
    ) -> None:
        """Wait until the partition's high watermark (what is split) reaches its log end as of
        this call (what was acknowledged), or until ``deadline`` on the loop's clock (one per
        request: ``loop.time() + ACKNOWLEDGED_WAIT_S``). Raises what the storage raises for a
        partition not hosted here."""
        acknowledged = storage.log_end_offset(topic, partition)
        loop = asyncio.get_running_loop()
        while storage.high_watermark(topic, partition) < acknowledged and not self.closed:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            await self.wait([(topic, partition)], remaining)

    def notify(self, topic: str, partition: int, high_watermark: int) -> None:
        """The storage's SplitListener: wake every fetch waiting on (topic, partition)."""
        waiters = self._by_partition.get((topic, partition))
        if waiters:
            key = (topic, partition)
            for waiter in waiters:
                waiter.wake(key)

    def wake_all(self) -> None:
        self.closed = True
        for waiters in list(self._by_partition.values()):
            for waiter in waiters:
                waiter.wake(None)
        self._by_partition.clear()
