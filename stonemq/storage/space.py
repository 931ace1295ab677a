"""The splitter's headroom: appends wait for space the splitter needs for what was acknowledged.

Every acknowledged byte is written twice: into a journal segment, then, by the splitter, into
a queue log. A journal segment can go only once the queue logs fed from it are flushed past it,
so if producers filled the read directory's filesystem with journal bytes (the same
filesystem when both directories share a disk, as on a single-disk machine), the splitter
could never write them out again, no journal segment could ever be deleted, and the broker
would stay full even after the disk was cleared, and fail to recover at its next start. The
rule: an append is refused (KAFKA_STORAGE_ERROR, producers retry) while the read directory's
free space is below what splitting the journal bytes not yet split will take, this append
included, plus a margin.

Splitting N bytes takes more than N bytes: every queue-log segment they fill brings an offset
index, a time index and a producer snapshot, and each file's last block is partly empty. With
small ``segment.bytes`` that is most of the cost (16 KiB segments on 4 KiB blocks: 16 KiB of
files per 16 KiB of records), so the unsplit bytes are weighed by ``split_cost_factor``, worked
out from the smallest ``segment.bytes`` and ``index.interval.bytes`` of any partition.

Free space comes from ``statvfs`` at most every ``REFRESH_S``; bytes appended since are
counted against it, so the check costs a subtraction on the produce path. The unsplit bytes
are summed over the journal partitions once per refresh too, not per append: a check that
passes leaves a slack (free space less the weighted lag and the margin), and each later
append spends its own weighted size plus its bytes from it; the splitter only shrinks the lag,
so the slack is conservative. Once it is spent, or at the next refresh, the check is made
again in full. (Every append to a journal partition, a follower's included, passes here.)
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from stonemq.storage import offset_index, time_index
from stonemq.storage.errors import StorageError

REFRESH_S = 0.02
log = logging.getLogger(__name__)

MARGIN_BYTES = 1024 * 1024
"""Room kept beyond the split cost: checkpoint files rewritten beside their old copy, the
recovery-point files, a directory block."""

FILES_PER_SEGMENT = 4
"""A queue-log segment's files that each end in a partly used block: log, index, time index,
producer snapshot."""


def split_cost_factor(segment_bytes: int, index_interval_bytes: int, block_bytes: int) -> float:
    """Bytes the read directory gives per journal byte split into queue logs whose segments roll
    at ``segment_bytes`` and are indexed every ``index_interval_bytes``. A segment holds at
    least half its size when batches are no larger than a segment (one batch else), so it
    rolls at most every ``segment_bytes / 2`` bytes; each roll costs up to a block per file;
    each index interval adds one offset and one time index entry."""
    roll = FILES_PER_SEGMENT * block_bytes
    per_interval = offset_index.ENTRY_SIZE + time_index.ENTRY_SIZE
    return 1.0 + roll / max(segment_bytes // 2, 1) + per_interval / max(index_interval_bytes, 1)


class SplitHeadroom:
    """Refuses appends while the read directory cannot take what the splitter still owes."""

    __slots__ = (
        "_checked_at",
        "_free",
        "_min_index_interval",
        "_min_segment",
        "_since",
        "_slack",
        "block_bytes",
        "cost_factor",
        "directory",
        "lag",
        "margin_bytes",
        "on_change",
        "refusing",
    )

    def __init__(
        self, directory: str, lag: Callable[[], int], margin_bytes: int = MARGIN_BYTES
    ) -> None:
        self.directory = directory
        self.lag = lag  # journal bytes written or queued, not yet split
        self.margin_bytes = margin_bytes
        self.block_bytes = 4096  # the filesystem's, from the first statvfs
        self.cost_factor = 1.0  # see split_cost_factor; raised by note_config
        self._min_segment = 1 << 62
        self._min_index_interval = 1 << 62
        self._free = 0
        self._since = 0  # bytes appended since the free space was read
        self._checked_at = -1.0
        # weighted bytes later appends may take without a full check until the next refresh
        # (``check``); negative: none, check in full
        self._slack = -1.0
        self.refusing = False  # logged when it starts and stops
        self.on_change: Callable[[], None] | None = None  # called when ``refusing`` flips

    def free_bytes(self) -> int:
        now = time.monotonic()
        if now - self._checked_at >= REFRESH_S:
            st = os.statvfs(self.directory)
            self._free = st.f_bavail * st.f_frsize
            block = max(st.f_bsize, st.f_frsize, 512)
            if block != self.block_bytes:
                self.block_bytes = block
                self._update_factor()
            self._since = 0
            self._checked_at = now
        return self._free - self._since

    def note_config(self, segment_bytes: int, index_interval_bytes: int) -> None:
        """A partition with these settings exists: the cost factor covers it from now on. It
        is never lowered while the broker runs (a deleted topic's small segments keep it up
        until a restart): conservative, and a scan of every partition per delete is not."""
        if segment_bytes < self._min_segment or index_interval_bytes < self._min_index_interval:
            self._min_segment = min(self._min_segment, segment_bytes)
            self._min_index_interval = min(self._min_index_interval, index_interval_bytes)
            self._update_factor()

    def _update_factor(self) -> None:
        self._slack = -1.0  # the next check weighs the lag with the new factor
        if self._min_segment < 1 << 62:
            self.cost_factor = split_cost_factor(
                self._min_segment, self._min_index_interval, self.block_bytes
            )

    def check(self, size: int) -> None:
        """Raise StorageError when an append of ``size`` bytes would leave the splitter short
        of space; else count it."""
        weighted = size * self.cost_factor
        if weighted <= self._slack and time.monotonic() - self._checked_at < REFRESH_S:
            self._slack -= weighted + size  # the lag grows by size, the free space shrinks
            self._since += size
            return
        lag = self.lag()
        need = int((lag + size) * self.cost_factor) + self.margin_bytes
        free = self.free_bytes()
        if free < need:
            self._slack = -1.0
            self._checked_at = -1.0  # read it again next time: space may come back any moment
            error = StorageError(
                f"{self.directory}: {free} bytes free, the splitter needs {need} for what is "
                "not split yet: produces wait until it catches up or space returns"
            )
            if not self.refusing:
                self.refusing = True
                log.warning("refusing produces: %s", error)
                if self.on_change is not None:
                    self.on_change()
            raise error
        if self.refusing:
            self.refusing = False
            log.info("%s: space for the splitter again, produces resume", self.directory)
            if self.on_change is not None:
                self.on_change()
        self._since += size
        self._slack = (free - size) - (lag + size) * self.cost_factor - self.margin_bytes
