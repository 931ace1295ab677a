"""Metadata (3): brokers, controller, topics and partitions; auto-creates topics on request.

Brokers, the controller and each partition's leader, leader epoch, replicas and ISR are those
of the routing (stonemq/cluster/routing.py): a partition answers for its journal partition.
With one broker, this broker leads every partition and is the controller. A topic that is
requested but missing is created when ``auto.create.topics.enable`` is true and the client
allows it (v4+), with ``num.partitions`` partitions.

As in Kafka (KafkaApis.handleTopicMetadataRequest), a topic entry a version cannot carry (a
null name before v12, where topic ids do not exist, or a topic id there) makes the request
invalid: the answer is Kafka's error response, every requested topic with INVALID_REQUEST.
(From v12 a null name without a topic id is that topic's INVALID_TOPIC_EXCEPTION.)
"""

from __future__ import annotations

import asyncio
import collections
import logging
import uuid
import weakref
from typing import Any

from kio.schema.errors import ErrorCode

from stonemq.cluster.routing import Leadership, live_leader, offline_replicas
from stonemq.coordinator.group_log import OFFSETS_TOPIC
from stonemq.handlers.authorized_operations import (
    UNKNOWN_AUTHORIZED_OPERATIONS,
    cluster_operations,
    topic_operations,
)
from stonemq.handlers.context import RequestContext, heavy_work
from stonemq.handlers.registry import api
from stonemq.metadata.store import TopicRecord
from stonemq.protocol.codec import EncodedOnce
from stonemq.topics import AdminError, UnknownTopicOrPartitionError, validate_topic_name

log = logging.getLogger(__name__)

TOPIC_IDS_VERSION = 12

# a requested topic: the record, its error, the name answered, the id answered when unknown
Wanted = tuple[TopicRecord | None, ErrorCode, str | None, uuid.UUID | None]


@api(3, 0, 13)
async def handle_metadata(ctx: RequestContext, request: Any) -> Any:
    invalid = _invalid_request(ctx.api_version, request.topics)
    if invalid is not None:
        log.info(
            "invalid Metadata request from %s (client %s): %s",
            ctx.client_host,
            ctx.client_id,
            invalid,
        )
        return _error_response(ctx, request.topics, ErrorCode.invalid_request)
    cache = _cache_of(ctx.broker)
    key = _cache_key(ctx, request)
    fingerprint = _fingerprint(ctx, key) if key is not None else None
    if fingerprint is not None:
        kept = cache.get(key, fingerprint)
        if kept is not None:
            ctx.reuse = kept
            return kept.response
    response = await _build_response(ctx, request)
    if fingerprint is not None and not ctx.encode_in_thread:
        ctx.reuse = cache.put(key, fingerprint, response)
    return response


async def _build_response(ctx: RequestContext, request: Any) -> Any:
    broker = ctx.broker
    allow_create = getattr(request, "allow_auto_topic_creation", True)
    wanted_topics: list[Wanted] = []
    if request.topics is None or (ctx.api_version == 0 and not request.topics):
        for record in broker.metadata.list_topics():
            wanted_topics.append((record, ErrorCode.none, record.name, None))
    else:
        seen: set[Any] = set()  # a topic named twice is answered once, as Kafka (a set)
        async for wanted in ctx.paced(request.topics):
            name = wanted.name
            key = name if name is not None else getattr(wanted, "topic_id", None)
            if key in seen:
                continue
            seen.add(key)
            if name is None and getattr(wanted, "topic_id", None) is not None:
                try:
                    record = broker.topics.by_id(wanted.topic_id)
                except AdminError as exc:
                    # Kafka echoes the unknown id (UNKNOWN_TOPIC_ID, name null)
                    wanted_topics.append((None, exc.error_code, None, wanted.topic_id))
                else:
                    wanted_topics.append((record, ErrorCode.none, record.name, None))
                continue
            try:
                record = await _lookup(ctx, name, allow_create)
            except AdminError as exc:
                wanted_topics.append((None, exc.error_code, name, None))
            else:
                wanted_topics.append((record, ErrorCode.none, name, None))
    include_operations = bool(getattr(request, "include_topic_authorized_operations", False))
    topics = await _topics(ctx, wanted_topics, include_operations)
    routing = broker.routing
    return ctx.build(
        "MetadataResponse",
        throttle_time=0,
        error_code=ErrorCode.none,  # v13: the top-level error (REBOOTSTRAP_REQUIRED is never due)
        brokers=tuple(
            ctx.build(
                "MetadataResponseBroker",
                node_id=b.broker_id,
                host=address[0],
                port=address[1],
                rack=b.rack,
            )
            for b in routing.brokers()
            for address in (ctx.address_of(b.broker_id, b.host, b.port),)
        ),
        cluster_id=broker.metadata.cluster_id(),
        controller_id=routing.controller_id(),
        topics=tuple(topics),
        # v8-10 (asked for with include_cluster_authorized_operations; DescribeCluster later)
        cluster_authorized_operations=cluster_operations(
            getattr(request, "include_cluster_authorized_operations", False)
        ),
    )


