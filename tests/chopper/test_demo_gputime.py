"""The demo's stand-in GPU time: what a throttled clock lengthens, and a device it cannot time."""
from __future__ import annotations

import pytest

from agent.backends.specs import SPECS
from chopper.demo.gputime import GpuTime, StandIn


class Clock:
    def __init__(self, mhz: float) -> None:
        self.mhz = mhz

    def clock_mhz(self) -> float:
        return self.mhz


def test_a_lower_clock_stretches_compute_only_and_full_clock_matches_the_declared_flops() -> None:
    spec, model = SPECS["MI300X"], StandIn()
    clock = Clock(spec.max_gfx_clock_mhz)
    timing = GpuTime(model, spec.peak_flops, spec.max_gfx_clock_mhz, world=2, clock=clock)
    full = {p: timing.seconds(p) for p in ("forward", "backward", "optimizer", "all_reduce")}
    # At full clock the compute phases do the step's 6·N·T FLOPs at η of the peak.
    assert full["forward"] + full["backward"] == pytest.approx(model.flops / (spec.peak_flops * model.efficiency))
    assert full["backward"] == pytest.approx(2 * full["forward"])
    clock.mhz = spec.max_gfx_clock_mhz / 2
    half = {p: timing.seconds(p) for p in full}
    assert half["forward"] == pytest.approx(2 * full["forward"]) and half["backward"] == pytest.approx(
        2 * full["backward"])
    assert (half["optimizer"], half["all_reduce"]) == (full["optimizer"], full["all_reduce"])
    # A sampled clock above the maximum (boost, a rounding) does not make the GPU faster than its peak.
    clock.mhz = 2 * spec.max_gfx_clock_mhz
    assert timing.seconds("forward") == pytest.approx(full["forward"])
    # One rank has no peer to reduce with.
    assert GpuTime(model, spec.peak_flops, spec.max_gfx_clock_mhz, world=1, clock=clock).seconds("all_reduce") == 0


def test_a_device_without_peak_or_clock_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"--gpu-time needs the GPU's peak FLOP/s.*set the agent's peak_flops"):
        GpuTime(StandIn(), float("nan"), 2100.0, world=2, clock=Clock(2100.0))
    with pytest.raises(ValueError, match=r"--gpu-time needs"):
        GpuTime(StandIn(), 1e15, 0.0, world=2, clock=Clock(2100.0))
