"""InitProducerId (22): producer ids and epochs for idempotent producers.

A fresh id comes from the metadata store (never reused, survives restarts). A producer that
presents its current id and epoch (KIP-360, v3+) gets the same id with the epoch bumped, or
a new id once the epoch would overflow. Transactions are not implemented yet, so a
transactional id is refused.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from stonemq.handlers.context import RequestContext
from stonemq.handlers.registry import api

MAX_EPOCH = 32767


@api(22, 0, 5)
async def handle_init_producer_id(ctx: RequestContext, request: Any) -> Any:
    if request.transactional_id is not None:
        return ctx.build(
            "InitProducerIdResponse",
            throttle_time=0,
            error_code=ErrorCode.transactional_id_authorization_failed,
            producer_id=-1,
            producer_epoch=-1,
        )
    producer_id = getattr(request, "producer_id", -1)
    epoch = getattr(request, "producer_epoch", -1)
    if producer_id >= 0 and 0 <= epoch < MAX_EPOCH - 1:
        new_id, new_epoch = producer_id, epoch + 1
    else:
        new_id, new_epoch = ctx.broker.metadata.allocate_producer_id(), 0
    return ctx.build(
        "InitProducerIdResponse",
        throttle_time=0,
        error_code=ErrorCode.none,
        producer_id=new_id,
        producer_epoch=new_epoch,
    )
