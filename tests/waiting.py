"""wait_for: poll a condition until it holds or a deadline passes (tests that wait on real processes)."""

from __future__ import annotations

import time


def wait_for(predicate, timeout_s: float, what: str, every_s: float = 0.1):
    """The first truthy value of predicate(), polled every `every_s`; AssertionError naming
    `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
