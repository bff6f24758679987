"""The report's trace figures: one pure function per figure (analysis frames in, Figure out).

The frames come from ``chopper.report.traces.analyze_traces`` (every analysis run once); each
function here only draws. Registered in ``TRACE_FIGURES`` with ``needs=("traces",)`` (or
``("cross_rank",)`` where two ranks are needed), which ``figures.FIGURES`` appends to its list.

Units: µs on every time axis, as ``chopper trace`` and Holistic Trace Analysis print them (tick
labels with thousands separators); shares in %. Ranks are never aligned by timestamp: traces of
different nodes do not share a clock.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from chopper.report.spec import (
    CROSS_SECTION,
    HOST_SECTION,
    KERNEL_SECTION,
    FigureSpec,
    ReportData,
    new_figure,
    no_data,
)

if TYPE_CHECKING:
    from chopper.report.traces import TraceSet

MAX_TRACE_RANKS = 64  # bars per rank
MAX_LINE_RANKS = 16  # lines (CDF) per figure
MAX_PANEL_RANKS = 4  # one panel per rank up to this many (top kernels), all ranks summed beyond
MAX_ITERATION_PANELS = 8
MAX_SPAN_LABELS = 16  # iterations per panel whose span and idle share are written above the bar
TOP_N = 15
MAX_LEAD_OPS = 20
NAME_CHARS = 72

IDLE, COMPUTE, NON_COMPUTE = "#90a4ae", "#2e7d32", "#1565c0"
MEMORY_COLOUR = "#ef6c00"
# Exclusive kernel-class combinations (HTA's names): one colour each, mixtures between their parts.
COMBINATION_COLOURS: dict[str, str] = {
    "COMPUTATION": COMPUTE,
    "COMMUNICATION": NON_COMPUTE,
    "MEMORY": MEMORY_COLOUR,
    "COMPUTATION overlapping COMMUNICATION": "#00897b",
    "COMPUTATION overlapping MEMORY": "#9ccc65",
    "COMMUNICATION overlapping MEMORY": "#8e24aa",
    "COMPUTATION overlapping COMMUNICATION overlapping MEMORY": "#6d4c41",
}
CLASS_COLOURS: dict[str, str] = {"COMPUTATION": COMPUTE, "COMMUNICATION": NON_COMPUTE, "MEMORY": MEMORY_COLOUR}
CPU_LATE, TO_START = "#c62828", "#5c6bc0"
US_FORMAT = FuncFormatter(lambda v, _pos: f"{v:,.0f}")


def clip_name(name: str, limit: int = NAME_CHARS) -> str:
    """``name`` cut to ``limit`` characters with an ellipsis in the middle.

    The middle goes because both ends tell kernels apart: the namespace and family at the start,
    the variant (``…_cta_per_row_1`` vs ``…_warp_per_row_1``, ``…Backward0``) at the end.
    """
    if len(name) <= limit:
        return name
    head = (limit - 1) // 2
    return name[:head] + "…" + name[len(name) - (limit - 1 - head):]


def _template_arguments(name: str) -> list[str]:
    """The top-level template arguments of a C++ kernel name (``[]`` when it has none)."""
    start = name.find("<")
    if start < 0:
        return []
    depth = 0
    args: list[str] = []
    cur: list[str] = []
    for ch in name[start + 1:]:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            if depth == 0:
                break
            depth -= 1
        elif ch == "," and depth == 0:
            args.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    return [*args, "".join(cur).strip()]


def _variant(name: str) -> str:
    """What tells apart kernels of one template: its first non-numeric template argument, shortened.

    ``vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, …>`` → ``CUDAFunctor_add``;
    ``cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x64_32x6_nt_align1>`` → the configuration.
    """
    from chopper.trace.analyses.top_kernels import short_name

    for arg in _template_arguments(name):
        if arg and not _NUMERIC.match(arg):
            return short_name(arg, limit=10_000).split("::")[-1]
    return ""


_NUMERIC = re.compile(r"^(?:-?\d+[uUlL]*|true|false)$")


def kernel_labels(names: list[str], limit: int = NAME_CHARS) -> list[str]:
    """Display names for a list of kernels, distinct where the kernels are.

    Algorithm:
        1. Shorten with ``top_kernels.short_name`` (no return type, anonymous namespace, template or
           parameter list).
        2. Where different kernels would share a label (``cutlass::Kernel`` wraps every CUTLASS
           GEMM; ``vectorized_elementwise_kernel`` every elementwise op), append the variant: the
           first non-numeric template argument, shortened (:func:`_variant`).
        3. Number what still collides (``#2``, ``#3``), so distinct kernels never read as one.
        4. Cut to ``limit`` characters in the middle (:func:`clip_name`).
    """
    from chopper.trace.analyses.top_kernels import short_name

    plain = list(names)
    base = [short_name(n, limit=10_000) for n in plain]
    counts = Counter(base)
    labels = [f"{b}<{v}>" if counts[b] > 1 and (v := _variant(n)) else b for n, b in zip(plain, base, strict=True)]
    counts, seen = Counter(labels), Counter[str]()
    out = []
    for label in labels:
        seen[label] += 1
        suffix = f" #{seen[label]}" if counts[label] > 1 else ""
        out.append(clip_name(label, limit - len(suffix)) + suffix)
    return out


def pick_trace_ranks(value: pd.Series, limit: int) -> tuple[list[int], int]:
    """Ranks to draw: all when at most ``limit``, else the ``limit`` with the largest ``value``.

    Args:
        value: Indexed by rank; the larger, the more worth showing (idle time, lead).
        limit: Most ranks drawn.

    Returns:
        The chosen ranks in rank order, and how many there were.
    """
    chosen = value.sort_values(ascending=False, kind="stable").index[:limit] if len(value) > limit else value.index
    return sorted(int(r) for r in chosen), len(value)


def _cut_note(fig: Figure, shown: int, total: int, how: str) -> None:
    if shown < total:
        fig.supxlabel(f"{shown} of {total} ranks shown: {how}", fontsize="small")


def _rank_bars(fig: Figure, ranks: list[int], stack: list[tuple[str, str, np.ndarray]], xlabel: str,
               annotate_pct: bool = True, legend_right: bool = False) -> Any:
    """Horizontal stacked bars, one per rank, with each segment's share of the bar written in it when wide."""
    ax = fig.add_subplot()
    y = np.arange(len(ranks))
    left = np.zeros(len(ranks))
    totals = np.sum([v for _, _, v in stack], axis=0) if stack else left
    for label, colour, v in stack:
        ax.barh(y, v, left=left, height=0.7, color=colour, linewidth=0, label=label)
        if annotate_pct:
            for yi, (lo, w, tot) in enumerate(zip(left, v, totals, strict=True)):
                # Only where the text fits inside the segment (about 6 % of the widest bar).
                if tot > 0 and w > 0.06 * totals.max():
                    ax.text(lo + w / 2, yi, f"{100 * w / tot:.1f}%", ha="center", va="center", fontsize="small",
                            color="white")
        left = left + v
    ax.set_yticks(y, [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.xaxis.set_major_formatter(US_FORMAT)
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    if legend_right:  # long labels (HTA's combination names) do not fit side by side above the plot
        fig.legend(loc="outside right upper", fontsize="small", frameon=False)
    else:
        fig.legend(loc="outside upper center", ncols=min(4, max(1, len(stack))), fontsize="small", frameon=False)
    return ax


# --------------------------------------------------------------------------------------------
# Figures (pure: frames in, Figure out)
# --------------------------------------------------------------------------------------------

def temporal_breakdown(temporal: pd.DataFrame, max_ranks: int = MAX_TRACE_RANKS) -> Figure:
    """HTA temporal breakdown per rank: idle, compute and non-compute time (µs), stacked to the kernel span.

    Args:
        temporal: ``rank``, ``idle_time_us``, ``compute_time_us``, ``non_compute_time_us``.
        max_ranks: Most ranks drawn (the most idle when cut).
    """
    ranks, total = pick_trace_ranks(temporal.set_index("rank")["idle_time_us"], max_ranks)
    rows = temporal.set_index("rank").loc[ranks]
    fig = new_figure(11, 1.5 + 0.45 * len(ranks))
    _rank_bars(fig, ranks, [
        ("compute", COMPUTE, rows["compute_time_us"].to_numpy(np.float64)),
        ("non-compute (communication, memory, syncs not under compute)", NON_COMPUTE,
         rows["non_compute_time_us"].to_numpy(np.float64)),
        ("idle", IDLE, rows["idle_time_us"].to_numpy(np.float64)),
    ], "µs of the kernel span (first kernel start to last kernel end, all streams)")
    _cut_note(fig, len(ranks), total, "the most idle")
    return fig


def kernel_type_breakdown(kernel_types: pd.DataFrame, max_ranks: int = MAX_TRACE_RANKS) -> Figure:
    """Time of each exclusive combination of kernel classes per rank (µs, stacked; % of kernel time in bars).

    Args:
        kernel_types: ``rank``, ``kernel_type``, ``time_us``.
        max_ranks: Most ranks drawn (those with the most kernel time when cut).
    """
    grid = kernel_types.pivot_table(index="rank", columns="kernel_type", values="time_us", aggfunc="sum",
                                    fill_value=0.0)
    ranks, total = pick_trace_ranks(grid.sum(axis=1), max_ranks)
    order = [c for c in COMBINATION_COLOURS if c in grid.columns]
    order += sorted(c for c in grid.columns if c not in COMBINATION_COLOURS)
    fig = new_figure(11, 1.6 + 0.45 * len(ranks))
    _rank_bars(fig, ranks, [(c, COMBINATION_COLOURS.get(c, "#bdbdbd"), grid.loc[ranks, c].to_numpy(np.float64))
                            for c in order], "µs during which exactly this combination of kernel classes ran",
               legend_right=True)
    _cut_note(fig, len(ranks), total, "the most kernel time")
    return fig


def top_kernels_figure(top: pd.DataFrame, n: int = TOP_N, max_panels: int = MAX_PANEL_RANKS) -> Figure:
    """The ``n`` kernels with the most GPU time (µs), labelled with their share of all kernel time (%).

    One panel per rank up to ``max_panels`` ranks; beyond, one panel of all ranks summed. Bars
    are coloured by HTA class; names are shortened (:func:`kernel_labels`).

    Args:
        top: ``rank``, ``name``, ``kernel_class``, ``count``, ``total_us``.
        n: Kernels per panel.
        max_panels: Most per-rank panels.
    """
    ranks = sorted(top["rank"].unique().tolist())
    if len(ranks) <= max_panels:
        groups = [(f"rank {r}", top[top["rank"] == r]) for r in ranks]
    else:
        groups = [(f"all {len(ranks)} ranks", top)]
    fig = new_figure(12, 0.8 + (0.6 + 0.27 * n) * len(groups))
    axes = fig.subplots(len(groups), 1, squeeze=False)[:, 0]
    for ax, (title, rows) in zip(axes, groups, strict=True):
        g = rows.groupby("name", sort=False).agg(cls=("kernel_class", "first"), count=("count", "sum"),
                                                 total_us=("total_us", "sum"))
        all_us = float(g["total_us"].sum())
        g = g.sort_values("total_us", ascending=False, kind="stable").head(n)
        y = np.arange(len(g))
        ax.barh(y, g["total_us"], color=[CLASS_COLOURS.get(c, "#bdbdbd") for c in g["cls"]], height=0.7)
        for yi, (us, cnt) in enumerate(zip(g["total_us"], g["count"], strict=True)):
            ax.text(us, yi, f" {100 * us / all_us:.1f}% · {cnt}×", va="center", fontsize="small")
        ax.set_yticks(y, kernel_labels([str(x) for x in g.index]), fontsize="small")
        ax.invert_yaxis()
        ax.set_xlim(0, float(g["total_us"].max()) * 1.22 if len(g) else 1.0)
        ax.xaxis.set_major_formatter(US_FORMAT)
        ax.set_title(title, fontsize="small", loc="left")
        ax.grid(axis="x", alpha=0.3)
        ax.set_axisbelow(True)
    axes[-1].set_xlabel("total GPU time (µs, summed over launches)")
    present = set(top["kernel_class"])
    fig.legend(handles=[Patch(color=c, label=k.lower()) for k, c in CLASS_COLOURS.items() if k in present],
               loc="outside upper center", ncols=3, fontsize="small", frameon=False)
    return fig


def overlap_cdf(comm_overlap: pd.DataFrame, overlap_pct: dict[int, float | None],
                max_ranks: int = MAX_LINE_RANKS) -> Figure:
    """Distribution over communication kernels of the share of each kernel's time overlapped by computation.

    For each rank, a step CDF: the y value at x is the % of that rank's communication kernels
    (HTA's selection) of which at most x % of the duration ran while a computation kernel ran on
    any stream (``traces.comm_overlap_fractions``). A curve hugging the left edge means
    communication is exposed; one reaching 100 % only at the right means it is hidden.

    Args:
        comm_overlap: ``rank``, ``fraction`` (0–1), one row per communication kernel.
        overlap_pct: HTA's duration-weighted overlap % per rank, shown in the legend.
        max_ranks: Most curves (the least overlapped when cut).
    """
    if comm_overlap.empty:
        return no_data(new_figure(11, 1.2), "no communication kernels in these traces: nothing to overlap")
    fig = new_figure(11, 4.2)
    mean = comm_overlap.groupby("rank")["fraction"].mean()
    ranks, total = pick_trace_ranks(-mean, max_ranks)
    ax = fig.add_subplot()
    for r in ranks:
        f = np.sort(comm_overlap.loc[comm_overlap["rank"] == r, "fraction"].to_numpy(np.float64))
        x = np.concatenate(([0.0], 100 * f, [100.0]))
        y = np.concatenate(([0.0], 100 * np.arange(1, len(f) + 1) / len(f), [100.0]))
        pct = overlap_pct.get(r)
        hta = "–" if pct is None or math.isnan(pct) else f"{pct:.1f}%"
        ax.step(x, y, where="post", linewidth=1.6, label=f"rank {r}: {len(f)} kernels, HTA overlap {hta}")
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 102)
    ax.set_xlabel("% of the communication kernel's duration overlapped by computation")
    ax.set_ylabel("% of communication kernels (cumulative)")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside right upper", fontsize="small", frameon=False)
    _cut_note(fig, len(ranks), total, "the least overlapped")
    return fig


def launch_overhead(by_op: pd.DataFrame, n: int = TOP_N) -> Figure:
    """CPU ops whose kernels wait longest after their launch call: per-kernel launch delay (µs),
    median as the bar and 95th percentile as the whisker, over the op's kernels on all ranks.

    Args:
        by_op: ``rank`` + ``launch.BY_OP_COLUMNS``.
        n: Operations drawn (the largest p95).
    """
    fig = new_figure(12, 1.4 + 0.3 * n)
    if by_op.empty:
        return no_data(fig, "no kernel could be linked to its launch (no correlation ids)")
    # Across ranks, a kernel-weighted median of medians would invent a distribution; the largest rank's
    # figures are shown instead, so every bar is one real distribution.
    g = by_op.sort_values(["launch_delay_p95_us", "kernels"], ascending=False, kind="stable")
    g = g.drop_duplicates("cpu_op").head(n)
    ax = fig.add_subplot()
    y = np.arange(len(g))
    med, p95 = g["launch_delay_median_us"].to_numpy(np.float64), g["launch_delay_p95_us"].to_numpy(np.float64)
    ax.barh(y, med, height=0.7, color=TO_START, label="median launch delay (kernel start − end of its launch call)")
    ax.errorbar(p95, y, xerr=[p95 - med, np.zeros(len(g))], fmt="|", color="black", markersize=10,
                label="95th percentile")
    for yi, (top, cnt, late, r) in enumerate(zip(p95, g["kernels"], g["cpu_late_kernels"], g["rank"], strict=True)):
        ax.text(top, yi, f" rank {r}: {cnt} kernel{'s' if cnt != 1 else ''}, {late} CPU-late", va="center",
                fontsize="small")
    ax.set_yticks(y, [clip_name(str(s)) for s in g["cpu_op"]], fontsize="small")
    ax.invert_yaxis()
    ax.set_xlim(0, float(p95.max()) * 1.4 if len(g) and p95.max() > 0 else 1.0)
    ax.xaxis.set_major_formatter(US_FORMAT)
    ax.set_xlabel("launch delay per kernel (µs)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    fig.legend(loc="outside upper center", ncols=2, fontsize="small", frameon=False)
    return fig


def idle_split(split: pd.DataFrame, max_ranks: int = MAX_TRACE_RANKS) -> Figure:
    """GPU idle time per rank (µs) split into host-wait, kernel-wait and unattributed.

    Args:
        split: ``rank``, ``host_wait_us``, ``kernel_wait_us``, ``unattributed_us``, ``idle_us``.
        max_ranks: Most ranks drawn (the most idle when cut).
    """
    ranks, total = pick_trace_ranks(split.set_index("rank")["idle_us"], max_ranks)
    rows = split.set_index("rank").loc[ranks]
    fig = new_figure(11, 1.5 + 0.45 * len(ranks))
    stack = [("host-wait: the GPU waited for the host to launch", CPU_LATE,
              rows["host_wait_us"].to_numpy(np.float64)),
             ("kernel-wait: launched, waiting on dependencies or the queue", TO_START,
              rows["kernel_wait_us"].to_numpy(np.float64))]
    unattributed = rows["unattributed_us"].to_numpy(np.float64)
    if (unattributed > 0).any():
        stack.append(("unattributed (next kernel has no linked launch)", IDLE, unattributed))
    _rank_bars(fig, ranks, stack, "µs of GPU idle time (the temporal breakdown's idle)")
    _cut_note(fig, len(ranks), total, "the most idle")
    return fig


def straggler_lead(lead: pd.DataFrame, max_ops: int = MAX_LEAD_OPS, max_ranks: int = MAX_TRACE_RANKS) -> Figure:
    """Operation × rank heatmap of straggler lead: mean over iterations of how much later than the
    fastest rank each rank finished the op (µs, each rank timed from its own iteration start).

    Args:
        lead: ``straggler.LEAD_COLUMNS`` (``iteration``, ``op``, ``rank``, ``lead_us``).
        max_ops: Operations drawn, those with the largest lead on any rank.
        max_ranks: Most ranks drawn (the largest mean lead when cut).
    """
    if lead.empty:
        return no_data(new_figure(11, 2.0), "no operation ran on two ranks in the same iteration")
    grid = lead.pivot_table(index="op", columns="rank", values="lead_us", aggfunc="mean")
    ranks, total = pick_trace_ranks(grid.mean(axis=0), max_ranks)
    grid = grid[ranks]
    grid = grid.loc[grid.max(axis=1).sort_values(ascending=False, kind="stable").index[:max_ops]]
    values = grid.to_numpy(np.float64)
    fig = new_figure(min(13.0, 8.5 + 0.6 * len(ranks)), 1.4 + 0.32 * len(grid))
    ax = fig.add_subplot()
    image = ax.imshow(values, aspect="auto", cmap="YlOrRd", interpolation="nearest", vmin=0)
    if len(ranks) <= 8:
        top = float(np.nanmax(values)) if np.isfinite(values).any() else 0.0
        for (i, j), v in np.ndenumerate(values):
            if np.isfinite(v):
                ax.text(j, i, f"{v:,.0f}", ha="center", va="center", fontsize="x-small",
                        color="white" if v > 0.6 * top else "black")
    ax.set_xticks(np.arange(len(ranks)), [f"rank {r}" for r in ranks], fontsize="small")
    ax.set_yticks(np.arange(len(grid)), [clip_name(str(o)) for o in grid.index], fontsize="small")
    ax.xaxis.tick_top()
    fig.colorbar(image, ax=ax, shrink=0.9, label="mean lead over iterations (µs)", format=US_FORMAT)
    _cut_note(fig, len(ranks), total, "the largest mean lead")
    return fig


def iteration_kernel_time(iterations: pd.DataFrame, max_panels: int = MAX_ITERATION_PANELS) -> Figure:
    """Kernel time per iteration (µs) by HTA class, one panel per rank, with the iteration's span.

    Bars stack computation, communication and memory kernel time (summed durations, so streams
    running at once count twice); above each bar, up to ``MAX_SPAN_LABELS`` bars, the iteration's span
    (first kernel start to last kernel end, µs) and the share of it with no kernel running. Kernels
    launched outside any ``ProfilerStep`` are the "outside" bar.

    Args:
        iterations: ``rank`` + ``tables.ITERATION_COLUMNS``.
        max_panels: Most ranks drawn (those with the most kernel time when cut).
    """
    ranks, total = pick_trace_ranks(iterations.groupby("rank")["kernel_us"].sum(), max_panels)
    cols = min(2, len(ranks))
    nrows = math.ceil(len(ranks) / cols)
    fig = new_figure(12, 1.0 + 2.8 * nrows)
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    stack = (("computation_us", "computation", COMPUTE), ("communication_us", "communication", NON_COMPUTE),
             ("memory_us", "memory", MEMORY_COLOUR))
    for ax, r in zip(axes, ranks, strict=False):
        rows = iterations[iterations["rank"] == r].sort_values("iteration")
        x = np.arange(len(rows))
        bottom = np.zeros(len(rows))
        for col, label, colour in stack:
            v = rows[col].to_numpy(np.float64)
            ax.bar(x, v, bottom=bottom, width=0.7, color=colour, label=label if r == ranks[0] else None)
            bottom = bottom + v
        if len(rows) <= MAX_SPAN_LABELS:
            # The span as text, not as a mark on this axis: an iteration that is mostly idle (13 s of span
            # around 66 ms of kernels) would squash its bars to nothing.
            for xi, top, span, busy in zip(x, bottom, rows["span_us"], rows["busy_us"], strict=True):
                idle = 100 * (1 - busy / span) if span > 0 else 0.0
                ax.annotate(f"span {span:,.0f}\nidle {idle:.0f}%", (xi, top), xytext=(0, 2),
                            textcoords="offset points", ha="center", va="bottom", fontsize="x-small")
            ax.set_ylim(0, float(bottom.max()) * 1.25 if bottom.max() > 0 else 1.0)
        ax.set_xticks(x, ["outside" if i < 0 else str(i) for i in rows["iteration"]])
        ax.yaxis.set_major_formatter(US_FORMAT)
        ax.set_title(f"rank {r}", fontsize="small", loc="left")
        ax.set_xlabel("iteration (ProfilerStep#)")
        ax.set_ylabel("µs")
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    for ax in axes[len(ranks):]:
        ax.set_axis_off()
    fig.legend(loc="outside upper center", ncols=4, fontsize="small", frameon=False)
    _cut_note(fig, len(ranks), total, "the most kernel time")
    return fig


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

def _traces(data: ReportData) -> TraceSet:
    assert data.traces is not None
    return data.traces


TRACE_FIGURES: list[FigureSpec] = [
    FigureSpec(
        "trace-temporal", KERNEL_SECTION, "Temporal breakdown per rank (HTA)",
        "Holistic Trace Analysis's temporal breakdown: over each rank's kernel span (first kernel start to last "
        "kernel end, all streams merged), compute = a computation kernel running, non-compute = only "
        "communication, memory or sync work running, idle = nothing running (µs; % of the span in the bars).",
        ("traces",), lambda d: temporal_breakdown(_traces(d).temporal),
    ),
    FigureSpec(
        "trace-kernel-types", KERNEL_SECTION, "Kernel-type breakdown per rank",
        "Time during which exactly each combination of kernel classes ran (exclusive: 'COMPUTATION overlapping "
        "COMMUNICATION' is time both ran at once and is not counted in either alone), µs; the % in the bars is "
        "the share of the rank's kernel time.",
        ("traces",), lambda d: kernel_type_breakdown(_traces(d).kernel_types),
    ),
    FigureSpec(
        "trace-top-kernels", KERNEL_SECTION, "Top kernels by GPU time",
        f"The {TOP_N} kernels with the most GPU time (µs summed over launches), coloured by class; the label is "
        "the share of all kernel time and the number of launches. One panel per rank for up to "
        f"{MAX_PANEL_RANKS} ranks, else all ranks summed. Names lose their parameter lists, and their template "
        "arguments unless needed to tell two kernels apart.",
        ("traces",), lambda d: top_kernels_figure(_traces(d).top_kernels),
    ),
    FigureSpec(
        "trace-overlap-cdf", KERNEL_SECTION, "Communication overlapped by computation (CDF)",
        "For every communication kernel, the fraction of its duration during which a computation kernel ran on "
        "any stream of the same GPU; each curve is the cumulative distribution of that fraction over one rank's "
        "communication kernels (% of kernels with at most x % overlapped). Left-hugging curves: exposed "
        "communication. The legend's HTA overlap is the same fraction weighted by duration.",
        ("traces",), lambda d: overlap_cdf(_traces(d).comm_overlap, _traces(d).overlap_pct),
    ),
    FigureSpec(
        "trace-iterations", KERNEL_SECTION, "Kernel time per iteration",
        "Per rank and ProfilerStep: computation, communication and memory kernel time (µs, summed durations: "
        "concurrent streams add up, so a bar can exceed the span); above each bar the iteration's span (first "
        "kernel start to last kernel end, µs) and the share of it with no kernel running. 'outside': kernels "
        "launched outside any ProfilerStep.",
        ("traces",), lambda d: iteration_kernel_time(_traces(d).iterations),
    ),
    FigureSpec(
        "trace-launch-overhead", HOST_SECTION, "Launch delay per operation",
        f"The {TOP_N} CPU ops whose kernels wait longest after their launch call: per kernel, launch delay = "
        "kernel start − end of the launch call (queueing behind earlier kernels plus launch latency), µs; the bar "
        "is the median over the op's kernels, the whisker the 95th percentile, shown for the rank where the "
        "p95 is largest. The label counts the op's kernels there and how many were CPU-late (their stream had "
        "finished its previous kernel before the host called the launch). The time the GPU as a whole waited for "
        "launches is the host-wait of the idle split below.",
        ("traces",), lambda d: launch_overhead(_traces(d).launch_by_op),
    ),
    FigureSpec(
        "trace-idle-split", HOST_SECTION, "GPU idle time: host-wait vs kernel-wait",
        "Each idle gap of the temporal breakdown, split at the launch call of the kernel that ends it: before it "
        "the GPU waited for the host (host-wait: data loading, Python, CPU-bound ops), after it the kernel was "
        "already launched and waited on dependencies or the queue (kernel-wait). µs; % of idle in the bars.",
        ("traces",), lambda d: idle_split(_traces(d).idle_split),
    ),
    FigureSpec(
        "trace-straggler-lead", CROSS_SECTION, "Straggler lead per operation and rank",
        "For each operation (layer annotation, else CPU op) and rank: how much later than the fastest rank the "
        "op's last kernel ended, each rank timed from its own ProfilerStep start (clocks of different nodes are "
        f"never compared); mean over iterations, µs. The {MAX_LEAD_OPS} ops with the largest lead are shown; a "
        "column that is dark throughout is the straggler.",
        ("cross_rank",), lambda d: straggler_lead(_traces(d).stragglers),
    ),
]
