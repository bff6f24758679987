"""The report's figures: one pure function per figure (frames in, ``matplotlib.figure.Figure`` out).

Every figure is registered in ``FIGURES`` as a ``FigureSpec`` (``chopper.report.spec``) that names
its section, its title, a caption for the reader, the inputs it needs (``"run"``,
``"attribution"``, ``"traces"``, ``"cross_rank"``) and an adapter from ``ReportData`` to the pure
function. The report renders, in registry order, every spec whose inputs are present. This module
holds the figures of a recorded run; the scaling prediction (``chopper.report.predict_figures``)
and the trace figures (``chopper.report.trace_figures``) are appended to ``FIGURES`` here, so it
stays the one registry.

Figures are built on ``matplotlib.figure.Figure`` with an explicit Agg canvas, never through
``pyplot``: no GUI backend is ever selected, no global figure registry fills up, and a caller's
own matplotlib backend (a notebook's) is left alone.

Units on every axis: seconds of wall time since the first sample, milliseconds per step, MHz,
watts, °C, MFU as a percentage. Step numbers are the job's common clock: ranks are joined by
``(job, step)``, never by timestamps across nodes (DESIGN "Data model").
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from chopper.report import predict_figures, trace_figures
from chopper.report.spec import (
    ATTRIBUTION_SECTION,
    HARDWARE_SECTION,
    STRAGGLER_SECTION,
    FigureSpec,
    ReportData,
    new_figure,
    no_data,
)
from chopper.schema import THROTTLE_CAUSES

F64 = npt.NDArray[np.float64]

# Limits that keep a report of a large job readable and its SVG small; captions say what was cut.
MAX_RANKS_PER_STEP_PLOT = 16
MAX_RANKS_TOTALS = 64
MAX_GPUS = 16
MAX_POINTS = 800  # per GPU time series after binning: about two points per pixel of a panel
MAX_SCATTER = 3000  # per GPU
BARS_UP_TO_STEPS = 60  # more steps than this are drawn as a stacked area, not bars
THROTTLE_ACTIVE = 0.05  # a sample interval counts as throttled above this residency share
MAX_PHASES = 8  # phase names drawn per report, the longest in total; the table says the same
# Terms below 1 µs in every step are float rounding of the closure, not time: left out of legends.
NEGLIGIBLE_MS = 1e-3

# (column, legend label, colour): the stack from the bottom, in the model's order.
TERMS: tuple[tuple[str, str, str], ...] = (
    ("ideal_s", "ideal", "#2e7d32"),
    ("matrix_util_loss_s", "matrix-util loss", "#9ccc65"),
    ("dvfs_power_s", "DVFS power", "#ef6c00"),
    ("dvfs_thermal_s", "DVFS thermal", "#c62828"),
    ("dvfs_current_s", "DVFS current", "#8e24aa"),
    ("dvfs_other_s", "DVFS other", "#6d4c41"),
    ("dvfs_unattributed_s", "DVFS unattributed", "#d7ccc8"),
    ("exposed_comm_s", "exposed comm", "#1565c0"),
    ("straggler_wait_s", "straggler wait", "#fbc02d"),
    ("idle_s", "idle", "#90a4ae"),
)
# Where FLOPs are unknown, ideal + matrix-util loss are only known as their sum.
AT_CLOCK = ("compute_at_clock_s", "compute at clock (no FLOPs)", "#c5e1a5")
# Throttle shading uses the colour of the DVFS term of the same cause, so the two read together.
CAUSE_COLOURS: dict[str, str] = {c: colour for col, _, colour in TERMS for c in THROTTLE_CAUSES
                                 if col == f"dvfs_{c}_s"}


# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------

def rank_labels(steps: pd.DataFrame) -> pd.Series:
    """``rank N``, or ``JOB rank N`` when the frame holds several jobs (rank numbers repeat then)."""
    if steps["job"].nunique() > 1:
        return steps["job"].astype(str) + " rank " + steps["rank"].astype(str)
    return "rank " + steps["rank"].astype(str)


def compute_seconds(steps: pd.DataFrame) -> pd.Series:
    """Compute time K of each step, s: ``T − idle − exposed − straggler wait`` (DESIGN step 3)."""
    return steps["compute_at_clock_s"] + steps["dvfs_loss_s"]


def pick_ranks(steps: pd.DataFrame, limit: int) -> tuple[list[tuple[str, int]], int]:
    """The (job, rank) pairs to draw: all when at most ``limit``, else the ``limit`` slowest by mean compute.

    Returns:
        The chosen pairs in (job, rank) order, and the number of pairs in ``steps``.
    """
    mean_k = compute_seconds(steps).groupby([steps["job"], steps["rank"]]).mean()
    chosen = mean_k.sort_values(ascending=False).index[:limit] if len(mean_k) > limit else mean_k.index
    return sorted((str(j), int(r)) for j, r in chosen), len(mean_k)


def gpu_ranks(steps: pd.DataFrame | None) -> dict[tuple[str, int], str]:
    """``(node, gpu)`` → the rank label(s) that drive it, from the attributed steps."""
    if steps is None or steps.empty:
        return {}
    labelled = steps.assign(label=rank_labels(steps))[["node", "gpu", "label"]].drop_duplicates()
    out: dict[tuple[str, int], str] = {}
    for (node, gpu), rows in labelled.groupby(["node", "gpu"], sort=True):
        out[(str(node), int(gpu))] = ", ".join(sorted(rows["label"]))
    return out


def pick_gpus(samples: pd.DataFrame, limit: int,
              ranks: dict[tuple[str, int], str]) -> tuple[list[tuple[str, int]], int]:
    """GPUs to draw: those that drive a rank (all GPUs when no rank is known), the most throttled when cut.

    Returns:
        The chosen GPUs in (node, gpu) order, and how many there were to choose from.
    """
    gpus = sorted({(str(n), int(g)) for n, g in zip(samples["node"], samples["gpu"], strict=True)})
    if ranks:
        gpus = [g for g in gpus if g in ranks]
    if len(gpus) <= limit:
        return gpus, len(gpus)
    counters = [f"throttle_{c}_s" for c in THROTTLE_CAUSES]
    grouped = samples.groupby(["node", "gpu"])[counters]
    accrued = (grouped.max() - grouped.min()).sum(axis=1)
    order = sorted(gpus, key=lambda g: -float(accrued.get(g, 0.0)))
    return sorted(order[:limit]), len(gpus)


def gpu_title(gpu: tuple[str, int], ranks: dict[tuple[str, int], str]) -> str:
    label = f"{gpu[0]} gpu {gpu[1]}"
    return f"{ranks[gpu]} · {label}" if gpu in ranks else label


def _blocks(n: int, limit: int) -> npt.NDArray[np.int64]:
    """Start indices of consecutive blocks that cut ``n`` items into at most ``limit`` blocks."""
    size = max(1, math.ceil(n / limit))
    return np.arange(0, n, size, dtype=np.int64)


def gpu_series(one_gpu: pd.DataFrame, t0_ns: int, max_points: int = MAX_POINTS) -> pd.DataFrame:
    """One GPU's samples as time series for plotting, binned to at most ``max_points`` rows.

    Algorithm:

    1. Sort by ``ts_ns``; a sample at ``ts`` describes ``(previous ts, ts]`` (DESIGN "Samples").
    2. Throttle share per cause and interval = increase of ``throttle_<cause>_s`` / interval length
       (s/s, clipped to 0–1; the first sample has no interval and gets 0). A cumulative counter,
       not a flag, so residency inside an interval is counted even when the throttle came and went.
    3. When there are more samples than ``max_points``, consecutive samples are merged: clock,
       power, temperature and busy are time-weighted means of the merged intervals, throttle shares
       the summed residency over the merged duration.

    Args:
        one_gpu: Sample rows of one GPU.
        t0_ns: Time origin, ns; output times are seconds since it.
        max_points: Most rows returned.

    Returns:
        Columns ``t0_s, t1_s`` (interval, s), ``gfx_clock_mhz, power_w, temp_c, busy_ratio`` and
        ``throttle_<cause>`` (share 0–1) per cause.
    """
    rows = one_gpu.sort_values("ts_ns", kind="stable")
    ts = rows["ts_ns"].to_numpy(dtype=np.int64)
    t1 = (ts - t0_ns) / 1e9
    t0 = np.concatenate(([t1[0]], t1[:-1])) if len(t1) else t1
    dt = t1 - t0
    values = {c: rows[c].to_numpy(dtype=np.float64) for c in ("gfx_clock_mhz", "power_w", "temp_c", "busy_ratio")}
    residency = {}
    for cause in THROTTLE_CAUSES:
        counter = rows[f"throttle_{cause}_s"].to_numpy(dtype=np.float64)
        # NaN counters (a backend that cannot read them) give no residency, not a gap in the plot.
        delta = np.nan_to_num(np.diff(counter, prepend=counter[:1]), nan=0.0)
        residency[cause] = np.clip(delta, 0.0, None)
    if len(t1) > max_points:
        starts = _blocks(len(t1), max_points)
        ends = np.append(starts[1:], len(t1)) - 1
        weights = np.add.reduceat(dt, starts)
        for name, v in values.items():
            known = ~np.isnan(v)
            num = np.add.reduceat(np.where(known, v * dt, 0.0), starts)
            den = np.add.reduceat(np.where(known, dt, 0.0), starts)
            # A block of zero-length intervals (only the first sample) keeps its plain value.
            values[name] = np.where(den > 0, num / np.where(den > 0, den, 1.0), v[starts])
        residency = {c: np.add.reduceat(r, starts) for c, r in residency.items()}
        t0, t1, dt = t0[starts], t1[ends], weights
    out = pd.DataFrame({"t0_s": t0, "t1_s": t1, **values})
    for cause, r in residency.items():
        out[f"throttle_{cause}"] = np.clip(np.where(dt > 0, r / np.where(dt > 0, dt, 1.0), 0.0), 0.0, 1.0)
    return out


def throttle_spans(series: pd.DataFrame, cause: str, threshold: float = THROTTLE_ACTIVE) -> list[tuple[float, float]]:
    """Contiguous ``(start_s, end_s)`` spans where ``throttle_<cause>`` exceeds ``threshold`` (share 0–1)."""
    active = series[f"throttle_{cause}"].to_numpy() > threshold
    if not active.any():
        return []
    t0, t1 = series["t0_s"].to_numpy(), series["t1_s"].to_numpy()
    edges = np.diff(np.concatenate(([0], active.astype(np.int8), [0])))
    begins, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1
    return [(float(t0[b]), float(t1[e])) for b, e in zip(begins, ends, strict=True)]


def _shade_throttle(ax: Any, series: pd.DataFrame) -> None:
    for cause in THROTTLE_CAUSES:
        for b, e in throttle_spans(series, cause):
            ax.axvspan(b, e, color=CAUSE_COLOURS[cause], alpha=0.18, linewidth=0)


def _readable_ylim(ax: Any, values: F64) -> None:
    """Plain tick labels and a visible band for a flat series.

    A constant clock averaged over merged intervals differs from itself by float rounding; left to
    matplotlib, the axis zooms into that 1e-10 range and labels it with an offset ("1e-10+2.1e3").
    """
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")
    finite = values[np.isfinite(values)]
    if not finite.size:
        return
    lo, hi = float(finite.min()), float(finite.max())
    if hi - lo < max(1e-9, 1e-3 * abs(hi)):
        pad = max(0.05 * abs(hi), 1.0)
        ax.set_ylim(lo - pad, hi + pad)


def _cut_note(fig: Figure, shown: int, total: int, what: str = "ranks",
              how: str = "the slowest by mean compute time") -> None:
    """Say below the figure which subset is drawn (the top holds the legend)."""
    if shown < total:
        fig.supxlabel(f"{shown} of {total} {what} shown: {how}", fontsize="small")


def _stack_columns(steps: pd.DataFrame) -> list[tuple[str, str, str]]:
    """The stack to draw; compute-at-clock replaces ideal + matrix loss where FLOPs are unknown."""
    terms = list(TERMS)
    if steps["ideal_s"].isna().any():
        terms.insert(2, AT_CLOCK)
    return terms


def _stack_values(steps: pd.DataFrame, terms: list[tuple[str, str, str]]) -> dict[str, F64]:
    unknown = steps["ideal_s"].isna().to_numpy()
    out: dict[str, F64] = {}
    for col, _, _ in terms:
        v = steps[col].to_numpy(dtype=np.float64)
        if col == AT_CLOCK[0]:
            v = np.where(unknown, v, 0.0)
        out[col] = np.nan_to_num(v, nan=0.0) * 1e3
    return out


def _term_legend(fig: Figure, terms: list[tuple[str, str, str]], used: set[str]) -> None:
    handles = [Patch(color=colour, label=label) for col, label, colour in terms if col in used]
    fig.legend(handles=handles, loc="outside upper center", ncols=min(6, len(handles)), fontsize="small",
               frameon=False)


# --------------------------------------------------------------------------------------------
# Figures (pure: frames in, Figure out)
# --------------------------------------------------------------------------------------------

def attribution_by_step(steps: pd.DataFrame, max_ranks: int = MAX_RANKS_PER_STEP_PLOT) -> Figure:
    """Stacked step-time attribution per step, one panel per rank (ms per term).

    Each bar is one step of one rank; its height is the step time and its segments are the terms
    of DESIGN "The attribution model" (ideal, matrix-util loss, DVFS by cause, exposed comm,
    straggler wait, idle). Past ``BARS_UP_TO_STEPS`` steps the stack is drawn as an area.
    """
    chosen, total = pick_ranks(steps, max_ranks)
    terms = _stack_columns(steps)
    fig = new_figure(11, 1.0 + 1.7 * len(chosen))
    axes = fig.subplots(len(chosen), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    used: set[str] = set()
    labels = rank_labels(steps)
    for ax, (job, rank) in zip(axes, chosen, strict=True):
        mask = (steps["job"] == job) & (steps["rank"] == rank)
        rows = steps[mask].sort_values("step")
        x = rows["step"].to_numpy(dtype=np.float64)
        values = _stack_values(rows, terms)
        bottom = np.zeros(len(rows))
        bars = len(rows) <= BARS_UP_TO_STEPS
        for col, _label, colour in terms:
            v = values[col]
            if not (v > NEGLIGIBLE_MS).any():
                continue
            used.add(col)
            if bars:
                ax.bar(x, v, bottom=bottom, width=0.85, color=colour, linewidth=0)
            else:
                # Rasterized (axes and text stay vector): thousands of vector steps would bloat the page.
                ax.fill_between(x, bottom, bottom + v, color=colour, linewidth=0, step="mid", rasterized=True)
            bottom = bottom + v
        ax.set_ylabel(f"{labels[mask].iloc[0]}\nms", fontsize="small")
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    axes[-1].set_xlabel("step")
    _term_legend(fig, terms, used)
    _cut_note(fig, len(chosen), total)
    return fig


def attribution_by_rank(steps: pd.DataFrame, max_ranks: int = MAX_RANKS_TOTALS) -> Figure:
    """Mean step-time attribution per rank (ms per step, stacked horizontal bars), MFU at the bar end."""
    chosen, total = pick_ranks(steps, max_ranks)
    terms = _stack_columns(steps)
    fig = new_figure(11, 1.4 + 0.32 * len(chosen))
    ax = fig.add_subplot()
    labels = rank_labels(steps)
    used: set[str] = set()
    names, means, mfus = [], [], []
    for job, rank in chosen:
        mask = (steps["job"] == job) & (steps["rank"] == rank)
        rows = steps[mask]
        values = _stack_values(rows, terms)
        names.append(labels[mask].iloc[0])
        means.append({col: float(v.mean()) for col, v in values.items()})
        known = rows[rows["ideal_s"].notna()]
        mfus.append(known["ideal_s"].sum() / known["step_time_s"].sum() if len(known) else math.nan)
    y = np.arange(len(chosen))
    left = np.zeros(len(chosen))
    for col, _label, colour in terms:
        v = np.array([m[col] for m in means])
        if not (v > NEGLIGIBLE_MS).any():
            continue
        used.add(col)
        ax.barh(y, v, left=left, height=0.7, color=colour, linewidth=0)
        left = left + v
    for yi, (end, mfu) in enumerate(zip(left, mfus, strict=True)):
        if not math.isnan(mfu):
            ax.text(end, yi, f" MFU {100 * mfu:.1f}%", va="center", fontsize="small")
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlabel("mean time per step (ms)")
    ax.set_xlim(0, float(left.max()) * 1.15 if len(left) and left.max() > 0 else 1)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    _term_legend(fig, terms, used)
    _cut_note(fig, len(chosen), total)
    return fig


def mfu_by_step(steps: pd.DataFrame, max_ranks: int = MAX_RANKS_PER_STEP_PLOT) -> Figure:
    """MFU (%) of every rank per step, with the job's MFU (Σ ideal / Σ step time over ranks) as a thick line."""
    fig = new_figure(11, 3.6)
    known = steps[steps["mfu"].notna()]
    if known.empty:
        return no_data(fig, "MFU unknown: no step carried FLOPs, or the devices have no peak FLOP/s")
    ax = fig.add_subplot()
    chosen, total = pick_ranks(known, max_ranks)
    labels = rank_labels(known)
    for job, rank in chosen:
        mask = (known["job"] == job) & (known["rank"] == rank)
        rows = known[mask].sort_values("step")
        # Per-step markers only while they can be told apart (each is an SVG element).
        ax.plot(rows["step"], 100 * rows["mfu"], marker="o" if len(rows) <= BARS_UP_TO_STEPS else None,
                markersize=3, linewidth=1.2, label=labels[mask].iloc[0])
    for job, rows in known.groupby("job", sort=True):
        per_step = rows.groupby("step")[["ideal_s", "step_time_s"]].sum()
        ax.plot(per_step.index, 100 * per_step["ideal_s"] / per_step["step_time_s"], color="black",
                linewidth=2.5, alpha=0.6, label=f"job {job}" if known["job"].nunique() > 1 else "job")
    ax.set_xlabel("step")
    ax.set_ylabel("MFU (%)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    fig.legend(loc="outside right upper", fontsize="small", frameon=False)
    _cut_note(fig, len(chosen), total)
    return fig


def gpu_telemetry(samples: pd.DataFrame, devices: pd.DataFrame, steps: pd.DataFrame | None = None,
                  max_gpus: int = MAX_GPUS) -> Figure:
    """Clock (MHz), power (W) and temperature (°C) over time, one row per GPU, throttling shaded by cause.

    Dashed lines mark the device's max clock and power cap. A shaded span is a run of sample
    intervals whose throttle share (``gpu_series`` step 2) exceeds ``THROTTLE_ACTIVE``.
    """
    ranks = gpu_ranks(steps)
    gpus, total = pick_gpus(samples, max_gpus, ranks)
    fig = new_figure(12, 0.9 + 1.9 * max(1, len(gpus)))
    if not gpus:
        return no_data(fig, "no samples")
    t0_ns = int(samples["ts_ns"].min())
    axes = fig.subplots(len(gpus), 3, sharex=True, squeeze=False)
    dev = devices.set_index(["node", "gpu"])
    seen: set[str] = set()
    for row, gpu in zip(axes, gpus, strict=True):
        series = gpu_series(samples[(samples["node"] == gpu[0]) & (samples["gpu"] == gpu[1])], t0_ns)
        info = dev.loc[gpu] if gpu in dev.index else None
        for ax, (col, unit, colour, limit) in zip(row, (
            ("gfx_clock_mhz", "clock MHz", "#1565c0", "max_gfx_clock_mhz"),
            ("power_w", "power W", "#ef6c00", "power_cap_w"),
            ("temp_c", "temp °C", "#c62828", None),
        ), strict=True):
            _shade_throttle(ax, series)
            ax.step(series["t1_s"], series[col], where="pre", color=colour, linewidth=1.0)
            _readable_ylim(ax, series[col].to_numpy(dtype=np.float64))
            if limit is not None and info is not None and float(info[limit]) > 0:
                ax.axhline(float(info[limit]), color="black", linestyle="--", linewidth=0.8, alpha=0.6)
            ax.set_ylabel(unit, fontsize="small")
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize="small")
        row[0].set_title(gpu_title(gpu, ranks), fontsize="small", loc="left")
        seen |= {c for c in THROTTLE_CAUSES if throttle_spans(series, c)}
    for ax in axes[-1]:
        ax.set_xlabel("time since first sample (s)")
    handles = [Patch(color=CAUSE_COLOURS[c], alpha=0.35, label=f"{c} throttling") for c in THROTTLE_CAUSES
               if c in seen] or [Patch(color="white", label="no throttle residency in this run")]
    fig.legend(handles=handles, loc="outside upper center", ncols=len(handles), fontsize="small", frameon=False)
    _cut_note(fig, len(gpus), total, "GPUs", "the most throttled")
    return fig


