"""The broker's metrics: counters kept as plain ints on the hot paths, and their Prometheus
text exposition (``prometheus-client``) on ``metrics.listen`` when that is set.

A counter here costs one integer add where it is counted; ``prometheus_client`` is imported
only when the endpoint is enabled, and its collector reads the ints at scrape time. The
process collector of ``prometheus_client`` (CPU seconds, resident memory, open files) comes
with the endpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

log = logging.getLogger("stonemq.metrics")


@dataclass
class BrokerMetrics:
    """Counters since the broker started (Prometheus ``_total`` counters)."""

    replica_fetch_requests_served: int = 0
    """ReplicaFetch requests answered by this broker as a journal partition leader."""
    replica_fetch_bytes_served: int = 0
    """Journal bytes sent to followers in those answers."""
    replica_fetch_requests_sent: int = 0
    """ReplicaFetch requests this broker sent as a follower (all its leader fetchers)."""


METRICS = BrokerMetrics()
"""The process's counters (one broker per process)."""

_HELP = {
    "replica_fetch_requests_served": "ReplicaFetch requests answered as a journal leader",
    "replica_fetch_bytes_served": "journal bytes sent to followers in ReplicaFetch answers",
    "replica_fetch_requests_sent": "ReplicaFetch requests sent to leaders as a follower",
}


def metric_name(field: str) -> str:
    """The Prometheus name of a counter field (``stonemq_<field>_total``)."""
    return f"stonemq_{field}_total"


class _Collector:
    """Reads :data:`METRICS` at scrape time."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        for f in fields(self.metrics):
            # prometheus_client adds the _total suffix to a counter family's samples
            family = CounterMetricFamily(f"stonemq_{f.name}", _HELP[f.name])
            family.add_metric([], getattr(self.metrics, f.name))
            yield family


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (HOST may be empty: every interface) -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"metrics.listen {value!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def start_exporter(listen: str, metrics: BrokerMetrics = METRICS) -> tuple[Any, Any]:
    """Serve ``/metrics`` (Prometheus text format) on ``listen`` in a daemon thread; returns
    prometheus_client's (server, thread) so the caller can shut it down."""
    from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server

    host, port = parse_listen(listen)
    registry = CollectorRegistry()
    registry.register(_Collector(metrics))
    ProcessCollector(registry=registry)
    server, thread = start_http_server(port, addr=host or "0.0.0.0", registry=registry)
    log.info("metrics on http://%s:%d/metrics", host or "0.0.0.0", server.server_port)
    return server, thread
