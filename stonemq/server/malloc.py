"""The broker process's glibc malloc thresholds: request and fetch buffers reuse heap pages.

The broker's large buffers (a ProduceRequest of a megabyte, the batches a fetch reads, 1 MiB
per partition) live for one request. With glibc's defaults a buffer that size is served by
``mmap`` until the first free raises the threshold, then from the heap, whose top is given
back to the kernel whenever more than twice that is free: each request faults in fresh
zeroed pages again. During a cold catch-up read that churn (page faults, ``brk``, zeroing)
took a fifth of the broker's CPU. Serving buffers below ``MMAP_THRESHOLD_BYTES`` from the heap
and keeping up to ``TRIM_THRESHOLD_BYTES`` of it free reuses pages already mapped: the same
catch-up of 512 MiB went from about 430 to 520 MB/s and from 0.96 to 0.55 broker CPU seconds,
and the peak PSS with 1,000 partitions under load did not grow (58 MB either way).

One arena (``ARENA_MAX``): glibc gives each thread that allocates its own arena (up to eight
per core), and each keeps its own free memory. The broker's threads (the splitter, the journal
writers, the disk reads) allocate their buffers with the GIL held, so they never contend for
an arena, and with one they reuse each other's free memory: with 1,000 partitions under load
the median PSS fell by about 4-5 MB (docs/benchmarks/analysis.md, "Process size, fourth pass").

Trimming (:func:`trim_heap`): transient buffers of 0.1-4 MiB (request frames, the records
decoded from them, queue-log write groups) are freed out of order, and the heap keeps their
pages as holes below live blocks, which no trim threshold gives back: at the process's size
peak under load the heap held 19-23 MiB of which 6-13 in use. ``malloc_trim(0)`` returns the
free pages of those holes too. The splitter calls it in its thread after a step's writes, at
most once per ``TRIM_INTERVAL_NS``: with 1,000 partitions under load the PSS peak was
40.6-44.9 MB (median 42.0, 8 runs) against main's 43.7-47.3 (45.2) in paired runs, at 0.2-0.5
ms of CPU per call (docs/benchmarks/analysis.md, "Process size, sixth pass").
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 8 * 1024 * 1024
ARENA_MAX = 1
_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
TRIM_INTERVAL_NS = 250_000_000
"""The least time between two :func:`trim_heap` calls that trim."""

_malloc_trim: Callable[[int], int] | None = None  # set by tune_malloc: the broker process only
_last_trim_ns = 0


def tune_malloc() -> bool:
    """Set the thresholds and the arena count (glibc only; another libc is left as it is).
    True if set. Called before the broker starts its threads: a thread that already has an
    arena keeps it."""
    global _malloc_trim
    try:  # dlopen(NULL): the process's own symbols (stonemq.storage.fileio says why)
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        malloc_trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    _malloc_trim = malloc_trim
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = (
        bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
        and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
        and bool(mallopt(_M_ARENA_MAX, ARENA_MAX))
    )
    if not ok:
        log.warning("mallopt refused the malloc thresholds; glibc's defaults are kept")
    return ok


def trim_heap() -> bool:
    """Give the malloc heap's free pages back to the kernel (``malloc_trim(0)``: the top and
    the holes), unless that was done less than ``TRIM_INTERVAL_NS`` ago or :func:`tune_malloc`
    did not run in this process (tests, tools). True if it trimmed. Called from one thread
    (the splitter's); ctypes lets the GIL go during the call."""
    global _last_trim_ns
    trim = _malloc_trim
    if trim is None:
        return False
    now = time.monotonic_ns()
    if now - _last_trim_ns < TRIM_INTERVAL_NS:
        return False
    _last_trim_ns = now
    trim(0)
    return True
