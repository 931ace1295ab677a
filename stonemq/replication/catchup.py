"""A follower behind its leader's journal start catches up from the leader's state at one
point (docs/architecture.md, "Behind the leader's journal start").

The leader deleted journal segments this follower still needs (it was out of the ISR), so
its journal cannot continue where it stopped: its queue logs would lack every batch the
leader split from the deleted bytes. One attempt (:func:`catch_up`), over one connection to
the leader, for one journal partition:

1. **The point.** CatchUpPoint (internal key 1001, handlers/catchup.py) with this broker's
   leader epoch: the leader answers P (its split position: at or above its journal start),
   its epoch history up to P, and each topic partition routed to the journal partition with
   its log start offset and its end offset at P.
2. **Ready.** This broker's splitter finishes splitting what it may (below the HW it last
   learned); from there to the attempt's end (``StorageEngine.catch_up_end``, after its
   last write, also on a cancel) the storage refuses replica appends, split-limit moves,
   truncations and a second attempt for the journal partition, so nothing else writes those
   queue logs (``StorageEngine.catch_up_prepare``).
3. **Plan.** Per topic partition: this replica's queue-log end must not pass the leader's
   end at P (the leader, newly elected, has not split that far yet: retried later; or an
   unclean election left entries it does not have: never truncated here); when the
   leader's log start is past it, the queue log is emptied to start there (Kafka's
   ``truncateFullyAndStartAt``). The copy starts at this replica's last batch, which must
   be the leader's batch there (same offsets, leader epoch, producer fields, record count
   and transactional/control bits: its bytes may differ, each replica recompressing to the
   topic's codec itself; else refused the same way).
4. **Copy.** Kafka's Fetch (v11, this broker's id as the replica id, the journal
   partition's leader epoch as each partition's current leader epoch) from each queue log's
   end to the leader's end at P, at most ``_PARTITIONS_PER_FETCH`` topic partitions and
   ``replica.fetch.response.max.bytes`` per request, ``replica.fetch.max.bytes`` per topic
   partition: memory stays bounded whatever the number of partitions. The batches are
   appended verbatim (same offsets, same leader epochs, CRC checked;
   ``StorageEngine.catch_up_append``); the producer state follows them.
5. **Install** (``StorageEngine.catch_up_install``), once routing still names the same
   leader in the same epoch: the queue logs durable and checkpointed, then atomically (a
   marker file, finished by the next start after a crash) an empty journal at P, the epoch
   history at P, P as split position and recovery point. The fetcher then fetches the
   journal from P, and the leader takes this broker back into the ISR by the normal rule.

A crash during the copy leaves the queue logs holding a prefix of the leader's (each batch
whole: a torn tail is cut by recovery) and the old journal: the next attempt resumes from the
queue logs' ends. A leader change restarts the attempt from the new leader (what was copied
stays: it was below the old leader's HW, which a clean election keeps).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from stonemq.protocol.catchup import (
    CatchUpRequest,
    CatchUpResponse,
    decode_response,
    encode_request,
)
from stonemq.protocol.fetch_client import FetchWant, decode_fetch, encode_fetch
from stonemq.replication.fetcher import read_frame

if TYPE_CHECKING:
    from stonemq.replication.manager import ReplicaManager

log = logging.getLogger("stonemq.replication")

_PARTITIONS_PER_FETCH = 1000
_PROGRESS_EVERY_S = 5.0


class CatchUpError(Exception):
    """This attempt cannot go on (logged; the fetcher tries again later)."""


@dataclass(slots=True)
class _Copy:
    topic: str
    partition: int
    offset: int  # this replica's queue-log end
    end: int  # the leader's end at P


@dataclass(slots=True)
class _Attempt:
    """One attempt's connection to the leader and the leadership it was started under."""

    manager: ReplicaManager
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    journal: int
    local: int  # the journal partition's index in this broker's storage
    leader: int
    epoch: int
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def ask(
        self, encode: Callable[[int], bytes], decode: Callable[[bytes], tuple[Any, ...]]
    ) -> tuple[Any, ...]:
        """Send one request (``encode`` takes its correlation id) and read its answer
        (``decode``'s tuple, the correlation id first; returned without it)."""
        cid = next(self.ids)
        self.writer.write(encode(cid))
        got, *answer = decode(await read_frame(self.reader, CatchUpError))
        if got != cid:
            raise CatchUpError(f"correlation id {got}, expected {cid}")
        return tuple(answer)

    def check_leadership(self) -> None:
        """The leader and epoch are still those the attempt started under."""
        lead = self.manager.routing.leadership(self.journal)
        if lead.leader != self.leader or lead.leader_epoch != self.epoch:
            raise CatchUpError(f"the leadership moved during the copy (epoch {self.epoch})")


