"""Per-iteration and per-phase tables of one rank's kernels."""
from __future__ import annotations

import numpy as np
import pandas as pd

from chopper.trace.analyses.temporal import union_ns
from chopper.trace.classify import COMMUNICATION, COMPUTATION, MEMORY
from chopper.trace.hierarchy import PHASES

_US = 1000.0
CLASS_COLUMNS: dict[str, str] = {
    COMPUTATION: "computation_us", COMMUNICATION: "communication_us", MEMORY: "memory_us",
}
ITERATION_COLUMNS: tuple[str, ...] = (
    "iteration", "kernels", "span_us", "kernel_us", *CLASS_COLUMNS.values(), "busy_us", "idle_us",
)
PHASE_COLUMNS: tuple[str, ...] = ("phase", "kernels", "kernel_us", "share_pct")


def per_iteration(kernels: pd.DataFrame) -> pd.DataFrame:
    """One row per iteration (``ProfilerStep#N``), plus -1 for kernels launched outside any step.

    Algorithm:
        1. Group kernels by the hierarchy's ``iteration``.
        2. Span = last kernel end − first kernel start of the iteration (all streams).
        3. Kernel time = summed kernel durations, in total and per HTA class (streams overlap, so
           kernel time can exceed the span).
        4. Busy = length of the union of the iteration's kernels; idle = span − busy.

    Args:
        kernels: The hierarchy frame (:func:`chopper.trace.hierarchy.build`).

    Returns:
        :data:`ITERATION_COLUMNS` (µs), by iteration; ``kernel_us`` sums to the rank's kernel time.
    """
    d = kernels.assign(dur=kernels["dur_ns"].astype(np.int64))
    g = d.groupby("iteration", sort=True)
    out = pd.DataFrame({
        "kernels": g.size(),
        "span_us": (g["end_ns"].max() - g["ts_ns"].min()) / _US,
        "kernel_us": g["dur"].sum() / _US,
    })
    by_class = d.pivot_table(index="iteration", columns="kernel_class", values="dur", aggfunc="sum", fill_value=0)
    for cls, col in CLASS_COLUMNS.items():
        out[col] = (by_class[cls] if cls in by_class else pd.Series(0, index=out.index)).reindex(out.index) / _US
    # A loop over iterations (tens to hundreds); each union is vectorized.
    busy = {it: union_ns(x["ts_ns"].to_numpy(np.int64), x["end_ns"].to_numpy(np.int64)) for it, x in g}
    out["busy_us"] = pd.Series(busy).reindex(out.index) / _US
    out["idle_us"] = out["span_us"] - out["busy_us"]
    return out.reset_index()[list(ITERATION_COLUMNS)]


def per_phase(kernels: pd.DataFrame) -> pd.DataFrame:
    """Kernel time per training phase: forward, backward, optimizer, unknown.

    Algorithm:
        1. Group kernels by the hierarchy's ``phase``; every phase gets a row, zero when absent.
        2. Share = the phase's summed kernel time ÷ all kernel time, in %.

    Args:
        kernels: The hierarchy frame (:func:`chopper.trace.hierarchy.build`).

    Returns:
        :data:`PHASE_COLUMNS`, in the order of :data:`~chopper.trace.hierarchy.PHASES`.
    """
    g = kernels.groupby("phase")["dur_ns"].agg(["size", "sum"]).reindex(list(PHASES), fill_value=0)
    total = float(g["sum"].sum())
    return pd.DataFrame({
        "phase": list(PHASES), "kernels": g["size"].to_numpy(dtype=np.int64),
        "kernel_us": g["sum"].to_numpy() / _US,
        "share_pct": 100.0 * g["sum"].to_numpy() / total if total else np.zeros(len(PHASES)),
    }, columns=list(PHASE_COLUMNS))
