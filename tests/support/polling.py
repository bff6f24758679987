"""Waiting on a condition with a deadline."""
from __future__ import annotations

import time


def wait_until(predicate, timeout_s: float = 10.0, interval_s: float = 0.1) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())
