"""OS-level names of the broker's threads: what ``top -H``, ``ps -L`` and
``/proc/PID/task/*/comm`` show, so a thread waiting on the disk or a CPU can be told apart.

Python (before 3.14) names its threads for itself only; every thread of the broker showed as
the process's name. Each of the broker's executors passes :func:`name_os_thread` as its
initializer: the thread takes its Python name without the ``stonemq-`` prefix, cut to the
kernel's 15 bytes (``split_0``, ``journal-2_0``, ``io_3``). The event loop's thread keeps the
process's name.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)

PREFIX = "stonemq-"
COMM_BYTES = 15  # TASK_COMM_LEN 16, with its terminating NUL


def os_name(python_name: str) -> str:
    """The OS name a thread called ``python_name`` gets."""
    name = python_name.removeprefix(PREFIX)
    return name.encode()[:COMM_BYTES].decode(errors="ignore") or python_name[:COMM_BYTES]


def name_os_thread() -> None:
    """Give the calling thread its OS name (an executor's initializer). A system without
    ``/proc`` (or one that refuses the write) keeps the old name: nothing else depends on it."""
    name = os_name(threading.current_thread().name)
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as fh:
            fh.write(name)
    except OSError as exc:
        log.debug("thread %s keeps its OS name: %s", name, exc)
