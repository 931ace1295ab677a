"""The broker object: builds the parts (metadata, storage, topics, producer state) and owns
their start and stop order. Handlers reach the parts through ``ctx.broker``."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stonemq.cluster import ClusterStartError
from stonemq.cluster.routing import ClusterRouting, Routing, SingleNodeRouting
from stonemq.coordinator.group_store import GroupRuntime
from stonemq.handlers.fetch_waiters import FetchWaiters
from stonemq.metadata.sqlite import (
    METADATA_FILE,
    MetadataStoreError,
    SqliteMetadataStore,
    holds_store,
)
from stonemq.metadata.store import CLUSTER_DEFAULT, MetadataStore
from stonemq.protocol.record_batch import set_stored_limit
from stonemq.quotas.manager import QuotaManager
from stonemq.server.connection_limits import (
    ConnectionLimits,
    parse_overrides,
    resolve_overrides,
)
from stonemq.storage.engine import StorageEngine, StorageError, UnknownPartitionError
from stonemq.storage.open_files import fit_to_fd_limit
from stonemq.storage.queue_log import queue_log_names
from stonemq.topics import TopicManager

if TYPE_CHECKING:
    from stonemq.cluster.controller import Controller
    from stonemq.cluster.membership import Membership
    from stonemq.config import Settings
    from stonemq.replication.manager import ReplicaManager
    from stonemq.tiering.service import TierService

log = logging.getLogger("stonemq.broker")


class Broker:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # connections accepted at once, in all (max.connections, lowered to the open-file
        # limit's room by the listener) and per client address (max.connections.per.ip)
        # (a host name among the overrides stands for the addresses it resolves to now)
        self.connection_limits = ConnectionLimits(
            settings.max_connections,
            settings.max_connections_per_ip,
            resolve_overrides(parse_overrides(settings.max_connections_per_ip_overrides)),
        )
        # a batch produce accepted can be read back (ListOffsets by time, the group log)
        set_stored_limit(settings.batch_max_uncompressed_bytes)
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        self.membership: Membership | None = None
        self.controller: Controller | None = None
        self.metadata: MetadataStore
        self.routing: Routing
        if settings.zookeeper_connect:
            self.metadata, self.membership, self.controller, self.routing = _join_cluster(settings)
        else:
            store = settings.data_dir / METADATA_FILE
            if not holds_store(store) and (logs := queue_log_names(str(settings.queue_path))):
                raise MetadataStoreError(
                    f"{store} is missing or empty, but {settings.queue_path} holds "
                    f"{len(logs)} queue logs ({logs[0]}, ...): their topics would be lost; "
                    "restore the file, or move the queue logs away to start afresh"
                )
            self.metadata = SqliteMetadataStore(store, cluster_id=settings.cluster_id)
            host, port = settings.advertised_address
            self.routing = SingleNodeRouting(
                settings.broker_id, settings.journal_partitions, host, port
            )
        self.storage = StorageEngine(
            str(settings.journal_path),
            str(settings.queue_path),
            # the journal partitions hosted here, numbered locally (all of them on one node)
            journal_partitions=len(self.routing.hosted()),
            journal_segment_bytes=settings.journal_segment_bytes,
            flush_policy=settings.journal_flush_policy,
            flush_interval_ms=settings.journal_flush_interval_ms,
            queue_checkpoint_interval_ms=settings.queue_checkpoint_interval_ms,
            max_open_files=fit_to_fd_limit(
                settings.queue_max_open_files,
                explicit="queue_max_open_files" in settings.model_fields_set,
            ),
            splitter_batch_bytes=settings.splitter_batch_bytes,
            queue_cache_retain_bytes=settings.queue_cache_retain_bytes,
            log_retention_check_interval_ms=settings.log_retention_check_interval_ms,
            producer_id_expiration_ms=settings.producer_id_expiration_ms,
            producer_id_expiration_check_interval_ms=(
                settings.producer_id_expiration_check_interval_ms
            ),
            replicated=self.routing.clustered,
        )
        # journal-partition replication (cluster brokers only; None on the single node)
        self.replicas: ReplicaManager | None = None
        if isinstance(self.routing, ClusterRouting):
            from stonemq.replication.manager import ReplicaManager

            self.replicas = ReplicaManager(settings.broker_id, self.routing, self.storage, settings)
            self.storage.journal_retain_from = self.replicas.retain_from
            if self.membership is not None:
                replicas = self.replicas
                self.membership.offline_journals = lambda: replicas.offline_journals
        self.topics = TopicManager(settings, self.metadata, self.storage, self.routing)
        if self.controller is not None:  # unclean.leader.election.enable is dynamic
            topics, controller = self.topics, self.controller
            controller.unclean_from(
                lambda: bool(topics.broker_setting("unclean.leader.election.enable"))
            )
            topics.on_broker_configs = controller.configs_changed
        self.quotas = QuotaManager(settings.quota_window_num, settings.quota_window_size_seconds)
        self.quotas.update(self.metadata.client_quotas())
        self.fetch_waiters = FetchWaiters()
        # partitions whose next produce waits for a batch validated off the event loop: the
        # batches after it are appended behind it (handlers/produce.py)
        self.produce_gates: dict[tuple[str, int], asyncio.Future[None]] = {}
        self.groups = GroupRuntime(settings, self.storage, self.topics)
        if self.replicas is not None:  # offset commits are answered once the ISR has them
            self.groups.log.wait_for_hw = self._offsets_hw
            self.replicas.on_leader = self._reload_groups
            self.replicas.topic_ids_gone = getattr(self.metadata, "topic_ids_gone", None)
            self.replicas.on_resign = self._unload_groups
        self._reloads: set[asyncio.Future[None]] = set()
        self.tier = _tier_service(settings, self.topics)
        if self.tier is not None:
            self.storage.local_retention = self.tier.local_cutoff
            self.storage.on_log_start = self.tier.on_log_start
        self.started_at = time.time()
        if settings.default_replication_factor > self.topics.live_brokers():
            log.warning(
                "default.replication.factor=%d cannot be met by %d broker: topics created "
                "without an explicit replication factor (and auto-created ones) get "
                "INVALID_REPLICATION_FACTOR, as from Kafka",
                settings.default_replication_factor,
                self.topics.live_brokers(),
            )

    async def controlled_shutdown(self) -> None:
        """Kafka's controlled shutdown (``controlled.shutdown.enable``): before it stops
        serving, a broker that leads journal partitions with another ISR member registers
        under ``/brokers/shutting_down``; the controller moves each such leadership to
        another ISR member (a new leader epoch; this broker follows it from then on), so
        producers move on without a leaderless gap. Waits until none is led here, at most
        ``controlled.shutdown.max.retries`` times ``controlled.shutdown.retry.backoff.ms``; what
        is still led here then moves once this broker's ZooKeeper session closes."""
        from stonemq.cluster.membership import SHUTTING_DOWN_PATH

        routing = self.routing
        if not isinstance(routing, ClusterRouting) or not self.settings.controlled_shutdown_enable:
            return
        me = self.broker_id

        def movable() -> list[int]:
            return [
                j
                for j in routing.hosted()
                if routing.leadership(j).leader == me
                and any(b != me for b in routing.leadership(j).isr)
            ]

        if not movable():
            return
        settings = self.settings
        wait_s = (
            max(settings.controlled_shutdown_max_retries, 1)
            * settings.controlled_shutdown_retry_backoff_ms
            / 1000
        )
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        log.info("controlled shutdown: moving the leadership of journal partitions %s", movable())
        try:
            await loop.run_in_executor(
                None,
                lambda: routing.client.create(
                    f"{SHUTTING_DOWN_PATH}/{me}", b"", ephemeral=True, makepath=True
                ),
            )
        except Exception as exc:  # ZooKeeper unreachable or the node left from before
            log.warning("controlled shutdown: cannot register (%s); stopping anyway", exc)
            return
        while movable() and time.monotonic() - started < wait_s:
            await asyncio.sleep(0.05)
        left = movable()
        if left:
            log.warning(
                "controlled shutdown: journal partitions %s still led here after %.1f s; "
                "they move once this broker's session closes",
                left,
                time.monotonic() - started,
            )
        else:
            log.info("controlled shutdown: leaderships moved in %.2f s", time.monotonic() - started)

    def _offsets_partitions(self, journal: int) -> set[int]:
        """The ``__consumer_offsets`` partitions that journal partition ``journal`` carries."""
        from stonemq.coordinator.group_log import OFFSETS_TOPIC

        record = self.topics.get(OFFSETS_TOPIC)
        if record is None:
            return set()
        return {p for p, j in enumerate(record.journal_partitions) if j == journal}

    def _unload_groups(self, journal: int) -> None:
        """``journal`` is no longer led here: the group coordinator unloads the groups of the
        ``__consumer_offsets`` partitions it carries."""
        partitions = self._offsets_partitions(journal)
        if partitions:
            self.groups.unload(partitions)

    def _reload_groups(self, journal: int) -> None:
        """``journal`` is led here now: the group coordinator reloads the
        ``__consumer_offsets`` partitions it carries (COORDINATOR_LOAD_IN_PROGRESS meanwhile)."""
        from stonemq.coordinator.group_log import OFFSETS_TOPIC

        record = self.topics.get(OFFSETS_TOPIC)
        if record is None:
            return
        until = {}
        for p, j in enumerate(record.journal_partitions):
            if j == journal:
                try:
                    until[p] = self.storage.log_end_offset(OFFSETS_TOPIC, p)
                except UnknownPartitionError:  # not registered here yet
                    continue
        if until:
            task = self.groups.start_reload(until)
            self._reloads.add(task)
            task.add_done_callback(self._reloads.discard)

    def _host_journal(self, journal: int) -> None:
        """On the loop: host journal partition ``journal``, placed on this broker after it
        started (a broker that joined the cluster): the hosted file, the storage engine's new
        journal, the topic partitions routed to it, then routing and replication take it
        (it is followed, or led, like those found at the start)."""
        routing = self.routing
        assert isinstance(routing, ClusterRouting) and self.replicas is not None
        if routing.local_index(journal) is not None or self.replicas.closed:
            return
        try:
            local = routing.host(journal)
            opened = self.storage.add_journal_partition()
            if opened != local:
                raise StorageError(
                    f"the storage engine opened local journal {opened}, the hosted file "
                    f"says {local}"
                )
        except (OSError, StorageError) as exc:
            log.error(
                "journal partition %d placed on this broker is not hosted (a restart tries "
                "again): %s",
                journal,
                exc,
            )
            return
        routing.publish(journal, local)
        registered = self.topics.register_journal(journal)
        log.info(
            "hosting journal partition %d (placed after the start) as local journal %d, "
            "with %d topic partitions",
            journal,
            local,
            registered,
        )
        self.replicas.reconcile()

    def _offsets_hw(self, partition: int) -> asyncio.Future[int]:
        """The HW wait of what was just appended to ``__consumer_offsets``-``partition``."""
        from stonemq.coordinator.group_log import OFFSETS_TOPIC

        assert self.replicas is not None
        record = self.topics.get(OFFSETS_TOPIC)
        journal = record.journal_partitions[partition] if record is not None else -1
        local = self.routing.local_index(journal)
        position = self.storage.journal_end(local) if local is not None else 0
        return self.replicas.wait_for_hw(journal, position)

    @property
    def broker_id(self) -> int:
        return self.settings.broker_id

    def recover(self) -> None:
        """Register every known partition with storage and run recovery (before serving)."""
        self.topics.register_all_with_storage()
        report = self.storage.recover()
        log.info(
            "recovery finished in %.3f s: %d journal bytes replayed, %d journal bytes and "
            "%d queue-log bytes truncated",
            report.duration_s,
            report.journal_bytes_replayed,
            report.journal_bytes_truncated,
            report.queue_bytes_truncated,
        )
        self.groups.load()  # committed offsets and groups, before the broker reports ready
        if self.replicas is not None:  # only a journal partition's leader coordinates
            for journal in self.routing.hosted():  # its groups (reloaded once it leads)
                self._unload_groups(journal)

    def start(self) -> None:
        """Start background work on the running loop (journal flusher, splitter)."""
        self.storage.start(self.fetch_waiters.notify)
        if self.routing.clustered:  # topics changed through other brokers
            self.topics.follow_store(asyncio.get_running_loop())
        if self.replicas is not None:
            self.replicas.start()
            assert isinstance(self.routing, ClusterRouting)
            loop = asyncio.get_running_loop()

            def new_hosted(journal: int) -> None:
                with contextlib.suppress(RuntimeError):  # the loop closed: stopping
                    loop.call_soon_threadsafe(self._host_journal, journal)

            self.routing.take_new_hosted(new_hosted)
        # client quotas and dynamic broker configs changed through other brokers
        self._follow_metadata("add_quota_listener", self.quotas.update)
        for scope in (CLUSTER_DEFAULT, str(self.settings.broker_id)):
            self._follow_metadata(
                "add_broker_config_listener",
                functools.partial(self.topics.broker_configs_changed, scope),
                scope,
            )
        self.groups.start()
        if self.tier is not None:
            self.tier.start()

    def _follow_metadata(
        self, add_listener_name: str, apply: Callable[[Any], None], *args: Any
    ) -> None:
        """Apply on the running loop what the metadata store's listener reports (the ZooKeeper
        store's watches call back in kazoo's thread; the SQLite store has no listeners)."""
        add_listener = getattr(self.metadata, add_listener_name, None)
        if add_listener is None:
            return
        loop = asyncio.get_running_loop()

        def changed(value: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: stopping
                loop.call_soon_threadsafe(apply, value)

        add_listener(*args, changed)

    async def close(self) -> None:
        self.fetch_waiters.wake_all()
        if isinstance(self.routing, ClusterRouting):
            self.routing.take_new_hosted(None)
        if self.replicas is not None:
            await self.replicas.close()
        self.groups.stop()
        if self.tier is not None:
            await self.tier.close()
        await self.storage.close()
        self.topics.close()
        if self.controller is not None:
            self.controller.close()
        if self.membership is not None:
            self.membership.close()
        self.metadata.close()


def _join_cluster(
    settings: Settings,
) -> tuple[MetadataStore, Membership, Controller, ClusterRouting]:
    """Open the ZooKeeper metadata store, register this broker, take part in controller
    election and wait until the controller has placed this broker's journal partitions (the
    storage engine opens the ones hosted here)."""
    from kazoo.handlers.threading import KazooTimeoutError

    from stonemq.cluster.controller import Controller, LeaderRebalance
    from stonemq.cluster.membership import Membership
    from stonemq.metadata.zookeeper import ZooKeeperMetadataStore

    connect = settings.zookeeper_connect
    assert connect
    try:
        store = ZooKeeperMetadataStore(
            connect,
            cluster_id=settings.cluster_id,
            broker_id=settings.broker_id,
            session_timeout_ms=settings.zookeeper_session_timeout_ms,
            connect_timeout_s=settings.zookeeper_connection_timeout_ms / 1000,
        )
    except KazooTimeoutError as exc:
        raise ClusterStartError(f"cannot reach ZooKeeper at {connect}: {exc}") from None
    host, port = settings.advertised_address
    session_s = settings.zookeeper_session_timeout_ms / 1000
    membership = Membership(
        store.client,
        settings.broker_id,
        host,
        port,
        settings.broker_rack,
        # a previous run's registration lives until its session expires: ZooKeeper expires
        # sessions on its tick, so up to a tick (2 s in its sample configuration) later
        wait_registered_s=session_s + max(5.0, session_s / 2),
    )
    routing = ClusterRouting(store.client, settings.broker_id, str(settings.journal_path))
    controller = Controller(
        store.client,
        settings.broker_id,
        settings.journal_partitions,
        settings.default_replication_factor,
        settings.unclean_leader_election_enable,
        rebalance=LeaderRebalance(
            settings.auto_leader_rebalance_enable,
            settings.leader_imbalance_check_interval_seconds,
            settings.leader_imbalance_per_broker_percentage,
        ),
    )
    routing.judge_with(controller.reach.unreachable)  # brokers dead before their sessions end
    try:
        membership.register()
        controller.start()
        # this broker's journal partitions, placed by the controller (perhaps this broker)
        routing.wait_for_placement(settings.journal_partitions)
    except BaseException:
        controller.close()
        membership.close()
        store.close()
        raise
    log.info(
        "joined cluster %s at %s as broker %d", store.cluster_id(), connect, settings.broker_id
    )
    return store, membership, controller, routing


def _tier_service(settings: Settings, topics: TopicManager) -> TierService | None:
    """The tiering service (cold reads, archive timer), or None without the tier extra."""
    try:
        from stonemq.tiering.service import TierService
    except ImportError as exc:
        log.info("tiered storage unavailable (%s); install stonemq[tier]", exc)
        return None
    return TierService(settings, topics)
