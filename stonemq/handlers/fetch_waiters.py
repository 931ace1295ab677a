"""Long-polling fetches waiting for the splitter: one future per waiting fetch, indexed by the
partitions it reads, woken when the splitter advances any of them (no timer per partition)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


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
