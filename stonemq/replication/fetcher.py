"""The follower's side of replication: one :class:`LeaderFetcher` per leader broker, which
fetches every journal partition this broker follows from that leader over one connection
(invariant 10: nothing per topic partition) and appends what comes back verbatim
(``StorageEngine.append_replica``); the follower's own splitter splits it below the HW the
leader reports (``StorageEngine.set_split_limit``), handed over within ``SPLIT_DELAY_S`` rather
than at every fetch (a follower serves no client).

A response error is handled as Kafka's ``AbstractFetcherThread``: NOT_LEADER_OR_FOLLOWER,
FENCED_LEADER_EPOCH and UNKNOWN_LEADER_EPOCH wait for routing to change (the partition is
fetched again after ``replica.fetch.backoff.ms``); a lost connection is opened again after
the back-off. A diverging epoch (the follower's history differs from the leader's: a tail the
leader never had, written by an earlier leader) is answered by truncating to where the two
agree (``StorageEngine.truncate_replica``); a truncation into split data (only an unclean
election leads there) is refused, and the partition stops being fetched, logged.

A follower whose position is below the leader's journal start (it was out of the ISR while
the leader deleted the journal segments it needs: the leader keeps them for its ISR only)
gets OFFSET_OUT_OF_RANGE with that start. Kafka's follower would truncate its whole log and
fetch from the leader's log start; a StoneMQ follower must not: its queue logs would then
lack every batch the leader split from the deleted journal bytes. It stops fetching that
journal partition and catches up from the leader's state at one point instead
(replication/catchup.py: a copy of the leader's queue logs up to that point, then its journal
restarts there), in a task of its own while the other journal partitions are fetched; once
installed, the partition is fetched again from the point (and the leader takes this broker
back into the ISR by the normal rule). An attempt that fails is logged and tried again after
``replica.fetch.backoff.ms``, as Kafka's fetcher delays a partition whose fetch failed; a
leadership change re-plans the fetchers at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import struct
import time
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from stonemq.protocol.replica_fetch import (
    FetchPartition,
    MalformedReplicaFetch,
    ReplicaFetchRequest,
    decode_response,
    encode_request,
)
from stonemq.server.metrics import METRICS
from stonemq.storage.errors import StorageError, UnknownTopicsError
from stonemq.storage.journal import CorruptEntryError

if TYPE_CHECKING:
    from stonemq.replication.manager import ReplicaManager

log = logging.getLogger("stonemq.replication")

_LENGTH = struct.Struct(">i")
_MAX_RESPONSE_BYTES = 1 << 30
_BECOMING_RETRY_S = 0.05
"""How soon a partition is asked again from a broker that routing names its leader but that
answered NOT_LEADER_OR_FOLLOWER (it is becoming leader)."""
SPLIT_DELAY_S = 0.01
"""How long a follower holds a HW the leader reported before its splitter may split up to it
(unless it is ``splitter.batch.bytes`` or more ahead of the splitter's limit): a follower
serves no client, so splitting every fetch's few kilobytes at once only multiplies the
splitter's steps (each a read and a write handed to its thread and back); its split lag,
which the leader's back-pressure bounds and a failover waits for, grows by this much time."""


async def read_frame(reader: asyncio.StreamReader, error: type[Exception]) -> bytes:
    """One length-prefixed response from a leader's connection (its size bounded at
    ``_MAX_RESPONSE_BYTES``; ``error`` raised for a size out of range)."""
    (size,) = _LENGTH.unpack(await reader.readexactly(4))
    if not 0 < size <= _MAX_RESPONSE_BYTES:
        raise error(f"response of {size} bytes")
    return await reader.readexactly(size)


_FIRST_BUFFER = 64 * 1024


class ResponseReceiver(asyncio.BufferedProtocol):
    """The follower's end of its connection to a leader: responses are received straight
    into one buffer (``recv_into``), and each frame is handed out as a read-only view of it.
    A ``StreamReader`` copied every byte three times more (into a bytes object per read,
    into its buffer, and out of it for ``readexactly``): at one partition with librdkafka,
    about a tenth of a follower's CPU.

    The buffer grows with the bytes that arrive, to at most twice what it holds (or by
    64 KiB) and never past the frame's end, whatever a length announces, and is kept for
    the next response: a follower asks again only once it has appended what the previous
    answer brought. It is written again only when no view of it is left (a bytearray with
    a view exported cannot be resized, which :meth:`_reusable` tries); otherwise the next
    frame goes into a new buffer, so a view handed out never sees its bytes change."""

    def __init__(self, error: type[Exception], max_bytes: int = _MAX_RESPONSE_BYTES) -> None:
        self._error = error
        self._max_bytes = max_bytes
        self._buf = bytearray(_FIRST_BUFFER)
        self._start = 0  # first byte not handed out
        self._end = 0  # one past the last byte received
        self._waiter: asyncio.Future[None] | None = None
        self._lost: BaseException | None = None
        self.transport: asyncio.Transport | None = None
        self.new_buffers = 0  # buffers made because a view of the old one lived (tests)

    # -- the transport's side ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._end == len(self._buf):
            self._compact()  # a head already handed out first
            if self._end == len(self._buf):
                self._grow()
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        self._wake()

    def eof_received(self) -> bool:
        self._lost = self._lost or EOFError("the leader closed the connection")
        self._wake()
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        self._lost = self._lost or exc or EOFError("the connection to the leader was lost")
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the fetcher's side -----------------------------------------------------------------
    async def read_frame(self) -> memoryview:
        """The next response without its length prefix, as a read-only view (valid until the
        caller drops it; the buffer is not written again while it lives)."""
        self._compact()
        while True:
            have = self._end - self._start
            if have >= 4:
                (size,) = _LENGTH.unpack_from(self._buf, self._start)
                if not 0 < size <= self._max_bytes:
                    raise self._error(f"response of {size} bytes")
                if have >= 4 + size:
                    begin = self._start + 4
                    self._start = begin + size
                    return memoryview(self._buf)[begin : begin + size].toreadonly()
            if self._lost is not None:
                raise asyncio.IncompleteReadError(bytes(self._buf[self._start : self._end]), None)
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def _reusable(self) -> bool:
        """No view of the buffer is left (resizing raises BufferError while one is)."""
        buf = self._buf
        try:
            buf.append(0)
        except BufferError:
            return False
        del buf[-1]
        return True

    def _compact(self) -> None:
        """Before the next frame: move what follows the frames handed out to the front of
        the buffer, or into a new one while a view of the old one lives."""
        if not self._start:
            return
        rest = self._end - self._start
        old = self._buf
        if not self._reusable():
            self.new_buffers += 1
            self._buf = bytearray(max(_FIRST_BUFFER, rest + _FIRST_BUFFER))
        if rest:  # from a copy: bytearray slice assignment memcpy's, and these may overlap
            self._buf[:rest] = old[self._start : self._end]
        self._start, self._end = 0, rest

    def _grow(self) -> None:
        """Room for more of a frame in a full buffer: at most twice what it holds (at least
        64 KiB more), never past the end of the frame at its head once its length is known."""
        buf = self._buf
        pending = self._end - self._start
        wanted = max(2 * pending, pending + _FIRST_BUFFER)
        if pending >= 4:
            (size,) = _LENGTH.unpack_from(buf, self._start)
            if 0 < size <= self._max_bytes and 4 + size > pending:  # still arriving
                wanted = min(wanted, 4 + size)
        grown = bytearray(wanted)
        grown[:pending] = memoryview(buf)[self._start : self._end]
        self._buf = grown
        self._start, self._end = 0, pending


class LeaderFetcher:
    """Fetches the journal partitions led by broker ``leader`` that this broker follows."""

    def __init__(self, manager: ReplicaManager, leader: int) -> None:
        self.manager = manager
        self.leader = leader
        self.partitions: list[int] = []
        self._paused: dict[int, float] = {}  # journal id -> monotonic time to fetch again
        # journal id -> the unknown topic ids last logged for it (said once, not every retry)
        self._unknown_logged: dict[int, set[bytes]] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._writer: asyncio.Transport | None = None
        self._ids = itertools.count(1)
        self._catch_ups: dict[int, asyncio.Task[None]] = {}  # journal id -> its attempt
        # HWs reported by the leader not handed to the splitter yet: local index -> limit
        self._split_pending: dict[int, int] = {}
        self._split_timer: asyncio.TimerHandle | None = None
        self.requests = 0  # replica fetch requests sent (tests, benchmarks)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"stonemq-replica-fetcher-{self.leader}"
        )

    def set_partitions(self, journals: list[int]) -> None:
        if sorted(journals) != self.partitions:
            self.partitions = sorted(journals)
            self._paused = {j: t for j, t in self._paused.items() if j in journals}
            for j, task in self._catch_ups.items():
                if j not in journals:  # its writes finish before the task ends (the storage
                    task.cancel()  # refuses another writer of j until then)
            self._changed.set()

    async def close(self) -> None:
        self.apply_split_limits()
        for task in self._catch_ups.values():
            task.cancel()  # an install under way finishes (shielded); the copy stops
        for task in list(self._catch_ups.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._catch_ups.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._disconnect()

    def _disconnect(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    async def _run(self) -> None:
        settings = self.manager.settings
        backoff_s = settings.replica_fetch_backoff_ms / 1000
        while True:
            try:
                await self._fetch_loop()
            except asyncio.CancelledError:
                raise
            except (OSError, EOFError, asyncio.IncompleteReadError, MalformedReplicaFetch) as exc:
                log.warning("replica fetcher for broker %d: %s; retrying", self.leader, exc)
            except Exception:
                log.exception("replica fetcher for broker %d failed; retrying", self.leader)
            self._disconnect()
            await asyncio.sleep(backoff_s)

    async def _fetch_loop(self) -> None:
        manager = self.manager
        settings = manager.settings
        endpoint = manager.routing.broker(self.leader)
        if endpoint is None:
            raise OSError(f"broker {self.leader} is not live")
        loop = asyncio.get_running_loop()
        writer, receiver = await loop.create_connection(
            lambda: ResponseReceiver(MalformedReplicaFetch), endpoint.host, endpoint.port
        )
        self._writer = writer
        log.info(
            "fetching journal partitions %s from broker %d at %s:%d",
            self.partitions,
            self.leader,
            endpoint.host,
            endpoint.port,
        )
        storage = manager.storage
        routing = manager.routing
        while True:
            now = time.monotonic()
            wanted = [j for j in self.partitions if self._paused.get(j, 0) <= now]
            if not wanted:
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), 0.1)
                continue
            parts = []
            splits = storage.split_positions()
            for j in wanted:
                local = routing.local_index(j)
                if local is None:
                    continue
                parts.append(
                    FetchPartition(
                        j,
                        routing.leadership(j).leader_epoch,
                        storage.journal_end(local),
                        storage.last_epoch(local),
                        splits[local] if splits else 0,
                        settings.replica_fetch_max_bytes,
                    )
                )
            request = ReplicaFetchRequest(
                manager.broker_id,
                settings.replica_fetch_wait_max_ms,
                settings.replica_fetch_min_bytes,
                settings.replica_fetch_response_max_bytes,
                tuple(parts),
            )
            correlation = next(self._ids)
            writer.write(encode_request(request, correlation))
            self.requests += 1
            METRICS.replica_fetch_requests_sent += 1
            got, response = decode_response(await receiver.read_frame())
            if got != correlation:
                raise MalformedReplicaFetch(f"correlation id {got}, expected {correlation}")
            sent = {p.journal_partition: p for p in parts}
            for data in response.partitions:
                asked = sent.get(data.journal_partition)
                if asked is None:
                    continue
                await self._take(asked, data)
            # the answer's records are views of the receiver's buffer: dropped here so the
            # next answer is received into the same buffer
            response = data = None  # type: ignore[assignment]

    async def _take(self, asked: FetchPartition, data: object) -> None:
        manager = self.manager
        storage = manager.storage
        j = asked.journal_partition
        local = manager.routing.local_index(j)
        if local is None or manager.leads(j):
            return
        error = data.error_code  # type: ignore[attr-defined]
        backoff_s = manager.settings.replica_fetch_backoff_ms / 1000
        if storage.catch_up_active(local):  # an attempt (of an earlier fetcher) not over
            self._paused[j] = time.monotonic() + backoff_s
            return
        start = data.log_start  # type: ignore[attr-defined]
        if error == ErrorCode.offset_out_of_range and asked.fetch_position < start:
            known = manager.behind_start.get(j)
            if known is None or known[0] != asked.fetch_position:  # once per position
                log.warning(
                    "journal partition %d: position %d is below leader %d's journal start %d "
                    "(the journal bytes it needs were deleted while this replica was out of "
                    "the ISR); catching up from the leader's state",
                    j,
                    asked.fetch_position,
                    self.leader,
                    start,
                )
                manager.behind_start[j] = (asked.fetch_position, start)
            self._start_catch_up(j)
            return
        if error == ErrorCode.none and manager.behind_start.pop(j, None) is not None:
            log.info("journal partition %d: fetching from leader %d again", j, self.leader)
        if error != ErrorCode.none:
            log.info(
                "journal partition %d: leader %d answers %s; waiting for routing",
                j,
                self.leader,
                ErrorCode(error).name,
            )
            lead = manager.routing.leadership(j)
            if lead.leader == self.leader and lead.leader_epoch >= asked.leader_epoch:
                # routing already names it leader: it is still checkpointing its epoch (a
                # failover under way), ready within milliseconds; a whole back-off here
                # held the new leader's HW, and every acks=all produce, for a second
                self._paused[j] = time.monotonic() + min(backoff_s, _BECOMING_RETRY_S)
            else:
                self._paused[j] = time.monotonic() + backoff_s
            return
        if data.diverging_epoch >= 0 or data.diverging_end >= 0:  # type: ignore[attr-defined]
            await self._truncate(asked, data)
            return
        end = asked.fetch_position
        records = data.records  # type: ignore[attr-defined]
        if len(records):
            try:
                end = await storage.append_replica(local, asked.fetch_position, records)
            except UnknownTopicsError as exc:
                # this broker's metadata lags its leader's journal: fetched again once it
                # knows those topics (the leader's HW waits for this replica meanwhile, and
                # drops it from the ISR after replica.lag.time.max.ms, as for any lag)
                manager.resolve_topics(exc.topic_ids)
                self._paused[j] = time.monotonic() + _BECOMING_RETRY_S
                if self._unknown_logged.get(j) != exc.topic_ids:
                    self._unknown_logged[j] = exc.topic_ids
                    log.info("%s; fetched again once this broker knows them", exc)
                return
            except (StorageError, CorruptEntryError) as exc:
                log.warning("journal partition %d: replica append failed: %s", j, exc)
                self._paused[j] = time.monotonic() + backoff_s
                return
        self._advance_split(local, min(data.high_watermark, end))  # type: ignore[attr-defined]

    def _advance_split(self, local: int, limit: int) -> None:
        """The splitter of ``local`` may split up to ``limit`` (a HW the leader reported, at
        most this replica's end): at once when it is ``splitter.batch.bytes`` ahead of the
        splitter's limit, else within ``SPLIT_DELAY_S`` with the HWs reported meanwhile."""
        storage = self.manager.storage
        if limit - storage.split_limit(local) >= self.manager.settings.splitter_batch_bytes:
            self._split_pending.pop(local, None)
            storage.set_split_limit(local, limit)
            return
        if limit > self._split_pending.get(local, -1):
            self._split_pending[local] = limit
        if self._split_timer is None:
            loop = asyncio.get_running_loop()
            self._split_timer = loop.call_later(SPLIT_DELAY_S, self.apply_split_limits)

    def apply_split_limits(self) -> None:
        """Hand every HW held back to the splitter now (each is a HW the leader reported: a
        clean election never takes it back, so applying it late, after a truncation or a
        leader change, is as safe as applying it at once)."""
        if self._split_timer is not None:
            self._split_timer.cancel()
            self._split_timer = None
        pending, self._split_pending = self._split_pending, {}
        storage = self.manager.storage
        for local, limit in pending.items():
            storage.set_split_limit(local, limit)

    def _start_catch_up(self, j: int) -> None:
        """Stop fetching ``j`` and catch it up from the leader's state in a task of its own
        (replication/catchup.py); fetched again once that is done, or after
        ``replica.fetch.backoff.ms`` when it failed."""
        self._paused[j] = float("inf")
        if j in self._catch_ups:
            return
        self.apply_split_limits()  # the catch-up first splits below the HW it learned
        task = asyncio.get_running_loop().create_task(
            self._catch_up(j), name=f"stonemq-catch-up-{j}"
        )
        self._catch_ups[j] = task

    async def _catch_up(self, j: int) -> None:
        from stonemq.replication.catchup import CatchUpError, catch_up

        retry = 0.0
        backoff_s = self.manager.settings.replica_fetch_backoff_ms / 1000
        try:
            await catch_up(self.manager, self.leader, j)
        except asyncio.CancelledError:
            raise
        except (
            CatchUpError,
            StorageError,
            OSError,
            EOFError,
            asyncio.IncompleteReadError,
            ValueError,
        ) as exc:
            log.error(
                "journal partition %d: catch-up from leader %d failed: %s", j, self.leader, exc
            )
            retry = backoff_s
        except Exception:
            log.exception("journal partition %d: catch-up from leader %d failed", j, self.leader)
            retry = backoff_s
        finally:
            self._catch_ups.pop(j, None)
        self.manager.behind_start.pop(j, None)
        if j in self._paused:
            self._paused[j] = time.monotonic() + retry
        self._changed.set()

    async def _truncate(self, asked: FetchPartition, data: object) -> None:
        """The leader says this replica's last epoch ends earlier there (or is not in its
        history): truncate as Kafka's follower does (KIP-101/279): to the smaller of the
        leader's end for that epoch and this replica's own end for it when this replica has
        that epoch, else to this replica's end for the largest epoch below it; the next
        fetch checks again from there."""
        manager = self.manager
        storage = manager.storage
        j = asked.journal_partition
        local = manager.routing.local_index(j)
        assert local is not None
        self.apply_split_limits()  # "back to our HW" below is the HW last reported
        leader_epoch = data.diverging_epoch  # type: ignore[attr-defined]
        leader_end = data.diverging_end  # type: ignore[attr-defined]
        if leader_epoch < 0:  # the leader has no epoch at or below ours: back to our HW
            target = storage.split_limit(local)
        else:
            own_epoch, own_end = storage.epoch_end(local, leader_epoch)
            target = min(leader_end, own_end) if own_epoch == leader_epoch else own_end
        target = min(target, asked.fetch_position)
        log.warning(
            "journal partition %d: diverged from leader %d at epoch %d (ends at %d there); "
            "truncating from %d to %d",
            j,
            self.leader,
            leader_epoch,
            leader_end,
            asked.fetch_position,
            target,
        )
        try:
            await storage.truncate_replica(local, max(target, 0))
        except StorageError as exc:
            log.error("journal partition %d: not fetched any more: %s", j, exc)
            self._paused[j] = time.monotonic() + 3600
