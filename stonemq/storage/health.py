"""Storage failure rules: which I/O errors a journal partition survives, and its fail-stop states.

Every failure the storage sees is reported here as an :class:`Event` against the journal
partition it concerns (a queue log's failures count against the journal partition that feeds
it), and the transition table below decides the partition's :class:`Health`:

* ``ONLINE``: appends and splitting go on.
* ``JOURNAL_FULL``: the last journal write failed for lack of space (ENOSPC, EDQUOT), a file
  size limit (EFBIG) or file descriptors and was cut back cleanly; its entries, and every
  entry queued behind them, failed with their offsets given back. Appends are still tried,
  so writes resume by themselves when space returns (the next successful write is
  ``JOURNAL_WRITE_OK``).
* ``SPLIT_FULL``: a queue log could not be written for lack of space. The read directory is
  one filesystem, so every journal partition enters this state together; the splitter
  retries, and appends are refused meanwhile (so the unsplit journal does not pile up)
  until a split step succeeds (``SPLIT_OK``, again for all). Appends also wait, before any
  write fails, while the read directory lacks the room to split what is acknowledged
  (``space.py``).
* ``OFFLINE``: fail-stop until restart. Any other write error (EIO...), a failed write that
  could not be cut back, a failed fsync or write-back of the journal or of a queue log fed
  from it, or a failed directory fsync of a checkpoint: the page cache's state is unknown
  (after a failed fsync Linux may drop the dirty pages and a later fsync succeeds, the
  PostgreSQL "fsyncgate" lesson), so nothing of this journal partition is trusted to become
  durable again in this process. Appends are refused, the splitter stops reading it, no
  checkpoint of it or of its queue logs moves, none of its journal segments is deleted, and
  a queue log whose own write failed answers reads with a storage error. What it
  acknowledged is in its journal and queue-log files up to the last checkpoint, and recovery
  at the next start replays the rest. A journal read by the splitter that fails (EIO) is
  fatal too: the splitter cannot get past it, and what it could not read is still on disk.
  So is a split step that fails for any other reason (a defect): logged with its traceback,
  where the splitter's task used to end unseen and leave every produce waiting. On a
  cluster broker, a failed write of the leader-epoch checkpoint (``CHECKPOINT_FAILED``) or
  of a follower's truncation (``TRUNCATION_FAILED``) too: the epoch history is what
  replicas truncate by.

The table is data, so a unit test can drive every transition with injected errors.
"""

from __future__ import annotations

import enum
import errno
import logging
from collections.abc import Callable

from stonemq.storage.errors import StorageError

log = logging.getLogger(__name__)


class Health(enum.Enum):
    ONLINE = "online"
    JOURNAL_FULL = "journal full"
    SPLIT_FULL = "queue logs full"
    OFFLINE = "offline"


class Event(enum.Enum):
    JOURNAL_WRITE_OK = "journal write succeeded"
    JOURNAL_WRITE_FULL = "journal write failed for lack of space"
    SPLIT_OK = "split step succeeded"
    SPLIT_FULL = "queue-log write failed for lack of space"
    # fatal: the partition goes offline
    JOURNAL_WRITE_ERROR = "journal write failed"
    JOURNAL_CUT_BACK_FAILED = "failed journal write could not be cut back"
    JOURNAL_FSYNC_FAILED = "journal fsync failed"
    JOURNAL_READ_ERROR = "journal read failed"
    QUEUE_WRITE_ERROR = "queue-log write failed"
    QUEUE_CUT_BACK_FAILED = "failed queue-log write could not be cut back"
    QUEUE_FSYNC_FAILED = "queue-log fsync failed"
    QUEUE_WRITEBACK_FAILED = "queue-log write-back failed"
    CHECKPOINT_FAILED = "checkpoint could not be made durable"
    SPLIT_STEP_FAILED = "split step failed unexpectedly"
    TRUNCATION_FAILED = "truncation to the leader's history failed"


FATAL = frozenset(
    {
        Event.JOURNAL_WRITE_ERROR,
        Event.JOURNAL_CUT_BACK_FAILED,
        Event.JOURNAL_FSYNC_FAILED,
        Event.JOURNAL_READ_ERROR,
        Event.QUEUE_WRITE_ERROR,
        Event.QUEUE_CUT_BACK_FAILED,
        Event.QUEUE_FSYNC_FAILED,
        Event.QUEUE_WRITEBACK_FAILED,
        Event.CHECKPOINT_FAILED,
        Event.SPLIT_STEP_FAILED,
        Event.TRUNCATION_FAILED,
    }
)

