"""The topic lifecycle: name rules, create/ensure/delete, partition growth, config changes.

:class:`TopicManager` is the one place that changes topics. It keeps the metadata store and the
storage engine in step (the store first, so a crash never leaves storage ahead of what the
store knows), picks each new partition's journal partition once, and caches every topic's
resolved configuration so the produce path can read ``max.message.bytes`` and
``message.timestamp.type`` with one dict lookup. Every error it raises is an
:class:`~stonemq.topic_configs.AdminError` carrying the Kafka error code to answer with.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from kio.schema.errors import ErrorCode

from stonemq.cluster.routing import Leadership, Routing, SingleNodeRouting, offline_replicas
from stonemq.coordinator.group_log import OFFSETS_TOPIC
from stonemq.metadata.store import (
    CLUSTER_DEFAULT,
    MetadataStore,
    TopicExistsError,
    TopicRecord,
    UnknownTopicError,
    random_uuid,
)
from stonemq.protocol.record_batch import RecordLimits
from stonemq.server.threads import name_os_thread
from stonemq.storage.engine import LogConfig
from stonemq.topic_configs import (
    AdminError,
    ConfigEntry,
    DynamicBrokerConfigs,
    InvalidConfigError,
    InvalidRequestError,
    TopicConfig,
    apply_incremental,
    broker_config_type,
    broker_value,
    describe_broker,
    describe_broker_defaults,
    resolve_topic,
    topic_config_type,
    validate_broker_configs,
    validate_topic_configs,
    validate_topic_values,
)

if TYPE_CHECKING:
    from stonemq.config import Settings

__all__ = [
    "AdminError",
    "InvalidConfigError",
    "InvalidPartitionsError",
    "InvalidReplicationFactorError",
    "InvalidRequestError",
    "InvalidTopicError",
    "JournalMappingError",
    "ProduceConfig",
    "TopicAlreadyExistsError",
    "TopicManager",
    "UnknownTopicIdError",
    "UnknownTopicOrPartitionError",
    "validate_topic_name",
]

MAX_NAME_LENGTH = 249
log = logging.getLogger("stonemq.topics")

_T = TypeVar("_T")

STEP_PARTITIONS = 2000
"""Partitions registered with storage per event-loop turn by a create of many."""

MAX_PARTITIONS = 1_000_000
"""A sanity bound on one topic's partition count (Kafka has none; a typo should not allocate
a billion partitions)."""

_LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]+")

INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC})
"""Topics only the broker writes, trims and deletes: clients get INVALID_TOPIC_EXCEPTION for a
produce, DeleteRecords or DeleteTopics on them, as Kafka's broker answers the first two."""

PINNED_INTERNAL_CONFIGS = {"retention.ms": "-1", "retention.bytes": "-1"}
"""Overrides every internal topic holds whatever the broker defaults say: the group
coordinator trims ``__consumer_offsets`` itself (snapshots, then DeleteRecords), and a
broker-wide ``log.retention.*`` must never delete committed offsets."""


def is_internal(name: str) -> bool:
    return name in INTERNAL_TOPICS


AUTO_CREATE_SLOTS = 4
"""Auto-creations planning at once (``TopicManager.ensure_async``): each plans on the loop."""


class InvalidTopicError(AdminError):
    error_code = ErrorCode.invalid_topic_exception


class TopicAlreadyExistsError(AdminError):
    error_code = ErrorCode.topic_already_exists


class InvalidPartitionsError(AdminError):
    error_code = ErrorCode.invalid_partitions


class PolicyViolationError(AdminError):
    error_code = ErrorCode.policy_violation


class InvalidReplicationFactorError(AdminError):
    error_code = ErrorCode.invalid_replication_factor


class InvalidReplicaAssignmentError(AdminError):
    error_code = ErrorCode.invalid_replica_assignment


class UnknownTopicOrPartitionError(AdminError):
    error_code = ErrorCode.unknown_topic_or_partition


class UnknownTopicIdError(AdminError):
    error_code = ErrorCode.unknown_topic_id


class JournalMappingError(Exception):
    """Stored partitions route to journal partitions that the settings no longer have."""


