from __future__ import annotations

import pytest

from agent.backends.base import BackendError, BackendUnavailable, DeviceLost
from agent.sampler import REOPEN_BACKOFF_S, BackendSampler, FixedRateTicker
from chopper.schema import DeviceInfo, Sample
from tests.support.fake_clock import FakeClock

S = 1_000_000_000


def test_no_drift_and_missed_ticks_counted() -> None:
    clock = FakeClock(S)
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
    clock = FakeClock(S)

    def boom(_: int) -> None:
        raise RuntimeError("backend exploded")

    ticker = FixedRateTicker(10.0, boom, monotonic_ns=clock, realtime_ns=clock)
    ticker.run_due_tick(clock.now)
    ticker.run_due_tick(clock.now + 100_000_000)
    assert ticker.tick_errors_total == 2


class FlakyBackend:
    """A backend whose ``open`` and ``sample`` raise what the test queues, else answer one GPU."""

    name = "flaky"

    def __init__(self) -> None:
        self.open_errors: list[Exception] = []
        self.sample_errors: list[Exception] = []
        self.opens = self.closes = 0

    def open(self) -> list[DeviceInfo]:
        self.opens += 1
        if self.open_errors:
            raise self.open_errors.pop(0)
        return [DeviceInfo(node="n", gpu=0, vendor="sim", model="m", uuid="u0", max_gfx_clock_mhz=2000.0,
                           peak_flops=1e15, memory_bytes=1 << 30, power_cap_w=500.0)]

    def sample(self, now_ns: int) -> list[Sample]:
        if self.sample_errors:
            raise self.sample_errors.pop(0)
        return [Sample(ts_ns=now_ns, node="n", gpu=0)]

    def close(self) -> None:
        self.closes += 1


def test_reopen_backoff_doubles_to_its_cap_and_resets_after_a_reopen() -> None:
    clock = FakeClock(S)
    backend = FlakyBackend()
    opened: list[int] = []
    sampler = BackendSampler(backend, lambda devices: opened.append(len(devices)), realtime_ns=clock)
    sampler.open()
    assert sampler.health.up and opened == [1]
    backend.sample_errors = [DeviceLost("gone")]
    backend.open_errors = [BackendError("still gone")] * 6
    assert sampler.sample(clock.now) == []
    waits = []
    while backend.open_errors or sampler.health.needs_reopen:
        due = sampler.health.next_reopen_ns
        waits.append((due - clock.now) / S)
        assert sampler.sample(due - 1) == [] and backend.opens == len(waits)  # not before its time
        clock.now = due
        samples = sampler.sample(due)
    assert waits == [1, 2, 4, 8, 16, 30, 30]  # doubling, capped at REOPEN_BACKOFF_S[1]
    assert samples and sampler.health.up and opened == [1, 1] and backend.closes == 7
    assert sampler.health.errors == {"device_lost": 1, "open": 6}
    assert sampler.health.last_error == "open: still gone"
    assert sampler.health.backoff_s == REOPEN_BACKOFF_S[0]  # reset: the next loss waits 1 s again


def test_a_failed_read_is_counted_and_retried_next_tick_without_a_reopen() -> None:
    clock = FakeClock(S)
    backend = FlakyBackend()
    sampler = BackendSampler(backend, lambda devices: None, realtime_ns=clock)
    sampler.open()
    backend.sample_errors = [RuntimeError("bad read")]
    assert sampler.sample(clock.now) == [] and not sampler.health.up
    assert sampler.health.errors == {"error": 1} and not sampler.health.needs_reopen
    assert sampler.sample(clock.now + 1) and sampler.health.up and backend.opens == 1
    assert sampler.health.last_sample_s >= 0


def test_first_open_failure_is_retried_but_an_unavailable_backend_is_raised() -> None:
    clock = FakeClock(S)
    backend = FlakyBackend()
    opened: list[int] = []
    sampler = BackendSampler(backend, lambda devices: opened.append(len(devices)), realtime_ns=clock)
    backend.open_errors = [BackendError("driver busy")]
    sampler.open()
    assert not sampler.health.up and sampler.health.errors == {"open": 1} and opened == []
    assert sampler.sample(clock.now + REOPEN_BACKOFF_S[0] * S) and opened == [1]
    backend.open_errors = [BackendUnavailable("no library")]
    with pytest.raises(BackendUnavailable):
        BackendSampler(backend, lambda devices: None).open()
