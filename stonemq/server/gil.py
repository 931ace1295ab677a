"""The broker process's GIL switch interval: how long the event loop keeps the GIL from a
thread that waits for it.

The broker's threads (the splitter's reads and writes, the journal writers, the disk reads of
fetches) spend their time in system calls that release the GIL, and need it back after each
one. While the event loop runs Python, a thread that wants it back waits until the loop is
asked to drop it, at CPython's switch interval (5 ms by default): a 1 MiB ``pwrite`` of about
0.1 ms took 5.4 ms (median) beside a thread running Python, 1.2 ms with an interval of 1 ms
(a paired measurement on this machine). Under a catch-up and pipelined requests the loop is
always running, so every step of the splitter (a journal read and a write per queue log)
paid that many times over, the splitter fell behind and producers were held for split lag
(issue 17's interference benchmark).

A shorter interval costs the loop a GIL hand-over more often, only while a thread waits for
it; the threads give it back at their next system call.
"""

from __future__ import annotations

import sys

SWITCH_INTERVAL_S = 0.001
"""CPython's switch interval in the broker process (its default: 0.005)."""


def tune_switch_interval(interval_s: float = SWITCH_INTERVAL_S) -> None:
    """Set the interpreter's switch interval (before the broker's threads start)."""
    sys.setswitchinterval(interval_s)
