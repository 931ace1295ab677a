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
from dataclasses import dataclass, field, fields
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
    replica_fetch_tail_reads: int = 0
    """Journal partitions of ReplicaFetch answers read from the leader's in-memory tail."""
    replica_fetch_file_reads: int = 0
    """Journal partitions of ReplicaFetch answers read from the journal files (a thread)."""
    produce_requests_started: int = 0
    """Produce requests the dispatcher started."""
    produce_queued_ns: int = 0
    """Time those requests waited in their connection's ready queue, decoded but not started
    (a connection's earlier requests, the dispatcher's rounds, split-lag holds)."""
    produce_handled_ns: int = 0
    """Time from their start to their response being ready (validation, the journal
    append and write, fsync under its policy)."""
    split_lag_holds: int = 0
    """Times a connection was held because its next request was a Produce while more than
    ``splitter.max.lag.bytes`` waited to be split."""
    split_lag_held_ns: int = 0
    """Time connections spent held so, summed over connections."""
    splitter_steps: int = 0
    """Splitter steps that split journal bytes."""
    splitter_thread_ns: int = 0
    """Time the splitter's thread spent reading the journal and writing queue logs."""
    splitter_loop_ns: int = 0
    """Time the splitter spent on the event loop (staging and publishing its steps)."""
    splitter_loop_wait_ns: int = 0
    """Time the splitter's steps waited for the event loop: from its thread's work being done
    to the loop running what comes next."""
    splitter_idle_ns: int = 0
    """Time the splitter had nothing to split (every journal partition split to its end)."""
    fetch_bytes_sent_zero_copy: int = 0
    """Fetched record bytes sent to consumers with ``sendfile`` from the segment files (never
    read into the broker's memory)."""
    file_ranges_opened: int = 0
    """Segment ranges opened for zero-copy fetch responses (each holds a descriptor)."""
    file_ranges_closed: int = 0
    """Those closed again (sent, left out of an answer, or their connection gone): equal to
    the opened count whenever no fetch response is being read or sent."""
    fetch_partition_reads: int = 0
    """Partitions read for consumers' fetches: each once per answer, and, while a fetch waits
    for ``min_bytes``, each that the splitter advanced once per wake-up."""
    fetch_bytes_sent_copied: int = 0
    """Fetched record bytes of segment ranges copied instead (a socket that cannot take
    ``sendfile``); records read into memory (page cache reads, the cold tier) not counted."""
    produce_loop_ns: int = 0
    """Of ``produce_handled_ns``, the time Produce handlers ran on the event loop (the rest
    they waited: for a write thread, for the loop to come back to them)."""
    produce_start_wait_ns: int = 0
    """Of ``produce_handled_ns``, the time from a Produce's start by the dispatcher to its
    handler's first step on the loop."""
    produce_steps: int = 0
    """Steps Produce handlers ran on the loop (each after the first followed a wait)."""
    loop_lag_probes: int = 0
    """Times the loop-lag probe ran (every ``LOOP_PROBE_S``, server/listener.py)."""
    loop_lag_ns: int = 0
    """Time those probes ran late, summed: how long a callback made ready waits for the
    event loop, sampled."""
    request_loop_ns: dict[int, int] = field(default_factory=dict)
    """Time requests' handlers ran on the event loop, their responses' encoding and sending
    included, by api key (a labelled family, ``api_key``)."""
    request_count: dict[int, int] = field(default_factory=dict)
    """Requests answered, by api key (a labelled family, ``api_key``)."""


METRICS = BrokerMetrics()
"""The process's counters (one broker per process)."""

_HELP = {
    "replica_fetch_requests_served": "ReplicaFetch requests answered as a journal leader",
    "replica_fetch_bytes_served": "journal bytes sent to followers in ReplicaFetch answers",
    "replica_fetch_requests_sent": "ReplicaFetch requests sent to leaders as a follower",
    "replica_fetch_tail_reads": "journal partitions of ReplicaFetch answers read from memory",
    "replica_fetch_file_reads": "journal partitions of ReplicaFetch answers read from files",
    "produce_requests_started": "Produce requests started by the dispatcher",
    "produce_queued_ns": "time Produce requests waited decoded in their connection's queue",
    "produce_handled_ns": "time from a Produce's start to its response being ready",
    "split_lag_holds": "connections held for split lag (their next request a Produce)",
    "split_lag_held_ns": "time connections were held for split lag, summed",
    "splitter_steps": "splitter steps that split journal bytes",
    "splitter_thread_ns": "time the splitter's thread read the journal and wrote queue logs",
    "splitter_loop_ns": "time the splitter staged and published on the event loop",
    "splitter_loop_wait_ns": "time the splitter's steps waited for the event loop",
    "splitter_idle_ns": "time the splitter had nothing to split",
    "fetch_bytes_sent_zero_copy": "fetched record bytes sent with sendfile from segment files",
    "file_ranges_opened": "segment ranges opened for zero-copy fetch responses",
    "file_ranges_closed": "segment ranges of fetch responses closed again",
    "fetch_partition_reads": "partitions read for fetches (answers and long-poll wake-ups)",
    "fetch_bytes_sent_copied": "fetched segment-range bytes copied (sendfile not possible)",
    "produce_loop_ns": "time Produce handlers ran on the event loop",
    "produce_start_wait_ns": "time from a Produce's start to its handler's first step",
    "produce_steps": "steps Produce handlers ran on the event loop",
    "loop_lag_probes": "runs of the event loop's lag probe",
    "loop_lag_ns": "time the event loop's lag probes ran late, summed",
    "request_loop_ns": "time requests ran on the event loop (handler, encoding, sending)",
    "request_count": "requests answered",
}


def metric_name(field: str) -> str:
    """The Prometheus name of a counter field: ``stonemq_<field>_total``, and a time kept in
    nanoseconds (``<name>_ns``) as ``stonemq_<name>_seconds_total``."""
    return f"stonemq_{_family(field)}_total"


def _family(field: str) -> str:
    return field[:-3] + "_seconds" if field.endswith("_ns") else field


class _Collector:
    """Reads :data:`METRICS` at scrape time."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        for f in fields(self.metrics):
            # prometheus_client adds the _total suffix to a counter family's samples
            value = getattr(self.metrics, f.name)
            scale = 1e-9 if f.name.endswith("_ns") else 1
            if isinstance(value, dict):
                family = CounterMetricFamily(
                    f"stonemq_{_family(f.name)}", _HELP[f.name], labels=["api_key"]
                )
                for key, count in sorted(value.items()):
                    family.add_metric([str(key)], count * scale)
            else:
                family = CounterMetricFamily(f"stonemq_{_family(f.name)}", _HELP[f.name])
                family.add_metric([], value * scale)
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
