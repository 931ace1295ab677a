"""The leader-epoch checkpoint (stonemq/storage/leader_epoch.py): Kafka's rules for assigning
epochs, answering OffsetForLeaderEpoch and truncating, as properties over any sequence of
operations, and the file surviving a reopen."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stonemq.storage.leader_epoch import (
    LEADER_EPOCH_FILE,
    EpochEntry,
    LeaderEpochCache,
    LeaderEpochFileError,
)

ops = st.lists(
    st.one_of(
        st.tuples(st.just("assign"), st.integers(0, 20), st.integers(0, 1000)),
        st.tuples(st.just("end"), st.integers(0, 1000), st.just(0)),
        st.tuples(st.just("start"), st.integers(0, 1000), st.just(0)),
    ),
    max_size=30,
)


def _apply(cache: LeaderEpochCache, op: tuple[str, int, int]) -> None:
    kind, a, b = op
    if kind == "assign":
        cache.assign(a, b)
        assert cache.latest == EpochEntry(a, b) or (
            cache.latest.epoch == a and cache.latest.start <= b
        )
        assert cache.epoch_for(max(b, cache.latest.start)) == a
    elif kind == "end":
        cache.truncate_from_end(a)
        assert all(e.start < a for e in cache.entries)
    else:
        before = cache.epoch_for(a)
        cache.truncate_from_start(a)
        assert cache.epoch_for(a) == before  # the epoch that wrote the new start is kept
        if before != -1:
            assert cache.entries[0].start == a


@pytest.mark.slow  # a property run of several seconds: in the full suite, not the fast set
@settings(max_examples=150, deadline=None)
@given(ops)
def test_any_history_stays_rising_and_survives_a_reopen(tmp_path_factory, history) -> None:
    directory = tmp_path_factory.mktemp("epochs")
    cache = LeaderEpochCache(str(directory))
    for op in history:
        _apply(cache, op)
        entries = cache.entries
        for before, after in itertools.pairwise(entries):
            assert before.epoch < after.epoch and before.start < after.start
    assert LeaderEpochCache(str(directory)).entries == cache.entries


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 30), st.integers(0, 500)), min_size=1, max_size=10),
    st.integers(-1, 35),
)
@pytest.mark.slow  # a property run of several seconds: in the full suite, not the fast set
def test_end_offset_for_is_where_the_asked_epoch_ended(tmp_path_factory, assigns, asked) -> None:
    cache = LeaderEpochCache(str(tmp_path_factory.mktemp("epochs")))
    for epoch, start in assigns:
        cache.assign(epoch, start)
    entries = cache.entries
    log_end = entries[-1].start + 100
    epoch, end = cache.end_offset_for(asked, log_end)
    if asked == -1 or asked > entries[-1].epoch:
        assert (epoch, end) == (-1, -1)
    elif asked == entries[-1].epoch:
        assert (epoch, end) == (asked, log_end)
    elif asked < entries[0].epoch:
        assert (epoch, end) == (asked, entries[0].start)
    else:
        floor = max((e for e in entries if e.epoch <= asked), key=lambda e: e.epoch)
        after = min((e for e in entries if e.epoch > asked), key=lambda e: e.epoch)
        assert (epoch, end) == (floor.epoch, after.start)


def test_kafkas_examples(tmp_path: Path) -> None:
    cache = LeaderEpochCache(str(tmp_path))
    assert cache.assign(2, 6)
    assert not cache.assign(2, 7)  # the same epoch later on: nothing new
    assert cache.assign(3, 8)
    assert cache.assign(4, 11)
    assert cache.end_offset_for(2, 20) == (2, 8)
    assert cache.end_offset_for(1, 20) == (1, 6)  # below every epoch: the first start
    assert cache.end_offset_for(4, 20) == (4, 20)  # the latest: the log end
    assert cache.end_offset_for(5, 20) == (-1, -1)
    # a new leader epoch starting below a recorded one drops what it contradicts
    assert cache.assign(5, 9)
    assert cache.entries == [EpochEntry(2, 6), EpochEntry(3, 8), EpochEntry(5, 9)]
    assert cache.truncate_from_end(9)
    assert cache.entries == [EpochEntry(2, 6), EpochEntry(3, 8)]
    assert cache.truncate_from_start(10)
    assert cache.entries == [EpochEntry(3, 10)]
    assert LeaderEpochCache(str(tmp_path)).entries == [EpochEntry(3, 10)]


def test_a_damaged_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / LEADER_EPOCH_FILE).write_text("0\n2\n3 10\n2 20\n")
    with pytest.raises(LeaderEpochFileError):
        LeaderEpochCache(str(tmp_path))
    (tmp_path / LEADER_EPOCH_FILE).write_text("garbage")
    with pytest.raises(LeaderEpochFileError):
        LeaderEpochCache(str(tmp_path))


def test_changes_from_two_threads_are_both_kept(tmp_path: Path) -> None:
    """The checkpoint round trims the start in a thread while a new epoch is assigned in
    another (a leader's election, a follower's fetch): each change is computed from the
    history the other left, never from the one both started with (the trim, written last,
    dropped the new epoch: an independent review)."""
    import threading

    cache = LeaderEpochCache(str(tmp_path))
    cache.assign(1, 0)
    cache.assign(2, 100)
    real_write = cache._file.write
    trim_writing, go_on = threading.Event(), threading.Event()

    def slow_first_write(rows: object) -> None:
        if not trim_writing.is_set():
            trim_writing.set()
            go_on.wait(5)
        real_write(rows)  # type: ignore[arg-type]

    cache._file.write = slow_first_write  # type: ignore[method-assign]
    trim = threading.Thread(target=cache.truncate_from_start, args=(50,))
    trim.start()
    assert trim_writing.wait(5)
    assign = threading.Thread(target=cache.assign, args=(3, 200))
    assign.start()
    assign.join(0.2)  # it waits for the trim (on the old code it wrote at once)
    go_on.set()
    trim.join(5)
    assign.join(5)
    want = [EpochEntry(1, 50), EpochEntry(2, 100), EpochEntry(3, 200)]
    assert cache.entries == want
    assert LeaderEpochCache(str(tmp_path)).entries == want
