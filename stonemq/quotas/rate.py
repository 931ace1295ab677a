"""The sampled rate a quota is enforced against, and the throttle time of a violation, as
Kafka's metrics compute them (``SampledStat``/``Rate`` and ``QuotaUtils.throttleTime``).

A rate keeps ``quota.window.num`` samples of ``quota.window.size.seconds`` each (plus one
that may overlap the window's start). A value is added to the current sample, a new sample
starts once the current one is a window old, and samples without an event for the whole
monitored span are reset. The rate is the sum of the samples over the elapsed time since the
oldest sample started, but never less than ``num - 1`` full windows: a fresh client may
therefore send up to ``(num - 1) * size * quota`` before its first throttle, as on Kafka.

Pure: times are passed in (milliseconds, monotonic), nothing here reads a clock.
"""

from __future__ import annotations


class SampledRate:
    """Kafka's ``Rate`` over a ``SampledStat`` of sums (``num_samples`` windows of
    ``window_ms``). Values are per second."""

    __slots__ = ("_current", "_last", "_max", "_starts", "_values", "last_record_ms", "window_ms")

    def __init__(self, num_samples: int, window_ms: int) -> None:
        if num_samples < 1 or window_ms < 1:
            raise ValueError("a rate needs at least one sample of at least 1 ms")
        self._max = num_samples + 1  # one extra for the sample overlapping the window start
        self.window_ms = window_ms
        self._starts: list[float] = []
        self._last: list[float] = []  # each sample's last event time
        self._values: list[float] = []
        self._current = 0
        self.last_record_ms = 0.0

    @property
    def num_samples(self) -> int:
        return self._max - 1

    def record(self, value: float, now_ms: float) -> None:
        if not self._starts:
            self._new_sample(now_ms)
        i = self._current
        if now_ms - self._starts[i] >= self.window_ms:
            i = self._advance(now_ms)
        self._values[i] += value
        self._last[i] = now_ms
        self.last_record_ms = now_ms

    def _new_sample(self, now_ms: float) -> None:
        self._starts.append(now_ms)
        self._last.append(now_ms)
        self._values.append(0.0)

    def _advance(self, now_ms: float) -> int:
        self._current = (self._current + 1) % self._max
        i = self._current
        if i >= len(self._starts):
            self._new_sample(now_ms)
        else:
            self._starts[i] = self._last[i] = now_ms
            self._values[i] = 0.0
        return i

    def _purge(self, now_ms: float) -> None:
        expire = self.num_samples * self.window_ms
        for i in range(len(self._starts)):
            if now_ms - self._last[i] >= expire:
                self._starts[i] = self._last[i] = now_ms
                self._values[i] = 0.0

    def window_size_ms(self, now_ms: float) -> float:
        """The span the rate divides by: since the oldest sample started, at least
        ``num - 1`` whole windows (and at least 1 ms)."""
        self._purge(now_ms)
        if not self._starts:
            self._new_sample(now_ms)
        elapsed = now_ms - min(self._starts)
        full = int(elapsed // self.window_ms)
        least = self.num_samples - 1
        if full < least:
            elapsed += (least - full) * self.window_ms
        return max(elapsed, 1.0)

    def total(self, now_ms: float) -> float:
        self._purge(now_ms)
        return sum(self._values)

    def measure(self, now_ms: float) -> float:
        """The rate per second at ``now_ms``."""
        window = self.window_size_ms(now_ms)
        return sum(self._values) / (window / 1000.0)


def throttle_time_ms(rate: SampledRate, bound: float, now_ms: float) -> int:
    """How long the client must wait for ``rate`` to fall back to ``bound`` if it records
    nothing more, 0 when it is within it: (observed - bound) / bound * window (Kafka's
    ``QuotaUtils.throttleTime``: with observed O over window W, the wait X gives
    O * W / (W + X) = bound)."""
    window = rate.window_size_ms(now_ms)
    observed = sum(rate._values) / (window / 1000.0)
    if observed <= bound:
        return 0
    return round((observed - bound) / bound * window)