async def catch_up(manager: ReplicaManager, leader: int, journal: int) -> None:
    """One attempt to catch journal partition ``journal`` up from ``leader``'s state (see
    the module docstring). Returns once installed; CatchUpError (or an I/O error) when it
    could not be."""
    routing = manager.routing
    storage = manager.storage
    local = routing.local_index(journal)
    lead = routing.leadership(journal)
    if local is None or lead.leader != leader:
        raise CatchUpError(f"broker {leader} does not lead it any more")
    epoch = lead.leader_epoch
    endpoint = routing.broker(leader)
    if endpoint is None:
        raise CatchUpError(f"broker {leader} is not live")
    reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
    attempt = _Attempt(manager, reader, writer, journal, local, leader, epoch)
    try:
        request = CatchUpRequest(manager.broker_id, journal, epoch)
        (point,) = await attempt.ask(lambda cid: encode_request(request, cid), decode_response)
        if point.error_code != ErrorCode.none:
            raise CatchUpError(f"the leader answers {ErrorCode(point.error_code).name}")
        await storage.catch_up_prepare(local)
        try:
            await _plan_copy_install(attempt, point)
        finally:  # every write of the attempt is done here (a cancel waits for them)
            storage.catch_up_end(local)
    finally:
        writer.close()


async def _plan_copy_install(attempt: _Attempt, point: CatchUpResponse) -> None:
    storage = attempt.manager.storage
    local = attempt.local
    todo: list[_Copy] = []
    for p in point.partitions:
        have = storage.catch_up_queue(local, p.topic, p.partition)
        if have is None:
            raise CatchUpError(f"{p.topic}-{p.partition} is not known here yet")
        end_here = have[0]
        if end_here > p.end_offset:
            raise CatchUpError(
                f"{p.topic}-{p.partition} ends at {end_here} here, past the leader's "
                f"{p.end_offset} at position {point.point}: the leader has not split that "
                "far; retrying (nothing is truncated)"
            )
        # the leader's log start taken; from this replica's last batch: compared with the
        # leader's before the copy appends after it (its history diverged, else)
        start = await storage.catch_up_offset(p.topic, p.partition, p.log_start_offset)
        if start < p.end_offset:
            todo.append(_Copy(p.topic, p.partition, start, p.end_offset))
    log.warning(
        "journal partition %d: catching up from leader %d's state at journal position %d: "
        "%d of %d topic partitions to copy",
        attempt.journal,
        attempt.leader,
        point.point,
        len(todo),
        len(point.partitions),
    )
    await _copy(attempt, point.point, todo)
    ends = [(p.topic, p.partition, p.end_offset) for p in point.partitions]
    await _take_log_starts(attempt, ends)
    attempt.check_leadership()
    keys = [(p.topic, p.partition) for p in point.partitions]
    # shielded: an install cut in the middle by a cancel would leave memory and disk apart
    install = asyncio.ensure_future(
        storage.catch_up_install(local, point.point, list(point.epochs), keys)
    )
    try:
        await asyncio.shield(install)
    except asyncio.CancelledError:  # the install goes on: this attempt ends after it
        await asyncio.wait([install])
        raise
    _forget_reader(storage.journal_directory(local))
    log.warning(
        "journal partition %d: caught up from leader %d at journal position %d "
        "(epoch %d); fetching its journal from there",
        attempt.journal,
        attempt.leader,
        point.point,
        attempt.epoch,
    )


