"""DeleteRecords (21): advance partitions' log start offsets on request, on every replica.

Per partition, as Kafka answers: an unknown topic or partition is UNKNOWN_TOPIC_OR_PARTITION;
in a cluster, a partition not led here is NOT_LEADER_OR_FOLLOWER; an offset of -1 means the
high watermark; an offset above the high watermark (or below -1) is OFFSET_OUT_OF_RANGE; an
internal topic is INVALID_TOPIC_EXCEPTION (its coordinator trims it); otherwise the log start
offset becomes max(current, offset) and ``low_watermark`` is the new log start offset. A
storage failure is KAFKA_STORAGE_ERROR.

Before it checks the offset the request waits for the split to reach what was acknowledged
(``FetchWaiters.until_split``, at most a second for the whole request), so a delete up to a
record acknowledged just before, or to -1, covers it as on a single Kafka broker.

The deletion is a log-start entry in the partition's journal partition
(``StorageEngine.delete_records``), so every replica applies it, in order with the batches,
and a new leader keeps it. The answer waits, as Kafka's delayed DeleteRecords waits for the
low watermark, until the entry is written, below the journal high watermark in a cluster (every
replica in the ISR holds it), split here (the log start has moved: a fetch below it is
OFFSET_OUT_OF_RANGE) and split by every follower in the ISR (their replica fetches report
how far their splitters got), so whichever replica leads next starts the partition there
too; REQUEST_TIMED_OUT when that takes longer than the request's
``timeout_ms`` (at least ``ACKNOWLEDGED_WAIT_S``), NOT_LEADER_OR_FOLLOWER when leadership
goes first. The entry stays: it is applied later.

A tiered topic's log start covers its archive too (KIP-405): the cold log start moves to the
offset as well (``TierService.delete_records``: the manifest first, then the files), also for
an offset below the local log start, and ``low_watermark`` is the log start a client sees.
Its log-start entry is written then too: each replica archives into its own cold store, and
every replica's splitter, applying the entry, moves its own cold log start
(``TierService.on_log_start``, the leader's included: tried again until made, and after a
restart's re-split), so a later leader does not serve the deleted records from its archive.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kio.schema.errors import ErrorCode

from stonemq.handlers.context import RequestContext
from stonemq.handlers.fetch_waiters import ACKNOWLEDGED_WAIT_S
from stonemq.handlers.registry import api
from stonemq.storage.engine import (
    LogStartAppend,
    OffsetOutOfRangeError,
    StorageError,
    UnknownPartitionError,
)
from stonemq.topics import is_internal

log = logging.getLogger(__name__)


class _Result:
    """One partition's answer, and its queued log-start entry while the answer waits."""

    __slots__ = ("cold", "error", "index", "journal", "low_watermark", "queued", "topic")

    def __init__(self, topic: str, index: int) -> None:
        self.topic = topic
        self.index = index
        self.error = ErrorCode.none
        self.low_watermark = -1
        self.queued: LogStartAppend | None = None
        self.journal = -1  # the journal partition (a cluster's id) the entry went to
        self.cold = -1  # a tiered partition: the offset its cold log start moves to


