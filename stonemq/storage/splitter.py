"""The Splitter: tails each JournalLog and writes every entry's batch into its QueueLog.

State is plain: a :class:`JournalReader` and a split position per journal partition, and a
``resolve`` function from (topic id, partition) to a QueueLog (None for a deleted topic, whose
entries are skipped). The journal files are the hand-off. A step reads about ``batch_bytes``
of one journal partition, stages its batches into their queue logs (``QueueLog.stage``),
writes them (``SplitWrite.write``: one ``pwritev`` per segment touched) and publishes them;
the split position moves only once they are published.

:meth:`Splitter.step` does all of that in the calling thread (recovery, the final split of a
clean stop, tests). :meth:`Splitter.run`, the driver inside the broker, never touches a file
on the event loop: the journal read and the writes run in the splitter's own thread, while the
loop only stages and publishes (bookkeeping in memory), so a disk that stalls a write stalls
the split, never the clients. One step is in flight at a time.

Splitting is idempotent: an entry whose offsets the QueueLog already holds is skipped, so the
journal can be re-split from any earlier position after a crash. A log-start entry (journal.py)
is applied (``on_log_start``) once the batches staged before it in its step are published; a
log start only moves forward, so applying one again changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from stonemq.protocol.record_batch import RecordBatchError
from stonemq.server.metrics import METRICS
from stonemq.server.threads import name_os_thread
from stonemq.storage.errors import CutBackError, StorageError
from stonemq.storage.health import FATAL, Event, Health, JournalHealth, is_space_error
from stonemq.storage.journal import JournalEntry, JournalReader
from stonemq.storage.page_cache import RECOVERY_READ_BYTES
from stonemq.storage.queue_log import QueueLog, SplitWrite

log = logging.getLogger(__name__)

Resolver = Callable[[bytes, int], "QueueLog | None"]
LogStarts = list[tuple[QueueLog, int]]
"""The log-start entries of a step: (queue log, new log start offset), in journal order."""

_RETRY_AFTER_ERROR_S = 1.0
_BUSY_RETRY_S = 0.01
"""How long a step skipped for a queue log another writer writes waits (``_stage``)."""
# a step of ``run`` behind by more than ``batch_bytes`` reads up to this many times it (the
# read buffer's size). 4 against 8 (paired, 3 runs, 1 KiB records, librdkafka): peak PSS with
# 1,000 partitions under load 45-50 against 53-54 MB (the read is the largest live buffer),
# and at 1 partition 316-375 against 168-218 MB/s and 2.24-2.44 against 2.43-2.87 CPU s/GB
# ("Process size, fourth pass"). 2 against 4 (6 pairs): PSS peak at 1,000 partitions lower in
# every pair (44.0-47.8 against 48.6-51.6 MB), CPU per GB at 1 partition within noise (twice
# the steps: user time up, kernel time down); 1 against 2 cost CPU at 1 partition (3 pairs)
# (docs/benchmarks/analysis.md, "Produce requests without copies")
CATCH_UP_STEPS = 2
# a step of ``run`` behind by ``DEEP_LAG_STEPS`` times ``batch_bytes`` or more (16 MiB of one
# journal partition by default: with 4 of them, about where ``splitter.max.lag.bytes``, 64 MiB,
# starts holding producers) reads up to ``DEEP_CATCH_UP_STEPS`` times it, into the whole read
# buffer, whose pages past a normal step's part are mapped only while the splitter is that far
# behind (given back once a step finds the lag within ``CATCH_UP_STEPS``; a second buffer for deep
# steps kept the normal part's 2 MiB mapped beside its own 4 MiB). Deep steps cost memory: 1,000
# partitions under librdkafka's load on a loaded machine peaked at 40-45 MB PSS against 37-40
# without them (``bench.broker_cpu``, 3 pairs with each layout, 2026-11-28). Under a busy event loop
# a step's cost is its waits, not its bytes: each step waits for the loop twice and its thread for
# the GIL after its job starts and after every read and write (sampled: 14% of the thread's time on
# a CPU, 23% waiting for one, 0.3% waiting for the disk), about 10 ms a step whatever its size with
# a catch-up from disk and pipelined Metadata on the loop. 2 MiB steps then split ~200 MB/s while
# producers wrote more, and were held for split lag for 67 s of 98 (the interference workload at
# 258k msg/s, paired with 8 MiB deep steps: held 64-67 s against 15-16 s, producer p99 11-15 s
# against 3.7-5.7 s; docs/benchmarks/analysis.md, interference). 4 here, not 8: the read buffer is
# the largest live one (PSS, above), and 4 MiB steps already split twice as fast under that wait.
DEEP_CATCH_UP_STEPS = 4
DEEP_LAG_STEPS = 16


class SplitError(StorageError):
    """A queue log fed from journal ``journal`` could not be written."""

    def __init__(self, journal: int, queue: QueueLog, cause: OSError) -> None:
        super().__init__(
            f"cannot write {queue.topic}-{queue.partition} from journal-{journal}: {cause}"
        )
        self.journal = journal
        self.queue = queue
        self.cause = cause

    @property
    def event(self) -> Event:
        if isinstance(self.cause, CutBackError):
            return Event.QUEUE_CUT_BACK_FAILED
        return Event.SPLIT_FULL if is_space_error(self.cause) else Event.QUEUE_WRITE_ERROR


class Splitter:
    """Moves journal entries into QueueLogs, journal partition by journal partition."""

    def __init__(
        self,
        journal_dirs: list[str],
        positions: list[int],
        resolve: Resolver,
        batch_bytes: int,
        healths: list[JournalHealth] | None = None,
        convert: Callable[[list[JournalEntry]], None] | None = None,
        on_log_start: Callable[[QueueLog, int], None] | None = None,
    ) -> None:
        self.readers = [JournalReader(d) for d in journal_dirs]
        # called on each read's entries in the reading thread, before staging (the topics'
        # compression.type: the engine recompresses batches there, off the event loop)
        self.convert = convert
        # applies a log-start entry to its queue log (on the loop, or in the calling thread
        # of :meth:`step`), after the step's writes are published
        self.on_log_start = on_log_start
        self.positions = list(positions)  # split position per journal partition
        self.resolve = resolve
        self.batch_bytes = batch_bytes
        self.bytes_split = 0
        # each journal partition's failure state (health.py): a failed queue-log write is
        # reported there; an offline journal partition is not split any more
        self.healths = healths or [JournalHealth(j) for j in range(len(journal_dirs))]
        self._thread: ThreadPoolExecutor | None = None  # reads and writes of ``run``
        self._in_flight: asyncio.Future[None] | None = None
        self._busy = False  # a step was skipped: a queue log had another writer's write
        self._skip_logged: tuple[int, str, int, int] | None = None
        # the journal reads of ``step_async`` land here (``_read_reused``): one anonymous
        # mapping of the deepest step, made at the first step, instead of new bytes per step.
        # Steps use its first ``CATCH_UP_STEPS`` batches, so only those pages are ever
        # mapped, but while far behind (``DEEP_CATCH_UP_STEPS``), when the rest are mapped
        # until the splitter has caught up (``_deep_pages``; then given back)
        self._buffer: mmap.mmap | None = None
        self._deep_pages = False

    def add_journal(self, directory: str, health: JournalHealth) -> None:
        """Split one more (new, empty) journal partition from position 0; the next round of
        :meth:`run` includes it."""
        self.readers.append(JournalReader(directory))
        self.positions.append(0)
        self.healths.append(health)

    def step(
        self, j: int, limit: int, advanced: set[QueueLog], batch_bytes: int | None = None
    ) -> int:
        """Split entries of journal ``j`` from its split position, at most about
        ``batch_bytes`` of them (default: the splitter's), never past ``limit`` (the journal's
        written end), all in the calling thread. Adds the QueueLogs that grew to
        ``advanced``; returns the journal bytes consumed."""
        pos = self.positions[j]
        if pos >= limit:
            return 0
        want = self.batch_bytes if batch_bytes is None else batch_bytes
        entries, end = self._read(j, pos, limit, want)
        staged = self._stage(j, entries)
        if staged is None:
            return 0
        writes, starts = staged
        _write_all(writes)
        self._publish(j, writes, starts, pos, end, advanced)
        return end - pos

    def step_bytes(self, unsplit: int) -> int:
        """Journal bytes one step of :meth:`run` reads with ``unsplit`` bytes waiting: the
        splitter's ``batch_bytes``, or, behind by more, all of them up to
        ``CATCH_UP_STEPS`` times that. A step costs the same event-loop hops whatever its
        size (each waits for the loop's current iteration, milliseconds while the loop
        serves a catch-up and pipelined requests), so a splitter that fell behind catches up
        in fewer of them instead of holding producers at one ``batch_bytes`` per hops' wait."""
        batch = self.batch_bytes
        if unsplit >= batch * DEEP_LAG_STEPS:
            return batch * DEEP_CATCH_UP_STEPS
        return max(batch, min(unsplit, batch * CATCH_UP_STEPS))

    async def step_async(self, j: int, limit: int, advanced: set[QueueLog]) -> int:
        """:meth:`step` with the journal read and the writes in the splitter's thread, as
        many bytes as :meth:`step_bytes` says. A cancel while the thread reads or writes
        waits for it, and publishes what the writes wrote."""
        pos = self.positions[j]
        if pos >= limit:
            return 0
        loop = asyncio.get_running_loop()
        thread = self._thread
        if thread is None:
            thread = self._thread = ThreadPoolExecutor(
                1, thread_name_prefix="stonemq-split", initializer=name_os_thread
            )
        clock = time.monotonic_ns
        read = loop.run_in_executor(
            thread, _timed, self._read_reused, j, pos, limit, self.step_bytes(limit - pos)
        )
        try:
            (entries, end), done_ns = await asyncio.shield(read)
        except asyncio.CancelledError:
            # a stop: the thread reads on through this journal's reader, which the final
            # split (StorageEngine.close, on the loop) uses next; two threads in one reader
            # closed its descriptor twice (audit31 p5)
            await asyncio.wait([read])
            raise
        on_loop = clock()
        METRICS.splitter_loop_wait_ns += on_loop - done_ns
        staged = self._stage(j, entries)
        if staged is None:  # never with the catch-up's guard (StorageEngine.catch_up_prepare)
            self._busy = True  # :meth:`run` tries again without waiting for a journal write
            await asyncio.sleep(_BUSY_RETRY_S)
            return 0
        writes, starts = staged
        if writes:
            METRICS.splitter_loop_ns += clock() - on_loop
            written = loop.run_in_executor(thread, _timed, _write_all, writes)
            self._in_flight = written
            try:
                done_ns = (await asyncio.shield(written))[1]
            except asyncio.CancelledError:
                await asyncio.wait([written])  # the files are being written: finish, publish
                try:
                    self._publish(j, writes, starts, pos, end, advanced)
                except SplitError as exc:
                    # a failed write: its failure rules apply, and the stop goes on (raised
                    # out of here it replaced the cancel: the splitter retried for ever and
                    # the stop waited on it, audit31 p2)
                    self.failed(exc)
                raise
            finally:
                self._in_flight = None
            on_loop = clock()
            METRICS.splitter_loop_wait_ns += on_loop - done_ns
        self._publish(j, writes, starts, pos, end, advanced)
        METRICS.splitter_loop_ns += clock() - on_loop
        if end > pos:
            METRICS.splitter_steps += 1
        return end - pos

    def _read(
        self, j: int, pos: int, limit: int, want: int, into: memoryview | None = None
    ) -> tuple[list[JournalEntry], int]:
        """Read entries of journal ``j`` (in the calling thread) and convert them."""
        entries, end = self.readers[j].read(pos, limit, want, verify=False, into=into)
        if self.convert is not None and entries:
            self.convert(entries)
        return entries, end

    def _read_reused(
        self, j: int, pos: int, limit: int, want: int
    ) -> tuple[list[JournalEntry], int]:
        """:meth:`_read` into the splitter's one read buffer, in its thread.

        The entries' batches are views of that buffer until the next read overwrites it.
        Nothing keeps one past its step: the step stages them (``SplitWrite`` runs), writes
        them from this same thread before it takes the next read, and publishes only their
        headers; ``convert`` replaces a batch with new bytes. Steps of :meth:`run` never
        overlap, and a step cancelled during its read drops its entries (the next read
        queues behind that one in this thread). Before, every step read into new bytes (up
        to ``CATCH_UP_STEPS`` times ``batch_bytes``) freed at its end: below the mmap
        threshold they came from the malloc heap and, freed out of order with the request
        frames, left holes in it (docs/benchmarks/analysis.md, "Process size, sixth pass")."""
        size = self.batch_bytes * CATCH_UP_STEPS
        buffer = self._buffer
        if buffer is None:  # pages are mapped when first read into, never zero-filled
            deep = self.batch_bytes * DEEP_CATCH_UP_STEPS
            buffer = self._buffer = mmap.mmap(-1, deep, flags=mmap.MAP_PRIVATE)
        if want > size:  # far behind: the whole mapping, its pages past ``size`` too
            self._deep_pages = True
            return self._read(j, pos, limit, want, memoryview(buffer))
        if self._deep_pages and limit - pos <= size:
            # caught up: no view of the deep part is left (the last deep step's are gone),
            # so its pages go back to the system; the mapping stays for the next time
            buffer.madvise(mmap.MADV_DONTNEED, size, len(buffer) - size)
            self._deep_pages = False
        return self._read(j, pos, limit, want, memoryview(buffer)[:size])

    async def idle(self) -> None:
        """Return once no write of the splitter is in flight (a deleted topic's directories
        can go then: no split write is left to create a file in them)."""
        written = self._in_flight
        if written is not None:
            await asyncio.wait([written])

    def _stage(
        self, j: int, entries: list[JournalEntry]
    ) -> tuple[list[SplitWrite], LogStarts] | None:
        """Stage the entries' batches into their queue logs (on the loop): one
        :class:`SplitWrite` per queue log, in the order of its first entry, and the step's
        log-start entries. None (nothing staged, logged) when one of those queue logs has
        another writer's write in flight: the step is skipped, the split position unchanged."""
        writes: dict[QueueLog, SplitWrite] = {}
        starts: LogStarts = []
        resolve = self.resolve
        for entry in entries:
            queue = resolve(entry.topic_id, entry.partition)
            if queue is None:
                continue  # its topic was deleted
            if entry.record_count < 0:  # a log-start entry: applied once published
                if queue.writing and queue not in writes:
                    self._skipped(j, queue, entry.position)
                    return None
                starts.append((queue, entry.base_offset))
                continue
            write = writes.get(queue)
            if write is None:
                if queue.writing:  # another writer's write in flight (a catch-up's copy):
                    self._skipped(j, queue, entry.position)  # never two at once in a log;
                    return None  # what was staged is dropped (nothing was written yet)
                write = writes[queue] = queue.new_write()
            try:
                queue.stage(write, entry.batch, entry.position)
            except RecordBatchError as exc:
                log.error(
                    "journal-%d: skipping entry at %d with a bad batch: %s",
                    j,
                    entry.position,
                    exc,
                )
        staged = []
        for queue, write in writes.items():
            if write.runs:
                write.take_index_writes()
                queue.writing = True
                staged.append(write)
        return staged, starts

    def _skipped(self, j: int, queue: QueueLog, position: int) -> None:
        """Log a step skipped for ``queue`` (once per journal position, not every retry)."""
        key = (j, queue.topic, queue.partition, position)
        if self._skip_logged != key:
            self._skip_logged = key
            log.error(
                "journal-%d: %s-%d is being written by another writer; the split step at %d "
                "is skipped until that write is published",
                j,
                queue.topic,
                queue.partition,
                position,
            )

    def _publish(
        self,
        j: int,
        writes: list[SplitWrite],
        starts: LogStarts,
        pos: int,
        end: int,
        advanced: set[QueueLog],
    ) -> None:
        """Publish what was written, then apply the log-start entries; on a failed write
        raise :class:`SplitError` with the split position unchanged and no log start moved
        (the step is retried: what was published is skipped then)."""
        failed: SplitWrite | None = None
        for write in writes:
            queue = write.queue
            if queue.publish(write):
                advanced.add(queue)
            if write.error is not None and failed is None and not queue.removed:
                failed = write
        if failed is not None:
            assert failed.error is not None
            raise SplitError(j, failed.queue, failed.error)
        on_log_start = self.on_log_start
        if on_log_start is not None:
            for queue, offset in starts:
                if not queue.removed and queue.failed is None:
                    on_log_start(queue, offset)
        self.positions[j] = end
        self.bytes_split += end - pos

    def split_to(
        self, j: int, limit: int, advanced: set[QueueLog], batch_bytes: int | None = None
    ) -> int:
        """Split everything of journal ``j`` below ``limit`` (shutdown and recovery)."""
        total = 0
        while True:
            n = self.step(j, limit, advanced, batch_bytes)
            if n == 0:
                return total
            total += n

    def recover_to(self, j: int, limit: int, advanced: set[QueueLog]) -> int:
        """Re-split everything of journal ``j`` below ``limit`` at recovery: the journal is
        read in ``RECOVERY_READ_BYTES`` reads whose pages are dropped behind them (it is read
        once; see ``page_cache``), then the reader goes back to reading through the cache."""
        reader = self.readers[j]
        reader.read_once = True
        try:
            return self.split_to(j, limit, advanced, RECOVERY_READ_BYTES)
        finally:
            reader.read_once = False

    async def run(
        self,
        limit: Callable[[int], int],
        wake: asyncio.Event,
        on_step: Callable[[set[QueueLog]], None],
    ) -> None:
        """Split forever: a bounded step per journal partition, then yield to the loop; sleep
        on ``wake`` (set when a journal flush lands) when every journal is split."""
        while True:
            wake.clear()
            progressed = False
            for j, health in enumerate(self.healths):
                if not health.splits:
                    continue  # offline: the next start replays it
                advanced: set[QueueLog] = set()
                consumed = 0
                try:
                    consumed = await self.step_async(j, limit(j), advanced)
                    if consumed or self._busy:
                        self._busy = False
                        progressed = True
                        if health.state is Health.SPLIT_FULL:  # the read directory has room
                            for each in self.healths:
                                each.on(Event.SPLIT_OK)
                except asyncio.CancelledError:
                    # a stop during the step's writes: they were published; their queue logs
                    # must be known dirty, or the final flush skips them (no fsync, no
                    # recovery point) while the split-position checkpoint counts them split
                    if advanced:
                        on_step(advanced)
                    raise
                except SplitError as exc:
                    self.failed(exc)
                    progressed = True  # retry without waiting for a journal write
                    if advanced:
                        on_step(advanced)
                        advanced = set()
                    await asyncio.sleep(_RETRY_AFTER_ERROR_S)
                except OSError as exc:  # the journal read failed: no way past it
                    health.on(Event.JOURNAL_READ_ERROR, exc)
                except Exception as exc:  # a defect, not an I/O error: fail-stop, loudly
                    # (it ended this task unseen: produces waited for good, nothing logged)
                    log.exception("journal-%d: split step failed", j)
                    health.on(Event.SPLIT_STEP_FAILED, exc)
                if advanced or consumed:
                    on_step(advanced)
                # a step that split something already waited for the loop twice (its read
                # and its writes); only a journal with nothing to split yields here
                if not consumed:
                    await asyncio.sleep(0)
            if not progressed:
                idle = time.monotonic_ns()
                await wake.wait()
                METRICS.splitter_idle_ns += time.monotonic_ns() - idle

    def failed(self, exc: SplitError) -> None:
        """Apply the failure rules to a failed split step: for lack of space the step is
        retried (produces to the journal partition are refused meanwhile); any other error
        fails the queue log and takes the journal partition offline."""
        event = exc.event
        if event in FATAL and exc.queue.failed is None:
            exc.queue.failed = exc
        if event is Event.SPLIT_FULL:  # one read directory: every journal's split needs it
            for health in self.healths:
                health.on(event, exc)
        else:
            self.healths[exc.journal].on(event, exc)

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
        for reader in self.readers:
            reader.close()
        self._buffer = None  # unmapped once the last view of it is gone


_T = TypeVar("_T")


def _timed(fn: Callable[..., _T], *args: Any) -> tuple[_T, int]:
    """``fn(*args)`` in the splitter's thread, its time counted; with the monotonic ns it
    finished at (the loop counts from there how long the step waited for it)."""
    started = time.monotonic_ns()
    out = fn(*args)
    done = time.monotonic_ns()
    METRICS.splitter_thread_ns += done - started
    return out, done


def _write_all(writes: list[SplitWrite]) -> None:
    """The writes of one step, in order, stopping at the first that fails."""
    for write in writes:
        write.write()
        if write.error is not None:
            return