async def _copy(attempt: _Attempt, point: int, todo: list[_Copy]) -> None:
    manager = attempt.manager
    storage = manager.storage
    settings = manager.settings
    total = len(todo)
    copied = 0
    said = time.monotonic()
    while todo:
        attempt.check_leadership()
        chunk = todo[:_PARTITIONS_PER_FETCH]
        fetches = [
            FetchWant(c.topic, c.partition, c.offset, settings.replica_fetch_max_bytes)
            for c in chunk
        ]
        error, parts = await attempt.ask(
            lambda cid, fetches=fetches: encode_fetch(
                manager.broker_id,
                attempt.epoch,
                fetches,
                settings.replica_fetch_response_max_bytes,
                cid,
                "stonemq-catch-up",
            ),
            decode_fetch,
        )
        if error != ErrorCode.none:
            raise CatchUpError(f"the leader's Fetch answers {ErrorCode(error).name}")
        by_key = {(c.topic, c.partition): c for c in chunk}
        before = [c.offset for c in chunk]
        for part in parts:
            c = by_key.get((part.topic, part.partition))
            if c is None:
                continue
            if (
                part.error_code == ErrorCode.offset_out_of_range
                and part.log_start_offset > c.offset
            ):  # the leader's retention moved past this replica's end meanwhile
                await storage.catch_up_restart_queue(c.topic, c.partition, part.log_start_offset)
                c.offset = part.log_start_offset
                continue
            if part.error_code != ErrorCode.none:
                raise CatchUpError(
                    f"{c.topic}-{c.partition}: the leader's Fetch answers "
                    f"{ErrorCode(part.error_code).name}"
                )
            if not part.records:
                if part.high_watermark < c.end:
                    raise CatchUpError(
                        f"{c.topic}-{c.partition}: the leader's end {part.high_watermark} is "
                        f"below its end {c.end} at the point"
                    )
                continue  # nothing whole this time: another partition's turn
            end = await storage.catch_up_append(c.topic, c.partition, part.records, c.end, point)
            copied += end - c.offset
            c.offset = end
        if before == [c.offset for c in chunk]:
            raise CatchUpError("a Fetch round copied nothing")
        todo = [c for c in todo if c.offset < c.end]
        if time.monotonic() - said >= _PROGRESS_EVERY_S:
            said = time.monotonic()
            log.info(
                "journal partition %d: catch-up copied %d records; %d of %d topic partitions left",
                attempt.journal,
                copied,
                len(todo),
                total,
            )


async def _take_log_starts(attempt: _Attempt, partitions: list[tuple[str, int, int]]) -> None:
    """Each topic partition's log start as the leader's Fetch answers it (a tiered
    partition's: the whole log's, its archive included) handed to ``storage.on_log_start``,
    which moves this replica's cold log start up to it (a no-op for a topic that does not
    tier). The log-start entries of the leader's DeleteRecords lie below the catch-up point,
    never fetched here: the catch-up moved this replica's local log start only, and after a
    failover its archive served the deleted records (audit37 p2). One Fetch per
    ``_PARTITIONS_PER_FETCH`` partitions, each from its end at the point, one byte."""
    manager = attempt.manager
    storage = manager.storage
    if getattr(storage, "on_log_start", None) is None:
        return  # no tier service here
    for i in range(0, len(partitions), _PARTITIONS_PER_FETCH):
        attempt.check_leadership()
        chunk = partitions[i : i + _PARTITIONS_PER_FETCH]
        fetches = [FetchWant(topic, partition, end, 1) for topic, partition, end in chunk]
        error, parts = await attempt.ask(
            lambda cid, fetches=fetches: encode_fetch(
                manager.broker_id,
                attempt.epoch,
                fetches,
                manager.settings.replica_fetch_response_max_bytes,
                cid,
                "stonemq-catch-up",
            ),
            decode_fetch,
        )
        if error != ErrorCode.none:
            raise CatchUpError(f"the leader's Fetch answers {ErrorCode(error).name}")
        for part in parts:
            answered = part.error_code in (ErrorCode.none, ErrorCode.offset_out_of_range)
            if answered and part.log_start_offset > 0:  # out of range: a start past the end
                storage.on_log_start(part.topic, part.partition, part.log_start_offset)


def _forget_reader(directory: str) -> None:
    from stonemq.handlers.replica_fetch import forget_reader

    forget_reader(directory)
