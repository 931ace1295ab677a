"""Admin APIs: CreateTopics (19), DeleteTopics (20), DescribeConfigs (32), AlterConfigs (33),
CreatePartitions (37), IncrementalAlterConfigs (44) and DescribeCluster (60).

A topic partition has its journal partition's replicas: a replication factor asked above
their count (1 on a single node; ``default.replication.factor`` at the brokers' start in a
cluster) is refused, any other gets that count, which CreateTopics answers. The work is done by
:class:`~stonemq.topics.TopicManager`; this module turns requests into its calls and its
:class:`~stonemq.topic_configs.AdminError` exceptions into per-resource error codes and messages,
as Kafka does (one bad topic never fails the others).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode

from stonemq import broker_loggers
from stonemq.handlers.authorized_operations import (
    UNKNOWN_AUTHORIZED_OPERATIONS,
    cluster_operations,
)
from stonemq.handlers.context import RequestContext
from stonemq.handlers.registry import api
from stonemq.topic_configs import AdminError, ConfigEntry, ConfigOp, InvalidRequestError
from stonemq.topics import PolicyViolationError, check_manual_assignment, validate_topic_name

log = logging.getLogger("stonemq.admin")

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
RESOURCE_BROKER_LOGGER = 8


class _Outcome:
    """The Kafka error of one resource's work, as a ``with`` block: an AdminError carries its
    own code; anything else is logged and answered UNKNOWN_SERVER_ERROR. The error is
    reported per resource and the request goes on with the next one."""

    __slots__ = ("error", "message")

    def __init__(self) -> None:
        self.error = ErrorCode.none
        self.message: str | None = None

    def __enter__(self) -> _Outcome:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> bool:
        if isinstance(exc, AdminError):
            self.error, self.message = exc.error_code, exc.message
            return True
        if isinstance(exc, Exception):
            log.error("admin request failed", exc_info=exc)
            self.error = ErrorCode.unknown_server_error
            self.message = f"{type(exc).__name__}: {exc}"
            return True
        return False

    @property
    def ok(self) -> bool:
        return self.error == ErrorCode.none


def _duplicates(names: Iterable[Any]) -> set[Any]:
    return {name for name, count in Counter(names).items() if count > 1}


# -- CreateTopics ---------------------------------------------------------------------------------
@api(19, 2, 7)
async def handle_create_topics(ctx: RequestContext, request: Any) -> Any:
    topics = ctx.broker.topics
    duplicates = _duplicates(t.name for t in request.topics)
    results = []
    requested = 0  # partitions this request creates (max.partitions.per.request)
    async for topic in ctx.paced(request.topics):
        if topic.name in duplicates:
            results.append(
                _create_result(
                    ctx,
                    topic.name,
                    error=ErrorCode.invalid_request,
                    message=f"Create topics request from client `{ctx.client_id}` contains "
                    f"multiple entries for the following topics: {topic.name}",
                )
            )
            continue
        with _Outcome() as outcome:
            num_partitions = _requested_partitions(topic, ctx.broker.routing)
            requested += topics.default_partitions() if num_partitions == -1 else num_partitions
            if requested > ctx.broker.settings.max_partitions_per_request:
                raise PolicyViolationError(
                    f"A request may create at most "
                    f"{ctx.broker.settings.max_partitions_per_request} partitions "
                    "(max.partitions.per.request)."
                )
            created = await topics.create_async(
                topic.name,
                num_partitions,
                {c.name: c.value for c in topic.configs},
                validate_only=request.validate_only,
                replication_factor=topic.replication_factor,
                assignments=_assignments(topic.assignments),
            )
        if not outcome.ok:
            results.append(
                _create_result(ctx, topic.name, error=outcome.error, message=outcome.message)
            )
        else:
            configs = None
            if ctx.api_version >= 5:
                configs = tuple(
                    ctx.build(
                        "CreatableTopicConfigs",
                        name=entry.name,
                        value=entry.value,
                        read_only=entry.read_only,
                        config_source=int(entry.source),
                        is_sensitive=entry.is_sensitive,
                    )
                    for entry in created.config.entries
                )
            results.append(
                _create_result(
                    ctx,
                    topic.name,
                    topic_id=created.record.topic_id,
                    num_partitions=created.record.partitions,
                    replication_factor=created.replication_factor,
                    configs=configs,
                )
            )
    if not request.validate_only:
        await _partitions_ready(ctx, request.timeout)
    return ctx.build("CreateTopicsResponse", throttle_time=0, topics=tuple(results))


async def _partitions_ready(ctx: RequestContext, timeout: timedelta) -> None:
    """Answer once new partitions' directories exist (created off the loop), as Kafka
    answers once the topic is created; past the request's timeout they are still being
    created and the answer goes anyway (first batches then create what is missing)."""
    await ctx.broker.storage.wait_precreated(timeout.total_seconds())


def _requested_partitions(topic: Any, routing: Any) -> int:
    """The partition count a CreatableTopic asks for, after Kafka's checks of a manual
    assignment (on a single node: the one broker's, as before)."""
    if topic.assignments:
        if topic.num_partitions != -1 or topic.replication_factor != -1:
            raise InvalidRequestError(
                "Both numPartitions or replicationFactor and replicasAssignments were set. "
                "Both cannot be used at the same time."
            )
        indexes = sorted(a.partition_index for a in topic.assignments)
        if indexes != list(range(len(indexes))):
            raise InvalidRequestError(
                "Partitions in the replica assignment must be numbered consecutively from 0."
            )
        previous: int | None = None
        for assignment in sorted(topic.assignments, key=lambda a: a.partition_index):
            if not routing.clustered:
                if tuple(assignment.broker_ids) != (routing.broker_id,):
                    raise InvalidRequestError(
                        f"Replica assignment {list(assignment.broker_ids)} for partition "
                        f"{assignment.partition_index} is not possible: this cluster has one "
                        f"broker, {routing.broker_id}."
                    )
                continue
            check_manual_assignment(assignment.broker_ids, _registered(routing), previous)
            previous = len(assignment.broker_ids)
        return len(indexes)
    return int(topic.num_partitions)


def _assignments(assignments: Any) -> list[tuple[int, ...]] | None:
    """A request's assignments (CreateTopics' in partition order, CreatePartitions' in
    theirs) as replica lists; None for none."""
    if not assignments:
        return None
    if hasattr(assignments[0], "partition_index"):
        assignments = sorted(assignments, key=lambda a: a.partition_index)
    return [tuple(int(b) for b in a.broker_ids) for a in assignments]


def _registered(routing: Any) -> Any:
    return lambda broker_id: routing.broker(broker_id) is not None


def _create_result(
    ctx: RequestContext,
    name: str,
    *,
    error: ErrorCode = ErrorCode.none,
    message: str | None = None,
    topic_id: Any = None,
    num_partitions: int = -1,
    replication_factor: int = -1,
    configs: tuple[Any, ...] | None = None,
) -> Any:
    return ctx.build(
        "CreatableTopicResult",
        name=name,
        topic_id=topic_id,
        error_code=error,
        error_message=message,
        topic_config_error_code=0,
        num_partitions=num_partitions,
        replication_factor=replication_factor,
        configs=configs,
    )


# -- DeleteTopics ---------------------------------------------------------------------------------
@api(20, 1, 6)
async def handle_delete_topics(ctx: RequestContext, request: Any) -> Any:
    """Each topic named is checked, then all are deleted in order by one task that outlives
    the request; each answer waits for its topic until the request's ``timeout_ms`` and is
    REQUEST_TIMED_OUT past it, the deletion going on (Kafka's DeleteTopics deadline: a topic
    of 50,000 partitions took 25 s to delete, and its client heard nothing meanwhile). A
    timeout of 0 waits for the end: Kafka answers REQUEST_TIMED_OUT at once, which
    librdkafka's default ``operation_timeout`` of 0 reports as success, and a client that
    deletes and creates again expects the name free."""
    topics = ctx.broker.topics
    if ctx.api_version >= 6:
        wanted = [(t.name, t.topic_id) for t in request.topics]
    else:
        wanted = [(name, None) for name in request.topic_names]
    duplicate_names = _duplicates(name for name, _ in wanted if name is not None)
    duplicate_ids = _duplicates(tid for name, tid in wanted if name is None and tid is not None)
    # (name, the id asked for, the topic's id, outcome)
    checked: list[tuple[str | None, Any, Any, _Outcome]] = []
    async for name, topic_id in ctx.paced(wanted):
        if topic_id is not None and topic_id.int == 0:
            topic_id = None
        asked, found = topic_id, None
        with _Outcome() as outcome:
            if name is not None and topic_id is not None:
                raise InvalidRequestError("You may not specify both topic name and topic id.")
            if name in duplicate_names or (name is None and topic_id in duplicate_ids):
                raise InvalidRequestError("Duplicate topic name.")
            if name is None:
                if topic_id is None:
                    raise InvalidRequestError("Neither topic name nor id were specified.")
                name = topics.by_id(topic_id).name
            found = topics.require(name).topic_id
        checked.append((name, asked, found, outcome))
    loop = asyncio.get_running_loop()
    timeout_s = request.timeout.total_seconds()
    deadline = loop.time() + timeout_s if timeout_s > 0 else None
    names = [name for name, _, _, outcome in checked if outcome.ok and name is not None]
    done = {name: loop.create_future() for name in names}
    for future in done.values():  # retrieved even when nobody waits any more
        future.add_done_callback(_retrieve)
    task = loop.create_task(_delete_in_order(ctx, names, done), name="stonemq-delete-topics")
    _DELETIONS.add(task)
    task.add_done_callback(_DELETIONS.discard)
    results = []
    for name, asked, found, outcome in checked:
        if outcome.ok and name is not None:
            left = None if deadline is None else max(deadline - loop.time(), 0.0)
            with outcome:
                try:
                    await asyncio.wait_for(asyncio.shield(done[name]), left)
                except TimeoutError:
                    outcome.error = ErrorCode.request_timed_out
                    outcome.message = f"Topic {name} is still being deleted"
        results.append(
            ctx.build(
                "DeletableTopicResult",
                name=name,
                topic_id=found if outcome.error == ErrorCode.none else asked,
                error_code=outcome.error,
                error_message=outcome.message,
            )
        )
    return ctx.build("DeleteTopicsResponse", throttle_time=0, responses=tuple(results))


_DELETIONS: set[asyncio.Task[None]] = set()  # running DeleteTopics work (kept referenced)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def _delete_in_order(
    ctx: RequestContext, names: list[str], done: dict[str, asyncio.Future[Any]]
) -> None:
    """Delete ``names`` one after the other, each topic's outcome set on its future; a
    tiered topic's cold data goes too, in the tier pool (a re-created topic of the same name
    does not tier until it is gone)."""
    topics = ctx.broker.topics
    tier = getattr(ctx.broker, "tier", None)
    for name in names:
        try:
            tiered = tier is not None and tier.tiered(name)
            # the tier service's deletion listener removes the cold data of a topic it
            # tracks (on every broker); here the rest, a tiered topic it had not seen yet
            untracked = tier is not None and not tier.tracks(name)
            record = await topics.delete(name)
            if tier is not None and tiered and untracked:
                tier.delete_topic_data(name, str(record.topic_id))
        except Exception as exc:
            done[name].set_exception(exc)
        else:
            done[name].set_result(record)


