"""The Splitter: tails each JournalLog and writes every entry's batch into its QueueLog.

State is plain: a :class:`JournalReader` and a split position per journal partition, and a
``resolve`` function from (topic id, partition) to a QueueLog (None for a deleted topic, whose
entries are skipped). The journal files are the hand-off, so the same object can later run in
its own process. :meth:`Splitter.step` is synchronous and bounded (``batch_bytes`` of journal);
:meth:`Splitter.run` is the asyncio driver used inside the broker.

Splitting is idempotent: an entry whose offsets the QueueLog already holds is skipped, so the
journal can be re-split from any earlier position after a crash.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from stonemq.protocol.record_batch import RecordBatchError
from stonemq.storage.errors import CutBackError, StorageError
from stonemq.storage.health import FATAL, Event, Health, JournalHealth, is_space_error
from stonemq.storage.journal import JournalEntry, JournalReader
from stonemq.storage.page_cache import RECOVERY_READ_BYTES
from stonemq.storage.queue_log import QueueLog

log = logging.getLogger(__name__)

Resolver = Callable[[bytes, int], "QueueLog | None"]

_RETRY_AFTER_ERROR_S = 1.0


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
    ) -> None:
        self.readers = [JournalReader(d) for d in journal_dirs]
        self.positions = list(positions)  # split position per journal partition
        self.resolve = resolve
        self.batch_bytes = batch_bytes
        self.bytes_split = 0
        # each journal partition's failure state (health.py): a failed queue-log write is
        # reported there; an offline journal partition is not split any more
        self.healths = healths or [JournalHealth(j) for j in range(len(journal_dirs))]

    def step(
        self, j: int, limit: int, advanced: set[QueueLog], batch_bytes: int | None = None
    ) -> int:
        """Split entries of journal ``j`` from its split position, at most about
        ``batch_bytes`` of them (default: the splitter's), never past ``limit`` (the journal's
        written end). Adds the QueueLogs that grew to ``advanced``; returns the journal bytes
        consumed."""
        pos = self.positions[j]
        if pos >= limit:
            return 0
        want = self.batch_bytes if batch_bytes is None else batch_bytes
        entries, end = self.readers[j].read(pos, limit, want, verify=False)
        # group by queue log (order within each kept) so each log's files are touched once
        # per step: fewer open-file cache misses with many partitions
        groups: dict[QueueLog, list[JournalEntry]] = {}
        resolve = self.resolve
        for entry in entries:
            queue = resolve(entry.topic_id, entry.partition)
            if queue is None:
                continue  # its topic was deleted
            group = groups.get(queue)
            if group is None:
                groups[queue] = [entry]
            else:
                group.append(entry)
        for queue, group in groups.items():
            for entry in group:
                try:
                    if queue.append(entry.batch, entry.position):
                        advanced.add(queue)
                except RecordBatchError as exc:
                    log.error(
                        "journal-%d: skipping entry at %d with a bad batch: %s",
                        j,
                        entry.position,
                        exc,
                    )
                except OSError as exc:
                    # retry the whole step later: what was appended is skipped then
                    raise SplitError(j, queue, exc) from exc
        self.positions[j] = end
        self.bytes_split += end - pos
        return end - pos

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
                    consumed = self.step(j, limit(j), advanced)
                    if consumed:
                        progressed = True
                        if health.state is Health.SPLIT_FULL:  # the read directory has room
                            for each in self.healths:
                                each.on(Event.SPLIT_OK)
                except SplitError as exc:
                    self.failed(exc)
                    progressed = True  # retry without waiting for a journal write
                    await asyncio.sleep(_RETRY_AFTER_ERROR_S)
                if advanced or consumed:
                    on_step(advanced)
                await asyncio.sleep(0)
            if not progressed:
                await wake.wait()

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
        for reader in self.readers:
            reader.close()
