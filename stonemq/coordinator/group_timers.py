"""One timer queue for every group timeout (sessions, rebalances, syncs, initial delays, retention).

No task or thread per member or per group: timers are entries in one heap, ordered by deadline.
Cancelling marks an entry dead; dead entries are dropped when they reach the top. The broker
runs one asyncio task (:class:`TimerDriver` in ``group_store``) that sleeps until
:meth:`TimerQueue.next_deadline` and calls :meth:`TimerQueue.fire_due`; tests call
``fire_due`` themselves after moving a :class:`~stonemq.coordinator.group_state.ManualClock`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from stonemq.coordinator.group_state import Clock


class Timer:
    __slots__ = ("callback", "cancelled", "deadline_ms")

    def __init__(self, deadline_ms: int, callback: Callable[[], None]) -> None:
        self.deadline_ms = deadline_ms
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class TimerQueue:
    def __init__(self, clock: Clock, on_earlier: Callable[[], None] | None = None) -> None:
        self.clock = clock
        self.on_earlier = on_earlier  # told when a new deadline comes before all others
        self._heap: list[tuple[int, int, Timer]] = []
        self._seq = itertools.count()

    def schedule(self, deadline_ms: int, callback: Callable[[], None]) -> Timer:
        timer = Timer(deadline_ms, callback)
        earliest = self._heap[0][0] if self._heap else None
        heapq.heappush(self._heap, (deadline_ms, next(self._seq), timer))
        if self.on_earlier is not None and (earliest is None or deadline_ms < earliest):
            self.on_earlier()
        return timer

    def now_ms(self) -> int:
        """Now on the queue's clock, which every deadline is on (a monotonic one in the
        broker: :class:`~stonemq.coordinator.group_state.MonotonicClock`)."""
        return self.clock.now_ms()

    def after(self, delay_ms: int, callback: Callable[[], None]) -> Timer:
        return self.schedule(self.clock.now_ms() + delay_ms, callback)

    def next_deadline(self) -> int | None:
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def fire_due(self) -> int:
        """Run every live timer whose deadline has passed, earliest first; how many ran."""
        fired = 0
        now = self.clock.now_ms()
        while self._heap and self._heap[0][0] <= now:
            _, _, timer = heapq.heappop(self._heap)
            if timer.cancelled:
                continue
            timer.cancelled = True
            timer.callback()
            fired += 1
        return fired

    def __len__(self) -> int:
        return sum(1 for _, _, t in self._heap if not t.cancelled)
