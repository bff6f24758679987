"""The α–β fit: it recovers a known model from noisy pairs, reports residuals, and refuses what the
data cannot support."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from chopper.predict import volumes
from chopper.predict.fit import GB, FitRefused, fit_collective, support

ALPHA, BUS_GBS = 20e-6, 12.0  # 20 µs per latency step, 12 GB/s bus bandwidth


def pairs(rng: np.random.Generator, sizes: list[float], worlds: list[int], noise: float, reps: int = 20,
          bandwidths: list[float] | None = None) -> dict[str, Any]:
    """Ring all-reduce timings drawn from t = α·L + V/B with multiplicative noise of ``noise`` (sd)."""
    rows = []
    for i, (s, n) in enumerate((s, n) for s in sizes for n in worlds):
        b = BUS_GBS if bandwidths is None else bandwidths[i % len(bandwidths)]
        steps, sent = volumes.latency_steps("all_reduce", n), volumes.bus_bytes("all_reduce", s, n)
        for _ in range(reps):
            rows.append((steps, sent, (ALPHA * steps + sent / (b * GB)) * (1 + noise * rng.standard_normal()), s, n, b))
    names = ("latency_steps", "bus_bytes", "seconds", "sizes", "worlds", "bandwidths_gbs")
    return {name: np.asarray(column) for name, column in zip(names, zip(*rows, strict=True), strict=True)}


def test_fit_recovers_alpha_and_beta_from_noisy_pairs() -> None:
    rng = np.random.default_rng(7)
    data = pairs(rng, [1e3, 1e5, 1e6, 1e8], [2, 4, 8], noise=0.03)
    del data["bandwidths_gbs"]
    fit = fit_collective("all_reduce", "ring", **data)
    assert fit.alpha_s == pytest.approx(ALPHA, rel=0.05)
    assert fit.effective_bandwidth_gbs == pytest.approx(BUS_GBS, rel=0.02)
    # The residuals are the noise drawn: 3% relative.
    assert fit.rms_rel == pytest.approx(0.03, rel=0.25)
    assert fit.max_rel < 0.15 and fit.pairs == 240 and not fit.alpha_fixed
    assert fit.sizes == (1e3, 1e8) and fit.worlds == (2, 8)


def test_a_fit_in_units_of_the_run_bandwidth_predicts_another_bandwidth() -> None:
    rng = np.random.default_rng(3)
    data = pairs(rng, [1e6, 1e7], [2, 4], noise=0.02, bandwidths=[1.0, 4.0])
    fit = fit_collective("all_reduce", "ring", **data)
    assert fit.scaled and fit.bandwidths == (1.0, 4.0)
    # β = 1: the drawn link runs at the bandwidth it was given.
    assert fit.beta == pytest.approx(1.0, rel=0.03)
    L, V = volumes.latency_steps("all_reduce", 4), volumes.bus_bytes("all_reduce", 1e7, 4)
    assert fit.seconds(L, V, 2.0) == pytest.approx(ALPHA * L + V / 2e9, rel=0.03)
    with pytest.raises(FitRefused, match="give the target bandwidth"):
        fit.seconds(L, V, None)


@pytest.mark.hazard(item=3, input="one message size at one world size (every call moves the same bytes)",
                    promise="refused as not identifiable, naming what to record or to fix; fitted once α is fixed")
def test_one_message_size_at_one_world_size_is_refused_unless_alpha_is_fixed(hazard) -> None:
    rng = np.random.default_rng(1)
    data = pairs(rng, [8.4e6], [2], noise=0.05)
    del data["bandwidths_gbs"]
    with pytest.raises(FitRefused, match=r"β is not identifiable.*--latency-us") as refused:
        fit_collective("all_reduce", "ring", **data)
    fit = fit_collective("all_reduce", "ring", **data, alpha_s=ALPHA)
    assert fit.alpha_fixed and fit.effective_bandwidth_gbs == pytest.approx(BUS_GBS, rel=0.03)
    hazard.outcome = (f"refused: {str(refused.value)[:90]}...; with α fixed, bandwidth "
                      f"{fit.effective_bandwidth_gbs:.2f} GB/s")


@pytest.mark.hazard(item=3, input="two timed collectives; timings that fall as bytes grow",
                    promise="each refused with the reason and what to record instead")
def test_too_few_pairs_and_a_falling_time_are_refused(hazard) -> None:
    with pytest.raises(FitRefused, match=r"2 timed call.*3 needed") as few:
        fit_collective("all_reduce", "ring", [2, 2], [1e6, 2e6], [1e-3, 2e-3], [1e6, 2e6], [2, 2])
    with pytest.raises(FitRefused, match="does not grow with the bytes") as falling:
        fit_collective("all_reduce", "ring", [2, 2, 2], [1e3, 1e6, 1e8], [3e-3, 2e-3, 1e-3], [1e3, 1e6, 1e8],
                       [2, 2, 2])
    hazard.outcome = f"{few.value}; {falling.value}"


def test_a_negative_latency_is_fixed_at_zero() -> None:
    V = np.array([1e6, 2e6, 4e6, 8e6])
    fit = fit_collective("all_gather", "ring", [1, 1, 1, 1], V, V / 1e9 - 1e-5, V, [2, 2, 2, 2])
    assert fit.alpha_s == 0.0 and fit.alpha_fixed and "negative" in fit.notes[0]


def test_support_refuses_far_extrapolation() -> None:
    rng = np.random.default_rng(0)
    data = pairs(rng, [1e6, 1e7], [2, 4], noise=0.01)
    del data["bandwidths_gbs"]
    fit = fit_collective("all_reduce", "ring", **data)
    assert support(fit, 5e6, 16, None) is None
    assert "more than 4× the largest observed (4)" in (support(fit, 5e6, 17, None) or "")
    assert "outside 4× the observed" in (support(fit, 1e9, 4, None) or "")
    assert "away from the effective" in (support(fit, 5e6, 4, 200.0) or "")