@api(21, 0, 2)
async def handle_delete_records(ctx: RequestContext, request: Any) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ACKNOWLEDGED_WAIT_S  # for the whole request
    storage, waiters = ctx.broker.storage, ctx.broker.fetch_waiters
    tier = getattr(ctx.broker, "tier", None)
    answers: list[tuple[str, list[_Result]]] = []
    async for topic in ctx.paced(request.topics):
        record = ctx.broker.topics.get(topic.name)
        results = []
        async for p in ctx.paced(topic.partitions):
            result = _Result(topic.name, p.partition_index)
            results.append(result)
            if record is None or not 0 <= p.partition_index < record.partitions:
                result.error = ErrorCode.unknown_topic_or_partition
            elif is_internal(topic.name):  # Kafka: "Cannot delete records of internal topic"
                result.error = ErrorCode.invalid_topic_exception
            elif ctx.not_led_here(record, p.partition_index):  # a follower holds it too
                result.error = ErrorCode.not_leader_or_follower
            elif (
                "delete"
                not in ctx.broker.topics.effective_config(topic.name).values["cleanup.policy"]
            ):  # Kafka's Partition.deleteRecordsOnLeader: "Records of partition ... can not be
                # deleted due to the configured policy" (an empty cleanup.policy here)
                result.error = ErrorCode.policy_violation
            else:
                result.journal = record.journal_partitions[p.partition_index]
                try:
                    await waiters.until_split(storage, topic.name, p.partition_index, deadline)
                    offset, tiered = p.offset, False
                    if tier is not None and tier.tiered(topic.name):  # KIP-405: the archive too
                        if offset == -1:
                            offset = storage.high_watermark(topic.name, p.partition_index)
                        result.cold = offset  # below -1: refused by storage just below
                        tiered = True
                    # a tiered partition's entry is written also below the local log start:
                    # every replica's splitter moves its own cold log start with it
                    result.queued = storage.delete_records(
                        topic.name, p.partition_index, offset, archived=tiered
                    )
                except UnknownPartitionError:  # not hosted here: led by another broker?
                    result.error = ctx.not_here(topic.name, p.partition_index)
                except OffsetOutOfRangeError:
                    result.error = ErrorCode.offset_out_of_range
                except (StorageError, OSError):
                    result.error = ErrorCode.kafka_storage_error
        answers.append((topic.name, results))
    await _until_applied(ctx, answers, max(request.timeout.total_seconds(), ACKNOWLEDGED_WAIT_S))
    built: list[list[Any]] = [[] for _ in answers]
    flat = ((i, r) for i, (_, results) in enumerate(answers) for r in results)
    async for i, r in ctx.paced(flat):
        if r.error == ErrorCode.none:
            if r.cold >= 0 and tier is not None:
                await tier.load_manifests([(r.topic, r.index)])
            try:
                r.low_watermark = storage.log_start_offset(r.topic, r.index)
                if r.cold >= 0 and tier is not None:
                    r.low_watermark = tier.log_start(r.topic, r.index, r.low_watermark)
            except UnknownPartitionError:  # deleted meanwhile
                r.error = ErrorCode.unknown_topic_or_partition
        built[i].append(
            ctx.build(
                "DeleteRecordsPartitionResult",
                partition_index=r.index,
                low_watermark=r.low_watermark,
                error_code=r.error,
            )
        )
    return ctx.build(
        "DeleteRecordsResponse",
        throttle_time=0,
        topics=tuple(
            ctx.build("DeleteRecordsTopicResult", name=name, partitions=tuple(parts))
            for (name, _), parts in zip(answers, built, strict=True)
        ),
    )


async def _until_applied(
    ctx: RequestContext, answers: list[tuple[str, list[_Result]]], timeout_s: float
) -> None:
    """Wait for every queued log-start entry to be written, replicated (a cluster: below
    the journal HW) and split here, all within ``timeout_s``; set each result's error."""
    waits = {
        asyncio.ensure_future(_applied(ctx, r)): r
        for _, results in answers
        for r in results
        if (r.queued is not None or r.cold >= 0) and r.error == ErrorCode.none
    }
    if not waits:
        return
    done, pending = await asyncio.wait(waits, timeout=timeout_s)
    for task in pending:
        task.cancel()
        waits[task].error = ErrorCode.request_timed_out
    for task in done:
        error = task.result()
        if error != ErrorCode.none:
            waits[task].error = error


async def _applied(ctx: RequestContext, result: _Result) -> ErrorCode:
    from stonemq.replication.manager import NotLeaderError

    queued = result.queued
    if queued is not None:
        try:
            await asyncio.shield(queued.written)  # a timeout leaves the entry to be written
        except (StorageError, OSError):
            return ErrorCode.kafka_storage_error
        replicas = ctx.broker.replicas
        if replicas is not None:
            try:
                await replicas.wait_for_hw(result.journal, queued.end)
            except NotLeaderError:
                return ErrorCode.not_leader_or_follower
        await ctx.broker.storage.split_past(queued.journal, queued.end)
        if replicas is not None:
            try:  # every ISR replica applied it: whichever leads next starts there too
                await replicas.wait_for_split(result.journal, queued.end)
            except NotLeaderError:
                return ErrorCode.not_leader_or_follower
    if result.cold >= 0:
        try:
            await asyncio.shield(
                ctx.broker.tier.delete_records(result.topic, result.index, result.cold)
            )
        except Exception as exc:  # the cold store failed: the next DeleteRecords tries again
            log.warning(
                "DeleteRecords of %s-%d in the archive failed: %s", result.topic, result.index, exc
            )
            return ErrorCode.kafka_storage_error
    return ErrorCode.none
