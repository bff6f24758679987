from __future__ import annotations

import math

import pytest

from agent.markers import ClosedStep
from agent.steps import SummaryQueue, summarize
from chopper.schema import Sample

S = 10**9


def step(gpu: int = 0, begin: float = 1.5, end: float = 3.5) -> ClosedStep:
    return ClosedStep("j", 0, gpu, 7, int(begin * S), int(end * S), 1e12, 1000, 3, 1, False)


def samples() -> list[Sample]:
    # 1 s intervals ending at t = 1..4; clock drops in the third interval, energy at 500 W.
    rows = [(1, 2000.0, 0.5, 70.0), (2, 2000.0, 1.0, 75.0), (3, 1000.0, 1.0, 90.0), (4, 2000.0, 0.0, 80.0)]
    return [
        Sample(ts_ns=t * S, node="n", gpu=0, gfx_clock_mhz=clk, busy_ratio=busy, power_w=500.0, energy_j=500.0 * t,
               temp_c=temp)
        for t, clk, busy, temp in rows
    ]


def test_summary_uses_overlap_weights_and_interpolated_energy() -> None:
    s = summarize(step(), "n", samples(), period_ns=S)
    assert s.step_time_s == 2.0 and s.tokens == 1000 and s.phases == 3
    # Overlaps: 0.5 s of (1,2], 1 s of (2,3], 0.5 s of (3,4]; busy = (0.5*1 + 1*1 + 0.5*0) / 2.
    assert s.busy_ratio == pytest.approx(0.75)
    # Busy-weighted clock: (0.5*2000 + 1*1000) / 1.5.
    assert s.mean_gfx_clock_mhz == pytest.approx(4000 / 3)
    assert s.min_gfx_clock_mhz == 1000.0
    assert s.energy_j == pytest.approx(1000.0)
    assert s.max_temp_c == 90.0


def test_summary_without_samples_has_nan_gpu_figures() -> None:
    s = summarize(step(gpu=-1), "n", [], period_ns=S)
    assert s.step_time_s == 2.0 and math.isnan(s.energy_j) and math.isnan(s.mean_gfx_clock_mhz)


def test_queue_waits_for_covering_sample_or_timeout() -> None:
    q = SummaryQueue(max_wait_ns=2 * S)
    q.add([step(gpu=0, end=3.5), step(gpu=-1, end=3.5)])
    assert [c.gpu for c in q.ready({0: 3 * S}, now_ns=int(3.6 * S))] == [-1]
    assert q.ready({0: 3 * S}, now_ns=int(4.0 * S)) == []
    assert [c.gpu for c in q.ready({0: 4 * S}, now_ns=int(4.0 * S))] == [0]
    q.add([step(gpu=1, end=3.5)])
    assert [c.gpu for c in q.ready({}, now_ns=int(5.5 * S))] == [1]
