"""The splitter's headroom: appends wait for space the splitter needs for what was acknowledged.

Every acknowledged byte is written twice: into a journal segment, then, by the splitter, into
a queue log. A journal segment can go only once the queue logs fed from it are flushed past it,
so if producers filled the read directory's filesystem with journal bytes (the same
filesystem when both directories share a disk, as on a single-disk machine), the splitter
could never write them out again, no journal segment could ever be deleted, and the broker
would stay full even after the disk was cleared, and fail to recover at its next start. The
rule: an append is refused (KAFKA_STORAGE_ERROR, producers retry) while the read directory's
free space is below the journal bytes not yet split, this append included, plus a margin.

Free space comes from ``statvfs`` at most every ``REFRESH_S``; bytes appended since are
counted against it, so the check costs a subtraction on the produce path.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from stonemq.storage.errors import StorageError

REFRESH_S = 0.02
log = logging.getLogger(__name__)

MARGIN_BYTES = 1024 * 1024
"""Room kept beyond the unsplit bytes: index entries, checkpoints, a new segment's first page."""


class SplitHeadroom:
    """Refuses appends while the read directory cannot take what the splitter still owes."""

    __slots__ = ("_checked_at", "_free", "_since", "directory", "lag", "margin_bytes", "refusing")

    def __init__(
        self, directory: str, lag: Callable[[], int], margin_bytes: int = MARGIN_BYTES
    ) -> None:
        self.directory = directory
        self.lag = lag  # journal bytes written or queued, not yet split
        self.margin_bytes = margin_bytes
        self._free = 0
        self._since = 0  # bytes appended since the free space was read
        self._checked_at = -1.0
        self.refusing = False  # logged when it starts and stops

    def free_bytes(self) -> int:
        now = time.monotonic()
        if now - self._checked_at >= REFRESH_S:
            st = os.statvfs(self.directory)
            self._free = st.f_bavail * st.f_frsize
            self._since = 0
            self._checked_at = now
        return self._free - self._since

    def check(self, size: int) -> None:
        """Raise StorageError when an append of ``size`` bytes would leave the splitter short
        of space; else count it."""
        need = self.lag() + size + self.margin_bytes
        free = self.free_bytes()
        if free < need:
            self._checked_at = -1.0  # read it again next time: space may come back any moment
            error = StorageError(
                f"{self.directory}: {free} bytes free, the splitter needs {need} for what is "
                "not split yet: produces wait until it catches up or space returns"
            )
            if not self.refusing:
                self.refusing = True
                log.warning("refusing produces: %s", error)
            raise error
        if self.refusing:
            self.refusing = False
            log.info("%s: space for the splitter again, produces resume", self.directory)
        self._since += size
