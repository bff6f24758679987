"""Kernel-type breakdown: time in each exclusive combination of kernel classes (HTA)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from chopper.trace.analyses.temporal import gpu_activity, merge_intervals
from chopper.trace.classify import COMMUNICATION, COMPUTATION, MEMORY
from chopper.trace.reader import Trace

# Bit order fixes the combination names: "COMPUTATION overlapping COMMUNICATION", as HTA writes them.
CLASS_BITS: tuple[str, ...] = (COMPUTATION, COMMUNICATION, MEMORY)


def combination_name(mask: int) -> str:
    """Name of a bit mask over :data:`CLASS_BITS`, e.g. 3 → "COMPUTATION overlapping COMMUNICATION"."""
    return " overlapping ".join(c for i, c in enumerate(CLASS_BITS) if mask & (1 << i))


def breakdown(trace: Trace, **options: bool) -> pd.DataFrame:
    """Time during which exactly each combination of kernel classes runs.

    Algorithm:
        1. Select GPU activity with :func:`~chopper.trace.analyses.temporal.gpu_activity`; keep the
           COMPUTATION, COMMUNICATION and MEMORY classes (sync events, HTA's "OTHER", are left out).
        2. Merge each class's intervals into a disjoint union; give each class one bit.
        3. Sweep: every merged start adds its bit, every end subtracts it; sorting these boundary
           events by time and taking the cumulative sum gives the set of classes running in each
           segment between consecutive boundaries.
        4. Sum segment lengths per non-empty set; share = time ÷ total time of all sets.

    Args:
        trace: One rank's trace.
        **options: Passed to ``gpu_activity``.

    Returns:
        One row per combination that occurs, largest first: ``kernel_type`` (e.g. "COMMUNICATION",
        "COMPUTATION overlapping COMMUNICATION"), ``time_us`` (µs), ``percentage`` (% of the total).
    """
    act = gpu_activity(trace, **options)
    times, deltas = [], []
    for bit, cls in enumerate(CLASS_BITS):
        sel = act["kernel_class"].eq(cls).to_numpy()
        ms, me = merge_intervals(act["start_ns"].to_numpy()[sel], act["end_ns"].to_numpy()[sel])
        times += [ms, me]
        deltas += [np.full(len(ms), 1 << bit), np.full(len(me), -(1 << bit))]
    t = np.concatenate(times)
    d = np.concatenate(deltas)
    order = np.argsort(t, kind="stable")
    t, d = t[order], d[order]
    running = np.cumsum(d)
    seg = np.diff(t, append=t[-1] if len(t) else 0)
    df = pd.DataFrame({"mask": running, "dur": seg})
    df = df[df["mask"] > 0].groupby("mask", as_index=False)["dur"].sum()
    df = df[df["dur"] > 0]
    total = df["dur"].sum()
    out = pd.DataFrame({
        "kernel_type": [combination_name(int(m)) for m in df["mask"]],
        "time_us": df["dur"].to_numpy() / 1000.0,
        "percentage": 100.0 * df["dur"].to_numpy() / total if total else 0.0,
    })
    return out.sort_values("time_us", ascending=False, ignore_index=True)
