"""ReplicaFetch (internal key 1000): a follower's fetch of the journal partitions this broker
leads (codec: stonemq/protocol/replica_fetch.py; the leader's side of replication:
stonemq/replication/manager.py).

Per journal partition, in Kafka's order (``Partition.fetchRecords``): led here and ready (else
NOT_LEADER_OR_FOLLOWER); the follower's leader epoch against this one (older:
FENCED_LEADER_EPOCH, newer: UNKNOWN_LEADER_EPOCH); the follower one of its replicas (else
NOT_LEADER_OR_FOLLOWER); its last epoch's end here (the journal's leader-epoch checkpoint):
when it ends before the follower's position, or the epoch is not in this history, the answer is
that *diverging epoch* and its end, and no bytes (the follower truncates there); a position
outside the journal gets OFFSET_OUT_OF_RANGE with this journal's start (a follower below it
catches up from this leader's state: handlers/catchup.py, replication/catchup.py). Otherwise
the follower's position is recorded (its end, split progress, caught-up time, the HW, an ISR
expansion) and whole journal entries from it are read: from the leader's in-memory tail of
the newest bytes when it holds them (replication/tail.py: what a follower that keeps up asks
for, answered on the loop with no file read), else from the files in the replica-read thread
(issue 17: no file read on the event loop). With less
than ``min_bytes`` ready the request waits, up to ``max_wait_ms``, for a journal write. A
journal partition whose read fails (a damaged entry's length or version, an I/O error) is
answered KAFKA_STORAGE_ERROR, logged once per position, while the request's other journal
partitions are served as usual (the follower backs off and asks again). Not advertised in
ApiVersions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kio.schema.errors import ErrorCode

from stonemq.handlers.context import RequestContext
from stonemq.protocol.replica_fetch import (
    REPLICA_FETCH_KEY,
    REPLICA_FETCH_VERSION,
    PartitionData,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    decode_request,
    encode_response,
)
from stonemq.server.metrics import METRICS
from stonemq.server.threads import name_os_thread
from stonemq.storage.errors import StorageError
from stonemq.storage.journal import CorruptEntryError, JournalReader

log = logging.getLogger("stonemq.replication")

INTERNAL: dict[int, tuple[int, int, Any, Any]] = {}
"""Internal API key -> (min version, max version, decode(frame, pos), handler)."""

_reads: ThreadPoolExecutor | None = None
_readers: dict[str, JournalReader] = {}
_failed_reads: dict[str, int] = {}  # journal directory -> position whose failed read was logged


def _read_thread() -> ThreadPoolExecutor:
    """One thread reads journal entries for followers (a reader and descriptor per journal
    partition, used by that thread only)."""
    global _reads
    if _reads is None:
        _reads = ThreadPoolExecutor(
            1, thread_name_prefix="stonemq-replica-read", initializer=name_os_thread
        )
    return _reads


_Job = tuple[str, int, int, int, int]
"""(journal directory, position, limit, max bytes, local journal partition) of one read."""
_Data = bytes | memoryview | Exception


def _read_entries(jobs: list[_Job]) -> list[_Data]:
    """In the replica-read thread: for each (directory, position, limit, max bytes, _), the
    bytes of the whole entries from ``position`` (``JournalReader.read_raw``), or the error
    that read raised (one damaged journal partition fails only its own answer)."""
    out: list[_Data] = []
    for directory, pos, limit, max_bytes, _ in jobs:
        try:
            reader = _readers.get(directory)
            if reader is None:
                reader = _readers[directory] = JournalReader(directory)
            out.append(reader.read_raw(pos, limit, max_bytes))
        except (CorruptEntryError, StorageError, OSError) as exc:
            out.append(exc)
    return out


async def handle_replica_fetch(ctx: RequestContext, request: ReplicaFetchRequest) -> Any:
    broker = ctx.broker
    manager = broker.replicas
    storage = broker.storage
    deadline = time.monotonic() + max(0, request.max_wait_ms) / 1000
    taken = manager.leaderships_taken  # a leadership taken here meanwhile ends the long poll
    while True:
        parts: list[PartitionData | None] = []
        jobs: list[_Job] = []
        slots: list[tuple[int, Any]] = []
        waiting: list[int] = []
        for p in request.partitions:
            answer, job = _check(broker, manager, storage, request.replica_id, p)
            parts.append(answer)
            if job is not None:
                slots.append((len(parts) - 1, p))
                jobs.append(job)
                waiting.append(p.journal_partition)
        datas = await _read(manager, jobs)
        total = sum(len(d) for d in datas if not isinstance(d, Exception))
        remaining = deadline - time.monotonic()
        if (
            total >= request.min_bytes
            or remaining <= 0
            or not waiting
            or len(waiting) < len(request.partitions)
            or manager.leaderships_taken != taken
            or any(isinstance(d, Exception) for d in datas)
        ):
            break
        if _written_since(manager, storage, slots, jobs):
            continue  # written while the read thread read: a wake-up wait_written missed
        await manager.wait_written(waiting, remaining)
    served = 0
    for (at, p), (directory, pos, _, _, _), data in zip(slots, jobs, datas, strict=True):
        state = manager.leader_state(p.journal_partition)
        epoch = state.epoch if state is not None else -1
        if isinstance(data, Exception):
            if _failed_reads.get(directory) != pos:
                _failed_reads[directory] = pos
                log.error(
                    "journal partition %d: reading position %d for replica %d failed (%s); "
                    "answered KAFKA_STORAGE_ERROR until it can be read",
                    p.journal_partition,
                    pos,
                    request.replica_id,
                    data,
                )
            parts[at] = PartitionData(
                p.journal_partition, ErrorCode.kafka_storage_error, epoch, -1, -1, -1, -1, b""
            )
            continue
        served += len(data)
        parts[at] = PartitionData(
            p.journal_partition,
            ErrorCode.none,
            epoch,
            state.hw if state is not None else -1,
            storage.journal_start(state.local) if state is not None else -1,
            -1,
            -1,
            data,
        )
    METRICS.replica_fetch_requests_served += 1
    METRICS.replica_fetch_bytes_served += served
    response = ReplicaFetchResponse(0, tuple(p for p in parts if p is not None))
    return encode_response(response, ctx.correlation_id)


async def _read(manager: Any, jobs: list[_Job]) -> list[_Data]:
    """Each job's bytes: from the journal partition's in-memory tail when it holds them (on
    the loop, no file touched), the others from the files in the replica-read thread, in
    one hand-off."""
    datas: list[_Data | None] = []
    missing: list[int] = []
    for k, (_, pos, limit, max_bytes, local) in enumerate(jobs):
        tail = manager.tail(local)
        data = tail.read(pos, limit, max_bytes) if tail is not None else None
        datas.append(data)
        if data is None:
            missing.append(k)
    METRICS.replica_fetch_tail_reads += len(jobs) - len(missing)
    if missing:
        METRICS.replica_fetch_file_reads += len(missing)
        read = await asyncio.get_running_loop().run_in_executor(
            _read_thread(), _read_entries, [jobs[k] for k in missing]
        )
        for k, data in zip(missing, read, strict=True):
            datas[k] = data
    return datas  # type: ignore[return-value]  # every None was replaced


def _written_since(
    manager: Any, storage: Any, slots: list[tuple[int, Any]], jobs: list[_Job]
) -> bool:
    """Whether a journal partition of this fetch was written past the end its read stopped
    at: the write's wake-up came before :meth:`wait_written` was waiting for it."""
    for (_, p), (_, _, end, _, _) in zip(slots, jobs, strict=True):
        state = manager.leader_state(p.journal_partition)
        if state is not None and storage.journal_written_end(state.local) > end:
            return True
    return False


