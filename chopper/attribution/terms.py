"""Steps 1-5 of the attribution model for many step windows at once, on numpy arrays only.

What the live agent (``agent.steps``) and the offline account (``model.py``) share: the figures
of each step window from its GPU's samples (``window_figures``) and the per-rank terms and flag
conditions computed from them (``rank_terms``, ``flag_tuples``). No pandas here, so the agent
loads neither pandas nor pyarrow. Units: seconds, ns (windows relative to the timeline's base),
MHz, °C, J, 0-1 ratios.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from chopper.attribution import dvfs, exposed_comm, ideal, idle, matrix_util
from chopper.attribution.columns import DVFS_CAUSES, FLAGS, LINK_COLUMNS
from chopper.attribution.timeline import F64, GpuTimeline
from chopper.schema import THROTTLE_CAUSES

RATIOS = ("busy_ratio", "matrix_ratio", "gfx_clock_mhz", "temp_c")
# Link bytes are the summed NVLink / XGMI counters: per GPU, all links, not per link.
LINK_COUNTERS = LINK_COLUMNS
COUNTERS = ("energy_j", *(f"throttle_{c}_s" for c in THROTTLE_CAUSES), *LINK_COUNTERS)
# A step is "partially covered" when samples miss more than this share of its window.
COVERAGE_TOLERANCE = 1e-3


FIGURES = ("covered_ns", "busy_known_ns", "busy", "busy_clock", "busy_w", "clock", "matrix", "min_clock",
           "max_temp", "energy_j", *(f"res_{c}" for c in THROTTLE_CAUSES), *LINK_COUNTERS)


def window_figures(tl: GpuTimeline, b: F64, e: F64) -> dict[str, F64]:
    """What one GPU's samples say about each window ``[b, e]`` (ns relative to the timeline's base)."""
    num, den = tl.integrals(
        ((None, None), ("busy_ratio", None), ("gfx_clock_mhz", "busy_ratio"), ("gfx_clock_mhz", None),
         ("matrix_ratio", None)), b, e,
    )
    fig: dict[str, F64] = {
        "covered_ns": num[0], "busy": num[1], "busy_known_ns": den[1], "busy_clock": num[2], "busy_w": den[2],
        "clock": _ratio(num[3], den[3]), "matrix": _ratio(num[4], den[4]),
    }
    fig["min_clock"] = tl.extreme("gfx_clock_mhz", b, e, largest=False)
    fig["max_temp"] = tl.extreme("temp_c", b, e, largest=True)
    fig["energy_j"] = tl.counter_delta("energy_j", b, e)
    for c in THROTTLE_CAUSES:
        fig[f"res_{c}"] = tl.counter_delta(f"throttle_{c}_s", b, e)
    for c in LINK_COUNTERS:
        fig[c] = tl.counter_delta(c, b, e)
    return fig


def _ratio(num: F64, den: F64) -> F64:
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def rank_terms(
    step_s: F64, fig: dict[str, F64], exposed_s: F64, max_clock_mhz: F64, flops: F64, peak_flops: F64, tokens: F64
) -> dict[str, npt.NDArray[Any]]:
    """Steps 1-5 of the model for many steps at once: every per-rank column and flag condition.

    Args:
        step_s: Step times, s.
        fig: ``window_figures`` of each step's window.
        exposed_s: Uncapped exposed communication, s (``exposed_comm.exposed_seconds``).
        max_clock_mhz, flops, peak_flops, tokens: Per step; NaN where unknown.
    """
    busy = _ratio(fig["busy"], fig["busy_known_ns"])
    idle_s = idle.idle_seconds(step_s, busy)
    exposed, comm_capped = exposed_comm.cap_exposed(exposed_s, idle_s, step_s)
    compute_s = step_s - idle_s - exposed
    # Busy-weighted clock; a step the GPU idled through has no busy weight, so the plain mean.
    mean_clock = np.where(fig["busy_w"] > 0, _ratio(fig["busy_clock"], fig["busy_w"]), fig["clock"])
    # Differences of cumulative integrals can put the mean of equal clocks a few ulp above them.
    mean_clock = np.fmin(mean_clock, max_clock_mhz)
    ratio = dvfs.clock_ratio(mean_clock, max_clock_mhz)
    dvfs_s = dvfs.dvfs_loss(compute_s, ratio)
    by_cause = dvfs.split_by_cause(dvfs_s, {c: fig[f"res_{c}"] for c in THROTTLE_CAUSES})
    at_clock = compute_s * ratio
    util_s, ideal_s, over = matrix_util.matrix_util_loss(at_clock, ideal.ideal_seconds(flops, peak_flops))
    energy = fig["energy_j"]
    return {
        "step_time_s": step_s, "ideal_s": ideal_s, "matrix_util_loss_s": util_s, "compute_at_clock_s": at_clock,
        "dvfs_loss_s": dvfs_s, **{f"dvfs_{c}_s": by_cause[c] for c in DVFS_CAUSES},
        "exposed_comm_s": exposed, "straggler_wait_s": np.zeros(step_s.size), "idle_s": idle_s,
        "mfu": ideal.mfu(ideal_s, step_s), "busy_ratio": busy, "matrix_ratio": fig["matrix"],
        "mean_gfx_clock_mhz": mean_clock, "min_gfx_clock_mhz": fig["min_clock"], "max_temp_c": fig["max_temp"],
        "energy_j": energy, "flops": flops, "tokens": tokens,
        "tokens_per_s": _ratio(tokens, step_s), "tokens_per_j": _ratio(tokens, energy), "compute_s": compute_s,
        **{c: fig[c] for c in LINK_COUNTERS},
        # Flag conditions, named as in columns.FLAGS.
        "no_flops": ~(flops > 0), "no_peak": (flops > 0) & ~(peak_flops > 0), "ideal_exceeds_compute": over,
        "no_gpu": np.isnan(max_clock_mhz), "no_samples": ~(fig["busy_known_ns"] > 0),
        "partial_samples": (fig["covered_ns"] > 0) & (fig["covered_ns"] < step_s * 1e9 * (1 - COVERAGE_TOLERANCE)),
        "comm_capped": comm_capped,
    }


ROW_FLAGS = ("no_flops", "no_peak", "ideal_exceeds_compute", "no_gpu", "no_samples", "partial_samples", "comm_capped")


def flag_tuples(conditions: dict[str, npt.NDArray[Any]]) -> list[tuple[str, ...]]:
    """Per row, the names of the conditions that hold, in ``columns.FLAGS`` order."""
    names = [n for n in FLAGS if n in conditions]
    matrix = np.column_stack([conditions[n] for n in names])
    return [tuple(n for n, on in zip(names, row, strict=True) if on) for row in matrix]
