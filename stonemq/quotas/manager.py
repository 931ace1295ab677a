"""The broker's quota manager: the configured client quotas, one sampled rate per quota
entity in use, and the throttle time of each request that goes over its quota.

Three quota types are enforced, as Kafka's ``ClientQuotaManager`` (produce, fetch) and
``ClientRequestQuotaManager`` (request) do: ``producer_byte_rate`` on produce request bytes,
``consumer_byte_rate`` on fetch response bytes, ``request_percentage`` on the event-loop time
a request's handling took (100 = one whole thread). A client's quota is the most specific
configured one (:func:`~stonemq.quotas.entity.resolve`), and its rate is shared by the clients
the matched entity covers. ``controller_mutation_rate`` and the ``ip`` entity's
``connection_creation_rate`` are stored and described but not enforced (see README).

Zero cost when no quota of a type is configured: callers test ``produce_active`` /
``fetch_active`` / ``request_active`` (plain attributes) before calling anything.
Runs on the event loop only; :meth:`QuotaManager.update` replaces the configured quotas
(after an AlterClientQuotas, or when the store reports another broker's change) and takes
effect for the next request of every connection.
"""

from __future__ import annotations

from collections.abc import Mapping

from stonemq.quotas.entity import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    Entity,
    resolve,
)
from stonemq.quotas.rate import SampledRate, throttle_time_ms

_RESOLVED_CACHE_MAX = 10_000
# throttle_time_ms is an INT32 on the wire: a client far over a tiny quota is muted this long
MAX_THROTTLE_MS = 2**31 - 1


class QuotaManager:
    __slots__ = (
        "_last_sweep_ms",
        "_quotas",
        "_rates",
        "_resolved",
        "fetch_active",
        "num_samples",
        "produce_active",
        "request_active",
        "request_max_throttle_ms",
        "window_ms",
    )

    def __init__(self, num_samples: int = 11, window_seconds: int = 1) -> None:
        self.num_samples = num_samples
        self.window_ms = window_seconds * 1000
        # Kafka bounds a request-quota throttle to one window (ClientRequestQuotaManager)
        self.request_max_throttle_ms = self.window_ms
        self._quotas: dict[Entity, dict[str, float]] = {}
        self._rates: dict[tuple[str, str, str], SampledRate] = {}
        self._resolved: dict[tuple[str, str, str], tuple[tuple[str, str], float] | None] = {}
        self._last_sweep_ms = 0.0
        self.produce_active = self.fetch_active = self.request_active = False

    @property
    def quotas(self) -> dict[Entity, dict[str, float]]:
        return self._quotas

    def update(self, quotas: Mapping[Entity, Mapping[str, float]]) -> None:
        """Replace the configured quotas; live rates keep their samples."""
        self._quotas = {entity: dict(values) for entity, values in quotas.items() if values}
        keys = {key for values in self._quotas.values() for key in values}
        self.produce_active = PRODUCER_BYTE_RATE in keys
        self.fetch_active = CONSUMER_BYTE_RATE in keys
        self.request_active = REQUEST_PERCENTAGE in keys
        self._resolved.clear()

    def quota_of(self, key: str, user: str, client_id: str) -> tuple[tuple[str, str], float] | None:
        """The applicable quota of ``key`` for a client: (its rate's tags, the bound)."""
        cache_key = (key, user, client_id)
        try:
            return self._resolved[cache_key]
        except KeyError:
            pass
        found = resolve(self._quotas, key, user, client_id)
        if len(self._resolved) >= _RESOLVED_CACHE_MAX:
            self._resolved.clear()
        self._resolved[cache_key] = found
        return found

    def _rate(self, key: str, tags: tuple[str, str]) -> SampledRate:
        rate_key = (key, *tags)
        rate = self._rates.get(rate_key)
        if rate is None:
            rate = self._rates[rate_key] = SampledRate(self.num_samples, self.window_ms)
        return rate

    def record(self, key: str, user: str, client_id: str, value: float, now_ms: float) -> int:
        """Add ``value`` to the client's rate for ``key``: the throttle time in ms (0 when
        within its quota or when it has none)."""
        found = self.quota_of(key, user, client_id)
        if found is None:
            return 0
        tags, bound = found
        self._sweep(now_ms)
        rate = self._rate(key, tags)
        rate.record(value, now_ms)
        throttle = throttle_time_ms(rate, bound, now_ms)
        if key == REQUEST_PERCENTAGE:
            return min(throttle, self.request_max_throttle_ms)
        return min(throttle, MAX_THROTTLE_MS)

    def unrecord(self, key: str, user: str, client_id: str, value: float, now_ms: float) -> None:
        """Take back a value recorded for a response that was not sent (a throttled fetch
        answered empty)."""
        found = self.quota_of(key, user, client_id)
        if found is not None:
            self._rate(key, found[0]).record(-value, now_ms)

    def max_value_in_window(self, key: str, user: str, client_id: str) -> float | None:
        """The most that can be recorded at once without a certain throttle (Kafka's
        ``getMaxValueInQuotaWindow``: quota * (samples - 1) * window), None without a quota.
        A fetch reads at most this many bytes."""
        found = self.quota_of(key, user, client_id)
        if found is None:
            return None
        return found[1] * (self.num_samples - 1) * (self.window_ms / 1000)

    def _sweep(self, now_ms: float) -> None:
        """Drop the rates idle for the whole monitored span (all their samples would be reset
        at their next use, so a fresh one is the same): memory follows active clients."""
        span = self.num_samples * self.window_ms
        if now_ms - self._last_sweep_ms < span:
            return
        self._last_sweep_ms = now_ms
        idle = [k for k, rate in self._rates.items() if now_ms - rate.last_record_ms >= span]
        for k in idle:
            del self._rates[k]

    @property
    def live_rates(self) -> int:
        return len(self._rates)
