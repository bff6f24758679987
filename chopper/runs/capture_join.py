"""One time axis for a capture: each profiled step's counters beside its kernels.

A ``chopper capture`` directory holds a recorded run (markers and samples, CLOCK_REALTIME ns) and
one Kineto trace per rank under ``traces/``, whose frames the reader also puts on CLOCK_REALTIME
(``chopper.trace.reader.clock_offset_ns``). This module joins the two per (rank, step), so the
counter-level account of a step (``chopper attribute``) and what the GPU ran in the same window
(``chopper trace``) can be read side by side, and so the alignment itself is checked.

Algorithm (:func:`join`):
    1. Per trace, the ``ProfilerStep#N`` ranges the client's capture wrapped around each profiled
       step (``cpu_ops`` user annotations), as ``trace_begin_ns``/``trace_end_ns``.
    2. Inner-join them with the attribution's step rows of the same rank and step number; the
       marker window ``[begin_ns, end_ns)`` is the step as the counters saw it.
    3. ``begin_offset_us``/``end_offset_us`` = trace − marker edge: how far the two clocks' views of
       the same step disagree (host-side ranges vs markers stamped by the same process: µs to a
       few ms; a large offset means the axes are not one).
    4. Kernel-level figures inside the marker window, from the trace's GPU activity as Holistic
       Trace Analysis classifies it (``temporal.gpu_activity``; every kernel, without HTA's
       rounding or last-step trimming), each interval clipped to the window: ``kernel_busy_s``
       (union of all activity), ``kernel_comm_s`` (union of communication kernels) and
       ``kernel_exposed_comm_s`` = |compute ∪ communication| − |compute|, the communication time
       no computation hid. A CPU-only trace has no kernels: these are NaN
       and the row says ``cpu_only_trace``.

Units: times in the result are seconds except the offsets (µs) and the windows (ns).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from chopper.trace import Trace, load_traces
from chopper.trace.analyses.temporal import gpu_activity, union_ns
from chopper.trace.classify import COMMUNICATION, COMPUTATION
from chopper.trace.discover import trace_files

_STEP_PREFIX = "ProfilerStep#"
_NS = 1e9

# Columns of the join, in order: the counter-level ones are copied from the attribution rows.
COUNTER_COLUMNS: tuple[str, ...] = ("step_time_s", "busy_ratio", "exposed_comm_s", "idle_s", "mean_gfx_clock_mhz")
JOIN_COLUMNS: tuple[str, ...] = (
    "job", "rank", "step", "begin_ns", "end_ns", "trace_begin_ns", "trace_end_ns",
    "begin_offset_us", "end_offset_us", *COUNTER_COLUMNS,
    "kernel_busy_s", "kernel_comm_s", "kernel_exposed_comm_s", "cpu_only_trace",
)


def profiler_steps(trace: Trace) -> pd.DataFrame:
    """The trace's ``ProfilerStep#N`` ranges: ``rank``, ``step``, ``trace_begin_ns``, ``trace_end_ns``.

    A step number that appears twice (nested or repeated ranges) keeps its outermost range.
    """
    ops = trace.cpu_ops
    marked = ops[ops["name"].str.startswith(_STEP_PREFIX)]
    number = pd.to_numeric(marked["name"].str.slice(len(_STEP_PREFIX)), errors="coerce")
    steps = pd.DataFrame({"rank": trace.rank, "step": number, "trace_begin_ns": marked["ts_ns"],
                          "trace_end_ns": marked["end_ns"]}).dropna(subset=["step"])
    steps["step"] = steps["step"].astype(np.int64)
    return (steps.sort_values(["step", "trace_begin_ns"]).drop_duplicates("step", keep="first")
            .reset_index(drop=True))


def _clipped_union_ns(start: np.ndarray, end: np.ndarray, begin: int, stop: int) -> int:
    """Length (ns) of the union of ``[start, end)`` intervals inside ``[begin, stop)``."""
    s, e = np.maximum(start, begin), np.minimum(end, stop)
    keep = e > s
    return union_ns(s[keep], e[keep])


def kernel_figures(trace: Trace, windows: pd.DataFrame) -> pd.DataFrame:
    """Kernel busy, communication and exposed communication (s) of ``trace`` in each window.

    Args:
        trace: One rank's trace on CLOCK_REALTIME.
        windows: ``begin_ns``, ``end_ns`` per row.

    Returns:
        ``kernel_busy_s``, ``kernel_comm_s``, ``kernel_exposed_comm_s`` aligned with ``windows``;
        NaN for a CPU-only trace.
    """
    columns = ("kernel_busy_s", "kernel_comm_s", "kernel_exposed_comm_s")
    if not len(trace.kernel_columns):
        return pd.DataFrame(np.nan, index=windows.index, columns=list(columns))
    # Every kernel, unrounded: the window decides what counts, not HTA's last-step trimming.
    act = gpu_activity(trace, hta_rounding=False, drop_last_step=False)
    start, end = act["start_ns"].to_numpy(np.int64), act["end_ns"].to_numpy(np.int64)
    cls = act["kernel_class"].to_numpy()
    comp, comm = cls == COMPUTATION, cls == COMMUNICATION
    both = comp | comm
    rows = []
    for begin, stop in zip(windows["begin_ns"].to_numpy(np.int64), windows["end_ns"].to_numpy(np.int64), strict=True):
        busy = _clipped_union_ns(start, end, begin, stop)
        comm_ns = _clipped_union_ns(start[comm], end[comm], begin, stop)
        exposed = (_clipped_union_ns(start[both], end[both], begin, stop)
                   - _clipped_union_ns(start[comp], end[comp], begin, stop))
        rows.append((busy / _NS, comm_ns / _NS, exposed / _NS))
    return pd.DataFrame(rows, index=windows.index, columns=list(columns))


def join(steps: pd.DataFrame, traces: Sequence[Trace]) -> pd.DataFrame:
    """Join attribution step rows with the traces' profiled steps on (rank, step); see the module doc.

    Args:
        steps: Attribution rows (``chopper.attribution.columns.STEP_COLUMNS``) of one job.
        traces: The capture's traces, one per rank, on CLOCK_REALTIME.

    Returns:
        One row per profiled step that the run also holds, :data:`JOIN_COLUMNS`, sorted by rank
        and step.
    """
    parts = []
    for trace in traces:
        mine = steps[steps["rank"] == trace.rank]
        joined = mine.merge(profiler_steps(trace), on=["rank", "step"], how="inner")
        if joined.empty:
            continue
        joined = joined.reset_index(drop=True)
        joined["begin_offset_us"] = (joined["trace_begin_ns"] - joined["begin_ns"]) / 1e3
        joined["end_offset_us"] = (joined["trace_end_ns"] - joined["end_ns"]) / 1e3
        joined = pd.concat([joined, kernel_figures(trace, joined)], axis=1)
        joined["cpu_only_trace"] = not len(trace.kernel_columns)
        parts.append(joined[list(JOIN_COLUMNS)])
    if not parts:
        return pd.DataFrame(columns=list(JOIN_COLUMNS))
    return pd.concat(parts, ignore_index=True).sort_values(["rank", "step"], ignore_index=True)


def join_capture(run_dir: str | Path, steps: pd.DataFrame) -> pd.DataFrame | None:
    """:func:`join` for a capture directory: its traces read (CPU-only ones too) and joined.

    The traces are found as every command finds them (``chopper.trace.discover.trace_files``: any
    ``.json``/``.json.gz`` at any depth, ``traces/`` for a ``chopper capture``), so ``chopper
    report`` and ``chopper attribute`` join the same files.

    Returns:
        The join, or None when ``run_dir`` holds no traces.

    Raises:
        chopper.trace.TraceError: a trace is unreadable or two claim one rank.
    """
    files = trace_files(run_dir)
    if not files:
        return None
    return join(steps, load_traces(files, require_gpu=False))


def to_records(joined: pd.DataFrame) -> list[dict[str, object]]:
    """The join as JSON-ready rows (numpy scalars to Python, NaN to None)."""
    return [{k: (None if isinstance(v, float) and np.isnan(v) else (v.item() if hasattr(v, "item") else v))
             for k, v in row.items()} for row in joined.to_dict(orient="records")]


DISPLAY_COLUMNS: tuple[str, ...] = ("job", "rank", "step", "step ms", "offset µs", "busy %", "kernel busy %",
                                    "exposed comm ms", "kernel exposed comm ms")
CPU_ONLY_NOTE = "–: a CPU-only trace has no GPU kernels; the kernel columns need a capture on a GPU"


def display_rows(joined: pd.DataFrame) -> list[list[str]]:
    """The join as text cells under :data:`DISPLAY_COLUMNS` (ms, µs, %; "–" where unknown)."""

    def cell(value: float, scale: float, fmt: str) -> str:
        return "–" if np.isnan(value) else format(scale * value, fmt)

    return [[str(r.job), str(r.rank), str(r.step), cell(r.step_time_s, 1e3, ".2f"),
             cell(r.begin_offset_us, 1.0, ".0f"), cell(r.busy_ratio, 100.0, ".1f"),
             cell(r.kernel_busy_s / r.step_time_s, 100.0, ".1f"), cell(r.exposed_comm_s, 1e3, ".2f"),
             cell(r.kernel_exposed_comm_s, 1e3, ".2f")] for r in joined.itertuples(index=False)]


def format_join(joined: pd.DataFrame) -> str:
    """The join as a fixed-width table (:func:`display_rows`), for ``chopper attribute``."""
    rows = [list(DISPLAY_COLUMNS), *display_rows(joined)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(DISPLAY_COLUMNS))]
    lines = ["capture: counters (samples + markers) and kernels (trace) per profiled step, one clock"]
    lines += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
              for row in rows]
    if len(joined) and joined["cpu_only_trace"].any():
        lines.append(CPU_ONLY_NOTE)
    return "\n".join(lines)
