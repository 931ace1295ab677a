"""The broker's threads carry OS-level names (stonemq/server/threads.py)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from hypothesis import given
from hypothesis import strategies as st

from stonemq.server.threads import COMM_BYTES, name_os_thread, os_name


def _comm() -> str:
    with open(f"/proc/self/task/{threading.get_native_id()}/comm") as fh:
        return fh.read().strip()


def test_an_executors_thread_takes_its_python_name_without_the_prefix() -> None:
    with ThreadPoolExecutor(
        1, thread_name_prefix="stonemq-split", initializer=name_os_thread
    ) as ex:
        assert ex.submit(_comm).result() == "split_0"
    with ThreadPoolExecutor(
        1, thread_name_prefix="stonemq-journal-3", initializer=name_os_thread
    ) as ex:
        assert ex.submit(_comm).result() == "journal-3_0"


def test_a_long_name_is_cut_to_the_kernels_limit() -> None:
    with ThreadPoolExecutor(
        1, thread_name_prefix="stonemq-replica-read-and-more", initializer=name_os_thread
    ) as ex:
        assert ex.submit(_comm).result() == "replica-read-an"


@given(st.text(min_size=1, max_size=40))
def test_os_names_fit_the_kernel_and_are_never_empty(name: str) -> None:
    got = os_name(name)
    assert got and len(got.encode()) <= COMM_BYTES