# -- CreatePartitions -----------------------------------------------------------------------------
@api(37, 0, 3)
async def handle_create_partitions(ctx: RequestContext, request: Any) -> Any:
    topics = ctx.broker.topics
    routing = ctx.broker.routing
    duplicates = _duplicates(t.name for t in request.topics)
    results = []
    async for topic in ctx.paced(request.topics):
        with _Outcome() as outcome:
            if topic.name in duplicates:
                raise InvalidRequestError("Duplicate topic name.")
            record = topics.require(topic.name)
            if topic.assignments:  # null or empty: the broker places the new partitions
                added = topic.count - record.partitions
                if added > 0 and len(topic.assignments) != added:
                    raise _AssignmentError(
                        f"Increasing the number of partitions by {added} but "
                        f"{len(topic.assignments)} assignments provided."
                    )
                for assignment in topic.assignments:
                    if not routing.clustered:
                        if tuple(assignment.broker_ids) != (routing.broker_id,):
                            raise _AssignmentError(
                                f"Replica assignment {list(assignment.broker_ids)} is not "
                                f"possible: this cluster has one broker, {routing.broker_id}."
                            )
                        continue
                    # Kafka's checks; as many replicas as the topic's partitions have
                    check_manual_assignment(
                        assignment.broker_ids,
                        _registered(routing),
                        routing.replication_factor(),
                    )
            await topics.add_partitions(
                topic.name,
                topic.count,
                validate_only=request.validate_only,
                assignments=_assignments(topic.assignments),
            )
        results.append(
            ctx.build(
                "CreatePartitionsTopicResult",
                name=topic.name,
                error_code=outcome.error,
                error_message=outcome.message,
            )
        )
    if not request.validate_only:
        await _partitions_ready(ctx, request.timeout)
    return ctx.build("CreatePartitionsResponse", throttle_time=0, results=tuple(results))


