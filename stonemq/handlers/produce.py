"""Produce (0): validate each partition's record batch, assign offsets in the journal, ack.

Per partition, in order: the topic name (internal topics are the broker's own) and its
existence (an illegal name: INVALID_TOPIC_EXCEPTION; else UNKNOWN_TOPIC_OR_PARTITION, never
auto-created: as in Kafka, only a Metadata request creates a topic, when
``auto.create.topics.enable`` allows); exactly one RecordBatch
v2 (magic 2 only: UNSUPPORTED_FOR_MESSAGE_FORMAT otherwise); its size against ``max.message.bytes``
(MESSAGE_TOO_LARGE) and the topic's ``segment.bytes`` (RECORD_LIST_TOO_LARGE, as Kafka's
``UnifiedLog.append``: a segment must be able to hold it); CRC-32C (CORRUPT_MESSAGE); the
idempotent producer's epoch and sequence, checked by storage against the partition's producer
state (INVALID_PRODUCER_EPOCH, OUT_OF_ORDER_SEQUENCE_NUMBER; a duplicate is answered as success
with the original's offset, once the original is known to be stored:
stonemq/storage/producer_state.py); LogAppendTime when the topic asks for it. The batch is then
handed to the journal as opaque bytes: no per-record work. All of that happens before the first
await, so pipelined requests keep their order.

acks=0 gets no response; acks=1 and acks=-1 are answered once every batch of the request is
in its journal file (and fsynced when ``journal.flush.policy`` is ``always``). With one
broker, the journal is the whole ISR, so 1 and -1 wait for the same thing (a topic whose
``min.insync.replicas`` is above 1 refuses acks=-1 with NOT_ENOUGH_REPLICAS). In a cluster a
partition whose journal partition is not led here gets NOT_LEADER_OR_FOLLOWER, and acks=-1
checks the ISR against ``min.insync.replicas`` first (NOT_ENOUGH_REPLICAS), then is answered
once the journal partition's high watermark passes the batch (stonemq/replication/manager.py;
NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR was smaller then, REQUEST_TIMED_OUT after the
request's timeout).

Versions 3-13, as Kafka 4: v13 names topics by topic id (an unknown id: UNKNOWN_TOPIC_ID;
no auto-creation by id), and its answer carries the id instead of the name. From v10 a
NOT_LEADER_OR_FOLLOWER partition says who leads it and the response lists that leader's
endpoint (KIP-951), so the client goes there without a Metadata round trip. v12 differs from
v11 only for transactional producers (KIP-890), which are refused here.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32

from stonemq.handlers.context import RequestContext, field_names, named_once
from stonemq.handlers.registry import api
from stonemq.protocol.produce_response import LOG_START_VERSION, EncodedProduce, encode_body
from stonemq.protocol.record_batch import (
    COMPRESSION_NONE,
    BatchHeader,
    CorruptRecordError,
    InvalidRecordError,
    InvalidTimestampError,
    RecordBatchError,
    RecordsTooLargeError,
    TransactionalBatchError,
    UnsupportedMagicError,
    check_batch,
    check_records,
    set_log_append_time,
    set_max_timestamp,
)
from stonemq.server.threads import name_os_thread
from stonemq.storage.engine import StorageError, UnknownPartitionError
from stonemq.storage.errors import (
    DuplicateSequenceError,
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
    ProducerStateError,
)
from stonemq.topics import (
    AdminError,
    ProduceConfig,
    UnknownTopicIdError,
    is_internal,
    validate_topic_name,
)

log = logging.getLogger("stonemq.produce")

_BACKGROUND: set[asyncio.Future[None]] = set()

_PRODUCER_ERRORS = {
    InvalidProducerEpochError: ErrorCode.invalid_producer_epoch,
    OutOfOrderSequenceError: ErrorCode.out_of_order_sequence_number,
}


class _PartitionResult:
    __slots__ = (
        "append_time",
        "base_offset",
        "error",
        "index",
        "journal",
        "journal_end",
        "log_start",
        "message",
        "min_isr",
        "record_errors",
        "written",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.error = ErrorCode.none
        self.message: str | None = None
        self.base_offset = -1
        self.append_time = -1
        self.log_start = -1  # the partition's log start when the batch was appended; -1: ask
        self.written: asyncio.Future[None] | None = None
        # a cluster's acks=all: the journal partition, the journal position the HW must pass
        # and the topic's min.insync.replicas (journal_end -1: no wait for the HW)
        self.journal = -1
        self.journal_end = -1
        self.min_isr = 1
        # KIP-467: (record index, message) of each record that made the batch fail
        self.record_errors: tuple[tuple[int, str], ...] = ()

    def fail(self, error: ErrorCode, message: str | None = None) -> _PartitionResult:
        self.error, self.message = error, message
        return self


LEADER_HINTS_VERSION = 10
"""From v10 a NOT_LEADER_OR_FOLLOWER answer says who leads (KIP-951)."""
TOPIC_IDS_VERSION = 13
"""From v13 topics are named by topic id (KIP-516); an unknown id is UNKNOWN_TOPIC_ID."""


@api(0, 3, 13)
async def handle_produce(ctx: RequestContext, request: Any) -> Any:
    broker = ctx.broker
    acks = request.acks
    replicas = broker.replicas  # None on a single node
    topics: list[tuple[str, list[_PartitionResult]]] = []
    topic_ids: list[uuid.UUID | None] = []
    now_ms = _now_ms()  # the broker's time for the timestamp bounds, once per request
    # a partition named twice: appended and answered once, with its last records
    by_id = ctx.api_version >= TOPIC_IDS_VERSION
    replace = named_once(
        request.topic_data,
        (lambda t: t.topic_id) if by_id else (lambda t: t.name),
        lambda t: t.partition_data,
        lambda p: p.index,
    )
    for topic_data in request.topic_data:
        partition_data = topic_data.partition_data
        if replace is not None:
            partition_data = [q for p in partition_data if (q := replace[id(p)]) is not None]
            if not partition_data:
                continue
        results = [_PartitionResult(p.index) for p in partition_data]
        if ctx.api_version >= TOPIC_IDS_VERSION:
            topic_id = topic_data.topic_id
            topic_ids.append(topic_id)
            try:
                if topic_id is None or topic_id.int == 0:
                    raise UnknownTopicIdError("produce names its topic by id from v13")
                name = broker.topics.by_id(topic_id).name
            except AdminError as exc:
                topics.append(("", results))
                for r in results:
                    r.fail(exc.error_code, str(exc))
                continue
        else:
            name = topic_data.name
            topic_ids.append(None)
        topics.append((name, results))
        if request.transactional_id is not None:
            for r in results:
                r.fail(
                    ErrorCode.transactional_id_authorization_failed,
                    "transactions are not supported yet",
                )
            continue
        if acks not in (0, 1, -1):
            for r in results:
                r.fail(ErrorCode.invalid_required_acks)
            continue
        if is_internal(name):
            for r in results:
                r.fail(ErrorCode.invalid_topic_exception, f"Cannot append to internal topic {name}")
            continue
        try:
            # never auto-created by a produce: Kafka creates topics on Metadata requests
            # only, and answers a produce to a topic it does not know with
            # UNKNOWN_TOPIC_OR_PARTITION (an illegal name: INVALID_TOPIC_EXCEPTION here,
            # which clients do not retry)
            validate_topic_name(name)
            record = broker.topics.require(name)
            produce_config = broker.topics.produce_config(name)
        except AdminError as exc:
            for r in results:
                r.fail(exc.error_code, str(exc))
            continue
        if acks == -1 and replicas is None and produce_config.min_insync_replicas > 1:
            for r in results:  # a single node is an ISR of one
                r.fail(
                    ErrorCode.not_enough_replicas,
                    f"min.insync.replicas is {produce_config.min_insync_replicas}, the ISR 1",
                )
            continue
        for result, data in zip(results, partition_data, strict=True):
            if not 0 <= data.index < record.partitions:
                result.fail(ErrorCode.unknown_topic_or_partition)
                continue
            if replicas is not None:
                journal = record.journal_partitions[data.index]
                if not replicas.leads(journal):
                    result.fail(ErrorCode.not_leader_or_follower)
                    continue
                if acks == -1:
                    isr = replicas.isr_size(journal)
                    if isr < produce_config.min_insync_replicas:
                        result.fail(
                            ErrorCode.not_enough_replicas,
                            f"the ISR of {isr} is smaller than min.insync.replicas "
                            f"{produce_config.min_insync_replicas}",
                        )
                        continue
                    result.journal = journal
                    result.min_isr = produce_config.min_insync_replicas
            _append_one(ctx, name, result, data.records, produce_config, now_ms)

    if acks == 0:  # no answer: as Kafka, an error closes the connection (the producer's only
        # sign of it, so that it refreshes its metadata instead of sending on to a broker
        # that drops what it sends)
        failed = _acks0_failure(topics)
        if failed is not None:
            ctx.close_reason = failed
        pending = [r for _, rs in topics for r in rs if r.written is not None]
        if pending:  # nobody waits for the answer, but failures must still be undone
            task = asyncio.ensure_future(_settle_acks0(ctx, topics, failed is None))
            _BACKGROUND.add(task)
            task.add_done_callback(_BACKGROUND.discard)
        return None
    await _settle(ctx, topics)
    if replicas is not None and acks == -1:
        await _wait_for_isr(ctx, topics, request.timeout_ms / 1000)
    none, hints = ErrorCode.none, ctx.api_version >= LEADER_HINTS_VERSION
    if not any(
        r.error != none
        and ((hints and r.error == ErrorCode.not_leader_or_follower) or r.record_errors)
        for _, results in topics
        for r in results
    ):  # no KIP-951 leader hints nor KIP-467 record errors: the common shape, encoded here;
        # kio's entity is built only if the connection must change the answer (a throttle
        # time to set)
        return EncodedProduce(
            _encoded_body(ctx, topics, topic_ids),
            lambda: _response_entity(ctx, topics, topic_ids),
        )
    return _response_entity(ctx, topics, topic_ids)


def _response_entity(
    ctx: RequestContext,
    topics: list[tuple[str, list[_PartitionResult]]],
    topic_ids: list[uuid.UUID | None],
) -> Any:
    """The answer as a kio entity (encoded by kio: leader hints, or a throttle time set)."""
    endpoints: dict[int, Any] = {}
    partition_response = _partition_response(ctx)
    return ctx.build(
        "ProduceResponse",
        responses=tuple(
            ctx.build(
                "TopicProduceResponse",
                name=name,
                topic_id=topic_id,
                partition_responses=tuple(
                    partition_response(ctx, name, r, endpoints) for r in results
                ),
            )
            for (name, results), topic_id in zip(topics, topic_ids, strict=True)
        ),
        throttle_time=0,
        node_endpoints=tuple(
            ctx.build("NodeEndpoint", node_id=e.broker_id, host=e.host, port=e.port, rack=e.rack)
            for e in endpoints.values()
        ),
    )


def _encoded_body(
    ctx: RequestContext,
    topics: list[tuple[str, list[_PartitionResult]]],
    topic_ids: list[uuid.UUID | None],
) -> bytes:
    """The response body as :mod:`stonemq.protocol.produce_response` writes it, from the
    results a kio entity would be built from (a partition that has no log start offset yet,
    one that failed before its append, gets it here, as the entity's builder would)."""
    none = ErrorCode.none
    if ctx.api_version >= LOG_START_VERSION:
        for name, results in topics:
            for r in results:
                if r.log_start < 0:
                    r.log_start = _log_start(ctx, name, r)
    return encode_body(
        ctx.api_version,
        [
            (
                name,
                topic_id,
                [
                    (
                        r.index,
                        r.error.value,
                        r.base_offset if r.error == none else -1,
                        r.append_time,
                        r.log_start,
                        r.message if r.error != none else None,
                    )
                    for r in results
                ],
            )
            for (name, results), topic_id in zip(topics, topic_ids, strict=True)
        ],
    )


def _partition_response(
    ctx: RequestContext,
) -> Callable[[RequestContext, str, _PartitionResult, dict[int, Any]], Any]:
    """The builder of one PartitionProduceResponse for this request's version (the class
    and the fields it has looked up once per version, not once per partition: a request of
    the multi-partition generator answers 1,024 partitions)."""
    return _PARTITION_RESPONSES.get(ctx.api_version) or _partition_response_for(ctx)


_PARTITION_RESPONSES: dict[
    int, Callable[[RequestContext, str, _PartitionResult, dict[int, Any]], Any]
] = {}


def _partition_response_for(
    ctx: RequestContext,
) -> Callable[[RequestContext, str, _PartitionResult, dict[int, Any]], Any]:
    cls = ctx.module.PartitionProduceResponse
    names = field_names(cls)
    optional = {  # the fields later versions added (v5, v8), sent when the version has them
        name: value
        for name, value in (("record_errors", ()), ("error_message", None))
        if name in names
    }
    with_log_start = "log_start_offset" in names
    hints = ctx.api_version >= LEADER_HINTS_VERSION
    none = ErrorCode.none

    def build(
        ctx: RequestContext, topic: str, r: _PartitionResult, endpoints: dict[int, Any]
    ) -> Any:
        values = dict(optional)
        if with_log_start:
            if r.log_start < 0:  # kept: the encoded body (``_encoded_body``) answers it too
                r.log_start = _log_start(ctx, topic, r)
            values["log_start_offset"] = r.log_start
        if r.error != none:
            if "error_message" in values:
                values["error_message"] = r.message
            if r.record_errors and "record_errors" in values:
                values["record_errors"] = tuple(
                    ctx.build(
                        "BatchIndexAndErrorMessage",
                        batch_index=i32(index),
                        batch_index_error_message=message,
                    )
                    for index, message in r.record_errors
                )
            if hints and r.error == ErrorCode.not_leader_or_follower:
                values.update(_leader_hint(ctx, topic, r, endpoints))
        return cls(
            index=r.index,
            error_code=r.error,
            base_offset=r.base_offset if r.error == none else -1,
            log_append_time=_as_datetime(r.append_time),
            **values,
        )

    _PARTITION_RESPONSES[ctx.api_version] = build
    return build


def _leader_hint(
    ctx: RequestContext, topic: str, result: _PartitionResult, endpoints: dict[int, Any]
) -> dict[str, Any]:
    """KIP-951 (v10+): a NOT_LEADER_OR_FOLLOWER partition carries its current leader and
    epoch, and the leader's endpoint joins the response's ``node_endpoints``."""
    if ctx.api_version < LEADER_HINTS_VERSION or result.error != ErrorCode.not_leader_or_follower:
        return {}
    leader, epoch, endpoint = ctx.current_leader(topic, result.index)
    if endpoint is not None:
        endpoints[endpoint.broker_id] = endpoint
    return {"current_leader": ctx.build("LeaderIdAndEpoch", leader_id=leader, leader_epoch=epoch)}


def _append_one(
    ctx: RequestContext,
    topic: str,
    result: _PartitionResult,
    records: bytes | memoryview | None,
    config: ProduceConfig,
    now_ms: int,
) -> None:
    """Validate one partition's batch and append it, before the request's first await (so
    pipelined batches keep their order); a large compressed batch is validated in a thread
    and appended after, with later batches to its partition queued behind it."""
    partition = result.index
    if not records:
        result.fail(ErrorCode.invalid_record, "produce request without a record batch")
        return
    if len(records) > config.max_message_bytes:
        result.fail(
            ErrorCode.message_too_large,
            f"batch of {len(records)} bytes exceeds max.message.bytes {config.max_message_bytes}",
        )
        return
    if len(records) > config.segment_bytes:  # Kafka's UnifiedLog.append: a segment holds it
        result.fail(
            ErrorCode.record_list_too_large,
            f"batch of {len(records)} bytes exceeds the topic's segment.bytes "
            f"{config.segment_bytes}",
        )
        return
    try:
        header = check_batch(records)
    except RecordBatchError as exc:
        _refuse(ctx, topic, result, exc)
        return
    gates = ctx.broker.produce_gates
    key = (topic, partition)
    waiting = gates.get(key)
    deferred = waiting is not None or (
        header.compression != COMPRESSION_NONE and len(records) > INLINE_COMPRESSED_BYTES
    )
    if not deferred:
        limits = config.limits
        bound = min(limits.max_uncompressed_bytes, INLINE_UNCOMPRESSED_BYTES)
        try:
            max_timestamp = check_records(records, header, limits, now_ms, bound)
        except RecordsTooLargeError:
            if bound >= limits.max_uncompressed_bytes:
                result.fail(ErrorCode.message_too_large, "records decompress past the bound")
                return
            deferred = True  # too large to decompress on the event loop
        except RecordBatchError as exc:
            _refuse(ctx, topic, result, exc)
            return
        else:
            _store(ctx, topic, result, records, header, config, max_timestamp)
            return
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    gates[key] = gate
    written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    result.written = written
    task = asyncio.ensure_future(
        _append_later(ctx, topic, result, records, header, config, waiting, gate, written)
    )
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


async def _append_later(
    ctx: RequestContext,
    topic: str,
    result: _PartitionResult,
    records: bytes | memoryview,
    header: BatchHeader,
    config: ProduceConfig,
    waiting: asyncio.Future[None] | None,
    gate: asyncio.Future[None],
    written: asyncio.Future[None],
) -> None:
    """The deferred half of :func:`_append_one`: validate in the validator thread, wait for
    the batch ahead on the partition to be appended, append; ``gate`` lets the next batch go,
    ``written`` carries this one's outcome to the response."""
    loop = asyncio.get_running_loop()
    key = (topic, result.index)
    try:
        try:
            max_timestamp = await loop.run_in_executor(
                _validator(), check_records, records, header, config.limits, _now_ms()
            )
        except RecordBatchError as exc:
            _refuse(ctx, topic, result, exc)
            return
        if waiting is not None:
            await asyncio.shield(waiting)
        _store(ctx, topic, result, records, header, config, max_timestamp)
    finally:
        if ctx.broker.produce_gates.get(key) is gate:
            del ctx.broker.produce_gates[key]
        gate.set_result(None)
        _chain(result.written if result.written is not written else None, written)


def _chain(source: asyncio.Future[None] | None, target: asyncio.Future[None]) -> None:
    """Resolve ``target`` as ``source`` resolves (at once when there is none)."""
    if source is None:
        if not target.done():  # cancelled when its request was dropped (connection closed)
            target.set_result(None)
        return

    def copy(done: asyncio.Future[None]) -> None:
        if target.done():
            return
        if done.cancelled():
            target.cancel()
        elif done.exception() is not None:
            target.set_exception(done.exception())  # type: ignore[arg-type]
        else:
            target.set_result(None)

    source.add_done_callback(copy)


def _store(
    ctx: RequestContext,
    topic: str,
    result: _PartitionResult,
    records: bytes | memoryview,
    header: BatchHeader,
    config: ProduceConfig,
    max_timestamp: int,
) -> None:
    """Append a validated batch (as received unless a timestamp must be set, as Kafka
    rewrites a LogAppendTime topic's batches or a wrong max timestamp)."""
    batch: bytes | bytearray | memoryview = records  # written as received: no copy
    if config.log_append_time:
        batch = bytearray(records)
        result.append_time = _now_ms()
        set_log_append_time(batch, 0, result.append_time)
    elif header.max_timestamp != max_timestamp:
        batch = bytearray(records)
        set_max_timestamp(batch, 0, max_timestamp)
    try:
        appended = ctx.broker.storage.append(
            topic, result.index, batch, header.record_count, producer=header, crc_checked=True
        )
    except DuplicateSequenceError as dup:  # answered with the original's offset once stored
        result.base_offset = dup.base_offset
        if config.log_append_time:  # and its append time, not this retry's (Kafka's
            result.append_time = dup.timestamp  # UnifiedLog: the duplicate's timestamp)
        result.written = dup.written  # type: ignore[assignment]
        _note_journal_end(ctx, result)  # the original is at or before it
        return
    except ProducerStateError as exc:
        result.fail(_PRODUCER_ERRORS[type(exc)], str(exc))
        return
    except UnknownPartitionError:  # not hosted here: NOT_LEADER_OR_FOLLOWER in a cluster
        result.fail(ctx.not_here(topic, result.index))
        return
    except StorageError as exc:
        result.fail(ErrorCode.kafka_storage_error, str(exc))
        return
    result.base_offset = appended.base_offset
    result.log_start = appended.log_start_offset
    result.written = appended.written
    if result.journal >= 0:
        _note_journal_end(ctx, result)


def _note_journal_end(ctx: RequestContext, result: _PartitionResult) -> None:
    """acks=all in a cluster: the journal position the HW must pass (the end of what the
    journal partition holds or queues now, the batch included)."""
    if result.journal < 0:
        return
    local = ctx.broker.routing.local_index(result.journal)
    if local is not None:
        result.journal_end = ctx.broker.storage.journal_end(local)


async def _wait_for_isr(
    ctx: RequestContext, topics: list[tuple[str, list[_PartitionResult]]], timeout_s: float
) -> None:
    """Delayed produce (Kafka's ``DelayedProduce``): each written acks=all batch is answered
    once its journal partition's HW passes it; NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR
    was smaller than min.insync.replicas then, NOT_LEADER_OR_FOLLOWER when leadership went
    first, REQUEST_TIMED_OUT after the request's timeout (one timer for the request)."""
    from stonemq.replication.manager import NotLeaderError

    replicas = ctx.broker.replicas
    assert replicas is not None
    waits: list[tuple[_PartitionResult, asyncio.Future[int]]] = []
    for _, results in topics:
        for r in results:
            if r.error == ErrorCode.none and r.journal_end >= 0:
                waits.append((r, replicas.wait_for_hw(r.journal, r.journal_end)))
    if not waits:
        return
    pending = [f for _, f in waits if not f.done()]
    if pending:
        await asyncio.wait(pending, timeout=max(timeout_s, 0))
    for r, future in waits:
        if not future.done():
            future.cancel()
            r.fail(ErrorCode.request_timed_out, "the ISR did not reach the batch in time")
        elif isinstance(future.exception(), NotLeaderError):
            r.fail(ErrorCode.not_leader_or_follower)
        elif future.exception() is not None:
            r.fail(ErrorCode.unknown_server_error, str(future.exception()))
        elif future.result() < r.min_isr:
            r.fail(
                ErrorCode.not_enough_replicas_after_append,
                f"written, but the ISR of {future.result()} is smaller than "
                f"min.insync.replicas {r.min_isr}",
            )


def _refuse(ctx: RequestContext, topic: str, result: _PartitionResult, exc: Exception) -> None:
    """Answer a batch the validator refused with its Kafka error (and log corrupt ones)."""
    error = _BATCH_ERRORS.get(type(exc), ErrorCode.invalid_record)
    if error == ErrorCode.corrupt_message:
        log.warning("corrupt batch for %s-%d from %s: %s", topic, result.index, ctx.client_id, exc)
    result.fail(error, str(exc))
    if isinstance(exc, InvalidTimestampError):
        result.record_errors = exc.record_errors


_BATCH_ERRORS = {
    UnsupportedMagicError: ErrorCode.unsupported_for_message_format,
    CorruptRecordError: ErrorCode.corrupt_message,
    InvalidRecordError: ErrorCode.invalid_record,
    InvalidTimestampError: ErrorCode.invalid_timestamp,
    RecordsTooLargeError: ErrorCode.message_too_large,
    TransactionalBatchError: ErrorCode.transactional_id_authorization_failed,
}

INLINE_COMPRESSED_BYTES = 64 * 1024
"""A compressed batch up to this size is validated on the event loop (its records decompress
to at most ``INLINE_UNCOMPRESSED_BYTES`` there: a millisecond or so); a larger one, or one
that decompresses to more, in the validator thread."""
INLINE_UNCOMPRESSED_BYTES = 1024 * 1024

_pool: ThreadPoolExecutor | None = None


def _validator() -> ThreadPoolExecutor:
    """One thread validates large compressed batches (the codecs release the GIL): at most
    one decompression of up to ``batch.max.uncompressed.bytes`` is in memory at a time."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(
            1, thread_name_prefix="stonemq-validator", initializer=name_os_thread
        )
    return _pool


def _now_ms() -> int:
    return int(time.time() * 1000)


def _acks0_failure(topics: list[tuple[str, list[_PartitionResult]]]) -> str | None:
    """Why an acks=0 produce closes its connection: its first partition error, or None."""
    for name, results in topics:
        for r in results:
            if r.error != ErrorCode.none:
                return f"acks=0 produce to {name}-{r.index} failed: {r.error.name.upper()}"
    return None


async def _settle_acks0(
    ctx: RequestContext, topics: list[tuple[str, list[_PartitionResult]]], open_: bool
) -> None:
    """:func:`_settle` for an acks=0 produce: a write that failed closes the connection too
    (``open_``: it was not closed for an error found before the writes)."""
    await _settle(ctx, topics)
    failed = _acks0_failure(topics) if open_ else None
    if failed is not None and ctx.turns is not None:
        ctx.turns.hang_up(failed)


async def _settle(ctx: RequestContext, topics: list[tuple[str, list[_PartitionResult]]]) -> None:
    """Wait until every appended batch is written; turn write failures into errors."""
    for name, results in topics:
        for r in results:
            if r.written is None:
                continue
            try:
                await r.written
            except StorageError as exc:
                log.error("journal write failed for %s-%d: %s", name, r.index, exc)
                r.fail(ErrorCode.kafka_storage_error, str(exc))


def _log_start(ctx: RequestContext, topic: str, result: _PartitionResult) -> int:
    if result.error in (
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.unknown_topic_id,
        ErrorCode.invalid_topic_exception,
    ):
        return -1
    try:
        return ctx.broker.storage.log_start_offset(topic, result.index)
    except UnknownPartitionError:
        return -1


def _as_datetime(timestamp_ms: int) -> datetime.datetime | None:
    """kio's type for log_append_time: None stands for -1 (CreateTime)."""
    if timestamp_ms < 0:
        return None
    return datetime.datetime.fromtimestamp(timestamp_ms / 1000, tz=datetime.UTC)