def clock_vs_temperature(samples: pd.DataFrame, steps: pd.DataFrame | None = None,
                         max_gpus: int = MAX_GPUS, max_points: int = MAX_SCATTER) -> Figure:
    """Clock (MHz) against temperature (°C) per GPU, one point per sample interval, coloured by throttle cause.

    Only intervals in which the GPU was at least half busy are drawn: an idle GPU parks its clock
    low on purpose, which says nothing about throttling.
    """
    ranks = gpu_ranks(steps)
    gpus, total = pick_gpus(samples, max_gpus, ranks)
    cols = min(4, max(1, len(gpus)))
    nrows = max(1, math.ceil(len(gpus) / cols))
    fig = new_figure(12, 0.8 + 2.8 * nrows)
    if not gpus:
        return no_data(fig, "no samples")
    t0_ns = int(samples["ts_ns"].min())
    axes = fig.subplots(nrows, cols, sharex=True, sharey=True, squeeze=False).ravel()
    seen: set[str] = set()
    clocks: list[F64] = []
    for ax, gpu in zip(axes, gpus, strict=False):
        series = gpu_series(samples[(samples["node"] == gpu[0]) & (samples["gpu"] == gpu[1])], t0_ns, max_points)
        series = series[series["busy_ratio"] >= 0.5]
        shares = series[[f"throttle_{c}" for c in THROTTLE_CAUSES]].to_numpy()
        dominant = np.where(shares.max(axis=1) > THROTTLE_ACTIVE, shares.argmax(axis=1), -1) if len(series) \
            else np.zeros(0, dtype=np.int64)
        colours = np.array(["#1565c0", *(CAUSE_COLOURS[c] for c in THROTTLE_CAUSES)])[dominant + 1]
        clocks.append(series["gfx_clock_mhz"].to_numpy(dtype=np.float64))
        ax.scatter(series["temp_c"], series["gfx_clock_mhz"], c=colours, s=18, alpha=0.6, linewidths=0,
                   rasterized=True)  # one SVG element per point would make the page megabytes
        seen |= {THROTTLE_CAUSES[i] for i in set(dominant.tolist()) if i >= 0}
        ax.set_title(gpu_title(gpu, ranks), fontsize="small", loc="left")
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize="small")
    _readable_ylim(axes[0], np.concatenate(clocks))  # y is shared: one call sets every panel
    for ax in axes[len(gpus):]:
        ax.set_axis_off()
    for ax in axes[::cols]:
        ax.set_ylabel("clock (MHz)")
    for ax in axes[-cols:]:
        ax.set_xlabel("temperature (°C)")
    handles = [Patch(color="#1565c0", label="not throttled")] + [
        Patch(color=CAUSE_COLOURS[c], label=f"{c} throttling") for c in THROTTLE_CAUSES if c in seen]
    fig.legend(handles=handles, loc="outside upper center", ncols=len(handles), fontsize="small", frameon=False)
    _cut_note(fig, len(gpus), total, "GPUs", "the most throttled")
    return fig