class _AssignmentError(AdminError):
    error_code = ErrorCode.invalid_replica_assignment


# -- DescribeConfigs ------------------------------------------------------------------------------
@api(32, 1, 4)
async def handle_describe_configs(ctx: RequestContext, request: Any) -> Any:
    results = []
    async for resource in ctx.paced(request.resources):
        configs: tuple[Any, ...] = ()
        with _Outcome() as outcome:
            entries = _describe_resource(ctx, resource.resource_type, resource.resource_name)
            keys = resource.configuration_keys
            if keys:  # null or empty: every config (what clients mean by asking for none)
                wanted = set(keys)
                entries = [e for e in entries if e.name in wanted]
            configs = tuple(
                [
                    _config_result(
                        ctx,
                        entry,
                        synonyms=request.include_synonyms,
                        documentation=getattr(request, "include_documentation", False),
                    )
                    async for entry in ctx.paced(entries)
                ]
            )
        results.append(
            ctx.build(
                "DescribeConfigsResult",
                error_code=outcome.error,
                error_message=outcome.message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
                configs=configs,
            )
        )
    return ctx.build("DescribeConfigsResponse", throttle_time=0, results=tuple(results))


def _describe_resource(ctx: RequestContext, resource_type: int, name: str) -> list[ConfigEntry]:
    topics = ctx.broker.topics
    if resource_type == RESOURCE_TOPIC:
        validate_topic_name(name)  # Kafka's ConfigHelper: INVALID_TOPIC_EXCEPTION first
        return list(topics.effective_config(name).entries)
    if resource_type == RESOURCE_BROKER:
        _check_broker_name(ctx, name)
        return topics.describe_broker(name)
    if resource_type == RESOURCE_BROKER_LOGGER:
        return broker_loggers.describe(name, ctx.broker.settings.broker_id)
    raise InvalidRequestError(f"Unsupported resource type {resource_type}")


