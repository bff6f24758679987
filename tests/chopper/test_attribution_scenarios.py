"""The ground-truth scenario generator itself: its runs are valid, its truth closes and matches
what it injected, and the samples it derives really determine that truth.

These tests do not exercise ``chopper.attribution``; they check the yardstick it is measured with.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from chopper.runs.rundir import read_run
from chopper.schema import DEVICE_COLUMNS, MARKER_COLUMNS, SAMPLE_COLUMNS, THROTTLE_CAUSES
from tests.support.attribution_scenarios import (
    ALL_SCENARIOS,
    CPU_SKEW_NS,
    HOT_RANK,
    MS,
    TRUTH_COLUMNS,
    Scenario,
    big_run,
    tolerance_s,
)

# Small big_run variants: one with data-loader gaps (20 Hz), one with zero-length gaps (0.5 Hz).
_BIG = {"big_run": lambda: big_run(20, 10, 20.0, seed=3), "big_run_slow_sampling": lambda: big_run(3, 4, 0.5)}
NAMES = [*ALL_SCENARIOS, *_BIG]
DVFS_COLUMNS = [f"dvfs_{c}_s" for c in (*THROTTLE_CAUSES, "unattributed")]


@functools.cache
def _scenario(name: str) -> Scenario:
    return _BIG[name]() if name in _BIG else ALL_SCENARIOS[name]()


def _truth_with_gpu(sc: Scenario) -> pd.DataFrame:
    """Truth rows with the (node, gpu) each rank drives, taken from its markers."""
    where = sc.markers.drop_duplicates(["job", "rank"])[["job", "rank", "node", "gpu"]]
    return sc.truth.merge(where, on=["job", "rank"], how="left", validate="many_to_one")


@pytest.mark.parametrize("name", NAMES)
def test_tables_have_the_schema_columns_and_sorted_timestamps(name: str) -> None:
    sc = _scenario(name)
    assert tuple(sc.devices.columns) == DEVICE_COLUMNS
    assert tuple(sc.samples.columns) == SAMPLE_COLUMNS
    assert tuple(sc.markers.columns) == MARKER_COLUMNS
    assert tuple(sc.truth.columns) == TRUTH_COLUMNS
    assert sc.samples["ts_ns"].is_monotonic_increasing
    assert sc.markers["ts_ns"].is_monotonic_increasing
    assert not sc.devices.duplicated(["node", "gpu"]).any()
    # One truth row per (job, rank, step) that has a step_end marker, and no other.
    ends = sc.markers[sc.markers["kind"] == "step_end"][["job", "rank", "step"]]
    keys = sc.truth[["job", "rank", "step"]]
    assert len(keys) == len(ends)
    pd.testing.assert_frame_equal(keys.sort_values(list(keys.columns), ignore_index=True),
                                  ends.sort_values(list(ends.columns), ignore_index=True), check_dtype=False)


@pytest.mark.parametrize("name", [*ALL_SCENARIOS, "big_run"])
def test_write_then_read_run_gives_back_the_same_tables(name: str, tmp_path: Path) -> None:
    sc = _scenario(name)
    run = read_run(sc.write(tmp_path / name))
    for table in ("devices", "samples", "markers"):
        ours, theirs = getattr(sc, table), getattr(run, table)
        assert len(ours) == len(theirs), table
        for col in ours.columns:
            a, b = ours[col].to_numpy(), theirs[col].to_numpy()
            if a.dtype.kind in "fiu":
                # Exact: float64 survives Parquet, and ts_ns must never take a float round trip.
                np.testing.assert_array_equal(a, b, err_msg=f"{table}.{col}")
            else:
                assert [str(x) for x in a] == [str(x) for x in b], f"{table}.{col}"


@pytest.mark.parametrize("name", [n for n in ALL_SCENARIOS if n != "short_steps"])
def test_seed_makes_scenarios_deterministic_and_varies_them(name: str) -> None:
    a, b, c = ALL_SCENARIOS[name](seed=7), ALL_SCENARIOS[name](seed=7), ALL_SCENARIOS[name](seed=8)
    for table in ("samples", "markers", "truth"):
        pd.testing.assert_frame_equal(getattr(a, table), getattr(b, table))
    assert not a.samples.equals(c.samples)


@pytest.mark.parametrize("name", NAMES)
def test_truth_closes_and_has_no_negative_terms(name: str) -> None:
    t = _scenario(name).truth
    parts = t["dvfs_loss_s"] + t["exposed_comm_s"] + t["straggler_wait_s"] + t["idle_s"]
    known = t["ideal_s"].notna()
    np.testing.assert_allclose((t["ideal_s"] + t["matrix_util_loss_s"] + parts)[known], t["step_time_s"][known],
                               rtol=1e-9, atol=0)
    np.testing.assert_allclose(t["compute_at_clock_s"] + parts, t["step_time_s"], rtol=1e-9, atol=0)
    np.testing.assert_allclose(t[DVFS_COLUMNS].sum(axis=1), t["dvfs_loss_s"], rtol=1e-9, atol=1e-15)
    terms = t[["ideal_s", "matrix_util_loss_s", "dvfs_loss_s", *DVFS_COLUMNS, "exposed_comm_s",
               "straggler_wait_s", "idle_s"]]
    assert (terms.fillna(0.0) >= 0).all().all()
    assert (t["step_time_s"] > 0).all()
    # The job-level split leaves at least one rank per step with no straggler wait.
    assert (t.groupby(["job", "step"])["straggler_wait_s"].min() == 0).all()


@pytest.mark.parametrize("name", NAMES)
def test_cumulative_counters_never_decrease(name: str) -> None:
    cum = ["energy_j", "link_tx_bytes", "link_rx_bytes", "pcie_tx_bytes", "pcie_rx_bytes",
           *(f"throttle_{c}_s" for c in THROTTLE_CAUSES)]
    for _, g in _scenario(name).samples.groupby(["node", "gpu"]):
        assert (np.diff(g[cum].to_numpy(), axis=0) >= 0).all()
        assert (np.diff(g["ts_ns"].to_numpy()) > 0).all()
        ratios = g[["busy_ratio", "mem_busy_ratio"]].to_numpy()
        assert ((ratios >= 0) & (ratios <= 1 + 1e-12)).all()


@pytest.mark.parametrize("name", NAMES)
def test_busy_time_in_samples_equals_busy_time_in_truth(name: str) -> None:
    sc = _scenario(name)
    truth = _truth_with_gpu(sc)
    whole_run = sc.gpu_busy.set_index(["node", "gpu"])["busy_s"]
    assert len(whole_run) == len(sc.devices)
    for (node, gpu), g in sc.samples.groupby(["node", "gpu"]):
        ts = g["ts_ns"].to_numpy()
        busy = g["busy_ratio"].to_numpy()
        # The first interval (before any step) is idle, so its unknown start does not matter.
        assert busy[0] == 0
        sampled = float((busy[1:] * np.diff(ts) / 1e9).sum())
        assert sampled == pytest.approx(whole_run[(node, gpu)], rel=1e-9)
        # Outside the steps the GPU is busy only while its last state is held to the next tick.
        mine = truth[(truth["node"] == node) & (truth["gpu"] == gpu)]
        in_steps = float((mine["step_time_s"] - mine["idle_s"]).sum())
        period = float(np.median(np.diff(ts))) / 1e9
        assert -1e-9 <= whole_run[(node, gpu)] - in_steps < period


@pytest.mark.parametrize("name", NAMES)
def test_markers_pair_up_inside_their_step(name: str) -> None:
    m = _scenario(name).markers
    for (_, _, step), g in m.groupby(["job", "rank", "step"]):
        kinds = g["kind"].tolist()
        assert kinds.count("step_begin") == 1 and kinds.count("step_end") == 1, step
        b = int(g.loc[g["kind"] == "step_begin", "ts_ns"].iloc[0])
        end = g[g["kind"] == "step_end"]
        e = int(end["ts_ns"].iloc[0])
        assert b < e
        assert kinds[0] == "step_begin" and kinds[-1] == "step_end"
        assert float(end["tokens"].iloc[0]) > 0
        for family in ("phase", "collective"):
            part = g[g["kind"].str.startswith(family)]
            for _, named in part.groupby("name"):
                seq = named["kind"].tolist()
                assert seq == [f"{family}_begin", f"{family}_end"] * (len(seq) // 2), seq
                ts = named["ts_ns"].to_numpy()
                assert (ts[1::2] >= ts[0::2]).all() and ts.min() >= b and ts.max() <= e
            if family == "collective":
                assert (part["bytes"] > 0).all()
        assert g.loc[g["kind"] != "step_end", "flops"].isna().all()
    assert set(m.loc[m["kind"].str.startswith("phase"), "name"]) == {"forward", "backward", "optimizer"}


# --------------------------------------------------------------------------------------------
# Each scenario injects what it says
# --------------------------------------------------------------------------------------------


def _truth(name: str) -> pd.DataFrame:
    return _scenario(name).truth


def test_clean_has_only_ideal_and_matrix_util() -> None:
    t = _truth("clean")
    assert (t[["dvfs_loss_s", "exposed_comm_s", "straggler_wait_s", "idle_s"]] == 0).all().all()
    assert (t["ideal_s"] > 0).all() and (t["matrix_util_loss_s"] > 0).all()


def test_power_capped_loses_a_fifth_of_the_step_to_power() -> None:
    t = _truth("power_capped")
    np.testing.assert_allclose(t["dvfs_loss_s"], 0.2 * t["step_time_s"], rtol=1e-12)
    np.testing.assert_allclose(t["dvfs_power_s"], t["dvfs_loss_s"], rtol=1e-12)


def test_mixed_throttle_splits_three_to_one_and_leaves_unexplained_steps_unattributed() -> None:
    t = _truth("mixed_throttle")
    unexplained = t["step"].isin([6, 7])
    a = t[~unexplained]
    np.testing.assert_allclose(a["dvfs_loss_s"], 0.15 * a["step_time_s"], rtol=1e-12)
    np.testing.assert_allclose(a["dvfs_power_s"], 0.75 * a["dvfs_loss_s"], rtol=1e-12)
    np.testing.assert_allclose(a["dvfs_thermal_s"], 0.25 * a["dvfs_loss_s"], rtol=1e-12)
    u = t[unexplained]
    np.testing.assert_allclose(u["dvfs_unattributed_s"], 0.1 * u["step_time_s"], rtol=1e-12)
    assert (u[["dvfs_power_s", "dvfs_thermal_s"]] == 0).all().all()


def test_hot_straggler_makes_the_fast_ranks_wait() -> None:
    sc = _scenario("hot_straggler")
    t = sc.truth
    hot, fast = t[t["rank"] == HOT_RANK], t[t["rank"] != HOT_RANK]
    assert (hot["straggler_wait_s"] == 0).all()
    assert (hot["dvfs_thermal_s"] > 0).all() and (hot["dvfs_thermal_s"] == hot["dvfs_loss_s"]).all()
    # The hot rank's compute is 25 % longer: ~112 ms of 450 ms, give or take the ±2 ms noise.
    assert fast["straggler_wait_s"].between(0.100, 0.125).all()
    assert (fast["dvfs_loss_s"] == 0).all()
    np.testing.assert_allclose(t["exposed_comm_s"], 0.030, rtol=1e-12)
    # All ranks share step boundaries in true time, though node 1's clock is 37.5 ms ahead.
    assert t.groupby("step")["step_time_s"].nunique().eq(1).all()
    begins = sc.markers[(sc.markers["kind"] == "step_begin") & (sc.markers["step"] == 1)]
    assert set(begins.groupby("node")["ts_ns"].first().diff().dropna().abs()) == {37_500_000}


def test_exposed_collectives_expose_the_all_reduce_and_the_gather_lead() -> None:
    t = _truth("exposed_collectives")
    np.testing.assert_allclose(t["exposed_comm_s"], 0.028, rtol=1e-12)
    assert (t[["idle_s", "dvfs_loss_s", "straggler_wait_s"]] == 0).all().all()


def test_dataloader_gaps_are_idle() -> None:
    t = _truth("dataloader_gaps")
    np.testing.assert_allclose(t["idle_s"], np.where(t["step"] % 2 == 1, 0.040, 0.080), rtol=1e-12)
    # The clock drops to 900 MHz only while idle, so the busy-weighted clock is f_max.
    assert (t["dvfs_loss_s"] == 0).all()


def test_short_steps_are_shorter_than_a_sample_interval() -> None:
    sc = _scenario("short_steps")
    period = np.diff(sc.samples[sc.samples["gpu"] == 0]["ts_ns"].to_numpy())
    assert (period == 100 * MS).all()
    assert (sc.truth["step_time_s"] == 0.030).all()
    np.testing.assert_allclose(sc.truth["idle_s"], 0.001, rtol=1e-9)
    np.testing.assert_allclose(sc.truth["dvfs_power_s"], 0.1 * 0.029, rtol=1e-9)


def test_missing_samples_merges_intervals() -> None:
    sc = _scenario("missing_samples")
    steps = np.diff(sc.samples[sc.samples["gpu"] == 0]["ts_ns"].to_numpy())
    assert steps.min() == 20 * MS and steps.max() >= 60 * MS
    assert (steps > 20 * MS).mean() > 0.2


def test_cpu_timestamps_are_early_by_the_skew() -> None:
    sc = _scenario("cpu_timestamps")
    assert sc.marker_skew_ns == CPU_SKEW_NS <= 1 * MS
    np.testing.assert_allclose(sc.truth["idle_s"], 0.020, rtol=1e-12)
    np.testing.assert_allclose(sc.truth["dvfs_other_s"], sc.truth["dvfs_loss_s"], rtol=1e-12)


def test_no_flops_steps_have_unknown_ideal() -> None:
    sc = _scenario("no_flops")
    t = sc.truth
    unknown = t["step"] >= 3
    assert t.loc[unknown, ["ideal_s", "matrix_util_loss_s"]].isna().all().all()
    assert t.loc[~unknown, ["ideal_s", "matrix_util_loss_s"]].notna().all().all()
    flops = sc.markers.loc[(sc.markers["kind"] == "step_end") & (sc.markers["step"] >= 3), "flops"]
    assert flops.isna().any() and (flops == 0).any()
    assert (t["dvfs_current_s"] > 0).all()


@pytest.mark.slow
def test_big_run_of_a_thousand_ranks_builds() -> None:
    # How fast it builds is benchmarks/bench_attribution.py's to say (CI machines are shared).
    sc = big_run(1000, 100, 10.0)
    assert len(sc.truth) == 100_000 and len(sc.devices) == 1000
    assert len(sc.markers) == 1000 * 100 * 10


# --------------------------------------------------------------------------------------------
# The samples determine the truth (the module docstring's claim)
# --------------------------------------------------------------------------------------------


def _overlap_s(ts: np.ndarray, begin: int, end: int, first_period: int) -> np.ndarray:
    """Seconds of each sample interval ``(previous ts, ts]`` inside ``[begin, end]``."""
    starts = np.concatenate(([ts[0] - first_period], ts[:-1]))
    return np.clip(np.minimum(ts, end) - np.maximum(starts, begin), 0, None) / 1e9


def _counter_delta(ts: np.ndarray, counter: np.ndarray, begin: int, end: int) -> float:
    """Increase of a cumulative counter over ``[begin, end]``, linearly interpolated."""
    at = np.interp([float(begin), float(end)], ts.astype(np.float64), counter)
    return float(at[1] - at[0])


@pytest.mark.parametrize("name", NAMES)
def test_truth_is_recoverable_from_samples_and_markers(name: str) -> None:
    """A plain sampled estimate of I, f̄ and the residency split lands within tolerance_s(T).

    This is the least an attribution can do with these tables, so if it misses the truth, the
    scenario (not the attribution) is wrong.
    """
    sc = _scenario(name)
    truth = _truth_with_gpu(sc).set_index(["job", "rank", "step"])
    fmax = sc.devices.set_index(["node", "gpu"])["max_gfx_clock_mhz"]
    samples = {k: g for k, g in sc.samples.groupby(["node", "gpu"])}
    m = sc.markers
    begins = m[m["kind"] == "step_begin"].set_index(["job", "rank", "step"])
    ends = m[m["kind"] == "step_end"].set_index(["job", "rank", "step"])
    for key, row in truth.iterrows():
        g = samples[(row["node"], row["gpu"])]
        ts = g["ts_ns"].to_numpy()
        b, e = int(begins.loc[key, "ts_ns"]), int(ends.loc[key, "ts_ns"])
        period = int(np.diff(ts[:2])[0])
        w = _overlap_s(ts, b, e, period)
        t = (e - b) / 1e9
        busy_w = w * g["busy_ratio"].to_numpy()
        idle = t - busy_w.sum()
        tol = float(tolerance_s(row["step_time_s"]))
        assert abs(idle - row["idle_s"]) <= tol, (key, idle, row["idle_s"])
        x_rank = row["exposed_comm_s"] + row["straggler_wait_s"]
        fbar = float((busy_w * g["gfx_clock_mhz"].to_numpy()).sum() / busy_w.sum())
        dvfs = (t - idle - x_rank) * (1 - fbar / fmax[(row["node"], row["gpu"])])
        assert abs(dvfs - row["dvfs_loss_s"]) <= tol, (key, dvfs, row["dvfs_loss_s"])
        res = np.array([_counter_delta(ts, g[f"throttle_{c}_s"].to_numpy(), b, e) for c in THROTTLE_CAUSES])
        split = dvfs * res / res.sum() if res.sum() > 0 else np.zeros(4)
        expected = row[[f"dvfs_{c}_s" for c in THROTTLE_CAUSES]].to_numpy(dtype=float)
        assert np.abs(split - expected).max() <= tol, (key, split, expected)