def phase_long(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per (job, rank, step, phase) with its seconds, from the ``phase_s`` mappings."""
    rows = [(job, rank, step, name, seconds)
            for job, rank, step, times in zip(steps["job"], steps["rank"], steps["step"], steps["phase_s"],
                                              strict=True)
            for name, seconds in times.items()]
    return pd.DataFrame(rows, columns=["job", "rank", "step", "phase", "seconds"])


def top_phases(long: pd.DataFrame, limit: int = MAX_PHASES) -> list[str]:
    """The ``limit`` phase names with the most time over the run, longest first (ties by name)."""
    totals = long.groupby("phase")["seconds"].sum()
    return sorted(totals.index, key=lambda name: (-totals[name], name))[:limit]


def phase_change(steps: pd.DataFrame, limit: int = MAX_PHASES) -> pd.DataFrame:
    """Per (job, rank, phase): steps it ran in, median seconds, and the median of its first and last quarter.

    A quarter is ``max(1, n // 4)`` of the rank's steps in step order (steps without the phase
    count as 0 s, so a phase that starts late shows as growth). ``late_s − early_s`` is how the
    phase changed across the run: the phase that grew when steps got slower.
    """
    long = phase_long(steps)
    names = top_phases(long, limit)
    out = []
    for (job, rank), rows in steps.groupby(["job", "rank"], sort=True):
        order = rows.sort_values("step")
        quarter = max(1, len(order) // 4)
        for name in names:
            per_step = np.array([times.get(name, 0.0) for times in order["phase_s"]], dtype=np.float64)
            if not (per_step > 0).any():
                continue
            out.append((job, int(rank), name, int((per_step > 0).sum()), float(np.median(per_step)),
                        float(np.median(per_step[:quarter])), float(np.median(per_step[-quarter:]))))
    return pd.DataFrame(out, columns=["job", "rank", "phase", "steps", "median_s", "early_s", "late_s"])


def phase_times_by_step(steps: pd.DataFrame, max_ranks: int = MAX_RANKS_PER_STEP_PLOT,
                        max_phases: int = MAX_PHASES) -> Figure:
    """Milliseconds per step of each named phase, one panel per rank, one line per phase.

    A phase's time in a step is the union of its windows (``chopper.attribution.phases``), so
    nested phases each draw their own line and the lines need not add up to the step time, which
    is drawn in grey behind them.
    """
    long = phase_long(steps)
    fig = new_figure(11, 1.2)
    if long.empty:
        return no_data(fig, "no phases: mark them with chopper.phase(...) or chopper.pytorch.instrument")
    names = top_phases(long, max_phases)
    colours = {name: f"C{i}" for i, name in enumerate(names)}
    chosen, total = pick_ranks(steps, max_ranks)
    fig.set_size_inches(11, 1.0 + 1.7 * len(chosen))
    axes = fig.subplots(len(chosen), 1, sharex=True, squeeze=False)[:, 0]
    labels = rank_labels(steps)
    for ax, (job, rank) in zip(axes, chosen, strict=True):
        mask = (steps["job"] == job) & (steps["rank"] == rank)
        rows = steps[mask].sort_values("step")
        dots = "o" if len(rows) <= BARS_UP_TO_STEPS else None
        ax.plot(rows["step"], 1e3 * rows["step_time_s"], color="0.8", linewidth=2.5)
        for name in names:
            ms = 1e3 * np.array([times.get(name, np.nan) for times in rows["phase_s"]], dtype=np.float64)
            if np.isnan(ms).all():
                continue
            ax.plot(rows["step"], ms, color=colours[name], marker=dots, markersize=3, linewidth=1.2)
        ax.set_ylabel(f"{labels[mask].iloc[0]}\nms", fontsize="small")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    handles = [Patch(color="0.8", label="step time")] + [Patch(color=colours[n], label=n) for n in names]
    fig.legend(handles=handles, loc="outside upper center", ncols=min(6, len(handles)), fontsize="small",
               frameon=False)
    shown = long["phase"].nunique()
    if shown > len(names):
        fig.supxlabel(f"{len(names)} of {shown} phase names shown: the longest in total", fontsize="small")
    else:
        _cut_note(fig, len(chosen), total)
    return fig


def straggler_heatmaps(steps: pd.DataFrame, max_ranks: int = MAX_RANKS_TOTALS) -> Figure:
    """Two rank × step heatmaps: compute lead (ms, compute time minus the job's median at that step)
    and straggler wait (ms, time spent waiting in collectives for a late rank).

    A straggler is a red row on the left (it computes longer than the median) and the matching
    dark rows on the right are the ranks that waited for it.
    """
    chosen, total = pick_ranks(steps, max_ranks)
    data = steps.assign(label=rank_labels(steps), compute_s=compute_seconds(steps))
    data["lead_ms"] = 1e3 * (data["compute_s"] - data.groupby(["job", "step"])["compute_s"].transform("median"))
    data["wait_ms"] = 1e3 * data["straggler_wait_s"]
    keep = pd.MultiIndex.from_tuples(chosen, names=["job", "rank"])
    data = data[pd.MultiIndex.from_frame(data[["job", "rank"]].astype({"job": str})).isin(keep)]
    order = data.drop_duplicates(["job", "rank"]).sort_values(["job", "rank"])["label"].tolist()
    fig = new_figure(12, 1.6 + 0.3 * len(order))
    axes = fig.subplots(1, 2, sharey=True)
    for ax, col, title, cmap in ((axes[0], "lead_ms", "compute lead over job median (ms)", "RdBu_r"),
                                 (axes[1], "wait_ms", "straggler wait (ms)", "YlOrBr")):
        grid = data.pivot_table(index="label", columns="step", values=col, aggfunc="mean").reindex(order)
        values = grid.to_numpy(dtype=np.float64)
        finite = values[np.isfinite(values)]
        if col == "lead_ms":
            span = float(np.abs(finite).max()) if finite.size and np.abs(finite).max() > 0 else 1.0
            norm: Any = TwoSlopeNorm(vcenter=0.0, vmin=-span, vmax=span)
        else:
            norm = None
        steps_axis = grid.columns.to_numpy(dtype=np.float64)
        extent = (steps_axis.min() - 0.5, steps_axis.max() + 0.5, len(order) - 0.5, -0.5) if len(steps_axis) \
            else None
        image = ax.imshow(values, aspect="auto", cmap=cmap, norm=norm, interpolation="nearest", extent=extent)
        fig.colorbar(image, ax=ax, shrink=0.9, label="ms")
        ax.set_title(title, fontsize="small")
        ax.set_xlabel("step")
    axes[0].set_yticks(np.arange(len(order)), order, fontsize="small")
    _cut_note(fig, len(chosen), total)
    return fig


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

def _steps(data: ReportData) -> pd.DataFrame:
    assert data.attribution is not None
    return data.attribution.steps


def _samples(data: ReportData) -> pd.DataFrame:
    """Samples of the GPUs that drive the report's ranks (all GPUs when no rank drives one)."""
    assert data.run is not None
    samples = data.run.samples
    steps = data.attribution.steps if data.attribution is not None else None
    ranks = gpu_ranks(steps)
    if not ranks:
        return samples
    keys = pd.MultiIndex.from_tuples(list(ranks), names=["node", "gpu"])
    return samples[pd.MultiIndex.from_frame(samples[["node", "gpu"]]).isin(keys)]


FIGURES: list[FigureSpec] = [
    FigureSpec(
        "attribution-by-step", ATTRIBUTION_SECTION, "Where each step's time went, per rank",
        "Each bar is one step of one rank, its height the step time (ms), split into the terms of the attribution "
        "model: ideal time at peak FLOP/s, matrix-utilisation loss, DVFS loss by throttle cause, exposed "
        "communication, waiting for a straggler, and idle time. Panels share the y axis.",
        ("attribution",), lambda d: attribution_by_step(_steps(d)),
    ),
    FigureSpec(
        "attribution-by-rank", ATTRIBUTION_SECTION, "Mean step-time attribution per rank",
        "Mean milliseconds per step of every term, per rank; the label at the end of each bar is the rank's MFU "
        "(Σ ideal / Σ step time). A rank with DVFS loss where the others have straggler wait is the straggler.",
        ("attribution",), lambda d: attribution_by_rank(_steps(d)),
    ),
    FigureSpec(
        "mfu", ATTRIBUTION_SECTION, "MFU per step",
        "Model FLOPs utilisation per rank and step (%); the thick line is the job's MFU at each step. Steps are the "
        "time axis because ranks are joined by step, not by the clocks of different nodes.",
        ("attribution",), lambda d: mfu_by_step(_steps(d)),
    ),
    FigureSpec(
        "phase-times", ATTRIBUTION_SECTION, "Time per phase and step, per rank",
        "Milliseconds each named phase (forward, backward, optimizer and your own chopper.phase names) took in "
        "every step of a rank, with the step time in grey behind them: when a step got slower, the line that rose "
        "with it is the phase that grew. A phase's time is the union of its windows in the step, so nested phases "
        "each have a line and the lines need not add up to the step time.",
        ("attribution",), lambda d: phase_times_by_step(_steps(d)),
    ),
    FigureSpec(
        "gpu-telemetry", HARDWARE_SECTION, "Clock, power and temperature over time",
        "One row per GPU: graphics clock (MHz, dashed: max clock), board power (W, dashed: power cap) and "
        "hotspot temperature (°C). Shading marks sample intervals that accrued throttle residency, coloured by "
        "cause (increase of the cumulative throttle counters between samples). Time is seconds since the run's "
        "first sample; node clocks may differ slightly.",
        ("run",), lambda d: gpu_telemetry(_samples(d), d.run.devices if d.run is not None else pd.DataFrame(),
                                          d.attribution.steps if d.attribution is not None else None),
    ),
    FigureSpec(
        "clock-vs-temperature", HARDWARE_SECTION, "Clock against temperature",
        "One point per sample interval in which the GPU was at least half busy: clock (MHz) against temperature "
        "(°C), coloured by the throttle cause with the most residency in the interval. A thermally throttled GPU "
        "shows as a low-clock, high-temperature cluster.",
        ("run",), lambda d: clock_vs_temperature(_samples(d),
                                                 d.attribution.steps if d.attribution is not None else None),
    ),
    FigureSpec(
        "straggler-heatmaps", STRAGGLER_SECTION, "Compute lead and straggler wait, rank × step",
        "Left: each rank's compute time minus the job's median at that step (ms; red is slower than the median). "
        "Right: the time each rank waited in collectives for a late rank (ms, darker is longer). A red row on the "
        "left with dark rows on the right is a straggler and the ranks it held up.",
        ("attribution",), lambda d: straggler_heatmaps(_steps(d)),
    ),
    *predict_figures.PREDICT_FIGURES,
    *trace_figures.TRACE_FIGURES,
]
