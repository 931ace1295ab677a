"""Client quota admin APIs: DescribeClientQuotas (48) and AlterClientQuotas (49), KIP-546.

Validation and matching are :mod:`stonemq.quotas.entity`'s (Kafka 4's rules and messages);
a change is written to the metadata store in its thread, then handed to the broker's
:class:`~stonemq.quotas.manager.QuotaManager`, so it applies to the next request of every
live connection (other brokers of a cluster see it through their store's watch). One bad
entry gets its own error and never fails the others; a request with ``validate_only`` checks
every entry and changes nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from stonemq.handlers.context import RequestContext
from stonemq.handlers.registry import api
from stonemq.quotas.entity import (
    Entity,
    QuotaRequestError,
    describe_entity,
    parse_filter,
    validate_entity,
    validate_value,
)

log = logging.getLogger("stonemq.admin")


@api(48, 0, 1)
async def handle_describe_client_quotas(ctx: RequestContext, request: Any) -> Any:
    try:
        quota_filter = parse_filter(
            ((c.entity_type, int(c.match_type), c.match) for c in request.components),
            request.strict,
        )
    except QuotaRequestError as exc:
        return ctx.build(
            "DescribeClientQuotasResponse",
            throttle_time=0,
            error_code=getattr(ErrorCode, exc.error),
            error_message=exc.message,
            entries=None,
        )
    entries = tuple(
        [
            ctx.build(
                "EntryData",
                entity=tuple(
                    ctx.build("EntityData", entity_type=entity_type, entity_name=name)
                    for entity_type, name in entity
                ),
                values=tuple(
                    ctx.build("ValueData", key=key, value=value)
                    for key, value in sorted(values.items())
                ),
            )
            async for entity, values in ctx.paced(list(ctx.broker.quotas.quotas.items()))
            if quota_filter.matches(entity)
        ]
    )
    return ctx.build(
        "DescribeClientQuotasResponse",
        throttle_time=0,
        error_code=ErrorCode.none,
        error_message=None,
        entries=entries,
    )


@api(49, 0, 1)
async def handle_alter_client_quotas(ctx: RequestContext, request: Any) -> Any:
    outcomes: list[tuple[Any, ErrorCode, str | None]] = []
    changes: dict[Entity, dict[str, float | None]] = {}
    seen: set[Entity] = set()
    async for entry in ctx.paced(request.entries):
        try:
            entity = validate_entity([(e.entity_type, e.entity_name) for e in entry.entity])
            if entity in seen:
                raise QuotaRequestError(
                    "invalid_request", f"Ignoring duplicate entity {describe_entity(entity)}"
                )
            seen.add(entity)
            ops: dict[str, float | None] = {}
            for op in entry.ops:
                if op.key in ops:
                    raise QuotaRequestError(
                        "invalid_request",
                        f"Duplicate quota key {op.key} not updating quota for this entity "
                        f"{describe_entity(entity)}",
                    )
                ops[op.key] = None if op.remove else float(op.value)
            for key, value in ops.items():
                if value is not None:
                    validate_value(entity, key, value)
        except QuotaRequestError as exc:
            outcomes.append((entry.entity, getattr(ErrorCode, exc.error), exc.message))
            continue
        changes[entity] = ops
        outcomes.append((entry.entity, ErrorCode.none, None))
    if changes and not request.validate_only:
        broker = ctx.broker
        try:
            quotas = await broker.topics.in_store_thread(
                broker.metadata.alter_client_quotas, changes
            )
        except Exception as exc:
            log.error("altering client quotas failed", exc_info=exc)
            message = f"{type(exc).__name__}: {exc}"
            outcomes = [
                (entity, ErrorCode.unknown_server_error, message)
                if error == ErrorCode.none
                else (entity, error, text)
                for entity, error, text in outcomes
            ]
        else:
            broker.quotas.update(quotas)
            log.info("client quotas altered: %s", _describe_changes(changes))
    return ctx.build(
        "AlterClientQuotasResponse",
        throttle_time=0,
        entries=tuple(
            [
                ctx.build(
                    "EntryData",
                    error_code=error,
                    error_message=message,
                    entity=tuple(
                        ctx.build(
                            "EntityData", entity_type=e.entity_type, entity_name=e.entity_name
                        )
                        for e in entity
                    ),
                )
                async for entity, error, message in ctx.paced(outcomes)
            ]
        ),
    )


def _describe_changes(changes: dict[Entity, dict[str, float | None]]) -> str:
    return "; ".join(
        f"{describe_entity(entity)} "
        + ", ".join(f"{k}={'<removed>' if v is None else v}" for k, v in ops.items())
        for entity, ops in changes.items()
    )