def validate_topic_name(name: str) -> None:
    """Kafka's topic-name rules; raises :class:`InvalidTopicError` with Kafka's message."""
    if not name:
        raise InvalidTopicError("Topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise InvalidTopicError('Topic name cannot be "." or ".."')
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidTopicError(
            f"Topic name is illegal, it can't be longer than {MAX_NAME_LENGTH} characters, "
            f"topic name: {name}"
        )
    if not _LEGAL_NAME.fullmatch(name):
        raise InvalidTopicError(
            f'Topic name "{name}" is illegal, it contains a character other than ASCII '
            "alphanumerics, '.', '_' and '-'"
        )


def collision_key(name: str) -> str:
    """Names that differ only in '.' versus '_' collide (their metric names would clash)."""
    return name.replace(".", "_")


def journal_partition_for(
    topic: str, partition: int, journal_partitions: int | Sequence[int]
) -> int:
    """The journal partition a new topic partition is routed to.

    A topic's partitions go round-robin over the candidate journal partitions (a count: all
    of ``0..n-1``; or a list of ids, :func:`placement_candidates`) from a start chosen by
    the CRC-32 of its name, so one topic spreads evenly and different topics start at
    different journal partitions; every journal partition a candidate gives what the count
    gives. Chosen once, recorded in the store with the partition, never recomputed (so
    changing ``journal.partitions`` later moves no existing partition).
    """
    start = zlib.crc32(topic.encode("utf-8"))
    if isinstance(journal_partitions, int):
        return (start + partition) % journal_partitions
    return journal_partitions[(start + partition) % len(journal_partitions)]


def placement_candidates(
    leaderships: Sequence[Leadership], live: Callable[[int], bool]
) -> list[int]:
    """The journal partitions (ids: indexes of ``leaderships``) new topic partitions may be
    routed to, as Kafka places new replicas on live brokers and never makes a fenced one
    leader: those whose replicas are all ``live`` if any; else those with a live leader;
    else (nothing live) every one, as before (the mapping never changes, so a partition
    placed on a dead broker's journal partition would stay leaderless until it returns)."""
    placed = [(j, lead) for j, lead in enumerate(leaderships) if lead.replicas]
    whole = [j for j, lead in placed if all(live(r) for r in lead.replicas)]
    if whole:
        return whole
    led = [j for j, lead in placed if lead.leader >= 0 and live(lead.leader)]
    if led:
        return led
    return list(range(len(leaderships)))


def check_manual_assignment(
    replicas: Sequence[int],
    registered: Callable[[int], bool],
    replication_factor: int | None = None,
) -> None:
    """Kafka's checks of a manual replica assignment (ReplicationControlManager's
    ``validateManualPartitionAssignment``, for CreateTopics, CreatePartitions and
    AlterPartitionReassignments), with its messages: not empty, every broker registered,
    none twice, and as many replicas as ``replication_factor`` (the previous partitions')
    when given. INVALID_REPLICA_ASSIGNMENT otherwise."""
    if not replicas:
        raise InvalidReplicaAssignmentError(
            "The manual partition assignment includes an empty replica list."
        )
    previous: int | None = None
    for broker_id in sorted(replicas):
        if not registered(broker_id):
            raise InvalidReplicaAssignmentError(
                f"The manual partition assignment includes broker {broker_id}, but no such "
                "broker is registered."
            )
        if broker_id == previous:
            raise InvalidReplicaAssignmentError(
                f"The manual partition assignment includes the broker {previous} more than once."
            )
        previous = broker_id
    if replication_factor is not None and len(replicas) != replication_factor:
        raise InvalidReplicaAssignmentError(
            f"The manual partition assignment includes a partition with {len(replicas)} "
            "replica(s), but this is not consistent with previous partitions, which have "
            f"{replication_factor} replica(s)."
        )


def match_assignment(replicas: Sequence[int], leaderships: Sequence[Leadership]) -> list[int]:
    """The journal partitions (indexes of ``leaderships``) a topic partition assigned
    ``replicas`` may be routed to: those whose replica list is exactly ``replicas`` (the
    first, the preferred leader, too), else those with the same replicas in another order,
    else none."""
    wanted = tuple(replicas)
    exact = [j for j, lead in enumerate(leaderships) if lead.replicas and lead.replicas == wanted]
    if exact:
        return exact
    same = sorted(wanted)
    return [
        j for j, lead in enumerate(leaderships) if lead.replicas and sorted(lead.replicas) == same
    ]


class StorageTopics(Protocol):
    """What the topic manager needs from :class:`~stonemq.storage.engine.StorageEngine`."""

    def add_partition(
        self,
        topic_id: uuid.UUID,
        topic: str,
        partition: int,
        journal_partition: int,
        config: LogConfig,
    ) -> None: ...

    def update_config(self, topic: str, config: LogConfig) -> None: ...

    async def remove_topic(self, topic: str) -> None: ...

    def set_producer_expiration_ms(self, ms: int) -> None: ...


@dataclass(frozen=True, slots=True)
class ProduceConfig:
    """What the produce path checks per topic."""

    max_message_bytes: int
    log_append_time: bool  # message.timestamp.type == LogAppendTime
    limits: RecordLimits  # the validator's record rules
    min_insync_replicas: int = 1  # acks=all needs an ISR at least this large
    segment_bytes: int = 1 << 30  # a larger batch is refused (RECORD_LIST_TOO_LARGE)


@dataclass(frozen=True, slots=True)
class _CreatePlan:
    """A create that passed every check: what it writes."""

    name: str
    journals: list[int]
    overrides: dict[str, str]
    config: TopicConfig
    replication_factor: int

    @property
    def partitions(self) -> int:
        return len(self.journals)

    def preview(self) -> CreatedTopic:
        """What a validate_only create answers (with a fresh id)."""
        record = TopicRecord(
            name=self.name,
            topic_id=random_uuid(),
            journal_partitions=tuple(self.journals),
            configs=self.overrides,
        )
        return CreatedTopic(record, self.config, self.replication_factor)


@dataclass(frozen=True, slots=True)
class CreatedTopic:
    """The outcome of :meth:`TopicManager.create` (also for validate_only, with a fresh id)."""

    record: TopicRecord
    config: TopicConfig
    replication_factor: int = 1


class TopicManager:
    """Creates, grows, reconfigures and deletes topics in the store and in storage together."""

    def __init__(
        self,
        settings: Settings,
        store: MetadataStore,
        storage: StorageTopics,
        routing: Routing | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.storage = storage
        if routing is None:
            host, port = settings.advertised_address
            routing = SingleNodeRouting(settings.broker_id, settings.journal_partitions, host, port)
        # which journal partitions exist and which are hosted here (stonemq/cluster/routing.py)
        self.routing = routing
        self._broker_dynamic = DynamicBrokerConfigs(
            own=store.broker_configs(str(settings.broker_id)),
            default=store.broker_configs(CLUSTER_DEFAULT),
        )
        self._configs: dict[str, TopicConfig] = {}
        self._produce: dict[str, ProduceConfig] = {}
        self._apply_broker_settings()
        # called once dynamic broker configs in force here changed (the controller's
        # unclean.leader.election.enable)
        self.on_broker_configs: Callable[[], None] | None = None
        self._collisions: dict[str, str] = {}
        self._ids: dict[uuid.UUID, str] = {}
        self._deleting: set[str] = set()  # names whose deletion is still in progress
        # one partition-count change or deletion of a topic at a time (each awaits the
        # store's thread and storage steps, so two could otherwise interleave)
        self._changing: dict[str, asyncio.Lock] = {}
        # called on the loop with a topic's name once it is deleted (here or, in a cluster,
        # through another broker): the group coordinator drops its committed offsets
        self.on_deleted: list[Callable[[str], object]] = []
        # auto-creations planning at once (see ensure_async)
        self._auto_create_slots = asyncio.Semaphore(AUTO_CREATE_SLOTS)
        self._in_flight = 0  # partitions of creates in progress (against max.partitions)
        self._changes: set[asyncio.Future[Any]] = set()  # changes running to their end
        self._store_thread: ThreadPoolExecutor | None = None
        for record in store.list_topics():
            self._collisions[collision_key(record.name)] = record.name
            self._ids[record.topic_id] = record.name

    # -- start-up -----------------------------------------------------------------------------
    def register_all_with_storage(self) -> int:
        """Register every stored partition with storage (before recovery). Returns the count."""
        count = 0
        journals = self.routing.total()
        for record in self.store.list_topics():
            highest = max(record.journal_partitions, default=-1)
            if highest >= journals:
                raise JournalMappingError(
                    f"topic {record.name} has a partition routed to journal partition "
                    f"{highest}, but journal.partitions is {journals}: journal.partitions "
                    "cannot be lowered once topics exist"
                )
            log_config = self.effective_config(record.name).log_config
            count += self._add_hosted(record, range(record.partitions), log_config)
        return count

    def register_journal(self, journal: int) -> int:
        """Register with storage every partition routed to journal partition ``journal``,
        which this broker hosts from now on (placed after it started). Returns the count."""
        count = 0
        for record in self.store.list_topics():
            mine = [p for p, j in enumerate(record.journal_partitions) if j == journal]
            if mine:
                log_config = self.effective_config(record.name).log_config
                count += self._add_hosted(record, mine, log_config)
        return count

    def _add_hosted(
        self, record: TopicRecord, partitions: range | list[int], log_config: LogConfig
    ) -> int:
        """Register with storage the ``partitions`` of ``record`` whose journal partition is
        hosted here (all of them on a single node), under its local journal index."""
        count = 0
        local_index = self.routing.local_index
        for partition in partitions:
            local = local_index(record.journal_partitions[partition])
            if local is not None:
                self.storage.add_partition(
                    record.topic_id, record.name, partition, local, log_config
                )
                count += 1
        return count

    # -- reads --------------------------------------------------------------------------------
    def get(self, name: str) -> TopicRecord | None:
        return self.store.get_topic(name)

    def require(self, name: str) -> TopicRecord:
        record = self.store.get_topic(name)
        if record is None:
            raise UnknownTopicOrPartitionError(f"Topic {name} does not exist")
        return record

    def by_id(self, topic_id: uuid.UUID) -> TopicRecord:
        name = self._ids.get(topic_id)
        record = self.store.get_topic(name) if name is not None else None
        if record is not None and record.topic_id == topic_id:
            return record
        raise UnknownTopicIdError(f"Topic id {topic_id} does not exist")

    def effective_config(self, name: str) -> TopicConfig:
        """The topic's resolved configuration (cached until an alter changes it)."""
        config = self._configs.get(name)
        if config is None:
            record = self.require(name)
            config = resolve_topic(self.settings, self._broker_dynamic, record.configs)
            self._configs[name] = config
        return config

    def produce_config(self, name: str) -> ProduceConfig:
        """``max.message.bytes`` and the timestamp type for a produce to ``name`` (cached)."""
        cached = self._produce.get(name)
        if cached is None:
            config = self.effective_config(name)
            log_append_time = config.timestamp_type == "LogAppendTime"
            cached = ProduceConfig(
                max_message_bytes=config.max_message_bytes,
                log_append_time=log_append_time,
                limits=RecordLimits(
                    max_uncompressed_bytes=self.settings.batch_max_uncompressed_bytes,
                    timestamp_before_max_ms=int(config.values["message.timestamp.before.max.ms"]),
                    timestamp_after_max_ms=int(config.values["message.timestamp.after.max.ms"]),
                    log_append_time=log_append_time,
                ),
                min_insync_replicas=int(config.values["min.insync.replicas"]),
                segment_bytes=config.log_config.segment_bytes,
            )
            self._produce[name] = cached
        return cached

    def broker_setting(self, name: str) -> object:
        """A broker config's effective value by Kafka name (dynamic > static > default)."""
        return broker_value(self.settings, self._broker_dynamic, name)

    def describe_broker(self, scope: str | None = None) -> list[ConfigEntry]:
        """Every broker config in force here, or (scope ``""``) the cluster-wide defaults."""
        if self._scope(scope) == CLUSTER_DEFAULT:
            return describe_broker_defaults(self.settings, self._broker_dynamic)
        return describe_broker(self.settings, self._broker_dynamic)

    def broker_dynamic_configs(self, scope: str | None = None) -> dict[str, str]:
        """The dynamic broker configs of a scope (None: this broker's own)."""
        if self._scope(scope) == CLUSTER_DEFAULT:
            return dict(self._broker_dynamic.default)
        return dict(self._broker_dynamic.own)

    def _scope(self, scope: str | None) -> str:
        return str(self.settings.broker_id) if scope is None else scope

    # -- create -------------------------------------------------------------------------------
    def default_partitions(self) -> int:
        return int(self.broker_setting("num.partitions"))  # type: ignore[call-overload]

    def create(
        self,
        name: str,
        num_partitions: int = -1,
        configs: Mapping[str, str | None] | None = None,
        *,
        validate_only: bool = False,
        replication_factor: int = -1,
        assignments: Sequence[Sequence[int]] | None = None,
    ) -> CreatedTopic:
        """Create a topic at once, on the calling thread (start-up, internal topics, tests);
        clients' requests go through :meth:`create_async`. ``num_partitions`` -1 means the
        ``num.partitions`` default, ``replication_factor`` -1 the
        ``default.replication.factor``; ``assignments``, each partition's replicas (checked
        by :func:`check_manual_assignment` already), route each partition to a journal
        partition of those replicas (:meth:`route_assignments`)."""
        plan = self._plan_create(name, num_partitions, configs, replication_factor, assignments)
        if validate_only:
            return plan.preview()
        record = self._store_create(plan)
        self._register(record, plan.config.log_config, 0, plan.config)
        return CreatedTopic(record, plan.config, plan.replication_factor)

    async def create_async(
        self,
        name: str,
        num_partitions: int = -1,
        configs: Mapping[str, str | None] | None = None,
        *,
        validate_only: bool = False,
        replication_factor: int = -1,
        assignments: Sequence[Sequence[int]] | None = None,
    ) -> CreatedTopic:
        """:meth:`create` without holding the event loop: the metadata store's commit runs in
        its thread, and storage takes the partitions ``STEP_PARTITIONS`` at a time, under the
        topic's change lock: a deletion asked meanwhile waits until every partition is
        registered (it used to forget the ones registered so far while the rest went on
        being registered, left behind as partitions of no topic)."""
        plan = self._plan_create(name, num_partitions, configs, replication_factor, assignments)
        if validate_only:
            return plan.preview()
        return await self._to_the_end(
            self._create_locked(name, num_partitions, configs, replication_factor, assignments)
        )

    async def _create_locked(
        self,
        name: str,
        num_partitions: int,
        configs: Mapping[str, str | None] | None,
        replication_factor: int,
        assignments: Sequence[Sequence[int]] | None = None,
    ) -> CreatedTopic:
        async with self._change(name):
            plan = self._plan_create(name, num_partitions, configs, replication_factor, assignments)
            self._in_flight += plan.partitions
            try:
                record = await self._in_store_thread(self._store_create, plan)
            finally:
                self._in_flight -= plan.partitions
            await self._register_async(record, plan.config.log_config, 0, plan.config)
        return CreatedTopic(record, plan.config, plan.replication_factor)

    def _to_the_end(self, change: Coroutine[Any, Any, _T]) -> Awaitable[_T]:
        """Run a topic change (create, growth, deletion) as its own task, to its end even if
        the request that asked for it goes: a client that disconnects cancels its requests'
        tasks, and a change cut between the store's commit and storage's last step left
        partitions of a deleted topic registered in storage, where the next growth of a topic
        of that name failed with a traceback (found by the long fuzz run). Kafka's
        controller, too, finishes an operation whose requester went away."""
        task = asyncio.ensure_future(change)
        self._changes.add(task)
        task.add_done_callback(self._change_done)
        return asyncio.shield(task)

    def _change_done(self, task: asyncio.Future[Any]) -> None:
        self._changes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # retrieved here: its requester may be gone; the requester, if not, gets it too
            log.debug("topic change ended with %r", task.exception())

    def _plan_create(
        self,
        name: str,
        num_partitions: int,
        configs: Mapping[str, str | None] | None,
        replication_factor: int,
        assignments: Sequence[Sequence[int]] | None = None,
    ) -> _CreatePlan:
        """Every check of a create, and what it will write."""
        validate_topic_name(name)
        if assignments:  # Kafka checks no replication factor against a manual assignment
            replication_factor = self.routing.replication_factor()
            num_partitions = len(assignments)
        else:
            replication_factor = self.check_replication_factor(replication_factor)
        if num_partitions == -1:
            num_partitions = self.default_partitions()
        if num_partitions <= 0:
            raise InvalidPartitionsError(
                "Number of partitions was set to an invalid non-positive value."
            )
        self.check_partition_limits(num_partitions)
        overrides = validate_topic_configs(configs or {})
        if is_internal(name):
            overrides.update(PINNED_INTERNAL_CONFIGS)
        if name in self._deleting:
            raise TopicAlreadyExistsError(f"Topic '{name}' is marked for deletion.")
        if self.store.get_topic(name) is not None:
            raise TopicAlreadyExistsError(f"Topic '{name}' already exists.")
        other = self._collisions.get(collision_key(name))
        if other is not None and other != name:
            raise InvalidTopicError(f"Topic '{name}' collides with existing topic: {other}")
        config = resolve_topic(self.settings, self._broker_dynamic, overrides)
        validate_topic_values(config.values)
        if assignments:
            journals = self.route_assignments(name, 0, assignments)
        else:
            candidates = self.placement_candidates()
            journals = [journal_partition_for(name, p, candidates) for p in range(num_partitions)]
        return _CreatePlan(name, journals, overrides, config, replication_factor)

    def _store_create(self, plan: _CreatePlan) -> TopicRecord:
        """Write the topic to the metadata store (in the store's thread from create_async)."""
        try:
            return self.store.create_topic(plan.name, plan.journals, plan.overrides)
        except TopicExistsError:
            raise TopicAlreadyExistsError(f"Topic '{plan.name}' already exists.") from None

    def _registered(self, record: TopicRecord, config: TopicConfig | None = None) -> None:
        """The caches after a topic was created or grew."""
        self._collisions[collision_key(record.name)] = record.name
        self._ids[record.topic_id] = record.name
        self._produce.pop(record.name, None)
        if config is not None:
            self._configs[record.name] = config

    def _register(
        self,
        record: TopicRecord,
        log_config: LogConfig,
        first: int,
        config: TopicConfig | None = None,
    ) -> None:
        self._registered(record, config)
        self._add_hosted(record, range(first, record.partitions), log_config)

    async def _register_async(
        self,
        record: TopicRecord,
        log_config: LogConfig,
        first: int,
        config: TopicConfig | None = None,
    ) -> None:
        """:meth:`_register`, ``STEP_PARTITIONS`` partitions per event-loop turn."""
        self._registered(record, config)
        for start in range(first, record.partitions, STEP_PARTITIONS):
            stop = min(start + STEP_PARTITIONS, record.partitions)
            self._add_hosted(record, range(start, stop), log_config)
            if stop < record.partitions:
                await asyncio.sleep(0)

    def pin_internal(self, name: str) -> None:
        """Give an internal topic created without its pinned configs (by an older version)
        those configs. (Lost in a refactor, and found by the cluster test: a broker that did
        not create ``__consumer_offsets`` itself answered every FindCoordinator with
        COORDINATOR_NOT_AVAILABLE.)"""
        record = self.require(name)
        missing = {k: v for k, v in PINNED_INTERNAL_CONFIGS.items() if record.configs.get(k) != v}
        if missing:
            overrides, config = self._plan_topic_configs(name, {**record.configs, **missing})
            self.store.set_topic_configs(name, overrides)  # once, on the first start after
            self._topic_configs_stored(name, config)  # an upgrade

    # -- changes made through other brokers (a cluster) ---------------------------------------
    def follow_store(self, loop: asyncio.AbstractEventLoop) -> None:
        """Apply topic changes other brokers make (the ZooKeeper store's watches call back in
        kazoo's thread; the change is applied on ``loop``), and catch up with any made before
        this was called."""
        add_listener = getattr(self.store, "add_listener", None)
        if add_listener is None:
            return

        def changed(name: str, record: TopicRecord | None) -> None:
            loop.call_soon_threadsafe(self._store_changed, name, record)

        add_listener(changed)
        for record in self.store.list_topics():
            self._store_changed(record.name, record)

    def _store_changed(self, name: str, record: TopicRecord | None) -> None:
        """On the loop: a topic was created, grew, changed configs or went (None)."""
        task = asyncio.ensure_future(self._follow(name, record))
        self._changes.add(task)
        task.add_done_callback(self._change_done)

    async def _follow(self, name: str, record: TopicRecord | None) -> None:
        async with self._change(name):
            current = self.store.get_topic(name)
            if current is None:  # deleted (through this broker or another)
                for topic_id in [t for t, n in self._ids.items() if n == name]:
                    del self._ids[topic_id]
                if self._collisions.get(collision_key(name)) == name:
                    del self._collisions[collision_key(name)]
                self._forget(name)
                self._deleted(name)
                await self.storage.remove_topic(name)
                return
            held = self.storage.topic_id_of(name)
            if held is not None and held != current.topic_id.bytes:
                # deleted and created again before this broker saw the deletion (a lost
                # ZooKeeper session): the old topic's queue logs go first, or the new topic
                # would take them for its own
                for topic_id in [t for t, n in self._ids.items() if n == name]:
                    if topic_id != current.topic_id:
                        del self._ids[topic_id]
                self._forget(name)
                self._deleted(name)
                await self.storage.remove_topic(name)
            self._forget(name)  # configs may have changed
            config = self.effective_config(name)
            self.storage.update_config(name, config.log_config)
            await self._register_async(current, config.log_config, 0, config)

    def route_assignments(
        self, name: str, first: int, assignments: Sequence[Sequence[int]]
    ) -> list[int]:
        """The journal partition of each manually assigned new partition (``first`` the
        first one's index): one of :func:`match_assignment`'s, spread as
        :func:`journal_partition_for` spreads; INVALID_REPLICA_ASSIGNMENT naming the replica
        lists the journal partitions have when none matches."""
        routing = self.routing
        leaderships = [routing.leadership(j) for j in range(routing.total())]
        journals = []
        for i, replicas in enumerate(assignments):
            matches = match_assignment(replicas, leaderships)
            if not matches:
                lists = ", ".join(
                    str(list(r))
                    for r in sorted({lead.replicas for lead in leaderships if lead.replicas})
                )
                raise InvalidReplicaAssignmentError(
                    f"The manual partition assignment {list(replicas)} for partition "
                    f"{first + i} matches no journal partition: StoneMQ replicates journal "
                    "partitions, and a topic partition has the replicas of the journal "
                    "partition it is placed on; this cluster's journal partitions have the "
                    f"replica lists {lists}."
                )
            journals.append(journal_partition_for(name, first + i, matches))
        return journals

    def placement_candidates(self) -> list[int]:
        """The journal partitions new topic partitions go to now: :func:`placement_candidates`
        with the brokers live by the judgement Metadata's offline replicas use (every journal
        partition on a single node)."""
        routing = self.routing
        dead = routing.dead()
        return placement_candidates(
            [routing.leadership(j) for j in range(routing.total())],
            lambda b: not offline_replicas(routing, (b,), dead),
        )

    def live_brokers(self) -> int:
        """How many brokers can hold a replica (the live brokers of the cluster)."""
        return max(1, len(self.routing.brokers()))

    def check_replication_factor(self, replication_factor: int) -> int:
        """The replication factor a new topic gets, or INVALID_REPLICATION_FACTOR.

        Kafka's checks first (-1 is ``default.replication.factor``; not above 0; more than the
        live brokers can hold). Then StoneMQ's: only journal partitions replicate, and every
        topic partition has its journal partition's N replicas (N: the controller's
        ``default.replication.factor`` at broker start; 1 on a single node), so a factor
        asked above N is refused and any other gets N: the value returned, and what
        CreateTopics answers, never the one asked."""
        asked = replication_factor
        if replication_factor == -1:
            replication_factor = int(self.broker_setting("default.replication.factor"))  # type: ignore[call-overload]
        if replication_factor <= 0:
            raise InvalidReplicationFactorError(
                "Replication factor must be larger than 0, or -1 to use the default value."
            )
        brokers = self.live_brokers()
        if replication_factor > brokers:
            raise InvalidReplicationFactorError(
                f"Unable to replicate the partition {replication_factor} time(s): The target "
                f"replication factor of {replication_factor} cannot be reached because only "
                f"{brokers} broker(s) are registered."
            )
        replicas = self.routing.replication_factor()
        if asked != -1 and replication_factor > replicas:
            raise InvalidReplicationFactorError(
                f"Unable to replicate the partition {replication_factor} time(s): StoneMQ "
                "replicates journal partitions, not topic partitions, and every topic "
                f"partition has its journal partition's {replicas} replica(s) (set by "
                "default.replication.factor when the brokers start); ask for at most "
                f"{replicas}."
            )
        return replicas

    def partition_count(self) -> int:
        """Partitions of every topic, plus those of creates in progress."""
        return self.store.partition_total() + self._in_flight

    def check_partition_limits(self, adding: int) -> None:
        """POLICY_VIOLATION when ``adding`` partitions would pass ``max.partitions`` (the
        broker's total) or ``max.partitions.per.request``, or INVALID_PARTITIONS past one
        topic's sanity bound."""
        if adding > MAX_PARTITIONS:
            raise InvalidPartitionsError(
                f"Number of partitions {adding} exceeds the limit of {MAX_PARTITIONS}."
            )
        per_request = self.settings.max_partitions_per_request
        if adding > per_request:
            raise PolicyViolationError(
                f"A request may create at most {per_request} partitions "
                f"(max.partitions.per.request), not {adding}."
            )
        total = self.partition_count()
        if total + adding > self.settings.max_partitions:
            raise PolicyViolationError(
                f"Adding {adding} partitions to the broker's {total} would pass max.partitions "
                f"({self.settings.max_partitions})."
            )

    async def in_store_thread(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run another metadata-store write (client quotas) in the store's thread."""
        return await self._in_store_thread(fn, *args)

    async def _in_store_thread(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run a metadata-store write in the store's thread: its commit waits on an fsync."""
        if self._store_thread is None:
            self._store_thread = ThreadPoolExecutor(
                1, thread_name_prefix="stonemq-metadata", initializer=name_os_thread
            )
        return await asyncio.get_running_loop().run_in_executor(self._store_thread, fn, *args)

    def close(self) -> None:
        """Wait for the metadata store's writes in progress (before the store closes)."""
        if self._store_thread is not None:
            self._store_thread.shutdown(wait=True)
            self._store_thread = None

    def ensure(self, name: str) -> TopicRecord:
        """The topic, auto-created with the broker defaults if ``auto.create.topics.enable``
        (at once: internal callers and tests; Metadata requests use :meth:`ensure_async`).

        Raises :class:`InvalidTopicError` for an illegal name and
        :class:`UnknownTopicOrPartitionError` when it does not exist and may not be created.
        """
        record = self._may_create(name)
        if record is not None:
            return record
        try:
            return self.create(name).record
        except TopicAlreadyExistsError:
            return self.require(name)

    async def ensure_async(self, name: str) -> TopicRecord:
        """:meth:`ensure` without holding the event loop (:meth:`create_async`), a few
        auto-creations at a time: a request naming thousands of new topics starts a task for
        each, all ready in the same turn of the loop, and each plans its topic (its configs
        resolved) before it first waits, so together they held the loop for seconds before
        any other client was read (5,000 topics in one Produce: 4-6 s)."""
        record = self._may_create(name)
        if record is not None:
            return record
        async with self._auto_create_slots:
            record = self.store.get_topic(name)  # made while this one waited for a slot
            if record is not None:
                return record
            try:
                return (await self.create_async(name)).record
            except TopicAlreadyExistsError:
                return self.require(name)

    def _may_create(self, name: str) -> TopicRecord | None:
        """The topic if it exists; None if it may be auto-created; else the error."""
        record = self.store.get_topic(name)
        if record is not None:
            return record
        validate_topic_name(name)
        if not self.broker_setting("auto.create.topics.enable") or name in self._deleting:
            raise UnknownTopicOrPartitionError(f"Topic {name} does not exist")
        return None

    @contextlib.asynccontextmanager
    async def _change(self, name: str) -> AsyncIterator[None]:
        """Hold the topic's change lock (the lock goes once nobody holds or waits for it)."""
        lock = self._changing.get(name)
        if lock is None:
            lock = self._changing[name] = asyncio.Lock()
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and self._changing.get(name) is lock:
                del self._changing[name]

    # -- delete -------------------------------------------------------------------------------
    async def delete(self, name: str) -> TopicRecord:
        """Delete a topic (never an internal one) from the store, in its thread, then from
        storage, in steps; its name stays taken (TOPIC_ALREADY_EXISTS, "marked for deletion")
        until its directories are gone."""
        if is_internal(name):
            raise InvalidTopicError(
                f"Topic {name} is a kafka internal topic and is not allowed to be deleted"
            )
        if name in self._deleting:
            raise UnknownTopicOrPartitionError(f"Topic {name} is already being deleted")
        self.require(name)
        self._deleting.add(name)
        return await self._to_the_end(self._delete_locked(name))

    async def _delete_locked(self, name: str) -> TopicRecord:
        try:
            async with self._change(name):
                return await self._delete(name)
        finally:
            self._deleting.discard(name)

    async def _delete(self, name: str) -> TopicRecord:
        try:
            record = await self._in_store_thread(self.store.delete_topic, name)
        except UnknownTopicError:
            raise UnknownTopicOrPartitionError(f"Topic {name} does not exist") from None
        if self._collisions.get(collision_key(name)) == name:
            del self._collisions[collision_key(name)]
        self._ids.pop(record.topic_id, None)
        self._forget(name)
        self._deleted(name)
        await self.storage.remove_topic(name)
        return record

    def _deleted(self, name: str) -> None:
        for listener in self.on_deleted:
            try:
                listener(name)
            except Exception:
                log.exception("a listener of the deletion of topic %s failed", name)

    def _forget(self, name: str) -> None:
        self._configs.pop(name, None)
        self._produce.pop(name, None)

    # -- partitions ---------------------------------------------------------------------------
    async def add_partitions(
        self,
        name: str,
        total: int,
        *,
        validate_only: bool = False,
        assignments: Sequence[Sequence[int]] | None = None,
    ) -> TopicRecord:
        """Grow ``name`` to ``total`` partitions; new partitions get journal partitions too
        (the store's commit in its thread, storage in steps). Changes of one topic run one
        at a time: two concurrent requests each added their partitions to the count the
        other had not yet committed, and one racing a delete failed with a traceback."""
        return await self._to_the_end(
            self._add_partitions_locked(name, total, validate_only, assignments)
        )

    async def _add_partitions_locked(
        self,
        name: str,
        total: int,
        validate_only: bool,
        assignments: Sequence[Sequence[int]] | None,
    ) -> TopicRecord:
        async with self._change(name):
            return await self._add_partitions(name, total, validate_only, assignments)

    async def _add_partitions(
        self,
        name: str,
        total: int,
        validate_only: bool,
        assignments: Sequence[Sequence[int]] | None = None,
    ) -> TopicRecord:
        if name in self._deleting:
            raise UnknownTopicOrPartitionError(f"Topic {name} is marked for deletion")
        record = self.require(name)
        current = record.partitions
        if total < current:
            raise InvalidPartitionsError(
                f"The topic {name} currently has {current} partition(s); {total} would not be "
                "an increase."
            )
        if total == current:
            raise InvalidPartitionsError(f"Topic already has {current} partition(s).")
        if total > MAX_PARTITIONS:
            raise InvalidPartitionsError(
                f"Number of partitions {total} exceeds the limit of {MAX_PARTITIONS}."
            )
        self.check_partition_limits(total - current)
        if assignments:
            new = self.route_assignments(name, current, assignments)
        else:
            candidates = self.placement_candidates()
            new = [journal_partition_for(name, p, candidates) for p in range(current, total)]
        if validate_only:
            return TopicRecord(
                name=name,
                topic_id=record.topic_id,
                journal_partitions=record.journal_partitions + tuple(new),
                configs=record.configs,
            )
        self._in_flight += len(new)
        try:
            record = await self._in_store_thread(self.store.add_partitions, name, new)
        finally:
            self._in_flight -= len(new)
        await self._register_async(record, self.effective_config(name).log_config, current)
        return record

    # -- configs ------------------------------------------------------------------------------
    async def alter_configs(
        self, name: str, configs: Mapping[str, str | None], *, validate_only: bool = False
    ) -> TopicConfig:
        """Replace the topic's whole override set (AlterConfigs); the store write runs in the
        store's thread (a SQLite commit waits on an fsync, a ZooKeeper write on a round trip)."""
        if validate_only:
            return self._plan_topic_configs(name, configs)[1]
        return await self._to_the_end(self._store_topic_configs(name, configs))

    async def _store_topic_configs(
        self, name: str, configs: Mapping[str, str | None]
    ) -> TopicConfig:
        async with self._change(name):  # planned on the state the write replaces
            overrides, config = self._plan_topic_configs(name, configs)
            await self._in_store_thread(self.store.set_topic_configs, name, overrides)
            return self._topic_configs_stored(name, config)

    def _plan_topic_configs(
        self, name: str, configs: Mapping[str, str | None]
    ) -> tuple[dict[str, str], TopicConfig]:
        """Validate a topic's new override set: the overrides and the config they give."""
        self.require(name)
        overrides = validate_topic_configs(configs)
        if is_internal(name):
            for key, value in PINNED_INTERNAL_CONFIGS.items():
                if overrides.setdefault(key, value) != value:
                    raise InvalidConfigError(
                        f"{key} of the internal topic {name} is managed by the broker "
                        f"and stays {value}"
                    )
        config = resolve_topic(self.settings, self._broker_dynamic, overrides)
        validate_topic_values(config.values, self.effective_config(name).values)
        return overrides, config

    def _topic_configs_stored(self, name: str, config: TopicConfig) -> TopicConfig:
        """The store holds the topic's new overrides: apply them here."""
        old = self.effective_config(name)
        self._forget(name)
        self._configs[name] = config
        if config.log_config != old.log_config:
            self.storage.update_config(name, config.log_config)
        return config

    async def incremental_alter_configs(
        self,
        name: str,
        ops: Sequence[tuple[str, int, str | None]],
        *,
        validate_only: bool = False,
    ) -> TopicConfig:
        """Apply SET/DELETE/APPEND/SUBTRACT operations to the topic's overrides."""
        record = self.require(name)
        effective = self.effective_config(name).strings()
        updated = apply_incremental(record.configs, ops, topic_config_type, effective.get)
        return await self.alter_configs(name, updated, validate_only=validate_only)

    async def alter_broker_configs(
        self,
        configs: Mapping[str, str | None],
        *,
        scope: str | None = None,
        validate_only: bool = False,
    ) -> dict[str, str]:
        """Replace the whole set of dynamic broker configs of a scope (None: this broker's
        own; ``""``: the cluster-wide default); topics without an override of the affected
        configs pick up the new values at once. The store write runs in the store's thread."""
        dynamic = validate_broker_configs(configs)
        if validate_only:
            return dynamic
        change = self._store_broker_configs(self._scope(scope), lambda _current: dynamic)
        return await self._to_the_end(change)

    async def incremental_alter_broker_configs(
        self,
        ops: Sequence[tuple[str, int, str | None]],
        *,
        scope: str | None = None,
        validate_only: bool = False,
    ) -> dict[str, str]:
        """Apply SET/DELETE/APPEND/SUBTRACT operations to a scope's dynamic broker configs as
        the store holds them when it writes (not to this broker's copy, which may not have
        seen another broker's change yet)."""
        scope = self._scope(scope)

        def change(current: dict[str, str]) -> dict[str, str]:
            if scope == CLUSTER_DEFAULT:
                levels = DynamicBrokerConfigs(default=current)
            else:
                levels = DynamicBrokerConfigs(own=current, default=self._broker_dynamic.default)
            effective = {e.name: e.value for e in describe_broker(self.settings, levels)}
            return validate_broker_configs(
                apply_incremental(current, ops, broker_config_type, effective.get)
            )

        if validate_only:
            return change(self.broker_dynamic_configs(scope))
        return await self._to_the_end(self._store_broker_configs(scope, change))

    async def _store_broker_configs(
        self, scope: str, change: Callable[[dict[str, str]], dict[str, str]]
    ) -> dict[str, str]:
        dynamic = await self._in_store_thread(self.store.update_broker_configs, change, scope)
        self.broker_configs_changed(scope, dynamic)
        return dynamic

    def broker_configs_changed(self, scope: str, dynamic: Mapping[str, str]) -> None:
        """Apply a scope's new dynamic broker configs (written through this broker or, seen
        through the store's watch, another one): topics without their own override of a
        changed config take the new value at once."""
        if scope == CLUSTER_DEFAULT:
            new = DynamicBrokerConfigs(own=self._broker_dynamic.own, default=dict(dynamic))
        elif scope == str(self.settings.broker_id):
            new = DynamicBrokerConfigs(own=dict(dynamic), default=self._broker_dynamic.default)
        else:
            return  # another broker's own configs
        if new == self._broker_dynamic:
            return
        old = {name: self.effective_config(name) for name in self._topic_names()}
        self._broker_dynamic = new
        self._configs.clear()
        self._produce.clear()
        for name, before in old.items():
            after = self.effective_config(name)
            if after.log_config != before.log_config:
                self.storage.update_config(name, after.log_config)
        self._apply_broker_settings()
        if self.on_broker_configs is not None:
            self.on_broker_configs()

    def _apply_broker_settings(self) -> None:
        """Hand the storage the dynamic broker configs it reads itself (Kafka's
        DynamicProducerStateManagerConfig: ``producer.id.expiration.ms``)."""
        expiration = self.broker_setting("producer.id.expiration.ms")
        self.storage.set_producer_expiration_ms(int(expiration))  # type: ignore[call-overload]

    async def allocate_producer_id(self) -> int:
        """A fresh producer id from the store, in the store's thread (reserving a new block
        is a store write)."""
        return await self._in_store_thread(self.store.allocate_producer_id)

    def _topic_names(self) -> list[str]:
        return [t.name for t in self.store.list_topics()]
