"""The broker's malloc thresholds, observed in a fresh interpreter through glibc's mallinfo2."""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys

import pytest

PROBE = """
import ctypes, ctypes.util, json, sys

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "tuned":
    from stonemq.server.malloc import tune_malloc
    assert tune_malloc()
mmapped = libc.mallinfo2().hblkhd
buffers = [bytes(1024 * 1024) for _ in range(4)]  # one fetch: 1 MiB from each of 4 logs
mmapped_during = libc.mallinfo2().hblkhd - mmapped
heap = libc.mallinfo2().arena
del buffers
kept = libc.mallinfo2().arena
print(json.dumps({"mmapped": mmapped_during, "heap": heap, "kept": kept}))
"""


def _probe(mode: str) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


@pytest.mark.skipif(
    sys.platform != "linux" or ctypes.util.find_library("c") is None, reason="glibc only"
)
def test_request_sized_buffers_reuse_heap_pages_once_tuned() -> None:
    default = _probe("default")
    # glibc's defaults: the first 1 MiB buffers are mmapped (fresh pages, unmapped on free)
    assert default["mmapped"] >= 1024 * 1024
    tuned = _probe("tuned")
    # tuned: all four come from the heap, and freeing them keeps the pages for the next
    assert tuned["mmapped"] == 0
    assert tuned["heap"] >= 4 * 1024 * 1024
    assert tuned["kept"] == tuned["heap"]


ARENAS_PROBE = """
import ctypes, ctypes.util, os, sys, threading

libc = ctypes.CDLL(ctypes.util.find_library("c"))
if sys.argv[1] == "tuned":
    from stonemq.server.malloc import tune_malloc
    assert tune_malloc()
held = []
def allocate():
    held.append(bytes(256 * 1024))  # a disk read's buffer, made in that thread
threads = [threading.Thread(target=allocate) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
sys.stderr.flush()
libc.malloc_stats()  # one "Arena N:" block per arena, on stderr
"""


@pytest.mark.skipif(
    sys.platform != "linux" or ctypes.util.find_library("c") is None, reason="glibc only"
)
def test_threads_share_one_arena_once_tuned() -> None:
    """Each thread's buffers come from the one arena, so its free memory is everyone's."""

    def arenas(mode: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", ARENAS_PROBE, mode], capture_output=True, text=True, check=True
        )
        return sum(line.startswith("Arena ") for line in out.stderr.splitlines())

    assert arenas("default") > 1  # glibc: a thread that allocates gets an arena of its own
    assert arenas("tuned") == 1
