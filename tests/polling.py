"""Waiting for a condition in tests: poll until it holds or a deadline passes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    what: str, check: Callable[[], Any], timeout: float = 30.0, every: float = 0.05
) -> Any:
    """``check()``'s first truthy value; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)
