"""The journal tail: the newest bytes of one journal partition, kept in memory so a leader
answers its followers' fetches of what it just wrote without reading the file.

A follower that keeps up fetches, in every round trip, the entries written since its previous
fetch: bytes the leader held in memory a moment before. Reading them back from the file goes
through the replica-read thread (issue 17's rule: no file read on the event loop), and that
hand-off and its way back cost more than the copy itself. The storage hands every group of
entries it has written to :meth:`JournalTail.appended` (``StorageEngine.on_journal_bytes``),
on the loop, once the group is in the file and before the followers' long polls wake: one
copy of the group, kept with its entries' boundaries, the oldest groups dropped beyond
``replica.fetch.tail.max.bytes``, except that groups an ISR follower has not fetched yet are
kept up to ``LAG_FACTOR`` times that (a follower a few large entries behind: librdkafka's
produce requests carry about 1 MB each, several are in flight, and a follower fetches one
entry of that size per round trip, so it often trails by 2-4 MiB and every fetch read the
files). :meth:`JournalTail.read` answers a fetch from those bytes
with exactly what ``JournalReader.read_raw`` would read from the files (whole entries, the
same cut at ``max_bytes``), or None when it cannot: a position outside the tail or not on an
entry boundary it knows, or a limit past the tail's end. The caller then reads the file in
the replica-read thread, as before.

Why the bytes are the file's: the tail holds one contiguous run of journal positions
``[start, end)`` made of groups exactly as written, in order. A group written anywhere else
than at ``end`` (after a truncation, a catch-up's new journal, or a write the tail never saw)
replaces the whole tail, so no position is ever served from bytes that another write has
replaced; and a fetch is served only below the journal's written end, which bounds a tail
left longer by a truncation until the next write replaces it. The follower truncating or
installing a catch-up also resets it (:meth:`reset`), so the tail is right even before that.
"""

from __future__ import annotations

import bisect
import collections
import itertools
from collections.abc import Sequence
from typing import Any

LAG_FACTOR = 4
"""How far beyond its bound a tail keeps the groups an ISR follower still has to fetch (as a
multiple of the bound); past that the oldest go whatever a follower needs (it reads the files,
as before)."""


class _Group:
    """One group of whole entries as written: its bytes and the journal position after each
    entry."""

    __slots__ = ("data", "ends", "start")

    def __init__(self, start: int, data: bytes, ends: list[int]) -> None:
        self.start = start
        self.data = data
        self.ends = ends

    @property
    def end(self) -> int:
        return self.ends[-1]


class JournalTail:
    """The newest bytes of one journal partition, at most ``max_bytes`` of them, or up to
    ``LAG_FACTOR`` times that while an ISR follower still needs the older groups (a group
    larger than ``max_bytes`` alone is not kept)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._groups: collections.deque[_Group] = collections.deque()
        self._starts: list[int] = []  # the groups' start positions, for bisect
        self.size = 0  # bytes held

    @property
    def start(self) -> int:
        """First journal position held (-1: nothing held)."""
        return self._groups[0].start if self._groups else -1

    @property
    def end(self) -> int:
        """Journal position after the last byte held (-1: nothing held)."""
        return self._groups[-1].end if self._groups else -1

    def reset(self) -> None:
        """Forget everything (a truncation, a catch-up's new journal)."""
        self._groups.clear()
        self._starts.clear()
        self.size = 0

    def appended(
        self, position: int, pieces: Sequence[Any], sizes: Sequence[int], needed_from: int = -1
    ) -> None:
        """Entries were written at journal ``position``: entry ``i`` is ``sizes[i]`` bytes,
        the concatenation of ``pieces`` in order (copied: the caller's buffers are reused).
        ``needed_from``: the smallest fetch position of the ISR followers (-1: none known);
        groups ending after it are kept beyond ``max_bytes``, up to ``LAG_FACTOR`` times it."""
        if not sizes or self.max_bytes <= 0:
            return
        if position != self.end:
            self.reset()  # not contiguous with what is held: the tail starts here
        data = b"".join(pieces)
        ends = list(itertools.accumulate(sizes, initial=position))
        del ends[0]
        if ends[-1] - position != len(data):  # a caller's bug: keep nothing unsure
            self.reset()
            return
        self._groups.append(_Group(position, data, ends))
        self._starts.append(position)
        self.size += len(data)
        groups = self._groups
        hard = self.max_bytes * LAG_FACTOR
        while (
            self.size > self.max_bytes
            and len(groups) > 1
            and (groups[0].end <= needed_from or needed_from < 0 or self.size > hard)
        ):
            old = groups.popleft()
            del self._starts[0]
            self.size -= len(old.data)
        if len(groups) == 1 and self.size > self.max_bytes:  # one group larger than the
            self.reset()  # bound: keep none

    def read(self, pos: int, limit: int, max_bytes: int) -> bytes | memoryview | None:
        """What ``JournalReader.read_raw(pos, limit, max_bytes)`` returns for the journal
        these bytes came from, or None when the tail cannot tell (read the file): ``pos`` not
        an entry boundary held, or ``limit`` past the tail's end. Nothing to read (``pos`` at
        or past ``limit``) is answered empty, as the file read does, tail or not."""
        want = min(max(max_bytes, 4), limit - pos)
        if want <= 0:  # nothing new (a follower that keeps up, waiting): no read at all
            return b""
        groups = self._groups
        if not groups or limit > groups[-1].end:
            return None
        i = bisect.bisect_right(self._starts, pos) - 1
        if i < 0:
            return None
        group = groups[i]
        if pos != group.start:
            k = bisect.bisect_left(group.ends, pos)
            if k == len(group.ends) or group.ends[k] != pos:
                return None  # inside an entry: the file read decides what that is
        stop = pos + want
        # the last entry boundary at or below ``stop`` (entries end where groups do)
        j = i
        last = len(groups) - 1
        while j < last and groups[j + 1].start <= stop:
            j += 1
        cut_group = groups[j]
        k = bisect.bisect_right(cut_group.ends, stop)
        cut = cut_group.ends[k - 1] if k else cut_group.start
        if cut <= pos:  # the first entry alone is larger than ``want``
            first_end = group.ends[bisect.bisect_right(group.ends, pos)]
            if first_end > limit:
                return b""
            return memoryview(group.data)[pos - group.start : first_end - group.start]
        if j == i:
            return memoryview(group.data)[pos - group.start : cut - group.start]
        chunks: list[Any] = [memoryview(group.data)[pos - group.start :]]
        for g in itertools.islice(groups, i + 1, j):
            chunks.append(g.data)
        chunks.append(memoryview(cut_group.data)[: cut - cut_group.start])
        return b"".join(chunks)
