"""Long-polling fetches waiting for the splitter: one future per waiting fetch, indexed by the
partitions it reads, woken when the splitter advances any of them (no timer per partition);
and the wait of a request that must see every acknowledged record (:meth:`FetchWaiters.
until_split`).

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


class FetchWaiters:
    def __init__(self) -> None:
        self._by_partition: dict[tuple[str, int], set[asyncio.Future[None]]] = {}
        self.closed = False

    async def wait(self, partitions: Iterable[tuple[str, int]], timeout_s: float) -> None:
        """Return when one of ``partitions`` advances, at shutdown, or after ``timeout_s``."""
        if self.closed or timeout_s <= 0:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        keys = list(dict.fromkeys(partitions))
        for key in keys:
            self._by_partition.setdefault(key, set()).add(future)
        try:
            await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            pass
        finally:
            for key in keys:
                waiters = self._by_partition.get(key)
                if waiters is not None:
                    waiters.discard(future)
                    if not waiters:
                        del self._by_partition[key]

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
        waiters = self._by_partition.pop((topic, partition), None)
        if waiters:
            for future in waiters:
                if not future.done():
                    future.set_result(None)

    def wake_all(self) -> None:
        self.closed = True
        for waiters in list(self._by_partition.values()):
            for future in waiters:
                if not future.done():
                    future.set_result(None)
        self._by_partition.clear()
