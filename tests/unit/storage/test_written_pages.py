"""WrittenPages: which queue-log ranges leave the page cache, and when (pure logic; the drop
itself is tested against the kernel in test_page_cache.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from stonemq.storage.page_cache import MAX_RANGES, PAGE_BYTES, WrittenPages

PATHS = ["a.log", "b.log", "c.log"]

writes_strategy = st.lists(
    st.tuples(st.sampled_from(PATHS), st.integers(min_value=1, max_value=3000)),
    min_size=1,
    max_size=60,
)


class Model:
    """The files as written: each write's (path, start, end, total bytes written after it)."""

    def __init__(self) -> None:
        self.size = dict.fromkeys(PATHS, 0)
        self.writes: list[tuple[str, int, int, int]] = []
        self.total = 0

    def write(self, pages: WrittenPages, path: str, n: int) -> None:
        start = self.size[path]
        self.size[path] = start + n
        self.total += n
        self.writes.append((path, start, start + n, self.total))
        pages.note(path, start, start + n)

    def newest_overlapping(self, path: str, offset: int, length: int) -> int:
        """The write mark of the newest write overlapping ``[offset, offset + length)``."""
        return max(
            mark
            for p, start, end, mark in self.writes
            if p == path and start < offset + length and offset < end
        )


@settings(max_examples=200, deadline=None)
@given(retain=st.integers(min_value=0, max_value=8192), writes=writes_strategy)
def test_writeback_starts_half_a_window_on_and_the_drop_a_window_on(
    retain: int, writes: list[tuple[str, int]]
) -> None:
    pages = WrittenPages(retain)
    model = Model()
    for path, n in writes:
        model.write(pages, path, n)
        hint, drop = pages.due()
        for ranges, min_age in ((hint, retain // 2), (drop, retain)):
            for hinted_path, offset, length in ranges:
                assert length > 0
                # a file's partly written last page stays: the next append writes into it
                assert (offset + length) % PAGE_BYTES == 0
                age = model.total - model.newest_overlapping(hinted_path, offset, length)
                assert age >= min_age, (hinted_path, offset, length, age)


@settings(max_examples=200, deadline=None)
@given(retain=st.integers(min_value=0, max_value=8192), writes=writes_strategy)
def test_every_whole_page_is_written_back_and_dropped_once_a_window_was_written_after_it(
    retain: int, writes: list[tuple[str, int]]
) -> None:
    pages = WrittenPages(retain)
    model = Model()
    hints: list[tuple[str, int, int]] = []
    drops: list[tuple[str, int, int]] = []

    def collect() -> None:
        hint, drop = pages.due()
        hints.extend(hint)
        drops.extend(drop)

    for path, n in writes:
        model.write(pages, path, n)
        collect()
    written = dict(model.size)
    # a window (and a merged range's worth) more, to another file
    model.size["d.log"] = 0
    for _ in range(3):
        model.write(pages, "d.log", retain // 2 + 4096)
        collect()
    for ranges in (hints, drops):
        for path in PATHS:
            covered = [False] * (written[path] - written[path] % PAGE_BYTES)
            for hinted_path, offset, length in ranges:
                if hinted_path == path:
                    for i in range(offset, min(offset + length, len(covered))):
                        covered[i] = True
            assert all(covered), path


def test_the_newest_bytes_stay_and_a_busy_file_goes_in_steps() -> None:
    pages = WrittenPages(1 << 20)
    for i in range(64):  # 4 MiB to one file, 64 KiB at a time
        pages.note("a.log", i << 16, (i + 1) << 16)
    hint, drop = pages.due()
    assert hint and drop, "3.5 MiB past a 1 MiB window"
    # in ranges of an eighth of the window; none in the newest half window
    assert max(offset + length for _, offset, length in hint) <= (4 << 20) - (512 << 10)
    assert all(length == 128 << 10 for _, offset, length in hint)
    # a drop starts at the folio boundary below it (older bytes of the same file)
    assert max(offset + length for _, offset, length in drop) <= 3 << 20
    assert all(offset % (2 << 20) == 0 for _, offset, _ in drop)


def test_tracking_is_bounded_when_writes_spread_over_many_files() -> None:
    pages = WrittenPages(1 << 40)  # a window no test fills: only the bound makes ranges due
    hinted = dropped = 0
    for i in range(5 * MAX_RANGES):
        pages.note(f"{i}.log", 0, PAGE_BYTES + 100)
        hint, drop = pages.due()
        hinted += len(hint)
        dropped += len(drop)
        assert len(pages) <= MAX_RANGES
    # the oldest were written back and dropped early instead of kept
    assert hinted >= 4 * MAX_RANGES and dropped >= 3 * MAX_RANGES


def test_minus_one_tracks_nothing() -> None:
    pages = WrittenPages(-1)
    for i in range(100):
        pages.note("a.log", i * 1000, (i + 1) * 1000)
    assert len(pages) == 0
    assert pages.due() == ([], [])


def test_interleaved_writes_to_a_few_files_stay_a_few_ranges() -> None:
    pages = WrittenPages(1 << 30)
    size = dict.fromkeys(PATHS, 0)
    for _ in range(1000):  # small appends to three partitions, interleaved
        for path in PATHS:
            pages.note(path, size[path], size[path] + 4096)
            size[path] += 4096
    assert len(pages) == len(PATHS)
    assert pages.due() == ([], [])


def test_due_ranges_are_handed_out_in_steps_of_megabytes() -> None:
    pages = WrittenPages(64 << 20)  # steps of an eighth: 8 MiB
    size = 0
    handed: list[int] = []
    for _ in range(2048):  # 128 MiB in 64 KiB appends to one file
        pages.note("a.log", size, size + (64 << 10))
        size += 64 << 10
        hint, drop = pages.due()
        if hint or drop:
            handed.append(sum(length for _, _, length in hint + drop))
    assert handed, "two windows written"
    assert all(n >= 8 << 20 for n in handed)
    assert len(handed) < 2048 // 64  # not one hand-out per append


def test_a_write_ending_in_the_page_it_starts_in_costs_no_range() -> None:
    """100,000 partitions written once with a small batch track nothing; the page is covered
    by the file's next range, which starts from its boundary."""
    pages = WrittenPages(16 * PAGE_BYTES)
    for i in range(100_000):
        pages.note(f"{i}.log", 0, 100)
    assert len(pages) == 0
    pages.note("0.log", 100, 2 * PAGE_BYTES + 100)
    assert len(pages) == 1
    handed: list[tuple[str, int, int]] = []
    for i in range(64):  # the window passes over it
        pages.note("other.log", i * 4 * PAGE_BYTES, (i + 1) * 4 * PAGE_BYTES)
        hint, drop = pages.due()
        handed += [r for r in hint + drop if r[0] == "0.log"]
    assert ("0.log", 0, 2 * PAGE_BYTES) in handed


def test_10000_partitions_written_in_turn_keep_one_range_each() -> None:
    """Small batches to 10,000 files in turn: each file's appends merge into its one range,
    none handed out before the window says (the bound counts files, not appends)."""
    pages = WrittenPages(1 << 40)
    batch = 1100
    for turn in range(8):
        for i in range(10_000):
            pages.note(f"{i}.log", turn * batch, (turn + 1) * batch)
            assert pages.due() == ([], [])
    assert len(pages) == 10_000
