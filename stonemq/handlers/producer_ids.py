"""InitProducerId (22): producer ids and epochs for idempotent producers.

Without a transactional id, every request gets a fresh id from the metadata store (never
reused, survives restarts), whatever id and epoch it presents, as Kafka's coordinator answers
(KIP-360's epoch bump is for transactional producers): bumping the epoch of an id the client
names would let one client fence another's producer. Transactions are not implemented yet,
so a transactional id is refused.

v6 adds two-phase commit (KIP-939: ``enable2_pc``, ``keep_prepared_txn``), which only a
transactional producer may use; the answer's ongoing-transaction producer id and epoch are
-1 (no transaction is ongoing) for every request served here.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from stonemq.handlers.context import RequestContext
from stonemq.handlers.registry import api


@api(22, 0, 6)
async def handle_init_producer_id(ctx: RequestContext, request: Any) -> Any:
    if request.transactional_id is not None:
        return ctx.build(
            "InitProducerIdResponse",
            throttle_time=0,
            error_code=ErrorCode.transactional_id_authorization_failed,
            producer_id=-1,
            producer_epoch=-1,
            ongoing_txn_producer_id=-1,
            ongoing_txn_producer_epoch=-1,
        )
    return ctx.build(
        "InitProducerIdResponse",
        throttle_time=0,
        error_code=ErrorCode.none,
        producer_id=await ctx.broker.topics.allocate_producer_id(),
        producer_epoch=0,
        ongoing_txn_producer_id=-1,
        ongoing_txn_producer_epoch=-1,
    )
