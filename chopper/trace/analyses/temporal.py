"""Temporal breakdown of one rank's GPU time: idle, compute, non-compute (HTA definitions).

Also holds the GPU-activity selection and the interval union shared by the overlap and
kernel-type analyses, so all three apply Holistic Trace Analysis's rules identically.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from chopper.trace.classify import COMMUNICATION, COMPUTATION, classify_names, sync_class
from chopper.trace.reader import Trace

_US = 1000  # ns per µs


def merge_intervals(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as disjoint, sorted intervals.

    Algorithm:
        1. Sort by start.
        2. A new group begins where a start lies after the running maximum of all previous ends
           (touching intervals merge).
        3. Each group spans its first start to its largest end.

    Args:
        start: Interval starts (ns).
        end: Interval ends (ns), ``end >= start``.

    Returns:
        ``(starts, ends)`` of the merged intervals (ns).
    """
    if len(start) == 0:
        return np.array([], dtype=np.int64), np.array([], dtype=np.int64)
    order = np.argsort(start, kind="stable")
    s, e = np.asarray(start)[order], np.asarray(end)[order]
    prev_max = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > prev_max[:-1]
    first = np.flatnonzero(new)
    last = np.r_[first[1:], len(s)] - 1
    return s[first], prev_max[last]


def union_ns(start: np.ndarray, end: np.ndarray) -> int:
    """Total length (ns) covered by at least one interval."""
    ms, me = merge_intervals(start, end)
    return int((me - ms).sum())


def gpu_activity(trace: Trace, *, hta_rounding: bool = True, include_syncs: bool = True,
                 drop_last_step: bool = True) -> pd.DataFrame:
    """GPU busy intervals of one rank, classed as Holistic Trace Analysis classes them.

    Algorithm:
        1. Take kernels, memcpys and memsets (and, as HTA does, ``cuda_sync`` events) on every
           stream and device of the rank.
        2. Class kernels with the HTA three-way table; sync events as "OTHER" when their name matches
           ``.*Sync`` (busy, not compute), else COMPUTATION (HTA's fall-through).
        3. When the trace writes float timestamps, round starts up and ends down to whole µs, as
           HTA's parser does (an end that falls before its start is clamped to the start).
        4. With two or more distinct ``ProfilerStep#N`` names, keep only events whose launching
           runtime call (joined by ``correlation``) starts before the last ProfilerStep starts;
           events without a correlation id are kept (HTA joins them to the CPU side's -1), those
           whose correlation matches no runtime call are dropped.

    Args:
        trace: One rank's trace.
        hta_rounding: Apply step 3 (HTA's µs rounding of float timestamps).
        include_syncs: Count ``cuda_sync`` events as GPU activity (step 1), as HTA does.
        drop_last_step: Apply step 4.

    Returns:
        Columns ``start_ns``, ``end_ns``, ``kernel_class``, ``name``.
    """
    k = trace.kernels
    cls, _ = classify_names(k["name"])
    parts = [pd.DataFrame({"start_ns": k["ts_ns"], "end_ns": k["end_ns"], "kernel_class": cls,
                           "name": k["name"], "correlation": k["correlation"]})]
    if include_syncs and len(trace.gpu_syncs):
        s = trace.gpu_syncs
        parts.append(pd.DataFrame({"start_ns": s["ts_ns"], "end_ns": s["end_ns"], "kernel_class": sync_class(s["name"]),
                                   "name": s["name"], "correlation": s["correlation"]}))
    act = pd.concat(parts, ignore_index=True)
    rounding = hta_rounding and trace.fractional_ts

    def up(ns: pd.Series | np.ndarray) -> np.ndarray:
        v = np.asarray(ns, dtype=np.int64)
        return -((-v) // _US) * _US if rounding else v

    act["start_ns"] = up(act["start_ns"])
    if rounding:
        act["end_ns"] = np.maximum((act["end_ns"].to_numpy() // _US) * _US, act["start_ns"].to_numpy())
    if drop_last_step:
        act = without_last_step(trace, act, up)
    return act.drop(columns="correlation").reset_index(drop=True)


def without_last_step(trace: Trace, act: pd.DataFrame, up: object) -> pd.DataFrame:
    ops = trace.cpu_ops
    is_step = ops["name"].str.contains("ProfilerStep", regex=False)
    names = set(ops.loc[is_step, "name"]) | set(
        trace.gpu_annotations.loc[trace.gpu_annotations["name"].str.contains("ProfilerStep", regex=False), "name"])
    if len(names) < 2 or not is_step.any():
        return act
    last_start = int(up(ops.loc[is_step, "ts_ns"]).max())  # type: ignore[operator]
    rt = trace.runtime.drop_duplicates("correlation")
    launch = pd.Series(up(rt["ts_ns"]), index=rt["correlation"].to_numpy())  # type: ignore[operator]
    launch_ts = act["correlation"].map(launch)
    keep = act["correlation"].eq(-1) | (launch_ts < last_start)
    return act[keep.to_numpy()]


def breakdown(trace: Trace, **options: bool) -> dict[str, float]:
    """Idle, compute and non-compute time over the rank's kernel span (HTA's temporal breakdown).

    Algorithm:
        1. Select GPU activity with :func:`gpu_activity` (HTA's classes, rounding and ProfilerStep rule).
        2. Span = last end − first start, all streams merged.
        3. Idle = span − length of the union of all activity.
        4. Compute = length of the union of COMPUTATION intervals.
        5. Non-compute = span − idle − compute (communication, memory, syncs not overlapped by compute).

    Args:
        trace: One rank's trace.
        **options: Passed to :func:`gpu_activity`.

    Returns:
        ``idle_time_us``, ``compute_time_us``, ``non_compute_time_us``, ``kernel_time_us`` (µs),
        and the shares ``idle_pct``, ``compute_pct``, ``non_compute_pct`` (% of the span).
    """
    act = gpu_activity(trace, **options)
    start, end = act["start_ns"].to_numpy(), act["end_ns"].to_numpy()
    span = int(end.max() - start.min()) if len(act) else 0
    busy = union_ns(start, end)
    comp = act["kernel_class"].eq(COMPUTATION).to_numpy()
    compute = union_ns(start[comp], end[comp])
    idle = span - busy
    non_compute = span - idle - compute

    def pct(x: int) -> float:
        return 100.0 * x / span if span else 0.0

    return {
        "idle_time_us": idle / _US, "compute_time_us": compute / _US,
        "non_compute_time_us": non_compute / _US, "kernel_time_us": span / _US,
        "idle_pct": pct(idle), "compute_pct": pct(compute), "non_compute_pct": pct(non_compute),
    }


__all__ = ["COMMUNICATION", "breakdown", "gpu_activity", "merge_intervals", "union_ns"]
