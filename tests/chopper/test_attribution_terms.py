"""Each attribution term on small hand-computed inputs."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from chopper.attribution import dvfs, exposed_comm, ideal, idle, matrix_util, straggler
from chopper.attribution.timeline import GpuTimeline

MS = 1_000_000


def test_idle_from_busy_and_unknown_busy() -> None:
    assert np.allclose(idle.idle_seconds(np.array([2.0, 1.0]), np.array([0.75, np.nan])), [0.5, 0.0])


def test_exposed_is_collective_minus_phases_per_step() -> None:
    # step 0: all_reduce 10-30 ms, backward 0-20 ms -> 10 ms exposed.
    # step 1: two overlapping collectives 0-10 and 5-15 ms, no phase -> 15 ms (a union, not a sum).
    # step 2: collective fully inside a phase -> 0.  step 3: no intervals at all -> 0.
    step = np.array([0, 0, 1, 1, 2, 2])
    coll = np.array([True, False, True, True, True, False])
    begin = np.array([10, 0, 0, 5, 3, 0]) * MS
    end = np.array([30, 20, 10, 15, 7, 10]) * MS
    x = exposed_comm.exposed_seconds(4, step, coll, begin, end)
    assert np.allclose(x, [0.010, 0.015, 0.0, 0.0])


def test_exposed_capped_by_idle() -> None:
    x, capped = exposed_comm.cap_exposed(np.array([0.5, 0.1]), np.array([0.7, 0.1]), np.array([1.0, 1.0]))
    assert np.allclose(x, [0.3, 0.1]) and capped.tolist() == [True, False]


def test_dvfs_split_by_residency_or_unattributed() -> None:
    ratio = dvfs.clock_ratio(np.array([1500.0, 1500.0, np.nan, 2200.0]), np.array([2000.0] * 4))
    assert np.allclose(ratio, [0.75, 0.75, 1.0, 1.0])
    loss = dvfs.dvfs_loss(np.array([1.0, 1.0, 1.0, 1.0]), ratio)
    split = dvfs.split_by_cause(loss, {
        "power": np.array([0.3, 0.0, 0.0, 0.0]), "thermal": np.array([0.1, 0.0, 0.0, 0.0]),
        "current": np.zeros(4), "other": np.array([0.0, np.nan, 0.0, 0.0]),
    })
    assert np.allclose(split["power"], [0.1875, 0, 0, 0]) and np.allclose(split["thermal"], [0.0625, 0, 0, 0])
    assert np.allclose(split["unattributed"], [0.0, 0.25, 0.0, 0.0])


def test_ideal_mfu_and_matrix_clamp() -> None:
    i = ideal.ideal_seconds(np.array([1e15, 0.0, 5e14]), np.array([1e15, 1e15, np.nan]))
    assert i[0] == 1.0 and np.isnan(i[1]) and np.isnan(i[2])
    assert ideal.mfu(np.array([0.5]), np.array([2.0]))[0] == 0.25
    u, capped, over = matrix_util.matrix_util_loss(np.array([0.8, 0.8, 0.8]), np.array([0.5, 1.0, np.nan]))
    assert np.allclose(u[:2], [0.3, 0.0]) and np.isnan(u[2])
    assert np.allclose(capped[:2], [0.5, 0.8]) and over.tolist() == [False, True, False]


def test_timeline_takes_overlapping_fractions() -> None:
    ts = np.array([100.0, 200.0, 300.0, 400.0]) * MS  # intervals (0,100], (100,200], ...
    tl = GpuTimeline.build(
        ts,
        {"busy_ratio": np.array([1.0, 0.5, np.nan, 0.0]), "gfx_clock_mhz": np.array([2000.0, 1000.0, 1500.0, 500.0])},
        {"energy_j": np.array([10.0, 20.0, 40.0, 80.0])},
    )
    b, e = np.array([50.0 * MS]), np.array([350.0 * MS])
    (busy, clock, coverage), (known, weight, covered) = tl.integrals(
        [("busy_ratio", None), ("gfx_clock_mhz", "busy_ratio"), (None, None)], b, e
    )
    assert busy[0] == pytest.approx(0.05e9 * 1.0 + 0.1e9 * 0.5)  # NaN interval and 0 add nothing
    assert known[0] == pytest.approx(0.05e9 + 0.1e9 + 0.05e9)
    assert clock[0] / weight[0] == pytest.approx((0.05 * 2000 + 0.05 * 1000) / 0.1)
    assert coverage[0] == covered[0] == pytest.approx(0.3e9)
    # Windows outside the samples see nothing; one reaching past the last sample sees up to it.
    outside, _ = tl.integrals([(None, None)], np.array([500.0 * MS, -MS]), np.array([600.0 * MS, 350.0 * MS]))
    assert outside[0].tolist() == pytest.approx([0.0, 350.0 * MS])
    assert tl.counter_delta("energy_j", b, e)[0] == pytest.approx(60.0 - 10.0)  # 60 = halfway 40..80
    assert tl.extreme("gfx_clock_mhz", b, e, largest=False)[0] == 500.0
    assert tl.extreme("gfx_clock_mhz", np.array([120.0 * MS]), np.array([180.0 * MS]), largest=True)[0] == 1000.0
    assert np.isnan(tl.extreme("gfx_clock_mhz", np.array([500.0 * MS]), np.array([600.0 * MS]), largest=True)[0])


def test_straggler_wait_and_slowest_rank() -> None:
    steps = pd.DataFrame({
        "job": ["j"] * 3, "step": [0] * 3, "rank": [0, 1, 2], "node": ["a", "a", "b"], "gpu": [0, 1, 0],
        "exposed_comm_s": [0.30, 0.25, 0.05], "compute_s": [0.5, 0.55, 0.75],
        "mean_gfx_clock_mhz": [2000.0, 1990.0, 1600.0], "max_temp_c": [70.0, 72.0, 100.0],
        **{f"dvfs_{c}_s": [0.0, 0.0, 0.0] for c in ("power", "current", "other", "unattributed")},
        "dvfs_thermal_s": [0.0, 0.0, 0.15],
    })
    out = straggler.straggler_wait(steps)
    assert np.allclose(out["straggler_wait_s"], [0.25, 0.20, 0.0]) and np.allclose(out["exposed_comm_s"], 0.05)
    (slow,) = straggler.slowest_ranks(out).to_dict("records")
    assert (slow["rank"], slow["node"], slow["cause"]) == (2, "b", "thermal")
    assert slow["compute_excess_s"] == pytest.approx(0.20) and slow["job_median_gfx_clock_mhz"] == 1990.0


def test_slow_rank_with_normal_clock_is_not_blamed_on_hardware() -> None:
    steps = pd.DataFrame({
        "job": ["j"] * 3, "step": [0] * 3, "rank": [0, 1, 2], "node": ["a"] * 3, "gpu": [0, 1, 2],
        "exposed_comm_s": [0.1, 0.1, 0.0], "compute_s": [0.5, 0.5, 0.6],
        "mean_gfx_clock_mhz": [1900.0, 1900.0, 1950.0], "max_temp_c": [70.0] * 3,
        **{f"dvfs_{c}_s": [0.01, 0.01, 0.01] for c in ("power", "thermal", "current", "other", "unattributed")},
    })
    (slow,) = straggler.slowest_ranks(steps).to_dict("records")
    assert slow["rank"] == 2 and slow["cause"] == "none"


def test_ranks_of_unknown_compute_are_left_out_of_the_slowest_rank() -> None:
    steps = pd.DataFrame({
        "job": ["j"] * 4, "step": [0, 0, 1, 1], "rank": [0, 1, 0, 1], "node": ["a"] * 4, "gpu": [0, 1, 0, 1],
        "exposed_comm_s": [0.0] * 4, "compute_s": [np.nan, np.nan, 0.5, np.nan],
        "mean_gfx_clock_mhz": [1900.0] * 4, "max_temp_c": [70.0] * 4,
        **{f"dvfs_{c}_s": [0.0] * 4 for c in ("power", "thermal", "current", "other", "unattributed")},
    })
    assert straggler.slowest_ranks(steps).empty  # step 0: nobody to compare; step 1: one rank known
