"""Temporal breakdown of one rank's GPU time: idle, compute, non-compute (HTA definitions).

Also holds the GPU-activity selection and the interval union shared by the overlap and
kernel-type analyses, so all three apply Holistic Trace Analysis's rules identically. They work
on numpy arrays only (:func:`activity`), so parsing a trace and running them never loads pandas;
:func:`gpu_activity` gives the same selection as a DataFrame for the pandas analyses.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from chopper.trace.classify import COMMUNICATION, COMPUTATION, MEMORY, OTHER, classify_unique
from chopper.trace.frames import Columns
from chopper.trace.reader import Trace
from chopper.trace.timestamps import US_NS, ceil_us, hta_interval

if TYPE_CHECKING:
    import pandas as pd

# HTA classes by small-int code: Activity.class_code indexes this, so selections compare ints, not strings.
ACTIVITY_CLASSES: tuple[str, ...] = (COMMUNICATION, MEMORY, COMPUTATION, OTHER)
_CLASS_CODE = {c: i for i, c in enumerate(ACTIVITY_CLASSES)}
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


@dataclass(frozen=True)
class Activity:
    """GPU busy intervals of one rank as numpy arrays (one entry per kept kernel or sync event).

    Attributes:
        start_ns: Starts (ns, HTA-rounded when asked).
        end_ns: Ends (ns).
        class_code: HTA class, an index into :data:`ACTIVITY_CLASSES` (int8).
        row: Source row: ``i < len(kernels)`` is kernel ``i``, else sync event ``i - len(kernels)``.
    """

    start_ns: np.ndarray
    end_ns: np.ndarray
    class_code: np.ndarray
    row: np.ndarray

    def __len__(self) -> int:
        return len(self.start_ns)

    def of(self, *classes: str) -> np.ndarray:
        """Boolean mask of the entries in any of ``classes``."""
        return np.isin(self.class_code, [_CLASS_CODE[c] for c in classes])

    def union_ns(self, *classes: str) -> int:
        """Length (ns) of the union of the intervals of ``classes``."""
        sel = self.of(*classes)
        return union_ns(self.start_ns[sel], self.end_ns[sel])


def _class_codes(frame: Columns) -> np.ndarray:
    """HTA class code per row: the names are classed once each, then mapped back."""
    uniques, inverse = frame.factorize("name")
    per_name = np.array([_CLASS_CODE[c] for c in classify_unique(uniques)[0]], dtype=np.int8)
    return per_name[inverse]


def activity(trace: Trace, *, hta_rounding: bool = True, include_syncs: bool = True,
             drop_last_step: bool = True) -> Activity:
    """GPU busy intervals of one rank, classed as Holistic Trace Analysis classes them.

    Algorithm:
        1. Take kernels, memcpys and memsets on every stream and device of the rank and, as HTA
           does, the ``cuda_sync`` events that name a stream (HTA leaves out those with stream -1,
           device-wide syncs in newer traces). HTA 0.5.0 counts any event with a ``stream``
           argument; CPU ops and runtime calls that carry one are not GPU work and stay out here
           (``Trace.cpu_stream_events`` counts them).
        2. Class every event by name with HTA's rules (:mod:`chopper.trace.classify`); each
           distinct name is classed once and the class mapped back to its rows.
        3. Time each event with :func:`chopper.trace.timestamps.hta_interval`: inward to whole µs
           when HTA rounds the trace (``Trace.fractional_ts``), else exact ns.
        4. With two or more distinct ``ProfilerStep#N`` names, keep only events whose launching
           runtime call (joined by ``correlation``) starts before the last ProfilerStep starts;
           events without a correlation id are kept (HTA joins them to the CPU side's -1), those
           whose correlation matches no runtime call are dropped (:func:`last_step_mask`).

    Args:
        trace: One rank's trace.
        hta_rounding: Apply step 3 (HTA's µs rounding of float timestamps).
        include_syncs: Count ``cuda_sync`` events as GPU activity (step 1), as HTA does.
        drop_last_step: Apply step 4.

    Returns:
        The kept events, kernels first, then sync events, each in trace order.
    """
    parts = [trace.kernel_columns] + ([trace.gpu_sync_columns] if include_syncs else [])
    start = np.concatenate([p["ts_ns"] for p in parts])
    end = np.concatenate([p["end_ns"] for p in parts])
    code = np.concatenate([_class_codes(p) for p in parts])
    rounding = hta_rounding and trace.fractional_ts
    start, end = hta_interval(start, end, rounding)
    n_kernels = len(trace.kernel_columns)
    on_stream = np.ones(len(start), dtype=bool)
    on_stream[n_kernels:] = trace.gpu_sync_columns["stream"] != -1 if include_syncs else True
    row = np.flatnonzero(on_stream)
    start, end, code = start[on_stream], end[on_stream], code[on_stream]
    if drop_last_step:
        correlation = np.concatenate([p["correlation"] for p in parts])[on_stream]
        keep = last_step_mask(trace, correlation, lambda ns: ceil_us(ns, rounding))
        start, end, code, row = start[keep], end[keep], code[keep], row[keep]
    return Activity(start_ns=start, end_ns=end, class_code=code, row=row)


def gpu_activity(trace: Trace, **options: bool) -> pd.DataFrame:
    """:func:`activity` as a DataFrame: ``start_ns``, ``end_ns``, ``kernel_class``, ``name``.

    Args:
        trace: One rank's trace.
        **options: Passed to :func:`activity`.
    """
    import pandas as pd  # deferred: only the DataFrame analyses call this

    act = activity(trace, **options)
    names = np.concatenate([trace.kernel_columns["name"], trace.gpu_sync_columns["name"]])
    # kernel_class stays object dtype (as the pandas analyses have always seen it), not pandas 3's str.
    kernel_class = pd.Series(np.array(ACTIVITY_CLASSES, dtype=object)[act.class_code], dtype=object)
    return pd.DataFrame({"start_ns": act.start_ns, "end_ns": act.end_ns, "kernel_class": kernel_class,
                         "name": names[act.row]})


def _step_names(frame: Columns) -> tuple[set[str], np.ndarray]:
    """Distinct ``ProfilerStep`` names of a frame and the mask of its rows that carry one."""
    uniques, inverse = frame.factorize("name")
    is_step = np.array(["ProfilerStep" in str(n) for n in uniques], dtype=bool)
    return {str(n) for n in uniques[is_step]}, is_step[inverse]


def last_step_mask(trace: Trace, correlation: np.ndarray,
                   up: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Which GPU events HTA keeps when it drops the last profiled step (step 4 of :func:`activity`).

    Algorithm:
        1. Collect the distinct ``ProfilerStep`` names of the CPU ops and GPU annotations; with fewer
           than two, or none among the CPU ops, keep everything.
        2. Last step start = the latest (``up``-rounded) start of a ProfilerStep CPU op.
        3. Launch time of a correlation id = ``up``-rounded start of the first runtime call with it
           (looked up by binary search in the runtime calls' sorted distinct ids).
        4. Keep events with correlation -1, and those whose launch starts before the last step.

    Args:
        trace: One rank's trace.
        correlation: Correlation id of each GPU event.
        up: Rounding applied to CPU-side times (µs ceiling when HTA rounds, else identity).

    Returns:
        Boolean mask aligned with ``correlation``.
    """
    correlation = np.asarray(correlation, dtype=np.int64)
    ops = trace.cpu_op_columns
    op_steps, is_step = _step_names(ops)
    ann_steps, _ = _step_names(trace.gpu_annotation_columns)
    if len(op_steps | ann_steps) < 2 or not is_step.any():
        return np.ones(len(correlation), dtype=bool)
    last_start = int(up(ops["ts_ns"][is_step]).max())
    rt = trace.runtime_columns
    ids, first = np.unique(rt["correlation"], return_index=True)  # first call of each id, as drop_duplicates
    launch = up(rt["ts_ns"][first])
    pos = np.minimum(np.searchsorted(ids, correlation), max(len(ids) - 1, 0))
    found = (ids[pos] == correlation) if len(ids) else np.zeros(len(correlation), dtype=bool)
    before = found & (launch[pos] < last_start) if len(ids) else found
    return (correlation == -1) | before


def without_last_step(trace: Trace, act: pd.DataFrame, up: Callable[[np.ndarray], np.ndarray]) -> pd.DataFrame:
    """Rows of a GPU-event frame with a ``correlation`` column that :func:`last_step_mask` keeps."""
    return act[last_step_mask(trace, act["correlation"].to_numpy(np.int64), up)]


def breakdown(trace: Trace, **options: bool) -> dict[str, float]:
    """Idle, compute and non-compute time over the rank's kernel span (HTA's temporal breakdown).

    Algorithm:
        1. Select GPU activity with :func:`activity` (HTA's classes, rounding and ProfilerStep rule).
        2. Span = last end − first start, all streams merged.
        3. Idle = span − length of the union of all activity.
        4. Compute = length of the union of COMPUTATION intervals.
        5. Non-compute = span − idle − compute (communication, memory, syncs not overlapped by compute).

    Args:
        trace: One rank's trace.
        **options: Passed to :func:`activity`.

    Returns:
        ``idle_time_us``, ``compute_time_us``, ``non_compute_time_us``, ``kernel_time_us`` (µs),
        and the shares ``idle_pct``, ``compute_pct``, ``non_compute_pct`` (% of the span).
    """
    act = activity(trace, **options)
    start, end = act.start_ns, act.end_ns
    span = int(end.max() - start.min()) if len(act) else 0
    busy = union_ns(start, end)
    compute = act.union_ns(COMPUTATION)
    idle = span - busy
    non_compute = span - idle - compute

    def pct(x: int) -> float:
        return 100.0 * x / span if span else 0.0

    return {
        "idle_time_us": idle / US_NS, "compute_time_us": compute / US_NS,
        "non_compute_time_us": non_compute / US_NS, "kernel_time_us": span / US_NS,
        "idle_pct": pct(idle), "compute_pct": pct(compute), "non_compute_pct": pct(non_compute),
    }


__all__ = ["ACTIVITY_CLASSES", "COMMUNICATION", "Activity", "activity", "breakdown", "gpu_activity", "last_step_mask",
           "merge_intervals", "union_ns", "without_last_step"]
