"""A clock the test sets by hand, for code that takes its clock as an argument (STYLE rule 6)."""
from __future__ import annotations

from typing import Generic, TypeVar

from tests.support.summaries import NS

# 2023-11-14T22:13:20Z in nanoseconds: a plausible wall clock for code that reads ``realtime_ns``.
START_NS = 1_700_000_000 * NS

T = TypeVar("T", int, float)


class FakeClock(Generic[T]):
    """Returns ``now`` when called; the test sets or advances ``now`` and nothing else moves it.

    The unit is the caller's, fixed by the start: int nanoseconds for the daemons'
    ``realtime_ns``/``monotonic_ns`` and the aggregator's receive clock (``START_NS``, say), float
    seconds for the rate limiter.
    """

    def __init__(self, now: T) -> None:
        self.now: T = now

    def __call__(self) -> T:
        return self.now
