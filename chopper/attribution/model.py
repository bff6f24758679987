"""The attribution model of DESIGN.md, per rank and step, then at job level.

For one rank's step window ``[b, e]``, ``T = e − b``:

1. ``I`` idle (``idle.py``) from the time-weighted busy ratio.
2. ``X`` exposed communication (``exposed_comm.py``), capped so that ``I + X ≤ T``.
3. ``K = T − I − X`` compute time; ``D`` DVFS loss (``dvfs.py``) from the busy-weighted mean
   clock, split by throttle cause.
4. ``T_ideal`` (``ideal.py``) and ``U`` matrix-utilisation loss (``matrix_util.py``).
5. Closure ``T_ideal + U + D + X + I = T`` holds by construction on every step whose ideal time
   is known (``K`` is defined as the remainder, ``U`` as the remainder of ``K × f̄/f_max``).
6. Job level (``straggler.py``): straggler wait is moved out of ``X``; the slowest rank of each
   step is named with its evidence.

Beside the account, each step's phase times (``phases.py``): per phase name, the union of its
windows in the step.

Collectives come from the job's collective markers, else from the NCCL / RCCL Inspector's records
of the run's ``collectives`` table placed on the rank's steps (``markers.inspector_intervals``);
``collective_source.py`` is the rule, and ``X`` is computed from the collectives it chooses.

Inputs are the DESIGN tables (``chopper.runs.rundir.RecordedRun`` or the agent's buffers) as pandas
frames; marker kinds are lower-case labels. Per GPU, every step window on it is evaluated at once
(``timeline.GpuTimeline``), so a run costs a few numpy calls per GPU, not per step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from chopper.attribution import dvfs, exposed_comm, gpu_errors, ideal, idle, matrix_util, phases, straggler
from chopper.attribution.collective_source import SOURCE_LABELS, Intervals, step_collectives
from chopper.attribution.columns import (
    COLLECTIVE_COLUMNS,
    DVFS_CAUSES,
    FLAGS,
    HEALTH_COLUMNS,
    LINK_COLUMNS,
    STEP_COLUMNS,
)
from chopper.attribution.markers import STEP_KEY, inspector_intervals, marker_tables
from chopper.attribution.timeline import F64, GpuTimeline
from chopper.schema import THROTTLE_CAUSES

RATIOS = ("busy_ratio", "matrix_ratio", "gfx_clock_mhz", "temp_c")
# Link bytes are the summed NVLink / XGMI counters: per GPU, all links, not per link.
LINK_COUNTERS = LINK_COLUMNS
COUNTERS = ("energy_j", *(f"throttle_{c}_s" for c in THROTTLE_CAUSES), *LINK_COUNTERS)
# A step is "partially covered" when samples miss more than this share of its window.
COVERAGE_TOLERANCE = 1e-3


class AttributionError(ValueError):
    """The input cannot be attributed; the message names the problem and the fix."""


@dataclass
class Attribution:
    """Result of ``attribute``.

    Attributes:
        steps: One row per (job, rank, step) with ``columns.STEP_COLUMNS`` (and, from
            ``attribute``, ``columns.COLLECTIVE_COLUMNS``, ``columns.LINK_COLUMNS`` and
            ``columns.HEALTH_COLUMNS``).
        stragglers: The slowest rank of every multi-rank step with its evidence.
        problems: Markers that could not be used, one line per (job, rank) and kind.
    """

    steps: pd.DataFrame
    stragglers: pd.DataFrame
    problems: list[str] = field(default_factory=list)


def _timelines(samples: pd.DataFrame, base_ns: int) -> dict[tuple[str, int], GpuTimeline]:
    """One timeline per (node, gpu); raises on repeated timestamps or counters that go backwards."""
    out: dict[tuple[str, int], GpuTimeline] = {}
    ordered = samples.sort_values(["node", "gpu", "ts_ns"], kind="stable")
    for (node, gpu), rows in ordered.groupby(["node", "gpu"], sort=False):
        ts_ns = rows["ts_ns"].to_numpy(dtype=np.int64)
        repeated = np.flatnonzero(np.diff(ts_ns) <= 0)
        if repeated.size:
            raise AttributionError(
                f"samples of node {node!r} gpu {gpu}: {repeated.size} repeated timestamps (first ts_ns="
                f"{ts_ns[repeated[0]]}); each GPU has one sample per tick: remove duplicated rows"
            )
        counters = {c: rows[c].to_numpy(dtype=np.float64) for c in COUNTERS}
        for name, values in counters.items():
            known = values[~np.isnan(values)]
            back = np.flatnonzero(np.diff(known) < 0)
            if back.size:
                raise AttributionError(
                    f"samples of node {node!r} gpu {gpu}: cumulative counter {name} goes backwards "
                    f"({known[back[0]]:g} then {known[back[0] + 1]:g}); counters must not decrease: check that "
                    "the table was not reordered or mixed from several runs"
                )
        out[(str(node), int(gpu))] = GpuTimeline.build(
            (ts_ns - base_ns).astype(np.float64),
            {c: rows[c].to_numpy(dtype=np.float64) for c in RATIOS}, counters,
        )
    return out


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


def _gpu_figures(steps: pd.DataFrame, timelines: dict[tuple[str, int], GpuTimeline], base_ns: int) -> dict[str, F64]:
    """``window_figures`` of every step from its GPU's timeline (NaN where there is none)."""
    fig = {k: np.full(len(steps), np.nan) for k in FIGURES}
    b_all = (steps["begin_ns"].to_numpy(dtype=np.int64) - base_ns).astype(np.float64)
    e_all = (steps["end_ns"].to_numpy(dtype=np.int64) - base_ns).astype(np.float64)
    for (node, gpu), idx in steps.groupby(["node", "gpu"], sort=False).indices.items():
        tl = timelines.get((str(node), int(gpu)))
        if tl is None:
            continue
        for name, values in window_figures(tl, b_all[idx], e_all[idx]).items():
            fig[name][idx] = values
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


