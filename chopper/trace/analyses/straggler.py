"""Cross-rank straggler lead per operation, on each rank's own clock."""
from __future__ import annotations

import numpy as np
import pandas as pd

from chopper.trace.reader import Trace

_US = 1000.0
LEAD_COLUMNS: tuple[str, ...] = ("iteration", "op", "op_kind", "rank", "end_us", "lead_us")
RANK_COLUMNS: tuple[str, ...] = ("rank", "ops", "mean_lead_us", "max_lead_us", "slowest_ops")


def iteration_starts(trace: Trace) -> pd.Series:
    """Start (ns, the rank's own clock) of each ``ProfilerStep#N`` range, indexed by N.

    Args:
        trace: One rank's trace.

    Returns:
        int64 Series; empty when the trace marks no steps.
    """
    ops = trace.cpu_ops
    n = ops["name"].astype(str).str.extract(r"^ProfilerStep#(\d+)")[0]
    sel = n.notna()
    s = pd.Series(ops.loc[sel, "ts_ns"].to_numpy(dtype=np.int64), index=n[sel].astype(np.int64).to_numpy())
    return s.groupby(level=0).min()


def op_end_times(trace: Trace, kernels: pd.DataFrame) -> pd.DataFrame:
    """When each operation's last kernel ended, measured from the start of its iteration.

    Algorithm:
        1. Keep kernels with an iteration; the operation is the kernel's ``layer`` where it has one,
           else its ``cpu_op`` (kernels with neither are left out).
        2. End of an operation in an iteration = the latest end of its kernels.
        3. Subtract that iteration's ``ProfilerStep#N`` start on *this* rank: ranks on different nodes
           do not share a clock, so only times relative to each rank's own iteration start compare.

    Args:
        trace: One rank's trace.
        kernels: The hierarchy frame of ``trace`` (:func:`chopper.trace.hierarchy.build`).

    Returns:
        ``iteration``, ``op``, ``op_kind`` ("layer" or "cpu_op"), ``rank``, ``end_us`` (µs after the
        iteration start).
    """
    k = kernels[kernels["iteration"] >= 0]
    layer = k["layer"].notna().to_numpy()
    op = np.where(layer, k["layer"].to_numpy(dtype=object), k["cpu_op"].to_numpy(dtype=object))
    d = pd.DataFrame({"iteration": k["iteration"].to_numpy(), "op": op,
                      "op_kind": np.where(layer, "layer", "cpu_op"), "end_ns": k["end_ns"].to_numpy()})
    d = d[pd.notna(d["op"])]
    g = d.groupby(["iteration", "op", "op_kind"], sort=True)["end_ns"].max().reset_index()
    starts = iteration_starts(trace)
    rel = g["end_ns"].to_numpy(dtype=np.int64) - g["iteration"].map(starts).to_numpy(dtype=np.int64)
    return pd.DataFrame({"iteration": g["iteration"], "op": g["op"], "op_kind": g["op_kind"], "rank": trace.rank,
                         "end_us": rel / _US})


def leads(traces: list[Trace], kernels: list[pd.DataFrame]) -> pd.DataFrame:
    """Straggler lead of each rank on each (iteration, operation) that at least two ranks ran.

    Algorithm:
        1. :func:`op_end_times` on every rank.
        2. Keep (iteration, operation) pairs present on two or more ranks.
        3. Lead = a rank's relative end − the smallest relative end over ranks for that pair: how
           much later than the fastest rank it finished that operation, in µs (0 for the fastest).

    Args:
        traces: The ranks' traces.
        kernels: Their hierarchy frames, in the same order.

    Returns:
        :data:`LEAD_COLUMNS`, largest lead first; empty with fewer than two ranks.
    """
    if len(traces) < 2:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in LEAD_COLUMNS})
    d = pd.concat([op_end_times(t, k) for t, k in zip(traces, kernels, strict=True)], ignore_index=True)
    key = ["iteration", "op", "op_kind"]
    grp = d.groupby(key, sort=False)["end_us"]
    d = d[grp.transform("size").to_numpy() >= 2].copy()
    d["lead_us"] = d["end_us"] - d.groupby(key, sort=False)["end_us"].transform("min")
    return d.sort_values(["lead_us", "iteration", "op", "rank"], ascending=[False, True, True, True],
                         ignore_index=True)[list(LEAD_COLUMNS)]


def per_rank(lead: pd.DataFrame, slowest: int = 3) -> pd.DataFrame:
    """Mean and largest lead of each rank.

    Args:
        lead: Output of :func:`leads`.
        slowest: How many of each rank's largest-lead operations to name.

    Returns:
        :data:`RANK_COLUMNS` (µs), one row per rank; ``slowest_ops`` is a list of op names.
    """
    if lead.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in RANK_COLUMNS})
    rows = []
    for rank, d in lead.groupby("rank", sort=True):
        top = d.nlargest(slowest, "lead_us")
        rows.append({"rank": int(rank), "ops": len(d), "mean_lead_us": float(d["lead_us"].mean()),
                     "max_lead_us": float(d["lead_us"].max()), "slowest_ops": top["op"].tolist()})
    return pd.DataFrame(rows, columns=list(RANK_COLUMNS))
