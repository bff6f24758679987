from __future__ import annotations

import math

import pytest

from agent.history import SampleWindow
from agent.markers import ClosedStep
from agent.steps import RankFigures, SummaryQueue, summarize
from chopper.schema import DeviceInfo, Sample

S = 10**9
DEVICE = DeviceInfo("n", 0, "amd", "MI300X", "u", 2000.0, 1e15, 1, 750.0)


def step(
    gpu: int = 0, begin: float = 1.5, end: float = 3.5, flops: float = 2e14, device_clock: bool = True
) -> ClosedStep:
    # forward 1.5-2.5 s, then an all_reduce 2.5-3.0 s that no phase covers.
    intervals = ((False, int(1.5 * S), int(2.5 * S), "forward", 0), (True, int(2.5 * S), int(3.0 * S), "all_reduce", 0))
    return ClosedStep("j", 0, gpu, 7, int(begin * S), int(end * S), flops, 1000, intervals, device_clock)


def samples() -> list[Sample]:
    # 1 s intervals ending at t = 1..4; clock drops in the third interval; 500 W; power throttling.
    rows = [(1, 2000.0, 0.5, 70.0), (2, 2000.0, 1.0, 75.0), (3, 1000.0, 1.0, 90.0), (4, 2000.0, 0.0, 80.0)]
    return [
        Sample(ts_ns=t * S, node="n", gpu=0, gfx_clock_mhz=clk, busy_ratio=busy, power_w=500.0, energy_j=500.0 * t,
               temp_c=temp, throttle_power_s=0.25 * t, throttle_thermal_s=0.0, throttle_current_s=0.0,
               throttle_other_s=0.0)
        for t, clk, busy, temp in rows
    ]


def test_summary_is_the_attribution_of_the_step() -> None:
    (s,) = summarize([step()], "n", SampleWindow.of(samples()), DEVICE, period_ns=S)
    assert s.step_time_s == 2.0 and s.tokens == 1000 and (s.phases, s.collectives) == (1, 1)
    # Overlaps: 0.5 s of (1,2], 1 s of (2,3], 0.5 s of (3,4]; busy = (0.5*1 + 1*1 + 0.5*0) / 2.
    assert s.busy_ratio == pytest.approx(0.75) and s.idle_s == pytest.approx(0.5)
    assert s.exposed_comm_s == pytest.approx(0.5)
    # Busy-weighted clock (0.5*2000 + 1*1000) / 1.5 over f_max 2000; compute K = 2 - 0.5 - 0.5 = 1 s.
    ratio = (4000 / 3) / 2000
    assert s.mean_gfx_clock_mhz == pytest.approx(4000 / 3) and s.min_gfx_clock_mhz == 1000.0
    assert s.dvfs_loss_s == pytest.approx(1 - ratio) and s.dvfs_power_s == pytest.approx(1 - ratio)
    assert s.ideal_s == pytest.approx(0.2) and s.matrix_util_loss_s == pytest.approx(ratio - 0.2)
    closure = s.ideal_s + s.matrix_util_loss_s + s.dvfs_loss_s + s.exposed_comm_s + s.idle_s
    assert closure == pytest.approx(s.step_time_s, rel=1e-12)
    assert s.energy_j == pytest.approx(1000.0) and s.max_temp_c == 90.0 and s.mfu == pytest.approx(0.1)
    assert s.mean_power_w == pytest.approx(500.0)
    assert list(s.flags) == []


def test_summary_without_samples_or_flops_is_flagged() -> None:
    (s,) = summarize([step(gpu=-1, flops=0.0, device_clock=False)], "n", None, None, period_ns=S)
    assert s.step_time_s == 2.0 and math.isnan(s.energy_j) and math.isnan(s.ideal_s)
    assert set(s.flags) == {"no_flops", "no_gpu", "no_samples", "cpu_clock"}


def test_rank_figures_count_the_mfu_numerator_and_denominator_over_steps_with_flops() -> None:
    """A step without FLOPs adds its time to compute_unknown and nothing to the MFU denominator, so the
    counters' ratio is the MFU of the steps with FLOPs, as the window gauge says."""
    (with_flops,) = summarize([step()], "n", SampleWindow.of(samples()), DEVICE, period_ns=S)
    (without,) = summarize([step(flops=0.0)], "n", SampleWindow.of(samples()), DEVICE, period_ns=S)
    figures = RankFigures()
    for s in (with_flops, without, with_flops):
        figures.add(s)
    now = figures.snapshot(with_flops.end_ns)
    assert now.flops_step_s == pytest.approx(2 * with_flops.step_time_s)
    assert now.seconds["ideal"] == pytest.approx(2 * with_flops.ideal_s)
    assert without.compute_at_clock_s > 0
    assert now.seconds["compute_unknown"] == pytest.approx(without.compute_at_clock_s)
    assert now.seconds["ideal"] / now.flops_step_s == pytest.approx(now.mfu)
    assert now.mfu == pytest.approx(0.1)


