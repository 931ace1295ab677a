"""The broker object: builds the parts (metadata, storage, topics, producer state) and owns
their start and stop order. Handlers reach the parts through ``ctx.broker``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from stonemq.cluster import ClusterStartError
from stonemq.cluster.routing import ClusterRouting, Routing, SingleNodeRouting
from stonemq.config import Settings
from stonemq.coordinator.group_store import GroupRuntime
from stonemq.handlers.fetch_waiters import FetchWaiters
from stonemq.metadata.sqlite import SqliteMetadataStore
from stonemq.metadata.store import MetadataStore
from stonemq.quotas.entity import Entity
from stonemq.quotas.manager import QuotaManager
from stonemq.storage.engine import StorageEngine
from stonemq.storage.open_files import fit_to_fd_limit
from stonemq.topics import TopicManager

if TYPE_CHECKING:
    from stonemq.cluster.controller import Controller
    from stonemq.cluster.membership import Membership
    from stonemq.tiering.service import TierService

log = logging.getLogger("stonemq.broker")


class Broker:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        self.membership: Membership | None = None
        self.controller: Controller | None = None
        self.metadata: MetadataStore
        self.routing: Routing
        if settings.zookeeper_connect:
            self.metadata, self.membership, self.controller, self.routing = _join_cluster(settings)
        else:
            self.metadata = SqliteMetadataStore(
                settings.data_dir / "metadata.db", cluster_id=settings.cluster_id
            )
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
        )
        self.topics = TopicManager(settings, self.metadata, self.storage, self.routing)
        self.quotas = QuotaManager(settings.quota_window_num, settings.quota_window_size_seconds)
        self.quotas.update(self.metadata.client_quotas())
        self.fetch_waiters = FetchWaiters()
        # partitions whose next produce waits for a batch validated off the event loop: the
        # batches after it are appended behind it (handlers/produce.py)
        self.produce_gates: dict[tuple[str, int], asyncio.Future[None]] = {}
        self.groups = GroupRuntime(settings, self.storage, self.topics)
        self.tier = _tier_service(settings, self.topics)
        if self.tier is not None:
            self.storage.local_retention = self.tier.local_cutoff
        self.started_at = time.time()
        if settings.default_replication_factor > self.topics.live_brokers():
            log.warning(
                "default.replication.factor=%d cannot be met by %d broker: topics created "
                "without an explicit replication factor (and auto-created ones) get "
                "INVALID_REPLICATION_FACTOR, as from Kafka",
                settings.default_replication_factor,
                self.topics.live_brokers(),
            )

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

    def start(self) -> None:
        """Start background work on the running loop (journal flusher, splitter)."""
        self.storage.start(self.fetch_waiters.notify)
        if self.routing.clustered:  # topics changed through other brokers
            self.topics.follow_store(asyncio.get_running_loop())
        add_quota_listener = getattr(self.metadata, "add_quota_listener", None)
        if add_quota_listener is not None:  # client quotas changed through other brokers
            loop = asyncio.get_running_loop()

            def quotas_changed(quotas: dict[Entity, dict[str, float]]) -> None:
                with contextlib.suppress(RuntimeError):  # the loop closed: stopping
                    loop.call_soon_threadsafe(self.quotas.update, quotas)

            add_quota_listener(quotas_changed)
        self.groups.start()
        if self.tier is not None:
            self.tier.start()

    async def close(self) -> None:
        self.fetch_waiters.wake_all()
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

    from stonemq.cluster.controller import Controller
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
    membership = Membership(store.client, settings.broker_id, host, port, settings.broker_rack)
    routing = ClusterRouting(store.client, settings.broker_id, str(settings.journal_path))
    controller = Controller(
        store.client,
        settings.broker_id,
        settings.journal_partitions,
        settings.default_replication_factor,
        settings.unclean_leader_election_enable,
    )
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
