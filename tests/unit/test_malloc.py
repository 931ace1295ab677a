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
