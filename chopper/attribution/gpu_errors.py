"""Which health counters of a step's GPU moved during the step (flag ``gpu_errors``, docs/HEALTH.md).

Input: a recorded run's ``errors`` table (``chopper.schema.ERROR_COLUMNS``): per reading (a sample's
``ts_ns``) and GPU, the cumulative value of each counter ``(kind, window, detail)``. The rule is the
agent's (``agent.health``): between two consecutive readings of one counter at ``t0 < t1``, a value
that grew (a counter or gauge kind of ``ERROR_KINDS``; states do not grow) is an event in
``(t0, t1]``; a GPU's first reading is its baseline. A step ``[b, e]`` on that GPU is flagged when an
event's interval overlaps it (``t0 < e`` and ``t1 >= b``): the readings cannot tell when inside the
interval the error happened. Per step, the result is the sorted kinds that moved.

Cost: one sort of the errors table, and per event one comparison against the steps of its GPU.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from chopper.schema import ERROR_KINDS

_SERIES = ["node", "gpu", "kind", "window", "detail"]


def events(errors: pd.DataFrame) -> pd.DataFrame:
    """Every growth of a counter or gauge between two readings: node, gpu, kind, after_ns, at_ns."""
    growing = errors[errors["kind"].map(ERROR_KINDS.get).isin(("counter", "gauge"))]
    ordered = growing.sort_values([*_SERIES, "ts_ns"], kind="stable")
    series = ordered.groupby(_SERIES, sort=False)
    grew = series["value"].diff() > 0  # NaN (a series' first reading) is not growth
    after = series["ts_ns"].shift()
    out = ordered.assign(after_ns=after)[grew.to_numpy()]
    return out[["node", "gpu", "kind", "after_ns", "ts_ns"]].rename(columns={"ts_ns": "at_ns"}).astype(
        {"after_ns": np.int64})


def moved_kinds(steps: pd.DataFrame, errors: pd.DataFrame | None) -> list[tuple[str, ...]]:
    """Per row of ``steps`` (node, gpu, begin_ns, end_ns), the kinds of its GPU's counters that moved."""
    moved: list[set[str]] = [set() for _ in range(len(steps))]
    if errors is not None and not errors.empty and len(steps):
        begin = steps["begin_ns"].to_numpy(dtype=np.int64)
        end = steps["end_ns"].to_numpy(dtype=np.int64)
        by_gpu = steps.groupby([steps["node"].astype(str), steps["gpu"].astype(np.int64)], sort=False).indices
        for ev in events(errors).itertuples(index=False):
            idx = by_gpu.get((str(ev.node), int(ev.gpu)))
            if idx is None:
                continue
            for i in idx[(int(ev.after_ns) < end[idx]) & (int(ev.at_ns) >= begin[idx])]:
                moved[i].add(str(ev.kind))
    return [tuple(sorted(kinds)) for kinds in moved]
