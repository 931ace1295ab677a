"""Serving: lock the data dir, recover, listen, print ``ready``, and shut down cleanly."""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from stonemq.broker import Broker
from stonemq.server.budget import OWNER_PROGRESS_BYTES, PARTIAL_STALL_S, RequestBudget
from stonemq.server.collector import tune_collector
from stonemq.server.connection import Connection
from stonemq.server.dispatcher import TURN_BYTES, Dispatcher
from stonemq.server.gil import tune_switch_interval
from stonemq.server.lock import DirectoryLock
from stonemq.server.metrics import METRICS
from stonemq.server.threads import name_os_thread
from stonemq.storage.open_files import connection_room

if TYPE_CHECKING:
    from stonemq.config import Settings

log = logging.getLogger("stonemq.server")

SHUTDOWN_GRACE_S = 5.0
LOOP_PROBE_S = 0.01


async def serve(settings: Settings) -> None:
    """Run the broker until SIGTERM/SIGINT.

    The signal handlers go in first, so a SIGTERM that arrives during recovery still ends in
    a clean shutdown (right after recovery) rather than the default kill.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    locks = [DirectoryLock(settings.data_dir)]
    for extra in (settings.journal_path, settings.queue_path):
        if not extra.resolve().is_relative_to(settings.data_dir.resolve()):
            locks.append(DirectoryLock(extra))
    acquired: list[DirectoryLock] = []
    try:
        for lock in locks:
            lock.acquire()
            acquired.append(lock)
        await _serve_locked(settings, stop)
    finally:
        for lock in acquired:
            lock.release()


async def _serve_locked(settings: Settings, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    tune_switch_interval()  # before the broker's threads (splitter, journal writers) run
    # asyncio's own default executor (fsyncs, deletions, page releases), its threads named
    # for the OS (server/threads.py)
    loop.set_default_executor(
        ThreadPoolExecutor(thread_name_prefix="stonemq-io", initializer=name_os_thread)
    )
    broker = Broker(settings)
    broker.recover()
    broker.start()
    connections: set[Connection] = set()
    room = connection_room(broker.storage.max_open_files)
    broker.connection_limits.max_connections = min(settings.max_connections, room)
    if room < settings.max_connections:
        log.info(
            "accepting at most %d connections: the open-file limit (ulimit -n) leaves room "
            "for that many beside %d queue-log files and the broker's own",
            room,
            broker.storage.max_open_files,
        )
    budget = RequestBudget(settings.queued_max_request_bytes)
    lag = broker.storage.split_lag_bytes
    replicas = broker.replicas
    if replicas is not None:  # a follower in the ISR that lags in splitting holds produces too
        storage_lag = lag

        def lag() -> int:
            return max(storage_lag(), replicas.follower_split_lag())

    dispatcher = Dispatcher(lag, settings.splitter_max_lag_bytes)
    broker.storage.split_watchers.append(dispatcher.recheck)
    servers: list[asyncio.Server] = []
    advertised = settings.advertised_endpoints()
    try:
        for endpoint in settings.listener_endpoints():  # one server per listener
            servers.append(
                await loop.create_server(
                    functools.partial(
                        Connection, broker, connections, budget, dispatcher, endpoint.name
                    ),
                    endpoint.host or None,  # an empty host: every interface, as Kafka
                    endpoint.port,
                    reuse_address=True,
                    backlog=1024,
                )
            )
    except OSError:
        for server in servers:
            server.close()
        await broker.close()  # recovery already ran: leave flushed checkpoints behind
        raise
    exporter = None
    if settings.metrics_listen is not None:
        from stonemq.server.metrics import start_exporter

        exporter = start_exporter(settings.metrics_listen)
    tune_collector()  # recovered and listening: what exists now lives as long as the broker
    reaper = loop.create_task(_close_idle(connections, settings.connections_max_idle_ms))
    stalls = loop.create_task(_close_stalled_owner(budget))
    # the loop-lag probe wakes the loop 100 times a second: only while someone can read it
    probe = loop.create_task(_probe_loop_lag()) if exporter is not None else None
    host, port = settings.listen_address
    adv_host, adv_port = settings.advertised_address
    log.info(
        "StoneMQ broker %d ready: listening on %s:%d (advertised %s:%d), data dir %s",
        settings.broker_id,
        host,
        port,
        adv_host,
        adv_port,
        settings.data_dir,
    )
    log.info(
        "listeners: %s",
        ", ".join(
            f"{e} (advertised {advertised[e.name][0]}:{advertised[e.name][1]})"
            for e in settings.listener_endpoints()
        ),
    )
    await stop.wait()
    started = time.monotonic()
    if broker.replicas is not None:  # leaderships move first, while it still serves
        await broker.controlled_shutdown()
    log.info("shutting down: no new connections, answering requests in flight")
    for server in servers:
        server.close()
    reaper.cancel()
    stalls.cancel()
    if probe is not None:
        probe.cancel()
    broker.fetch_waiters.wake_all()
    if broker.replicas is not None:  # followers' fetches are answered at once from now
        broker.replicas.shutting_down()
    try:
        await asyncio.wait_for(
            asyncio.gather(*(c.drain() for c in list(connections))), SHUTDOWN_GRACE_S
        )
    except TimeoutError:
        log.warning("some requests were still in flight after %.0f s", SHUTDOWN_GRACE_S)
    for conn in list(connections):
        conn.close()
    log.info("requests in flight answered in %.2f s", time.monotonic() - started)
    log.info(
        "dispatcher: %d rounds; the most bytes one connection moved in a round: %d "
        "(api key %d; a turn is %d)",
        dispatcher.rounds,
        dispatcher.most_in_a_round,
        dispatcher.most_in_a_round_api,
        TURN_BYTES,
    )
    log.info(
        "counters: %d produce requests started; splitter: %d steps, %.3f s in its thread, "
        "%.3f s on the loop",
        METRICS.produce_requests_started,
        METRICS.splitter_steps,
        METRICS.splitter_thread_ns / 1e9,
        METRICS.splitter_loop_ns / 1e9,
    )
    await broker.close()
    if exporter is not None:
        exporter[0].shutdown()
    log.info("stopped cleanly in %.2f s", time.monotonic() - started)


QUIET_BUFFER_RELEASE_S = 10.0
"""A connection that has received nothing for this long gives up its empty receive buffer
(``FrameDecoder.release_idle``; the next receive makes one again)."""


async def _close_idle(connections: set[Connection], max_idle_ms: int) -> None:
    """Kafka's connections.max.idle.ms: one sweep for all connections, not a timer each; the
    same sweep takes the receive buffers of connections quiet for QUIET_BUFFER_RELEASE_S."""
    while True:
        await asyncio.sleep(min(max_idle_ms / 1000, QUIET_BUFFER_RELEASE_S))
        now = time.monotonic()
        deadline, quiet = now - max_idle_ms / 1000, now - QUIET_BUFFER_RELEASE_S
        for conn in list(connections):
            if conn.idle and conn.last_active < deadline:
                conn.close()
            elif conn.last_active < quiet:
                conn.release_buffer()


async def _probe_loop_lag() -> None:
    """Every ``LOOP_PROBE_S``, how late a timer's callback runs: the wait of anything made
    ready on the event loop, sampled (``loop_lag_ns`` over ``loop_lag_probes``)."""
    clock = time.perf_counter_ns
    interval_ns = int(LOOP_PROBE_S * 1e9)
    while True:
        due = clock() + interval_ns
        await asyncio.sleep(LOOP_PROBE_S)
        METRICS.loop_lag_probes += 1
        METRICS.loop_lag_ns += max(0, clock() - due)


async def _close_stalled_owner(budget: RequestBudget) -> None:
    """Close a connection whose partly received frame holds queued.max.request.bytes while
    others wait, and whose peer has sent less than OWNER_PROGRESS_BYTES in PARTIAL_STALL_S
    (see budget.py)."""
    while True:
        await asyncio.sleep(1.0)
        owner = budget.stalled_owner(time.monotonic())
        if isinstance(owner, Connection):
            owner.abort(
                f"partial request holding queued.max.request.bytes, nothing received for "
                f"{PARTIAL_STALL_S:.0f} s (or less than {OWNER_PROGRESS_BYTES // 1024} KiB) while "
                "other connections wait"
            )