_O, _J, _S, _X = Health.ONLINE, Health.JOURNAL_FULL, Health.SPLIT_FULL, Health.OFFLINE

TRANSITIONS: dict[tuple[Health, Event], Health] = {
    (_O, Event.JOURNAL_WRITE_OK): _O,
    (_O, Event.JOURNAL_WRITE_FULL): _J,
    (_O, Event.SPLIT_OK): _O,
    (_O, Event.SPLIT_FULL): _S,
    (_J, Event.JOURNAL_WRITE_OK): _O,
    (_J, Event.JOURNAL_WRITE_FULL): _J,
    (_J, Event.SPLIT_OK): _J,
    (_J, Event.SPLIT_FULL): _S,
    (_S, Event.JOURNAL_WRITE_OK): _S,
    (_S, Event.JOURNAL_WRITE_FULL): _S,
    (_S, Event.SPLIT_OK): _O,
    (_S, Event.SPLIT_FULL): _S,
    **{(state, event): _X for state in Health for event in FATAL},
    **{(_X, event): _X for event in Event},
}
"""(state, event) -> next state, for every pair."""

ACCEPTS_APPENDS = frozenset({Health.ONLINE, Health.JOURNAL_FULL})
SPLITS = frozenset({Health.ONLINE, Health.JOURNAL_FULL, Health.SPLIT_FULL})

SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EMFILE, errno.ENFILE})
"""Write errors that say a limit was reached, not that the device failed: no space, a file
size limit, no descriptors. Once the partial write is cut back the file is as it was, and
they go away by themselves. Any other write error is fatal."""


def is_space_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in SPACE_ERRNOS


class JournalHealth:
    """The health of one journal partition, and of the queue logs it feeds."""

    __slots__ = ("error", "index", "on_full", "on_offline", "state")

    def __init__(self, index: int) -> None:
        self.index = index
        self.state = Health.ONLINE
        self.error: StorageError | None = None  # why it is not ONLINE
        # called with ``index`` once, when the partition goes OFFLINE (a cluster broker
        # asks its controller to move the partition's leadership: replication/manager.py)
        self.on_offline: Callable[[int], None] | None = None
        # called with ``index`` when it runs out of space (JOURNAL_FULL or SPLIT_FULL from
        # ONLINE) and when it is ONLINE again (a cluster broker has the controller move its
        # leadership meanwhile: replication/manager.py); on the thread that saw it
        self.on_full: Callable[[int], None] | None = None

    def on(self, event: Event, detail: object = "") -> Health:
        """Apply ``event``; returns the new state (logged when it changes)."""
        before = self.state
        after = TRANSITIONS[(before, event)]
        self.state = after
        if after is Health.ONLINE:
            self.error = None
        elif after is not before or self.error is None:
            self.error = StorageError(
                f"journal-{self.index} {after.value}: {event.value}: {detail}"
            )
        if after is not before:
            level = logging.ERROR if after is Health.OFFLINE else logging.WARNING
            if after is Health.ONLINE:
                level = logging.INFO
            log.log(
                level,
                "journal-%d: %s -> %s (%s: %s)",
                self.index,
                before.value,
                after.value,
                event.value,
                detail,
            )
            if after is Health.OFFLINE and self.on_offline is not None:
                self.on_offline(self.index)
            elif self.on_full is not None and Health.ONLINE in (before, after):
                self.on_full(self.index)
        return after

    @property
    def offline(self) -> bool:
        return self.state is Health.OFFLINE

    @property
    def accepts_appends(self) -> bool:
        return self.state in ACCEPTS_APPENDS

    @property
    def splits(self) -> bool:
        return self.state in SPLITS

    def check_append(self) -> None:
        """Raise the StorageError an append gets while appends are refused."""
        if self.state not in ACCEPTS_APPENDS:
            assert self.error is not None
            # a new exception each time: raising the stored one again would chain every
            # caller's frames onto its traceback, and with them every refused request's
            # batches (views of whole request frames) for as long as the journal is down
            raise StorageError(*self.error.args)