def _invalid_request(version: int, topics: Any) -> str | None:
    """Why Kafka would throw InvalidRequestException for these topic entries, or None."""
    for wanted in topics or ():
        topic_id = getattr(wanted, "topic_id", None)
        if wanted.name is None and version < TOPIC_IDS_VERSION:
            return f"Topic name can not be null for version {version}"
        if topic_id is not None and version < TOPIC_IDS_VERSION:
            return f"Topic IDs are not supported in requests for version {version}"
    return None


def _error_response(ctx: RequestContext, topics: Any, error: ErrorCode) -> Any:
    """Kafka's MetadataRequest.getErrorResponse: no brokers, each requested topic with
    ``error`` (a null name as ""), its topic id echoed, no partitions."""
    return ctx.build(
        "MetadataResponse",
        throttle_time=0,
        error_code=ErrorCode.none,  # v13: the top-level error (REBOOTSTRAP_REQUIRED is never due)
        brokers=(),
        cluster_id=None,
        controller_id=-1,
        topics=tuple(
            ctx.build(
                "MetadataResponseTopic",
                error_code=error,
                name=wanted.name if wanted.name is not None else "",
                topic_id=getattr(wanted, "topic_id", None),
                is_internal=False,
                partitions=(),
                topic_authorized_operations=UNKNOWN_AUTHORIZED_OPERATIONS,
            )
            for wanted in topics
        ),
        cluster_authorized_operations=UNKNOWN_AUTHORIZED_OPERATIONS,
    )


def _topic(
    ctx: RequestContext,
    record: TopicRecord | None,
    error: ErrorCode,
    name: str | None,
    unknown_id: uuid.UUID | None,
    include_operations: bool,
) -> Any:
    partitions = ()
    if record is not None:
        leadership = ctx.broker.routing.leadership
        partitions = tuple(
            _partition(ctx, p, leadership(j)) for p, j in enumerate(record.journal_partitions)
        )
    return ctx.build(
        "MetadataResponseTopic",
        error_code=error,
        name=name,
        topic_id=record.topic_id if record is not None else unknown_id,
        is_internal=record is not None and record.name == OFFSETS_TOPIC,
        partitions=partitions,
        # v8+: every topic operation when asked (no authorizer), as Kafka answers
        topic_authorized_operations=topic_operations(include_operations),
    )


def _partition(ctx: RequestContext, index: int, lead: Leadership) -> Any:
    """A partition entry: its journal partition's leader, epoch, replicas and ISR (a partition
    whose journal partition has no live leader answers LEADER_NOT_AVAILABLE with leader -1, as
    Kafka: also while its leader is registered but judged dead, before the controller elects
    another, so clients keep asking instead of waiting on the dead one)."""
    routing = ctx.broker.routing
    dead = routing.dead()
    leader = live_leader(routing, lead, dead)
    return ctx.build(
        "MetadataResponsePartition",
        error_code=ErrorCode.none if leader >= 0 else ErrorCode.leader_not_available,
        partition_index=index,
        leader_id=leader,
        leader_epoch=lead.leader_epoch,
        replica_nodes=lead.replicas,
        isr_nodes=lead.isr,
        offline_replicas=offline_replicas(routing, lead.replicas, dead),
    )


CACHE_PARTITIONS = 50_000
"""Partition entries of the Metadata responses kept for reuse, over all the keys (least
recently used out first): a few MB of entities and encoded bodies at most."""


class _Kept(EncodedOnce):
    """A response kept for reuse with the fingerprint of the state it was built from."""

    __slots__ = ("fingerprint", "partitions")

    def __init__(self, response: Any, fingerprint: tuple[Any, ...]) -> None:
        super().__init__(response)
        self.fingerprint = fingerprint
        self.partitions = len(fingerprint[1])