def attribute(
    devices: pd.DataFrame, samples: pd.DataFrame, markers: pd.DataFrame, job: str | None = None,
    collectives: pd.DataFrame | None = None, errors: pd.DataFrame | None = None,
) -> Attribution:
    """Attribute every step of every rank (module docstring, steps 1-6).

    Args:
        devices: DESIGN device rows (``max_gfx_clock_mhz``, ``peak_flops`` per node and GPU).
        samples: DESIGN sample rows.
        markers: DESIGN marker rows with lower-case kind labels.
        job: Only this job; all jobs when None.
        collectives: The run's Inspector collective records (``rundir.COLLECTIVE_COLUMNS``); None
            or empty: the markers' collectives only.
        errors: The run's health counters (``chopper.schema.ERROR_COLUMNS``); None or empty: no
            step is flagged ``gpu_errors``.

    Raises:
        AttributionError: Samples that contradict the data model (repeated timestamps, counters
            going backwards), or a job that has no steps.
    """
    if job is not None:
        markers = markers[markers["job"] == job]
        if markers.empty:
            raise AttributionError(f"job {job!r} has no markers in this run; check --job")
    if markers.empty:
        raise AttributionError("the run has no markers: record while a job marks steps (chopper.step() or "
                               "chopper.pytorch.instrument)")
    tables = marker_tables(markers)
    steps = tables.steps
    base_ns = int(min(markers["ts_ns"].min(), samples["ts_ns"].min() if len(samples) else markers["ts_ns"].min()))
    timelines = _timelines(samples, base_ns)
    dev = devices[["node", "gpu", "max_gfx_clock_mhz", "peak_flops"]].astype({"node": str, "gpu": np.int64})
    steps = steps.astype({"node": str}).merge(dev, on=["node", "gpu"], how="left")
    fig = _gpu_figures(steps, timelines, base_ns)
    unknown = steps[steps["max_gfx_clock_mhz"].isna() & (steps["gpu"] >= 0)]
    problems = list(tables.problems) + [
        f"job {job!r} rank {rank}: its markers name node {node!r} gpu {gpu}, which is not in the devices table; "
        "its steps have no GPU terms (flag no_gpu): record the devices of every node"
        for (job, rank, node, gpu), _ in unknown.groupby(["job", "rank", "node", "gpu"], sort=True)
    ]

    n = len(steps)
    step_s = (steps["end_ns"].to_numpy() - steps["begin_ns"].to_numpy()) / 1e9
    # Intervals are matched to step rows through the step key.
    key_index = pd.MultiIndex.from_frame(steps[STEP_KEY])
    iv = tables.intervals
    iv_step = key_index.get_indexer(pd.MultiIndex.from_frame(iv[STEP_KEY])) if len(iv) else np.zeros(0, np.int64)
    iv_step = iv_step.astype(np.int64)
    is_coll = iv["is_collective"].to_numpy(dtype=bool)
    iv_begin, iv_end = iv["begin_ns"].to_numpy(dtype=np.int64), iv["end_ns"].to_numpy(dtype=np.int64)
    phase = ~is_coll
    phase_s = phases.phase_seconds(n, iv_step[phase], iv["name"].to_numpy()[phase].tolist(),
                                   iv_begin[phase], iv_end[phase])
    inspector = inspector_intervals(steps, _job_records(collectives, job))
    problems += inspector.problems
    coll = step_collectives(
        n, Intervals(iv_step[is_coll], iv_begin[is_coll], iv_end[is_coll], iv["bytes"].to_numpy(np.float64)[is_coll]),
        inspector.intervals, Intervals.spans(iv_step[phase], iv_begin[phase], iv_end[phase]), inspector.has_feed,
    )
    terms = rank_terms(
        step_s, fig, coll["exposed_s"], steps["max_gfx_clock_mhz"].to_numpy(dtype=np.float64),
        steps["flops"].to_numpy(dtype=np.float64), steps["peak_flops"].to_numpy(dtype=np.float64),
        steps["tokens"].to_numpy(dtype=np.float64),
    )
    out = pd.DataFrame({
        **{k: steps[k] for k in ("job", "rank", "step", "node", "gpu", "begin_ns", "end_ns")},
        **{k: v for k, v in terms.items() if k not in ROW_FLAGS},
    })
    out["gpu_errors"] = gpu_errors.moved_kinds(out, errors)
    out = straggler.straggler_wait(out)
    slow = straggler.slowest_ranks(out)
    # A left merge leaves the slowest ranks' rows marked and the others NaN.
    slowest = out[STEP_KEY].merge(slow[STEP_KEY].assign(slowest=True), on=STEP_KEY, how="left")["slowest"]
    conditions = {k: terms[k] for k in ROW_FLAGS}
    conditions["slowest_rank"] = slowest.notna().to_numpy(dtype=bool)
    conditions["inspector_unplaced"] = inspector.unplaced
    conditions["gpu_errors"] = out["gpu_errors"].map(bool).to_numpy(dtype=bool)
    out["flags"] = flag_tuples(conditions) if n else []
    out["phase_s"] = phase_s
    out["collective_source"] = [SOURCE_LABELS[int(s)] for s in coll["source"]]
    out["collective_disagreement_s"] = coll["disagreement_s"]
    out["inspector_collectives"] = coll["inspector_count"]
    for name in ("collective_s", "collective_bytes", "inspector_collective_s", "inspector_bytes"):
        out[name] = coll[name]
    return Attribution(out[[*STEP_COLUMNS, *COLLECTIVE_COLUMNS, *LINK_COLUMNS, *HEALTH_COLUMNS]].reset_index(drop=True),
                       slow,
                       problems)


def _job_records(collectives: pd.DataFrame | None, job: str | None) -> pd.DataFrame:
    """The Inspector records that may belong to ``job``: its own and those the agent could not name a job for."""
    if collectives is None:
        return pd.DataFrame()
    return collectives if job is None else collectives[collectives["job"].isin((job, ""))]