def _check(broker: Any, manager: Any, storage: Any, replica: int, p: Any) -> tuple[Any, Any]:
    """(an answer without data, None) or (None, the read job) for one journal partition."""
    journal = p.journal_partition
    state = manager.leader_state(journal)

    def error(code: ErrorCode, epoch: int = -1) -> tuple[PartitionData, None]:
        return PartitionData(journal, code, epoch, -1, -1, -1, -1, b""), None

    if state is None:
        return error(ErrorCode.not_leader_or_follower)
    if p.leader_epoch < state.epoch:
        return error(ErrorCode.fenced_leader_epoch, state.epoch)
    if p.leader_epoch > state.epoch:
        return error(ErrorCode.unknown_leader_epoch, state.epoch)
    if replica not in state.replicas or replica == broker.broker_id:
        return error(ErrorCode.not_leader_or_follower, state.epoch)
    local = state.local
    if p.last_fetched_epoch >= 0:
        epoch, end = storage.epoch_end(local, p.last_fetched_epoch)
        if epoch != p.last_fetched_epoch or end < p.fetch_position:
            return PartitionData(
                journal,
                ErrorCode.none,
                state.epoch,
                state.hw,
                storage.journal_start(local),
                epoch,
                end,
                b"",
            ), None
    leader_end = storage.journal_written_end(local)
    start = storage.journal_start(local)
    if not start <= p.fetch_position <= leader_end:  # with the journal start, as Kafka's
        return PartitionData(  # log start offset: the follower tells below from above
            journal, ErrorCode.offset_out_of_range, state.epoch, state.hw, start, -1, -1, b""
        ), None
    manager.follower_fetched(state, replica, p.fetch_position, p.split_position)
    directory = storage.journal_directory(local)
    return None, (directory, p.fetch_position, leader_end, max(p.max_bytes, 0), local)


INTERNAL[REPLICA_FETCH_KEY] = (
    REPLICA_FETCH_VERSION,
    REPLICA_FETCH_VERSION,
    decode_request,
    handle_replica_fetch,
)


def _register_catch_up() -> None:
    """CatchUpPoint (handlers/catchup.py) beside ReplicaFetch in the internal APIs."""
    from stonemq.handlers.catchup import REGISTRATION

    key, entry = REGISTRATION
    INTERNAL[key] = entry


_register_catch_up()


def forget_reader(directory: str) -> None:
    """A journal partition's files were replaced (a follower's catch-up reset its journal):
    the replica-read thread's reader of them opens the new ones on its next read."""
    reader = _readers.pop(directory, None)
    if reader is not None and _reads is not None:
        _reads.submit(reader.close)
    _failed_reads.pop(directory, None)
