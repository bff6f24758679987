"""The check's figures: three MFUs of one loop from three sources, and what the counters saw.

- **FLOP-derived MFU** (independent of Chopper): ``steps · flops_per_step / (peak · seconds)``,
  with ``steps`` and ``seconds`` from the loop's own timer (``workload.timed_loop``) and the
  FLOPs from ``FlopCounterMode``.
- **Marker MFU** (Chopper's account): ``Σ ideal_s / Σ step_time_s`` over the attributed steps
  of the recorded run, i.e. the same FLOPs over the step windows that the markers delimit.
- **Counter-derived MFU**: ``Σ T · m · f̄/f_max / Σ T`` over the steps, with ``m`` the step's
  time-weighted matrix/tensor activity from the backend (NVML GPM ``ANY_TENSOR_UTIL`` on NVIDIA
  Hopper and newer; NaN where the backend has no such counter, e.g. AMD MI300 or NVIDIA GPUs
  without GPM) and ``f̄/f_max`` its busy-weighted clock over the maximum: a tensor pipe busy at
  clock ``f̄`` delivers at most ``peak · f̄/f_max``. It reads high when the pipes run below their
  dense BF16 rate while active, so it bounds the FLOP-derived MFU from above rather than equals it.

Throttle counters are the backend's cumulative residency seconds by cause, differenced between
the first and the last sample inside the loop's span; the DVFS loss is Chopper's attribution of
lost time to those causes. Pure functions of the recorded tables; seconds, MHz, watts, °C.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from chopper.attribution.columns import DVFS_CAUSES
from chopper.schema import THROTTLE_CAUSES


@dataclass(frozen=True)
class Figures:
    """Everything the check prints and writes to ``check.json``; NaN where unknown.

    Attributes:
        steps_attributed: Complete steps in the recorded run.
        step_time_s: Their total time.
        mfu_flops: FLOP-derived MFU (independent).
        mfu_markers: Chopper's marker-window MFU.
        mfu_counter: Counter-derived MFU.
        tensor_active_ratio: Step-time-weighted matrix/tensor activity, 0–1.
        mean_clock_mhz: Step-time-weighted busy-weighted graphics clock.
        min_clock_mhz: Lowest sampled clock in any step.
        max_clock_mhz: The device's maximum clock.
        max_temp_c: Hottest sample in any step.
        mean_power_w: Energy counter difference over its time span.
        throttle_s: Residency seconds accrued per cause (power, thermal, current, other).
        dvfs_s: Attributed DVFS loss per cause, seconds.
        split_s: The step-time account summed over steps: ideal, matrix_util_loss, dvfs, exposed_comm,
            straggler_wait, idle.
        flags: Step flags and how many steps carried each.
    """

    steps_attributed: int
    step_time_s: float
    mfu_flops: float
    mfu_markers: float
    mfu_counter: float
    tensor_active_ratio: float
    mean_clock_mhz: float
    min_clock_mhz: float
    max_clock_mhz: float
    max_temp_c: float
    mean_power_w: float
    throttle_s: dict[str, float]
    dvfs_s: dict[str, float]
    split_s: dict[str, float]
    flags: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


SPLIT_COLUMNS = ("ideal_s", "matrix_util_loss_s", "dvfs_loss_s", "exposed_comm_s", "straggler_wait_s", "idle_s")


def flop_mfu(steps: int, flops_per_step: float, seconds: float, peak_flops: float) -> float:
    """FLOPs done over FLOPs the device could have done in ``seconds`` at its peak."""
    if seconds <= 0 or not peak_flops > 0:
        return math.nan
    return steps * flops_per_step / (peak_flops * seconds)


def _weighted(values: pd.Series, weights: pd.Series) -> float:
    known = values.notna() & weights.notna()
    total = float(weights[known].sum())
    return float((values[known] * weights[known]).sum() / total) if total > 0 else math.nan


def _throttle(samples: pd.DataFrame, begin_ns: int, end_ns: int) -> tuple[dict[str, float], float]:
    """Residency seconds per cause and mean power between the first and last sample in ``[begin, end]``."""
    inside = samples[(samples["ts_ns"] >= begin_ns) & (samples["ts_ns"] <= end_ns)].sort_values("ts_ns")
    if len(inside) < 2:
        return dict.fromkeys(THROTTLE_CAUSES, math.nan), math.nan
    first, last = inside.iloc[0], inside.iloc[-1]
    throttle = {c: float(last[f"throttle_{c}_s"] - first[f"throttle_{c}_s"]) for c in THROTTLE_CAUSES}
    span_s = (int(last["ts_ns"]) - int(first["ts_ns"])) / 1e9
    power = float(last["energy_j"] - first["energy_j"]) / span_s
    return throttle, power


def compute(steps: pd.DataFrame, samples: pd.DataFrame, device: pd.Series, loop_steps: int,
            loop_seconds: float, flops_per_step: float) -> Figures:
    """Figures of one rank's attributed steps on one GPU.

    Args:
        steps: ``chopper.attribution`` step rows of the check's job (one rank, one GPU).
        samples: The recorded samples (every GPU of the node).
        device: The devices row of the GPU the steps ran on.
        loop_steps: Steps the loop counted in its timed window.
        loop_seconds: That window's length by the loop's own timer.
        flops_per_step: FLOPs of one step.
    """
    max_clock = float(device["max_gfx_clock_mhz"])
    t = steps["step_time_s"]
    total = float(t.sum())
    ideal = steps["ideal_s"]
    mfu_markers = float(ideal.sum() / t[ideal.notna()].sum()) if ideal.notna().any() else math.nan
    at_clock = steps["matrix_ratio"] * steps["mean_gfx_clock_mhz"] / max_clock
    mine = samples[(samples["node"] == device["node"]) & (samples["gpu"] == device["gpu"])]
    throttle, power = (_throttle(mine, int(steps["begin_ns"].min()), int(steps["end_ns"].max()))
                       if len(steps) else (dict.fromkeys(THROTTLE_CAUSES, math.nan), math.nan))
    flags: dict[str, int] = {}
    for row in steps["flags"]:
        for flag in row:
            flags[flag] = flags.get(flag, 0) + 1
    return Figures(
        steps_attributed=len(steps),
        step_time_s=total,
        mfu_flops=flop_mfu(loop_steps, flops_per_step, loop_seconds, float(device["peak_flops"])),
        mfu_markers=mfu_markers,
        mfu_counter=_weighted(at_clock, t),
        tensor_active_ratio=_weighted(steps["matrix_ratio"], t),
        mean_clock_mhz=_weighted(steps["mean_gfx_clock_mhz"], t),
        min_clock_mhz=float(steps["min_gfx_clock_mhz"].min()),  # NaN only when no step has a sample
        max_clock_mhz=max_clock,
        max_temp_c=float(steps["max_temp_c"].max()),
        mean_power_w=power,
        throttle_s=throttle,
        dvfs_s={c: float(steps[f"dvfs_{c}_s"].sum()) for c in DVFS_CAUSES},
        split_s={c.removesuffix("_s"): float(steps[c].sum()) for c in SPLIT_COLUMNS},
        flags=flags,
    )
