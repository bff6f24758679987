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

Steps 1-5 are ``terms.py`` (numpy only, shared with the live agent); this module builds their
inputs from the tables and adds step 6.

Inputs are the DESIGN tables (``chopper.runs.rundir.RecordedRun`` or the agent's buffers) as pandas
frames; marker kinds are lower-case labels. Per GPU, every step window on it is evaluated at once
(``timeline.GpuTimeline``), so a run costs a few numpy calls per GPU, not per step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from chopper.attribution import gpu_errors, phases, straggler
from chopper.attribution.collective_source import SOURCE_LABELS, Intervals, step_collectives
from chopper.attribution.columns import COLLECTIVE_COLUMNS, HEALTH_COLUMNS, LINK_COLUMNS, STEP_COLUMNS
from chopper.attribution.markers import STEP_KEY, inspector_intervals, marker_tables
from chopper.attribution.terms import (
    COUNTERS,
    FIGURES,
    RATIOS,
    ROW_FLAGS,
    flag_tuples,
    rank_terms,
    window_figures,
)
from chopper.attribution.timeline import F64, GpuTimeline


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
