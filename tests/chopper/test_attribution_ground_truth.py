"""The attribution recovers every injected term of every ground-truth scenario.

Recovery: each term within ``tolerance_s(T) = max(2 ms, 1 % of T)`` of the truth, closure to 1e-9
relative on every step, through the same path a user takes (a recorded run directory on disk).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from chopper.attribution import attribute_run
from tests.support.attribution_scenarios import ALL_SCENARIOS, HOT_RANK, tolerance_s

TERMS = ("step_time_s", "ideal_s", "matrix_util_loss_s", "dvfs_loss_s", "dvfs_power_s", "dvfs_thermal_s",
         "dvfs_current_s", "dvfs_other_s", "dvfs_unattributed_s", "exposed_comm_s", "straggler_wait_s", "idle_s")


def recovered(name: str, tmp_path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    scenario = ALL_SCENARIOS[name]()
    result = attribute_run(scenario.write(tmp_path / name))
    assert not result.problems
    joined = scenario.truth.merge(result.steps, on=["job", "rank", "step"], suffixes=("_true", ""), validate="1:1")
    assert len(joined) == len(scenario.truth) == len(result.steps)
    return joined, result.stragglers


@pytest.mark.parametrize("name", sorted(ALL_SCENARIOS))
def test_every_term_recovered(name: str, tmp_path: Path) -> None:
    joined, _ = recovered(name, tmp_path)
    tol = tolerance_s(joined["step_time_s_true"].to_numpy())
    for term in TERMS:
        truth, got = joined[f"{term}_true"].to_numpy(), joined[term].to_numpy()
        assert np.array_equal(np.isnan(truth), np.isnan(got)), f"{name} {term}: unknown in one, known in the other"
        error = np.abs(np.nan_to_num(got - truth))
        assert (error <= tol).all(), f"{name} {term}: max error {error.max() * 1e3:.3f} ms, step {error.argmax()}"


@pytest.mark.parametrize("name", sorted(ALL_SCENARIOS))
def test_closure_on_every_step(name: str, tmp_path: Path) -> None:
    joined, _ = recovered(name, tmp_path)
    total = joined[["compute_at_clock_s", "dvfs_loss_s", "exposed_comm_s", "straggler_wait_s", "idle_s"]].sum(axis=1)
    assert np.allclose(total, joined["step_time_s"], rtol=1e-9, atol=0)
    known = joined[joined["ideal_s"].notna()]
    total = known[["ideal_s", "matrix_util_loss_s", "dvfs_loss_s", "exposed_comm_s", "straggler_wait_s",
                   "idle_s"]].sum(axis=1)
    assert np.allclose(total, known["step_time_s"], rtol=1e-9, atol=0)
    causes = joined[[f"dvfs_{c}_s" for c in ("power", "thermal", "current", "other", "unattributed")]].sum(axis=1)
    assert np.allclose(causes, joined["dvfs_loss_s"], rtol=1e-9, atol=1e-15)


def test_hot_straggler_is_named_with_thermal_evidence(tmp_path: Path) -> None:
    joined, stragglers = recovered("hot_straggler", tmp_path)
    assert (stragglers["rank"] == HOT_RANK).all() and (stragglers["cause"] == "thermal").all()
    assert (stragglers["mean_gfx_clock_mhz"] < stragglers["job_median_gfx_clock_mhz"]).all()
    assert (stragglers["compute_excess_s"] > 0.05).all()
    hot = joined[joined["rank"] == HOT_RANK]
    assert all("slowest_rank" in flags for flags in hot["flags"])


def test_no_flops_steps_are_flagged_not_guessed(tmp_path: Path) -> None:
    joined, _ = recovered("no_flops", tmp_path)
    missing = joined[joined["ideal_s_true"].isna()]
    assert len(missing) > 0
    assert missing["mfu"].isna().all() and missing["matrix_util_loss_s"].isna().all()
    assert all("no_flops" in flags for flags in missing["flags"])
    assert missing["dvfs_loss_s"].gt(0).all() and missing["idle_s"].notna().all()  # the rest still computed