class ResponseCache:
    """Metadata responses by what was asked (version, listener, topic names or all topics,
    the authorized-operations flags), each valid while the fingerprint of what it was built
    from is unchanged: the topic records (a topic created, deleted or grown has a new
    record), every partition's leadership, the live brokers, the controller and the cluster
    id. A client asking the same Metadata over and over (a pipeliner, or every client's
    periodic refresh) then costs a fingerprint and a copy of bytes, not a build and an
    encode of every partition. Only responses whose topics all exist are kept (a missing
    topic may be auto-created by the request), and none of ``LARGE_RESPONSE_PARTITIONS`` or
    more partitions (those are built in a thread)."""

    def __init__(self, max_partitions: int = CACHE_PARTITIONS) -> None:
        self.max_partitions = max_partitions
        self.partitions = 0
        self.hits = 0
        self._kept: collections.OrderedDict[tuple[Any, ...], _Kept] = collections.OrderedDict()

    def get(self, key: tuple[Any, ...], fingerprint: tuple[Any, ...]) -> _Kept | None:
        kept = self._kept.get(key)
        if kept is None:
            return None
        if kept.fingerprint != fingerprint:
            self._drop(key)
            return None
        self._kept.move_to_end(key)
        self.hits += 1
        return kept

    def put(self, key: tuple[Any, ...], fingerprint: tuple[Any, ...], response: Any) -> _Kept:
        """Keep ``response`` for ``key`` (its body is encoded when it is first sent)."""
        self._drop(key)
        kept = self._kept[key] = _Kept(response, fingerprint)
        self.partitions += kept.partitions
        while self.partitions > self.max_partitions and len(self._kept) > 1:
            self._drop(next(iter(self._kept)))
        return kept

    def __len__(self) -> int:
        return len(self._kept)

    def _drop(self, key: tuple[Any, ...]) -> None:
        kept = self._kept.pop(key, None)
        if kept is not None:
            self.partitions -= kept.partitions


_caches: weakref.WeakKeyDictionary[Any, ResponseCache] = weakref.WeakKeyDictionary()


def _cache_of(broker: Any) -> ResponseCache:
    cache = _caches.get(broker)
    if cache is None:
        cache = _caches[broker] = ResponseCache()
    return cache


def _cache_key(ctx: RequestContext, request: Any) -> tuple[Any, ...] | None:
    """What the response depends on besides the broker's state; None when it may not be
    kept (a topic named by id)."""
    topics = request.topics
    names: tuple[str, ...] | None
    if topics is None or (ctx.api_version == 0 and not topics):
        names = None
    else:
        names = tuple(t.name for t in topics)
        for t in topics:
            topic_id = getattr(t, "topic_id", None)
            if t.name is None or (topic_id is not None and topic_id.int != 0):
                return None
    return (
        ctx.api_version,
        ctx.listener,
        names,
        bool(getattr(request, "include_cluster_authorized_operations", False)),
        bool(getattr(request, "include_topic_authorized_operations", False)),
    )


def _fingerprint(ctx: RequestContext, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The state a response for ``key`` is built from, or None when it may not be kept."""
    broker = ctx.broker
    names = key[2]
    if names is None:
        records = tuple(broker.metadata.list_topics())
    else:
        found = [broker.topics.get(name) for name in names]
        if any(record is None for record in found):
            return None  # it may be auto-created, or is an error: built each time
        records = tuple(found)
    routing = broker.routing
    leadership = routing.leadership
    leads = tuple(leadership(j) for record in records for j in record.journal_partitions)
    if len(leads) >= LARGE_RESPONSE_PARTITIONS:
        return None
    return (
        records,
        leads,
        tuple(routing.brokers()),
        routing.dead(),
        routing.controller_id(),
        broker.metadata.cluster_id(),
    )


LARGE_RESPONSE_PARTITIONS = 5000
"""From this many partitions on, the response is built and encoded in a thread: a
100,000-partition topic took a second of Python, which would hold the event loop (the
thread gives the loop the GIL every few milliseconds, so other clients are still served)."""


async def _topics(
    ctx: RequestContext,
    wanted: list[Wanted],
    include_operations: bool,
) -> list[Any]:
    """The response's topic entries (built off the event loop when there are many)."""

    def build() -> list[Any]:
        return [
            _topic(ctx, record, error, name, topic_id, include_operations)
            for record, error, name, topic_id in wanted
        ]

    partitions = sum(entry[0].partitions for entry in wanted if entry[0] is not None)
    if partitions < LARGE_RESPONSE_PARTITIONS:
        return [
            _topic(ctx, record, error, name, topic_id, include_operations)
            async for record, error, name, topic_id in ctx.paced(wanted)
        ]
    ctx.encode_in_thread = True
    return await asyncio.get_running_loop().run_in_executor(heavy_work(), build)


async def _lookup(ctx: RequestContext, name: str, allow_create: bool) -> TopicRecord:
    topics = ctx.broker.topics
    if allow_create:
        return await topics.ensure_async(name)
    validate_topic_name(name)
    record = topics.get(name)
    if record is None:
        raise UnknownTopicOrPartitionError(f"Topic {name} does not exist")
    return record
