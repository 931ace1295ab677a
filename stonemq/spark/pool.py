"""Idle confluent-kafka clients kept between the tasks of one Spark Python worker.

Spark reuses its Python workers (``spark.python.worker.reuse``, on by default), so a task of
the next micro-batch can take the producer or consumer the previous task used instead of
connecting again (ApiVersions, Metadata, InitProducerId: tens of milliseconds a task), as
Spark's Kafka connector caches its producers and consumers in the executor JVM. A client
serves one task at a time; one whose task failed is closed, not returned; one left idle
for :data:`IDLE_TIMEOUT_S` is closed by a daemon thread (like the connector's
``spark.kafka.producer.cache.timeout``), so a worker that stops getting tasks does not keep
connections, or reconnect attempts to a broker that went away, for its whole life.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

IDLE_TIMEOUT_S = 60.0
IDLE_PER_KEY = 4  # clients kept per configuration; more are closed when returned
_SWEEP_EVERY_S = 5.0


class ClientPool:
    """Idle clients by configuration key, with the time each was returned."""

    def __init__(self, close: Callable[[Any], None]) -> None:
        self._close = close
        self._idle: dict[Hashable, list[tuple[float, Any]]] = {}
        self._lock = threading.Lock()
        self._sweeper: threading.Thread | None = None

    def take(self, key: Hashable) -> Any | None:
        """An idle client for ``key`` (the most recently returned), or None."""
        with self._lock:
            idle = self._idle.get(key)
            return idle.pop()[1] if idle else None

    def give(self, key: Hashable, client: Any) -> None:
        """Keep ``client`` for the next task (closed instead when enough are idle)."""
        with self._lock:
            idle = self._idle.setdefault(key, [])
            keep = len(idle) < IDLE_PER_KEY
            if keep:
                idle.append((time.monotonic(), client))
                self._start_sweeper()
        if not keep:
            self._close(client)

    def sweep(self, now: float | None = None) -> int:
        """Close the clients idle for longer than :data:`IDLE_TIMEOUT_S`; returns how many."""
        now = time.monotonic() if now is None else now
        stale = []
        with self._lock:
            for key in list(self._idle):
                fresh = [(t, c) for t, c in self._idle[key] if now - t <= IDLE_TIMEOUT_S]
                stale += [c for t, c in self._idle[key] if now - t > IDLE_TIMEOUT_S]
                if fresh:
                    self._idle[key] = fresh
                else:
                    del self._idle[key]
        for client in stale:
            self._close(client)
        return len(stale)

    def idle(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._idle.values())

    def _start_sweeper(self) -> None:  # under the lock
        if self._sweeper is not None and self._sweeper.is_alive():
            return
        self._sweeper = threading.Thread(target=self._sweep_loop, name="stonemq-pool", daemon=True)
        self._sweeper.start()

    def _sweep_loop(self) -> None:
        while True:
            time.sleep(_SWEEP_EVERY_S)
            self.sweep()
            if not self.idle():
                with self._lock:
                    if not self._idle:  # a client given meanwhile starts a new sweeper
                        self._sweeper = None
                        return


def close_quietly(client: Any) -> None:
    """Close ``client``; one that already failed has nothing left to release."""
    with contextlib.suppress(Exception):
        client.close()


def config_key(conf: dict[str, Any], ignore: tuple[str, ...] = ()) -> tuple[tuple[str, str], ...]:
    """A hashable key of a client configuration (values as text)."""
    return tuple(sorted((k, str(v)) for k, v in conf.items() if k not in ignore))
