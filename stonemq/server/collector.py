"""The broker process's cyclic garbage collector: a larger young generation, startup frozen,
full collections deferred while large requests are in flight.

CPython's collector runs a young-generation collection every 700 net container allocations,
and every tenth of those an older one over everything that survived. A broker holding
10,000 partitions has a few hundred thousand long-lived containers (queue logs, segments,
topic metadata), while its request path allocates and frees several small objects per
batch: with the default threshold the collections showed up as time in whatever line
allocated (at 10,000 partitions of one-record batches, 46.6 and 47.0 µs of broker CPU per
batch against 41.1 and 40.8 with a threshold ten times larger, paired runs). Most of what a
request allocates is freed by reference counting before a larger young generation fills, so
fewer collections traverse the same live objects.

What exists when the broker is ready (the modules, the recovered partitions and their
metadata) is moved to the permanent generation (``gc.freeze``): collections never traverse
it again. Cyclic garbage lives a little longer (at most ``YOUNG_THRESHOLD_ALLOCATIONS``
allocations' worth more before it is found); ``tests/unit/storage/test_bounded_resources.py``
and the idle and under-load PSS figures of the bench bound what that costs.
"""

from __future__ import annotations

import gc
import time

YOUNG_THRESHOLD_ALLOCATIONS = 7000
"""Net container allocations between young-generation collections (CPython's default: 700)."""
OLDER_THRESHOLD_COLLECTIONS = 10
"""Collections of a generation between collections of the next (CPython's default)."""


def tune_collector() -> None:
    """Collect once, freeze what survives, raise the young generation's threshold. Called
    once the broker has recovered and listens."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(
        YOUNG_THRESHOLD_ALLOCATIONS, OLDER_THRESHOLD_COLLECTIONS, OLDER_THRESHOLD_COLLECTIONS
    )


FULL_COLLECTION_DEFER_MAX_S = 10.0
"""The longest full collections wait while large requests are in flight; past it they run again
until no large request is left (a client sending large requests back to back never keeps
cyclic garbage from being found for longer)."""
_DEFERRED_THRESHOLD = 1 << 30
_deferring = 0  # large requests in flight
_deferred_since = 0.0
_saved: tuple[int, int, int] | None = None


def defer_full_collections() -> None:
    """A large request (100,000 entries: a million objects alive while it is decoded, handled
    and encoded) starts: no full collection until it is answered. CPython's full collection
    traverses every live object not frozen, and one over such a request held the GIL (the
    event loop, whatever thread it ran in) for 150-270 ms; the young collections go on, and
    once the request is answered its objects are freed and the next full collection is cheap.
    Called on the event loop only, paired with :func:`resume_full_collections`."""
    global _deferring, _deferred_since, _saved
    now = time.monotonic()
    if _deferring == 0:
        _saved = gc.get_threshold()
        _deferred_since = now
        gc.set_threshold(_saved[0], _saved[1], _DEFERRED_THRESHOLD)
    elif _saved is not None and now - _deferred_since > FULL_COLLECTION_DEFER_MAX_S:
        gc.set_threshold(*_saved)
    _deferring += 1


def resume_full_collections(*_: object) -> None:
    """A large request was answered (or dropped with its connection); the last one puts the
    collector's thresholds back. Any arguments are ignored (a task's done callback)."""
    global _deferring
    _deferring -= 1
    if _deferring == 0 and _saved is not None:
        gc.set_threshold(*_saved)
