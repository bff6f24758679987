"""The demo's closing verdict: where the time went, which rank was slowest and why, in a few lines.

Everything comes from the offline attribution of the run the demo recorded
(``chopper.attribution.attribute_run``, the same as ``chopper attribute RUN``), nothing from the
scenario the demo set up, so the verdict is what the telemetry found:

1. Job shares: each term's seconds summed over every rank-step, over the summed step time, and
   DVFS loss split by cause the same way; MFU is ``Σ ideal / Σ step time``.
2. One line per rank: its busy-weighted clock (mean over its steps), hottest temperature, and the
   share of its step time lost to DVFS, by cause.
3. The slowest rank: the one named slowest (largest compute time) in the most steps, with the
   median of its clock and of the job's median clock over those steps, its hottest temperature,
   and the causes those steps were given (``chopper.attribution.straggler``).

Lines fit in 100 columns.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from chopper.attribution import Attribution
from chopper.attribution.columns import DVFS_CAUSES
from chopper.attribution.report import summary

TERMS = (("ideal", "ideal_s"), ("matrix", "matrix_util_loss_s"), ("DVFS", "dvfs_loss_s"),
         ("exposed comm", "exposed_comm_s"), ("straggler wait", "straggler_wait_s"), ("idle", "idle_s"))
# A cause below this share of the step time is left out of a line (it would read "power 0.0%").
SHOWN_SHARE = 0.005


def _pct(part: Any, whole: float) -> str:
    return f"{100 * (part or 0.0) / whole:.1f}%"


def _by_cause(totals: dict[str, Any], whole: float) -> str:
    """``thermal 25.1%, power 4.9%``: the DVFS causes of ``totals`` as shares of ``whole``, largest first."""
    causes = sorted(((totals[f"dvfs_{c}_s"] or 0.0, c) for c in DVFS_CAUSES), reverse=True)
    shown = [f"{c} {_pct(s, whole)}" for s, c in causes if s > SHOWN_SHARE * whole]
    return ", ".join(shown) or "none"


def job_lines(job: dict[str, Any], trainer_mfu: float | None = None) -> list[str]:
    """MFU and where the time went (module step 1), from one entry of ``summary()["jobs"]``."""
    total = job["step_time_s"] or 0.0
    if total <= 0:
        return [f"job {job['job']}: no step time recorded"]
    mfu = "unknown (the steps declared no FLOPs)" if job["mfu"] is None else f"{100 * job['mfu']:.1f}%"
    if trainer_mfu is not None and job["mfu"] is not None:
        mfu += f" (by the trainers' own clocks: {100 * trainer_mfu:.1f}%)"
    shares = [f"{name} {_pct(job[key], total)}" for name, key in TERMS]
    return [
        f"MFU {mfu}, {job['steps']} rank-steps",
        "where the time went: " + ", ".join(shares[:3]),
        f"  DVFS by cause: {_by_cause(job, total)}",
        "  " + ", ".join(shares[3:]),
    ]


def rank_lines(result: Attribution) -> list[str]:
    """One line per rank (module step 2)."""
    steps = result.steps
    lines = []
    for entry in summary(result)["ranks"]:
        total = entry["step_time_s"] or 0.0
        if total <= 0:
            lines.append(f"rank {entry['rank']}: no step time recorded")
            continue
        mine = steps[(steps["job"] == entry["job"]) & (steps["rank"] == entry["rank"])]
        gpus = ",".join(str(g) for g in sorted(mine["gpu"].unique()))
        lines.append(f"rank {entry['rank']}: gpu {gpus}, {mine['mean_gfx_clock_mhz'].mean():.0f} MHz, "
                     f"up to {mine['max_temp_c'].max():.0f} °C, DVFS {_pct(entry['dvfs_loss_s'], total)} of its "
                     f"time ({_by_cause(entry, total)})")
    return lines


def slowest_lines(stragglers: pd.DataFrame) -> list[str]:
    """Who was slowest and why (module step 3)."""
    if stragglers.empty:
        return ["slowest rank: none to name (a single rank, or no step that every rank reported)"]
    counts = stragglers["rank"].value_counts()
    rank = int(counts.index[0])
    mine = stragglers[stragglers["rank"] == rank]
    causes = mine["cause"].value_counts()
    cause = str(causes.index[0])
    why = ("its clock was not below the job's: the excess is not the hardware's (look at the host)"
           if cause == "none" else f"throttled for {cause}")
    steps_by_cause = ", ".join(f"{c} in {n}" for c, n in causes.items())
    gpus = ",".join(str(g) for g in sorted(mine["gpu"].unique()))
    return [
        f"slowest: rank {rank} in {counts.iloc[0]} of {len(stragglers)} steps, on gpu {gpus}: "
        f"{mine['mean_gfx_clock_mhz'].median():.0f} MHz",
        f"  against the job's median {mine['job_median_gfx_clock_mhz'].median():.0f} MHz, "
        f"up to {mine['max_temp_c'].max():.0f} °C, {why}",
        f"  (steps by cause: {steps_by_cause})",
    ]


def verdict_lines(result: Attribution, job: str, trainer_mfu: float | None = None) -> list[str]:
    """The whole verdict for ``job``; ``trainer_mfu`` is the MFU by the trainers' own clocks, if known."""
    jobs = [j for j in summary(result)["jobs"] if j["job"] == job]
    if not jobs:
        return [f"job {job}: no complete step was recorded"]
    return [*job_lines(jobs[0], trainer_mfu), *rank_lines(result), *slowest_lines(result.stragglers)]
