"""Job level: straggler wait, and the slowest rank of each step with its hardware evidence.

Ranks of a job are joined by ``(job, step)``, never by wall clock across nodes.

Algorithm, per ``(job, step)`` with at least two ranks:

1. ``W_r = X_r − min over ranks of X`` is straggler wait: time rank ``r`` sat in collectives
   beyond what the least-waiting rank did, because another rank arrived late. It is moved out of
   ``X_r`` (so ``exposed_comm_s`` becomes the minimum and ``straggler_wait_s`` is ``W_r``).
2. The slowest rank is the one with the largest compute time ``K`` (ranks whose ``K`` is unknown
   are left out of the comparison); its excess over the median
   ``K`` of the job at that step is reported with its evidence: busy-weighted mean clock against
   the job's median clock, maximum temperature, and the throttle cause with the most DVFS loss.
   It is a *thermal/power/current straggler* when its clock was below the job's median and that
   cause accrued residency, an ``unattributed`` one when its clock was low with no residency, and
   ``none`` when its clock was not low: then the excess is not the hardware's (look at the host,
   the data loader or the kernels). Where the steps carry ``gpu_errors`` (the kinds of the GPU's
   health counters that moved during the step, ``gpu_errors.py``), the evidence names them: a GPU
   correcting a burst of ECC errors, replaying PCIe or NVLink packets is the first suspect.

Seconds in, seconds out; pandas in, pandas out.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from chopper.schema import THROTTLE_CAUSES

JOIN = ["job", "step"]


def straggler_wait(steps: pd.DataFrame) -> pd.DataFrame:
    """Return ``steps`` with ``straggler_wait_s`` set and ``exposed_comm_s`` reduced by it."""
    out = steps.copy()
    least = out.groupby(JOIN, sort=False)["exposed_comm_s"].transform("min")
    out["straggler_wait_s"] = out["exposed_comm_s"] - least
    out["exposed_comm_s"] = least
    return out


def slowest_ranks(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per multi-rank ``(job, step)``: the slowest rank and its evidence (module step 2)."""
    columns = ["job", "step", "rank", "node", "gpu", "compute_s", "compute_excess_s", "mean_gfx_clock_mhz",
               "job_median_gfx_clock_mhz", "max_temp_c", "cause", *(["gpu_errors"] if "gpu_errors" in steps else [])]
    steps = steps[steps["compute_s"].notna()]  # a rank whose compute is unknown cannot be compared
    grouped = steps.groupby(JOIN, sort=True)
    size = grouped["rank"].transform("size")
    multi = steps[size > 1]
    if multi.empty:
        return pd.DataFrame(columns=columns)
    grouped = multi.groupby(JOIN, sort=True)
    slowest = multi.loc[grouped["compute_s"].idxmax()].copy()
    keyed = slowest.set_index(JOIN)
    median_compute = grouped["compute_s"].median().reindex(keyed.index).to_numpy()
    median_clock = grouped["mean_gfx_clock_mhz"].median().reindex(keyed.index).to_numpy()
    slowest["compute_excess_s"] = slowest["compute_s"].to_numpy() - median_compute
    slowest["job_median_gfx_clock_mhz"] = median_clock
    by_cause = slowest[[f"dvfs_{c}_s" for c in (*THROTTLE_CAUSES, "unattributed")]].to_numpy()
    names = np.array([*THROTTLE_CAUSES, "unattributed"])
    clock_low = slowest["mean_gfx_clock_mhz"].to_numpy() < median_clock
    slowest["cause"] = np.where(clock_low & (by_cause.max(axis=1) > 0), names[by_cause.argmax(axis=1)], "none")
    return slowest[columns].reset_index(drop=True)
