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
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 8 * 1024 * 1024
ARENA_MAX = 1
_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def tune_malloc() -> bool:
    """Set the thresholds and the arena count (glibc only; another libc is left as it is).
    True if set. Called before the broker starts its threads: a thread that already has an
    arena keeps it."""
    try:  # dlopen(NULL): the process's own symbols (stonemq.storage.fileio says why)
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
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
