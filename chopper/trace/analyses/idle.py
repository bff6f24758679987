"""GPU idle time split into host-wait and kernel-wait.

The gaps are those of Holistic Trace Analysis's temporal breakdown (same activity selection,
rounding and ProfilerStep rule), so the split adds up to its ``idle_time`` exactly.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from chopper.trace.analyses.launch import join_launch
from chopper.trace.analyses.temporal import ACTIVITY_CLASSES, activity, merge_intervals, without_last_step
from chopper.trace.reader import Trace
from chopper.trace.timestamps import ceil_us

_US = 1000.0
GAP_COLUMNS: tuple[str, ...] = ("start_ns", "end_ns", "gap_us", "next_launch_ts_ns", "host_wait_us",
                                "kernel_wait_us", "unattributed_us")
STREAM_COLUMNS: tuple[str, ...] = ("device", "stream", "kernels", "span_us", "busy_us", "idle_us", "host_wait_us",
                                   "kernel_wait_us", "unattributed_us")


def activity_with_launch(trace: Trace) -> pd.DataFrame:
    """HTA's GPU activity (:func:`~chopper.trace.analyses.temporal.gpu_activity`) with each event's launch.

    Algorithm:
        1. Take :func:`~chopper.trace.analyses.temporal.activity` without its ProfilerStep filter;
           its ``row`` indexes the kernels, then the GPU sync events, so name, correlation, device
           and stream attach by that index.
        2. Apply the temporal breakdown's own ProfilerStep filter, so the set is the same.
        3. Join each event's runtime call by correlation (``launch_ts_ns`` -1 where none).

    Args:
        trace: One rank's trace.

    Returns:
        ``start_ns``, ``end_ns``, ``kernel_class``, ``name``, ``device``, ``stream``, ``correlation``,
        ``launch_ts_ns``, ``linked``.
    """
    a = activity(trace, drop_last_step=False)
    cols = ["name", "device", "stream", "correlation"]
    src = pd.concat([trace.kernels[cols], trace.gpu_syncs[cols]], ignore_index=True).iloc[a.row]
    act = pd.DataFrame({"start_ns": a.start_ns, "end_ns": a.end_ns,
                        "kernel_class": np.array(ACTIVITY_CLASSES, dtype=object)[a.class_code],
                        **{c: src[c].to_numpy() for c in cols}})
    rounding = trace.fractional_ts
    act = without_last_step(trace, act, lambda ns: ceil_us(ns, rounding)).reset_index(drop=True)
    act["launch_ts_ns"], _, act["linked"] = join_launch(trace.runtime, act["correlation"])
    return act


def split_gaps(start: np.ndarray, end: np.ndarray, launch_ts: np.ndarray, linked: np.ndarray) -> pd.DataFrame:
    """Gaps of one timeline, each split at the moment the kernel that ends it was launched.

    Algorithm:
        1. Merge the intervals; a gap runs from one merged interval's end to the next one's start.
        2. The events starting exactly at a gap's end are what the GPU waited for; the earliest
           launch call among them (runtime call start) is when the host asked for that work.
        3. Host-wait = clip(launch − gap start, 0, gap): the GPU had nothing queued because the host
           had not yet issued the launch. Kernel-wait = the rest of the gap: the launch was already
           issued and the kernel waited on dependencies (events, other streams) or the queue.
        4. A gap whose next events have no linked launch is "unattributed" as a whole.

    Args:
        start: Event starts (ns).
        end: Event ends (ns).
        launch_ts: Launch-call start of each event (ns; any value where not linked).
        linked: Whether each event has a launch.

    Returns:
        One row per gap, :data:`GAP_COLUMNS`; host + kernel + unattributed = gap exactly.
    """
    ms, me = merge_intervals(start, end)
    g0, g1 = me[:-1], ms[1:]
    if len(g0) == 0:
        return pd.DataFrame({c: pd.Series(dtype=np.float64) for c in GAP_COLUMNS})
    ev = pd.DataFrame({"start": start, "launch": np.where(linked, launch_ts, np.iinfo(np.int64).max)})
    first_launch = ev[ev["start"].isin(g1)].groupby("start")["launch"].min()
    launch = first_launch.reindex(g1).to_numpy(dtype=np.int64)
    has = launch != np.iinfo(np.int64).max
    gap = g1 - g0
    host = np.where(has, np.clip(launch - g0, 0, gap), 0)
    kernel = np.where(has, gap - host, 0)
    return pd.DataFrame({
        "start_ns": g0, "end_ns": g1, "gap_us": gap / _US, "next_launch_ts_ns": np.where(has, launch, -1),
        "host_wait_us": host / _US, "kernel_wait_us": kernel / _US, "unattributed_us": np.where(has, 0, gap) / _US,
    }, columns=list(GAP_COLUMNS))


def gaps(trace: Trace) -> pd.DataFrame:
    """Every idle gap of the rank's merged GPU timeline (all streams), split by :func:`split_gaps`.

    Args:
        trace: One rank's trace.

    Returns:
        :data:`GAP_COLUMNS`, in time order; ``gap_us`` sums to HTA's ``idle_time``.
    """
    act = activity_with_launch(trace)
    return split_gaps(act["start_ns"].to_numpy(np.int64), act["end_ns"].to_numpy(np.int64),
                      act["launch_ts_ns"].to_numpy(np.int64), act["linked"].to_numpy(bool))


def split(trace: Trace) -> dict[str, float | int]:
    """Rank totals: idle time and its host-wait / kernel-wait split.

    Algorithm:
        1. :func:`gaps` over the merged timeline of every stream, within HTA's kernel span.
        2. Sum each column; shares are % of the idle time.

    Args:
        trace: One rank's trace.

    Returns:
        ``idle_us``, ``host_wait_us``, ``kernel_wait_us``, ``unattributed_us`` (µs),
        ``host_wait_pct``, ``kernel_wait_pct`` (% of idle), ``gaps`` (count).
    """
    g = gaps(trace)
    idle = float(g["gap_us"].sum())

    def pct(x: float) -> float:
        return 100.0 * x / idle if idle else 0.0

    host, kernel = float(g["host_wait_us"].sum()), float(g["kernel_wait_us"].sum())
    return {"idle_us": idle, "host_wait_us": host, "kernel_wait_us": kernel,
            "unattributed_us": float(g["unattributed_us"].sum()),
            "host_wait_pct": pct(host), "kernel_wait_pct": pct(kernel), "gaps": len(g)}


def per_stream(trace: Trace) -> pd.DataFrame:
    """Idle time of each stream within its own span, split the same way.

    Algorithm:
        1. Per (device, stream): the stream's span is its first start to its last end; gaps as in
           :func:`split_gaps` over that stream's events alone.
        2. Busy = span − idle.

    Args:
        trace: One rank's trace.

    Returns:
        :data:`STREAM_COLUMNS` (µs), one row per stream, most idle first.
    """
    act = activity_with_launch(trace)
    rows = []
    # A loop over streams (a handful per rank); the work inside is vectorized.
    for (dev, stream), s in act.groupby(["device", "stream"], sort=True):
        start, end = s["start_ns"].to_numpy(np.int64), s["end_ns"].to_numpy(np.int64)
        g = split_gaps(start, end, s["launch_ts_ns"].to_numpy(np.int64), s["linked"].to_numpy(bool))
        span = (int(end.max()) - int(start.min())) / _US
        idle = float(g["gap_us"].sum())
        rows.append({"device": int(dev), "stream": int(stream), "kernels": len(s), "span_us": span,
                     "busy_us": span - idle, "idle_us": idle, "host_wait_us": float(g["host_wait_us"].sum()),
                     "kernel_wait_us": float(g["kernel_wait_us"].sum()),
                     "unattributed_us": float(g["unattributed_us"].sum())})
    out = pd.DataFrame(rows, columns=list(STREAM_COLUMNS))
    return out.sort_values(["idle_us", "device", "stream"], ascending=[False, True, True], ignore_index=True)
