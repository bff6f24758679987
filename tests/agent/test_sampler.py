from __future__ import annotations

from agent.sampler import FixedRateTicker


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000_000

    def __call__(self) -> int:
        return self.now


def test_no_drift_and_missed_ticks_counted() -> None:
    clock = FakeClock()
    stamps: list[int] = []
    ticker = FixedRateTicker(100.0, stamps.append, monotonic_ns=clock, realtime_ns=clock)
    due = clock.now
    # A tick that starts 3 ms late still schedules the next one 10 ms after the first was due.
    clock.now += 3_000_000
    due = ticker.run_due_tick(due)
    assert due == 1_010_000_000
    assert ticker.last_lag_s == 0.003
    # Now the sampler stalls for 35 ms: 3 ticks were skipped, the schedule stays on the 10 ms grid.
    clock.now = due + 35_000_000
    due = ticker.run_due_tick(due)
    assert ticker.missed_ticks_total == 3
    assert due == 1_050_000_000
    assert ticker.ticks_total == 2 and len(stamps) == 2


def test_failing_tick_is_counted_not_fatal() -> None:
    clock = FakeClock()

    def boom(_: int) -> None:
        raise RuntimeError("backend exploded")

    ticker = FixedRateTicker(10.0, boom, monotonic_ns=clock, realtime_ns=clock)
    ticker.run_due_tick(clock.now)
    ticker.run_due_tick(clock.now + 100_000_000)
    assert ticker.tick_errors_total == 2