def _check_broker_name(ctx: RequestContext, name: str) -> None:
    """A broker resource is this broker's id (its own configs) or "" (the cluster-wide
    defaults); Kafka's admin clients send a broker id's request to that broker."""
    broker_id = ctx.broker.settings.broker_id
    if name not in ("", str(broker_id)):
        raise InvalidRequestError(
            f"Unexpected broker id, expected {broker_id} or empty string, but received {name}"
        )


def _config_result(
    ctx: RequestContext, entry: ConfigEntry, *, synonyms: bool, documentation: bool
) -> Any:
    return ctx.build(
        "DescribeConfigsResourceResult",
        name=entry.name,
        value=entry.value,
        read_only=entry.read_only,
        config_source=int(entry.source),
        is_sensitive=entry.is_sensitive,
        synonyms=tuple(
            ctx.build("DescribeConfigsSynonym", name=s.name, value=s.value, source=int(s.source))
            for s in entry.synonyms
        )
        if synonyms
        else (),
        config_type=int(entry.type),
        documentation=entry.documentation if documentation else None,
    )


# -- AlterConfigs and IncrementalAlterConfigs -----------------------------------------------------
@api(33, 0, 2)
async def handle_alter_configs(ctx: RequestContext, request: Any) -> Any:
    """Replace the whole override set of each resource (Kafka's legacy semantics)."""

    async def apply(resource: Any, topics: Any, validate_only: bool) -> None:
        names = [c.name for c in resource.configs]
        if _duplicates(names):
            raise InvalidRequestError(
                f"Error due to duplicate config keys: {', '.join(sorted(_duplicates(names)))}"
            )
        configs = {c.name: c.value for c in resource.configs}
        if resource.resource_type == RESOURCE_BROKER_LOGGER:
            raise InvalidRequestError(
                "AlterConfigs is deprecated and does not support the resource type BROKER_LOGGER"
            )
        if resource.resource_type == RESOURCE_TOPIC:
            await topics.alter_configs(resource.resource_name, configs, validate_only=validate_only)
        else:
            await topics.alter_broker_configs(
                configs, scope=resource.resource_name, validate_only=validate_only
            )

    return ctx.build(
        "AlterConfigsResponse", throttle_time=0, responses=await _alter_each(ctx, request, apply)
    )


