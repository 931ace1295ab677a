"""The replica manager: leadership, the journal high watermark, delayed produce and the ISR of
the journal partitions hosted here (Kafka's ``ReplicaManager`` + ``Partition``, per journal
partition only: ../shared/design/cluster.md).

- **Leadership.** Routing (ZooKeeper) says who leads each journal partition in which epoch.
  When it names this broker, the epoch is checkpointed at the journal end
  (``StorageEngine.become_leader``) before the partition takes an append (:meth:`leads` is
  False until then). Otherwise the partition is followed: one :class:`LeaderFetcher` per
  leader broker fetches every journal partition this broker follows from it.
- **High watermark.** Per led journal partition, each follower's journal end (its fetch
  position), split position and last caught-up time (Kafka's rule: caught up when it fetched
  from at least the leader's end, or from at least the leader's end as of its previous
  fetch, then as of that fetch). HW = the smallest journal end over the ISR, never moving
  back; the splitter splits only below it (``StorageEngine.set_split_limit``).
- **Delayed produce.** An acks=all batch waits for the HW to pass its journal end position:
  one FIFO of waiters per journal partition (positions only rise), popped as the HW moves.
  No timer per partition: the request's timeout is the handler's one timer.
- **Tail.** Per led journal partition, the newest journal bytes written here, at most
  ``replica.fetch.tail.max.bytes`` (up to ``tail.LAG_FACTOR`` times that while an ISR
  follower has not fetched them; replication/tail.py): a follower's fetch of them is
  answered from memory, without the replica-read thread (handlers/replica_fetch.py). Created
  empty when the partition starts being led here, dropped when it stops.
- **ISR.** The leader shrinks the ISR (a follower not caught up for
  ``replica.lag.time.max.ms``) and expands it (a follower at the HW and past the start of the
  current epoch), writing ``/journal_partitions/<j>/state`` at the version it read, after
  checking that it still names this broker leader in this epoch; a deposed leader's write
  fails, and it stops leading (invariant 7).

Everything here runs on the event loop except the ZooKeeper writes (a thread).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import BadVersionError, NoNodeError

from stonemq.cluster.controller import JOURNAL_PATH
from stonemq.cluster.journal_state import PartitionState
from stonemq.cluster.membership import report_full_journals, report_offline_journals
from stonemq.replication.tail import JournalTail

if TYPE_CHECKING:
    from stonemq.cluster.routing import ClusterRouting
    from stonemq.config import Settings
    from stonemq.replication.fetcher import LeaderFetcher
    from stonemq.storage.engine import StorageEngine

log = logging.getLogger("stonemq.replication")

LEADER_SPLIT_DELAY_S = 0.005
"""How long a leader may hold a HW move before its splitter may split up to it (unless it is
``splitter.batch.bytes`` or more ahead of the splitter's limit, then at once): each HW move
(every follower fetch of new bytes) woke a split step of a few kilobytes, a read and a write
handed to the splitter's thread and back. Held this long, the moves in that time become one
step. A record acknowledged with acks=all reaches the queue logs (consumers, offset commits)
at most this long after its HW move plus one split step; acks wait for the HW only, not for
the split."""

BECOME_LEADER_RETRY_S = 1.0
"""After a failed attempt to lead a journal partition (an exception other than its copy going
offline, which hands the leadership over), how long before the next one: the retry came at
once, and a failure that repeats (a defect) looped on the event loop, logging each time."""

CATCH_UP_RETAIN_S = 300.0
"""How long a leader keeps its journal from the point it gave a follower behind its journal
start (handlers/catchup.py) while that follower copies, then from each of its fetch positions
until it is back in the ISR (renewed by each CatchUpPoint and fetch). Past it, retention goes
on as before and a slow follower asks for a new point (its copy resumes from what it holds)."""


class NotLeaderError(Exception):
    """This broker does not (or no longer) lead the journal partition."""


@dataclass(slots=True)
class FollowerState:
    """What the leader knows of one follower of one journal partition."""

    end: int = -1  # its journal end (fetch position); -1 until it fetched
    split: int = -1  # its split position
    last_caught_up_s: float = 0.0
    last_fetch_s: float = 0.0
    last_fetch_leader_end: int = -1


@dataclass(slots=True)
class LeaderState:
    """A journal partition led here."""

    journal: int  # global id
    local: int  # storage index
    epoch: int
    epoch_start: int  # journal position where this epoch starts
    isr: tuple[int, ...]
    replicas: tuple[int, ...]
    hw: int
    followers: dict[int, FollowerState] = field(default_factory=dict)
    waiters: collections.deque[tuple[int, asyncio.Future[int]]] = field(
        default_factory=collections.deque
    )
    # DeleteRecords waiting for every ISR follower to split past a position (wait_for_split)
    split_waiters: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)
    isr_change_pending: bool = False
    # the ISR the HW is computed over: the ISR, and while an expansion is being written the
    # broker joining it too (Kafka's maximal ISR, KIP-497): once ZooKeeper names it in the
    # ISR the controller may make it leader, so nothing it lacks may be acknowledged from
    # the moment the write is sent
    maximal_isr: tuple[int, ...] = ()
    # followers catching up from a point (replication/catchup.py): broker -> (journal
    # position its copy continues from, monotonic time the pin lapses)
    catch_up_pins: dict[int, tuple[int, float]] = field(default_factory=dict)


class ReplicaManager:
    def __init__(
        self,
        broker_id: int,
        routing: ClusterRouting,
        storage: StorageEngine,
        settings: Settings,
    ) -> None:
        self.broker_id = broker_id
        self.routing = routing
        self.storage = storage
        self.settings = settings
        self.client = routing.client
        self.lag_time_s = settings.replica_lag_time_max_ms / 1000
        self._leading: dict[int, LeaderState] = {}  # journal id -> state (ready to append)
        self._becoming: set[int] = set()
        self._fetchers: dict[int, LeaderFetcher] = {}
        self._following: dict[int, int] = {}  # journal id -> leader broker fetched from
        self._written: dict[int, asyncio.Future[None]] = {}  # long polls of replica fetches
        self._tails: dict[int, JournalTail] = {}  # local index -> tail, led journals only
        # counts the leaderships taken here: a replica fetch's long poll ends when it moves
        # (handlers/replica_fetch.py)
        self.leaderships_taken = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Future[Any]] = set()
        self._closed = False
        # followed journal partitions whose position is below their leader's journal start:
        # (position, leader's start); not fetched (replication/fetcher.py)
        self.behind_start: dict[int, tuple[int, int]] = {}
        # called with a journal partition once it is led here (group coordinators reload),
        # and once it is not any more (they unload)
        self.on_leader: Callable[[int], None] | None = None
        self.on_resign: Callable[[int], None] | None = None
        # the cluster's metadata asked about topic ids a fetched run names and this broker
        # does not know (blocking: a thread): it reloads the topics that hold them, whose
        # registration here follows, and returns the ids no topic holds (deleted)
        self.topic_ids_gone: Callable[[set[bytes]], set[bytes]] | None = None
        self._resolving: asyncio.Future[Any] | None = None
        # HWs of led journal partitions not yet handed to the splitter: local index -> HW
        # (see LEADER_SPLIT_DELAY_S), and the timer that hands them over
        self._split_pending: dict[int, int] = {}
        self._split_timer: asyncio.TimerHandle | None = None
        # hosted journal partitions whose copy here is offline (fail-stop until a restart),
        # and the ZooKeeper session their offline nodes were written in (cluster/membership.py)
        self._offline: set[int] = set()
        # the same, as a tuple replaced whole: read by Membership's re-registration thread
        self.offline_journals: tuple[int, ...] = ()
        self._offline_reported: Any = None
        self._offline_reporting = False
        # hosted journal partitions whose copy here is out of space (storage/health.py:
        # journal or queue logs full; appends are still tried), and the (session, journal
        # partitions) their full nodes were last written as: the controller moves their
        # leadership to a member with room and takes this broker out of their ISR, until a
        # write succeeds here again and the nodes go
        self._full: set[int] = set()
        self._full_reported: Any = None
        self._full_reporting = False

    # -- life -------------------------------------------------------------------------------
    def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self.storage.on_journal_written = self._on_written
        self.storage.on_journal_bytes = self._on_bytes
        self.storage.on_journal_offline = lambda local: loop.call_soon_threadsafe(
            self._journal_offline, local
        )
        self.storage.on_journal_full = lambda local: loop.call_soon_threadsafe(
            self._journal_full, local
        )
        self.routing.on_change = lambda: loop.call_soon_threadsafe(self.reconcile)
        self._spawn(self._isr_loop())
        self.reconcile()

    def shutting_down(self) -> None:
        """The broker stops: lead nothing more (followers' fetches get
        NOT_LEADER_OR_FOLLOWER at once and back off), fetch nothing more."""
        self._closed = True
        for journal in list(self._leading):
            self._resign(journal, "the broker is stopping")
        for fetcher in self._fetchers.values():
            self._spawn(fetcher.close())
        self._fetchers.clear()
        for waiter in self._written.values():
            if not waiter.done():
                waiter.set_result(None)

    async def close(self) -> None:
        self._closed = True
        self.apply_split_limits()  # the storage's final split goes up to them
        self.routing.on_change = None
        for fetcher in list(self._fetchers.values()):
            await fetcher.close()
        self._fetchers.clear()
        for state in self._leading.values():
            self._fail_waiters(state)
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    @property
    def closed(self) -> bool:
        return self._closed

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- leadership -------------------------------------------------------------------------
    def reconcile(self) -> None:
        """Take routing's view of every hosted journal partition: become leader, stop
        leading, or follow (re-planning the fetchers)."""
        if self._closed:
            return
        from stonemq.replication.fetcher import LeaderFetcher

        self._report_offline_once()  # again in a new session: its nodes went with the old
        self._report_full_once()
        wanted: dict[int, int] = {}
        for journal in self.routing.hosted():
            lead = self.routing.leadership(journal)
            state = self._leading.get(journal)
            if lead.leader == self.broker_id:
                if state is not None and state.epoch == lead.leader_epoch:
                    if not state.isr_change_pending and (
                        state.isr != lead.isr or state.maximal_isr
                    ):
                        state.isr = lead.isr  # the controller took a stopping follower out
                        state.maximal_isr = ()  # or an ISR write's outcome is known now
                        self._update_hw(state)
                    continue
                if state is not None:
                    self._resign(journal, "a newer epoch of its own leadership")
                # an offline copy is not led (the controller moves the leadership once the
                # offline node is written): trying would fail, and fail again on every retry
                if journal not in self._becoming and journal not in self._offline:
                    self._becoming.add(journal)
                    self._spawn(self._become_leader(journal, lead.leader_epoch))
                continue
            if state is not None:
                self._resign(journal, f"broker {lead.leader} leads it in epoch {lead.leader_epoch}")
            if journal not in self._becoming:  # followed: replica appends are taken again
                local = self.routing.local_index(journal)
                if local is not None:
                    self.storage.stop_leading(local)
            if lead.leader >= 0 and journal not in self._offline:  # nothing to append to
                wanted[journal] = lead.leader
        self._following = wanted
        by_leader: dict[int, list[int]] = {}
        for journal, leader in wanted.items():
            by_leader.setdefault(leader, []).append(journal)
        for leader, fetcher in list(self._fetchers.items()):
            if leader not in by_leader:
                del self._fetchers[leader]
                self._spawn(fetcher.close())
        for leader, journals in by_leader.items():
            fetcher = self._fetchers.get(leader)
            if fetcher is None:
                fetcher = self._fetchers[leader] = LeaderFetcher(self, leader)
                fetcher.start()
            fetcher.set_partitions(journals)

    def _journal_offline(self, local: int) -> None:
        """The copy here of a hosted journal partition went offline: have the controller
        move its leadership and take this broker out of its ISR, and stop fetching it."""
        journal = self.routing.journal_of(local)
        if journal in self._offline or self._closed:
            return
        self._offline.add(journal)
        self.offline_journals = tuple(sorted(self._offline))
        self._offline_reported = None
        log.error(
            "journal partition %d is offline on this broker until it restarts: the controller "
            "moves its leadership to another ISR member and takes this broker out of its ISR",
            journal,
        )
        self.reconcile()  # reports it, and stops fetching it

    def _report_offline_once(self) -> None:
        """Write the offline nodes unless they are written in this session or being written."""
        if (
            self._offline
            and not self._offline_reporting
            and self._offline_reported != self.client.client_id
        ):
            self._offline_reporting = True
            self._spawn(self._report_offline())

    async def _write_nodes(self, report: Any, journals: list[int], what: str) -> bool:
        """Write this broker's ``what`` nodes with ``report`` (membership.py) in a thread;
        False, logged, when ZooKeeper could not be reached (the next reconcile tries again)."""
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, report, self.client, self.broker_id, journals
            )
        except Exception as exc:
            log.warning("%s journal partitions %s not reported: %s", what, journals, exc)
            return False
        return True

    async def _report_offline(self) -> None:
        session = self.client.client_id
        journals = sorted(self._offline)
        try:
            written = await self._write_nodes(report_offline_journals, journals, "offline")
        finally:
            self._offline_reporting = False
        if not written:
            return
        if journals == sorted(self._offline):
            self._offline_reported = session
        else:  # another went offline meanwhile
            self._report_offline_once()

    def _journal_full(self, local: int) -> None:
        """The copy here of a hosted journal partition may have run out of space or have
        room again (``StorageEngine.out_of_space``): have the controller move its leadership
        to an ISR member with room and take this broker out of its ISR, or let it back. Its
        appends go on being tried meanwhile: as a follower, its fetches are appended once
        space returns, and it rejoins the ISR as any follower that caught up."""
        journal = self.routing.journal_of(local)
        full = self.storage.out_of_space(local)
        if self._closed or (journal in self._full) == full:
            return
        if full:
            self._full.add(journal)
            log.warning(
                "journal partition %d is out of space on this broker: the controller moves "
                "its leadership to an ISR member with room and takes this broker out of its "
                "ISR until a write succeeds here again",
                journal,
            )
        else:
            self._full.discard(journal)
            log.info("journal partition %d has room again on this broker", journal)
        self._report_full_once()

    def _report_full_once(self) -> None:
        """Write the full nodes unless they are written as they are, in this session, or
        being written."""
        if self._full_reporting or self._closed:
            return
        if self._full_reported == (self.client.client_id, sorted(self._full)):
            return
        if not self._full and self._full_reported is None:
            return  # none written, none wanted
        self._full_reporting = True
        self._spawn(self._report_full())

    async def _report_full(self) -> None:
        session = self.client.client_id
        journals = sorted(self._full)
        try:
            written = await self._write_nodes(report_full_journals, journals, "out-of-space")
        finally:
            self._full_reporting = False
        if not written:
            return
        self._full_reported = (session, journals)
        self._report_full_once()  # another change meanwhile

    async def _become_leader(self, journal: int, epoch: int) -> None:
        retry_s = 0.0
        try:
            local = self.routing.local_index(journal)
            assert local is not None
            await self.storage.become_leader(local, epoch)
            lead = self.routing.leadership(journal)
            if lead.leader != self.broker_id or lead.leader_epoch != epoch:
                self.storage.stop_leading(local)
                return  # moved on meanwhile; reconcile runs again on that change
            now = time.monotonic()
            state = LeaderState(
                journal,
                local,
                epoch,
                self.storage.journal_end(local),
                lead.isr,
                lead.replicas,
                self.storage.split_limit(local),
                {
                    b: FollowerState(last_caught_up_s=now)
                    for b in lead.replicas
                    if b != self.broker_id
                },
            )
            self._leading[journal] = state
            self._tails[local] = JournalTail(self.settings.replica_fetch_tail_max_bytes)
            log.info(
                "journal partition %d: leading in epoch %d from journal position %d (isr %s)",
                journal,
                epoch,
                state.epoch_start,
                list(state.isr),
            )
            self._update_hw(state)
            # followers' long polls in flight name the journal partitions they followed
            # before this election: answered now, their next fetch names this one too (else
            # its HW, and every acks=all produce, waited up to replica.fetch.wait.max.ms)
            self.leaderships_taken += 1
            for waiter in self._written.values():
                if not waiter.done():
                    waiter.set_result(None)
            if self.on_leader is not None:
                self.on_leader(journal)
        except Exception:
            log.exception(
                "journal partition %d: becoming leader in epoch %d failed (tried again in "
                "%.0f s unless its leadership moves)",
                journal,
                epoch,
                BECOME_LEADER_RETRY_S,
            )
            retry_s = BECOME_LEADER_RETRY_S
        finally:
            self._becoming.discard(journal)
            if not self._closed and self._loop is not None:
                self._loop.call_later(retry_s, self.reconcile)

    def _resign(self, journal: int, why: str) -> None:
        state = self._leading.pop(journal, None)
        if state is None:
            return
        self.apply_split_limits()  # before a follower's fetch (a truncation) may follow
        self.storage.stop_leading(state.local)
        self._tails.pop(state.local, None)
        log.info("journal partition %d: no longer leading epoch %d: %s", journal, state.epoch, why)
        self._fail_waiters(state)
        if self.on_resign is not None:
            self.on_resign(journal)

    def _fail_waiters(self, state: LeaderState) -> None:
        while state.waiters:
            _, future = state.waiters.popleft()
            if not future.done():
                _lost(future, state.journal)
        split_waiters, state.split_waiters = state.split_waiters, []
        for _, future in split_waiters:
            if not future.done():
                _lost(future, state.journal)

    def leads(self, journal: int) -> bool:
        """Led here and ready for appends (its epoch checkpointed)."""
        return journal in self._leading

    def leader_state(self, journal: int) -> LeaderState | None:
        return self._leading.get(journal)

    def isr_size(self, journal: int) -> int:
        state = self._leading.get(journal)
        return len(state.isr) if state is not None else 0

    def tail(self, local: int) -> JournalTail | None:
        """The in-memory tail of local journal partition ``local`` (None: not led here)."""
        return self._tails.get(local)

    def _on_bytes(self, local: int, position: int, pieces: list[Any], sizes: list[int]) -> None:
        """The storage wrote a group of entries of ``local`` at ``position`` (before their
        acknowledgements and the followers' wake-up): kept in its tail when led here."""
        tail = self._tails.get(local)
        if tail is None:
            return
        state = self._leading.get(self.routing.journal_of(local))
        needed = -1
        if state is not None:  # the slowest ISR follower's position: kept while it is near
            me = self.broker_id
            followers = state.followers
            for broker in state.isr:
                if broker != me:
                    follower = followers.get(broker)
                    if follower is not None and follower.end >= 0:
                        needed = follower.end if needed < 0 else min(needed, follower.end)
        tail.appended(position, pieces, sizes, needed)

    # -- high watermark and delayed produce -------------------------------------------------
    def _on_written(self, local: int) -> None:
        """The storage wrote entries of local journal partition ``local``."""
        journal = self.routing.journal_of(local)
        state = self._leading.get(journal)
        if state is not None:
            self._update_hw(state)
        waiter = self._written.pop(journal, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait_written(self, journals: list[int], timeout_s: float) -> None:
        """Return once one of ``journals`` was written to, or after ``timeout_s``."""
        if timeout_s <= 0 or not journals:
            return
        loop = asyncio.get_running_loop()
        futures = []
        for journal in journals:
            future = self._written.get(journal)
            if future is None or future.done():
                future = self._written[journal] = loop.create_future()
            futures.append(future)
        await asyncio.wait(futures, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)

    def _update_hw(self, state: LeaderState) -> None:
        hw = self.storage.journal_written_end(state.local)
        for broker in state.maximal_isr or state.isr:
            if broker == self.broker_id:
                continue
            follower = state.followers.get(broker)
            end = follower.end if follower is not None else -1
            if end < 0:
                return  # not known yet: the HW stays
            hw = min(hw, end)
        if state.split_waiters:  # the ISR may have shrunk to the followers that split
            self._wake_split_waiters(state)
        if hw <= state.hw:
            return
        state.hw = hw
        self._advance_split(state.local, hw)
        waiters = state.waiters
        isr = len(state.isr)
        while waiters and waiters[0][0] <= hw:
            _, future = waiters.popleft()
            if not future.done():
                future.set_result(isr)

    def _advance_split(self, local: int, hw: int) -> None:
        """The splitter of led ``local`` may split up to ``hw``: at once when that is
        ``splitter.batch.bytes`` or more past its limit, else within ``LEADER_SPLIT_DELAY_S``
        together with the moves made meanwhile."""
        storage = self.storage
        if hw - storage.split_limit(local) >= self.settings.splitter_batch_bytes:
            self._split_pending.pop(local, None)
            storage.set_split_limit(local, hw)
            return
        self._split_pending[local] = hw  # HWs only rise: the newest is the highest
        if self._split_timer is None:
            loop = self._loop or asyncio.get_running_loop()
            self._split_timer = loop.call_later(LEADER_SPLIT_DELAY_S, self.apply_split_limits)

    def apply_split_limits(self) -> None:
        """Hand every HW held back to the splitter now. Each was the HW of its partition (a
        clean election never takes it back), so handing it over after the partition stopped
        being led here is as safe as at once."""
        if self._split_timer is not None:
            self._split_timer.cancel()
            self._split_timer = None
        pending, self._split_pending = self._split_pending, {}
        for local, hw in pending.items():
            self.storage.set_split_limit(local, hw)

    def wait_for_hw(self, journal: int, position: int) -> asyncio.Future[int]:
        """A future resolved (with the ISR size then) once the HW of ``journal`` passes
        ``position``; NotLeaderError when leadership is lost first."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        state = self._leading.get(journal)
        if state is None:
            _lost(future, journal)
        elif state.hw >= position:
            future.set_result(len(state.isr))
        else:
            state.waiters.append((position, future))
        return future

    def wait_for_split(self, journal: int, position: int) -> asyncio.Future[None]:
        """A future resolved once every follower in the ISR of ``journal`` reports (in its
        replica fetches) that its splitter has passed ``position``: a DeleteRecords is
        answered only once every ISR replica moved its log start, as Kafka's waits for every
        replica's (``DelayedDeleteRecords``), so whichever of them leads next starts the
        partition there. NotLeaderError when leadership is lost first."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        state = self._leading.get(journal)
        if state is None:
            _lost(future, journal)
            return future
        state.split_waiters.append((position, future))
        self._wake_split_waiters(state)
        return future

    def _wake_split_waiters(self, state: LeaderState) -> None:
        me = self.broker_id
        split = min(
            (
                f.split if (f := state.followers.get(b)) is not None else -1
                for b in state.isr
                if b != me
            ),
            default=2**63 - 1,
        )
        waiting = []
        for position, future in state.split_waiters:
            if future.done():
                continue
            if split >= position:
                future.set_result(None)
            else:
                waiting.append((position, future))
        state.split_waiters = waiting

    def high_watermark(self, journal: int) -> int:
        state = self._leading.get(journal)
        return state.hw if state is not None else -1

    # -- follower fetches (on the leader) ---------------------------------------------------
    def follower_fetched(self, state: LeaderState, broker: int, position: int, split: int) -> None:
        """A follower in ``state``'s replicas fetched from ``position``: its end and
        caught-up time (Kafka's ``Replica.updateFetchState``), the HW, an ISR expansion."""
        follower = state.followers.get(broker)
        if follower is None:
            follower = state.followers[broker] = FollowerState()
        now = time.monotonic()
        leader_end = self.storage.journal_written_end(state.local)
        if position >= leader_end:
            follower.last_caught_up_s = max(follower.last_caught_up_s, now)
        elif position >= follower.last_fetch_leader_end:
            follower.last_caught_up_s = max(follower.last_caught_up_s, follower.last_fetch_s)
        follower.last_fetch_leader_end = leader_end
        follower.last_fetch_s = now
        follower.end = position
        if broker in state.catch_up_pins:  # a follower back from a catch-up
            if broker in state.isr:  # the ISR's floor keeps what it needs from here
                del state.catch_up_pins[broker]
            else:  # its journal kept from where it fetches until it rejoins the ISR
                state.catch_up_pins[broker] = (position, now + CATCH_UP_RETAIN_S)
        if split < follower.split:  # never seen go back, except by a restart
            follower.split = split
        elif split > follower.split:
            follower.split = split
            for watcher in self.storage.split_watchers:  # held produces may go again
                watcher()
            if state.split_waiters:
                self._wake_split_waiters(state)
        self._update_hw(state)
        if (
            broker not in state.isr
            and not state.isr_change_pending
            and broker not in self.routing.shutting_down()  # controlled shutdown: it leaves
            # judged dead (its listener unreachable) while it still fetches: the controller
            # keeps it out of every ISR, so it stays out until reachable (KIP-841: no fenced
            # broker in an ISR), else the ISR would flap between the two
            and broker not in self.routing.dead()
            and position >= state.hw
            and position >= state.epoch_start
        ):
            self._change_isr(state, (*state.isr, broker), f"broker {broker} caught up")

    def follower_split_lag(self) -> int:
        """The most journal bytes an ISR follower of a journal partition led here holds but
        has not split (its fetch position less its split position, both reported in every
        replica fetch): the dispatcher holds produces while it exceeds
        ``splitter.max.lag.bytes``, as for this broker's own splitter, so a follower that
        would lead after a failover is never far behind in splitting (invariant 8)."""
        worst = 0
        me = self.broker_id
        for state in self._leading.values():
            followers = state.followers
            for broker in state.isr:
                if broker != me:
                    follower = followers.get(broker)
                    if follower is not None and follower.split >= 0:
                        worst = max(worst, follower.end - follower.split)
        return worst

    def retain_from(self, local: int) -> int:
        """The journal position below which the leader may delete journal segments: what
        every follower in the ISR has (a follower out of the ISR may fall behind it)."""
        journal = self.routing.journal_of(local)
        state = self._leading.get(journal)
        if state is None:
            return 2**63 - 1
        floor = 2**63 - 1
        for broker in state.isr:
            if broker != self.broker_id:
                follower = state.followers.get(broker)
                floor = min(floor, follower.end if follower is not None else 0)
        if state.catch_up_pins:
            now = time.monotonic()
            for broker, (point, until) in list(state.catch_up_pins.items()):
                if until < now:
                    del state.catch_up_pins[broker]
                else:
                    floor = min(floor, point)
        return max(floor, 0)

    def retain_for_catch_up(self, state: LeaderState, broker: int, point: int) -> None:
        """Follower ``broker`` copies this journal partition's state at ``point``: its
        journal segments from there stay for ``CATCH_UP_RETAIN_S`` (or until it fetches)."""
        state.catch_up_pins[broker] = (point, time.monotonic() + CATCH_UP_RETAIN_S)

    # -- topics a follower does not know yet ------------------------------------------------
    def resolve_topics(self, topic_ids: set[bytes]) -> None:
        """A fetched run named ``topic_ids``, unknown here (UnknownTopicsError): ask the
        cluster's metadata, once at a time, so those created meanwhile are registered
        (through the metadata's listeners) and those deleted are appended and skipped."""
        if self._resolving is not None or self.topic_ids_gone is None:
            return
        loop = asyncio.get_running_loop()
        ask = self.topic_ids_gone
        fut = loop.run_in_executor(None, ask, set(topic_ids))
        self._resolving = fut

        def done(f: asyncio.Future[set[bytes]]) -> None:
            self._resolving = None
            if f.cancelled():
                return
            exc = f.exception()
            if exc is not None:  # ZooKeeper unreachable: the next fetch asks again
                log.warning("unknown topic ids not resolved: %s", exc)
                return
            gone = f.result()
            if gone:
                log.info("%d topic id(s) of fetched entries belong to deleted topics", len(gone))
                self.storage.topics_gone(gone)

        fut.add_done_callback(done)

    # -- ISR changes ------------------------------------------------------------------------
    async def _isr_loop(self) -> None:
        """Shrink the ISR of led journal partitions whose followers lag (Kafka checks every
        half ``replica.lag.time.max.ms``)."""
        while True:
            await asyncio.sleep(self.lag_time_s / 2)
            now = time.monotonic()
            for state in list(self._leading.values()):
                if state.isr_change_pending:
                    continue
                out = [
                    b
                    for b in state.isr
                    if b != self.broker_id
                    and now
                    - state.followers.setdefault(
                        b, FollowerState(last_caught_up_s=now)
                    ).last_caught_up_s
                    > self.lag_time_s
                ]
                if out:
                    isr = tuple(b for b in state.isr if b not in out)
                    self._change_isr(state, isr, f"brokers {out} lag")

    def _change_isr(self, state: LeaderState, isr: tuple[int, ...], why: str) -> None:
        state.isr_change_pending = True
        # an expansion counts in the HW from now; a shrink only once written (the larger
        # ISR holds until then): the HW always covers every ISR ZooKeeper may name
        state.maximal_isr = tuple(dict.fromkeys((*state.isr, *isr)))
        self._spawn(self._write_isr(state, isr, why))

    async def _write_isr(self, state: LeaderState, isr: tuple[int, ...], why: str) -> None:
        try:
            ok = await asyncio.get_running_loop().run_in_executor(
                None, write_isr, self.client, state.journal, self.broker_id, state.epoch, isr
            )
        except Exception as exc:  # ZooKeeper unreachable: tried again on the next event
            log.warning(
                "journal partition %d: ISR change to %s failed: %s", state.journal, isr, exc
            )
            ok = None
        finally:
            state.isr_change_pending = False
        if self._leading.get(state.journal) is not state:
            # a newer leadership of the journal partition began here meanwhile (the write
            # named the old epoch, so ZooKeeper refused it): that one is not resigned for it
            return
        if ok is None:  # it may have been written all the same: the joiner still counts
            return  # (until ZooKeeper's ISR is read back: reconcile)
        state.maximal_isr = ()
        if not ok:
            self._resign(state.journal, "its ISR change was refused: the controller moved on")
            return
        log.info(
            "journal partition %d: ISR %s -> %s (%s)",
            state.journal,
            list(state.isr),
            list(isr),
            why,
        )
        state.isr = isr
        self._update_hw(state)


def write_isr(client: Any, journal: int, broker_id: int, epoch: int, isr: tuple[int, ...]) -> bool:
    """A leader's ISR change (blocking: a thread): written at the state node's version after
    checking that the node still names ``broker_id`` leader in ``epoch``; False when it does
    not (the leader was deposed: the controller moved on)."""
    path = f"{JOURNAL_PATH}/{journal}/state"
    for _ in range(5):
        try:
            data, stat = client.get(path)
        except NoNodeError:
            return False
        current = PartitionState.from_json(data)
        if current.leader != broker_id or current.leader_epoch != epoch:
            return False
        try:
            client.set(path, replace(current, isr=isr).to_json(), version=stat.version)
            return True
        except BadVersionError:
            continue  # changed since the read: look again
    raise RuntimeError("state node kept changing")


def _lost(future: asyncio.Future[int], journal: int) -> None:
    """Fail an HW waiter: leadership of ``journal`` was lost. A waiter that gave up first (its
    request timed out, its connection closed, or a gather took another exception) never reads
    this expected outcome: marked as read, so asyncio does not log it as an error."""
    future.set_exception(NotLeaderError(f"journal partition {journal}"))
    future.exception()