def test_queue_waits_for_covering_sample_or_timeout() -> None:
    q = SummaryQueue(max_wait_ns=2 * S)
    q.add([step(gpu=0, end=3.5), step(gpu=-1, end=3.5)])
    assert [c.gpu for c in q.ready({0: 3 * S}, now_ns=int(3.6 * S))] == [-1]
    assert q.ready({0: 3 * S}, now_ns=int(4.0 * S)) == []
    assert [c.gpu for c in q.ready({0: 4 * S}, now_ns=int(4.0 * S))] == [0]
    q.add([step(gpu=1, end=3.5)])
    assert [c.gpu for c in q.ready({}, now_ns=int(5.5 * S))] == [1]


def test_collective_time_counts_hidden_and_exposed_collectives_once() -> None:
    # all_reduce 2.0-2.8 s half inside forward (1.5-2.5 s), a second one 2.6-3.0 s overlapping it:
    # union 2.0-3.0 s = 1 s of collectives, 0.5 s of it outside every phase.
    intervals = ((False, int(1.5 * S), int(2.5 * S), "forward", 0), (True, int(2.0 * S), int(2.8 * S), "all_reduce", 0),
                 (True, int(2.6 * S), int(3.0 * S), "all_reduce", 0))
    closed = ClosedStep("j", 0, 0, 7, int(1.5 * S), int(3.5 * S), 2e14, 1000, intervals, True)
    (s,) = summarize([closed], "n", SampleWindow.of(samples()), DEVICE, period_ns=S)
    assert s.collective_s == pytest.approx(1.0) and s.exposed_comm_s == pytest.approx(0.5)
    figures = RankFigures()
    figures.add(s)
    figures.add(s)
    now = figures.snapshot(int(3.5 * S))
    assert now.collective_s == pytest.approx(2.0) and now.seconds["exposed_comm"] == pytest.approx(1.0)


def test_summary_carries_phase_times_as_unions_per_name() -> None:
    # forward 1.5-2.0 and again 2.2-2.5 inside a user phase "train" 1.5-2.5; the all_reduce is no phase.
    intervals = ((False, int(1.5 * S), int(2.5 * S), "train", 0), (False, int(1.5 * S), int(2.0 * S), "forward", 0),
                 (False, int(2.2 * S), int(2.5 * S), "forward", 0), (True, int(2.5 * S), int(3.0 * S), "all_reduce", 0))
    closed = ClosedStep("j", 0, 0, 7, int(1.5 * S), int(3.5 * S), 2e14, 1000, intervals, True)
    (s,) = summarize([closed], "n", SampleWindow.of(samples()), DEVICE, period_ns=S)
    assert {p.name: p.seconds for p in s.phase_times} == pytest.approx({"forward": 0.8, "train": 1.0})
    assert s.phases == 3 and s.collectives == 1


def test_rank_figures_bound_the_phase_names() -> None:
    from agent.steps import MAX_PHASE_SERIES
    from chopper.attribution.phases import OTHER

    figures = RankFigures()
    for i in range(MAX_PHASE_SERIES + 10):
        spans = ((False, 0, S, f"p{i}", 0), (False, 0, S // 2, "p0", 0))
        closed = ClosedStep("j", 0, -1, i, 0, 2 * S, 0.0, 0, spans, False)
        (s,) = summarize([closed], "n", None, None, period_ns=S)
        figures.add(s)
    phases = figures.snapshot(0).phase_s
    assert len(phases) == MAX_PHASE_SERIES + 1 and phases[OTHER] == pytest.approx(10.0)
    assert phases["p0"] == pytest.approx(1.0 + (MAX_PHASE_SERIES + 9) * 0.5)


def test_rank_figures_memory_does_not_grow_with_steps_between_scrapes() -> None:
    """A rank at 100 steps/s for 5 minutes, never scraped: its totals hold a minute of per-second sums, not steps."""
    import pickle

    from agent.steps import MFU_WINDOW_NS

    (s,) = summarize([step()], "n", SampleWindow.of(samples()), DEVICE, period_ns=S)
    figures = RankFigures()
    period_ns = S // 100

    def run(first: int, count: int) -> int:
        for i in range(first, first + count):
            s.end_ns = i * period_ns
            figures.add(s)
        return len(pickle.dumps(figures))  # everything it holds

    one_minute = run(0, 6_000)
    five_minutes = run(6_000, 24_000)
    assert five_minutes <= one_minute + 256, (one_minute, five_minutes)  # one entry per step: ~600 KB more
    # The window still holds the last minute: MFU is that of the steps in it, then nothing.
    now = 30_000 * period_ns
    assert figures.mfu(now) == pytest.approx(s.ideal_s / s.step_time_s)
    assert math.isnan(figures.mfu(now + MFU_WINDOW_NS + 2 * S))


def test_queue_knows_which_ranks_wait() -> None:
    q = SummaryQueue(max_wait_ns=2 * S)
    q.add([step(gpu=0, end=3.5), step(gpu=0, end=3.6)])
    assert q.waiting(("j", 0)) and not q.waiting(("j", 1))
    q.ready({0: int(3.55 * S)}, now_ns=int(3.7 * S))
    assert q.waiting(("j", 0))  # the second step still waits
    q.ready({0: 4 * S}, now_ns=4 * S)
    assert not q.waiting(("j", 0)) and len(q) == 0