@api(44, 0, 1)
async def handle_incremental_alter_configs(ctx: RequestContext, request: Any) -> Any:
    """SET / DELETE / APPEND / SUBTRACT individual configs of each resource."""

    async def apply(resource: Any, topics: Any, validate_only: bool) -> None:
        ops = [(c.name, c.config_operation, c.value) for c in resource.configs]
        nulls = [name for name, op, value in ops if op != ConfigOp.DELETE and value is None]
        if nulls:  # Kafka's ConfigAdminManager, before any resource type's own checks
            raise InvalidRequestError(f"Null value not supported for : {', '.join(nulls)}")
        if resource.resource_type == RESOURCE_BROKER_LOGGER:
            names = [name for name, _, _ in ops]
            if _duplicates(names):
                raise InvalidRequestError("Error due to duplicate config keys")
            broker_loggers.alter(
                resource.resource_name,
                ctx.broker.settings.broker_id,
                ops,
                validate_only=validate_only,
            )
        elif resource.resource_type == RESOURCE_TOPIC:
            await topics.incremental_alter_configs(
                resource.resource_name, ops, validate_only=validate_only
            )
        else:
            await topics.incremental_alter_broker_configs(
                ops, scope=resource.resource_name, validate_only=validate_only
            )

    return ctx.build(
        "IncrementalAlterConfigsResponse",
        throttle_time=0,
        responses=await _alter_each(ctx, request, apply, keep_duplicates=True),
    )


async def _alter_each(
    ctx: RequestContext,
    request: Any,
    apply: Callable[[Any, Any, bool], Awaitable[None]],
    *,
    keep_duplicates: bool = False,
) -> tuple[Any, ...]:
    """Run ``apply`` for each topic or broker resource; one result (with its error) each.

    A resource named twice or more is applied in none of its entries, as Kafka: with
    ``keep_duplicates`` (IncrementalAlterConfigs, ConfigAdminManager) each entry is answered
    INVALID_REQUEST "Each resource must appear at most once."; otherwise (AlterConfigs,
    ControllerApis) the resource is answered once, INVALID_REQUEST "Duplicate resource."."""
    named = Counter((r.resource_type, r.resource_name) for r in request.resources)
    results = []
    answered: set[tuple[int, str]] = set()
    async for resource in ctx.paced(request.resources):
        key = (resource.resource_type, resource.resource_name)
        if named[key] > 1 and not keep_duplicates:
            if key in answered:
                continue
            answered.add(key)
        with _Outcome() as outcome:
            if named[key] > 1:
                raise InvalidRequestError(
                    "Each resource must appear at most once."
                    if keep_duplicates
                    else "Duplicate resource."
                )
            if resource.resource_type == RESOURCE_BROKER:
                _check_broker_name(ctx, resource.resource_name)
            elif resource.resource_type not in (RESOURCE_TOPIC, RESOURCE_BROKER_LOGGER):
                raise InvalidRequestError(f"Unsupported resource type {resource.resource_type}")
            await apply(resource, ctx.broker.topics, request.validate_only)
        results.append(
            ctx.build(
                "AlterConfigsResourceResponse",
                error_code=outcome.error,
                error_message=outcome.message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
            )
        )
    return tuple(results)


# -- DescribeCluster ------------------------------------------------------------------------------
@api(60, 0, 2)
async def handle_describe_cluster(ctx: RequestContext, request: Any) -> Any:
    broker = ctx.broker
    operations = cluster_operations(request.include_cluster_authorized_operations)
    endpoint_type = int(getattr(request, "endpoint_type", 1))
    if endpoint_type != 1:
        return ctx.build(
            "DescribeClusterResponse",
            throttle_time=0,
            error_code=ErrorCode.unsupported_endpoint_type,
            error_message="The request was sent to an endpoint of type BROKER, but we wanted "
            "an endpoint of type CONTROLLER",
            endpoint_type=endpoint_type,
            cluster_id=broker.metadata.cluster_id(),
            controller_id=-1,
            brokers=(),
            cluster_authorized_operations=UNKNOWN_AUTHORIZED_OPERATIONS,
        )
    return ctx.build(
        "DescribeClusterResponse",
        throttle_time=0,
        error_code=ErrorCode.none,
        error_message=None,
        endpoint_type=1,
        cluster_id=broker.metadata.cluster_id(),
        controller_id=broker.routing.controller_id(),
        brokers=tuple(  # the live brokers (this one alone on a single node)
            ctx.build(
                "DescribeClusterBroker",
                broker_id=b.broker_id,
                host=address[0],
                port=address[1],
                rack=b.rack,
                is_fenced=False,
            )
            for b in broker.routing.brokers()
            for address in (ctx.address_of(b.broker_id, b.host, b.port),)
        ),
        cluster_authorized_operations=operations,
    )
