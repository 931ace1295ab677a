"""CatchUpPoint (internal key 1001): the leader's answer to a follower behind its journal start
(codec: stonemq/protocol/catchup.py; the follower's side: stonemq/replication/catchup.py).

Checked in ReplicaFetch's order: led here and ready (else NOT_LEADER_OR_FOLLOWER), the
follower's leader epoch against this one (older: FENCED_LEADER_EPOCH, newer:
UNKNOWN_LEADER_EPOCH), the follower one of its replicas (else NOT_LEADER_OR_FOLLOWER). The
answer is taken in one event-loop step, so it is one consistent point: P is the journal
partition's split position now, every topic partition routed to it ends at its queue log's
end (what is split from the journal below P), with its log start offset, and the epochs are
the journal's leader-epoch history up to P. The leader keeps its journal from P for that
follower for ``CATCH_UP_RETAIN_S`` (``ReplicaManager.retain_for_catch_up``), so the follower
finds the bytes after P when its copy is done. Not advertised in ApiVersions.
"""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from stonemq.handlers.context import RequestContext
from stonemq.protocol.catchup import (
    CATCH_UP_KEY,
    CATCH_UP_VERSION,
    CatchUpPartition,
    CatchUpRequest,
    CatchUpResponse,
    decode_request,
    encode_response,
)

log = logging.getLogger("stonemq.replication")


def answer(broker: Any, request: CatchUpRequest) -> CatchUpResponse:
    """The answer for ``request`` (on the loop, in one step)."""
    manager = broker.replicas
    storage = broker.storage
    state = manager.leader_state(request.journal_partition)

    def error(code: ErrorCode, epoch: int = -1) -> CatchUpResponse:
        return CatchUpResponse(code, epoch, -1, -1, (), ())

    if state is None:
        return error(ErrorCode.not_leader_or_follower)
    if request.leader_epoch < state.epoch:
        return error(ErrorCode.fenced_leader_epoch, state.epoch)
    if request.leader_epoch > state.epoch:
        return error(ErrorCode.unknown_leader_epoch, state.epoch)
    if request.replica_id not in state.replicas or request.replica_id == broker.broker_id:
        return error(ErrorCode.not_leader_or_follower, state.epoch)
    point, epochs, partitions = storage.catch_up_point(state.local)
    manager.retain_for_catch_up(state, request.replica_id, point)
    log.info(
        "journal partition %d: replica %d catches up from point %d (%d topic partitions)",
        request.journal_partition,
        request.replica_id,
        point,
        len(partitions),
    )
    return CatchUpResponse(
        ErrorCode.none,
        state.epoch,
        point,
        storage.journal_start(state.local),
        tuple(epochs),
        tuple(CatchUpPartition(*p) for p in partitions),
    )


async def handle_catch_up(ctx: RequestContext, request: CatchUpRequest) -> Any:
    return encode_response(answer(ctx.broker, request), ctx.correlation_id)


REGISTRATION = (CATCH_UP_KEY, (CATCH_UP_VERSION, CATCH_UP_VERSION, decode_request, handle_catch_up))
