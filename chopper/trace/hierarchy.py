"""Kernel → runtime launch → CPU op → layer → phase → iteration → rank, as columns of one frame.

Pure pandas / numpy. Containment ("the innermost range on the launching thread that contains the
launch") is answered for all kernels at once by :func:`innermost_containing`.
"""
from __future__ import annotations

import itertools
import re

import numpy as np
import pandas as pd

from chopper.trace.classify import classify_names
from chopper.trace.reader import Trace

HIERARCHY_COLUMNS: tuple[str, ...] = (
    "kernel_class", "kernel_type", "cpu_op", "layer", "phase", "iteration", "launch_ts_ns", "launch_thread", "rank",
)
PHASES: tuple[str, ...] = ("forward", "backward", "optimizer", "unknown")

_STEP = re.compile(r"^ProfilerStep#(\d+)")
_OPTIMIZER = re.compile(r"^Optimizer\.|optimizer", re.IGNORECASE)
_BACKWARD = re.compile(r"^autograd::engine|Backward\d*$")


def _parents(start: list[int], end: list[int], group: list[int]) -> np.ndarray:
    """Enclosing interval of each interval, for intervals sorted by (group, start, -end).

    A stack walk: pop ranges that end before the current one ends (they cannot contain it); what
    remains on top is the innermost container.
    """
    parent = np.full(len(start), -1, dtype=np.int64)
    stack: list[int] = []
    prev = None
    for i in range(len(start)):
        if group[i] != prev:
            stack, prev = [], group[i]
        while stack and end[stack[-1]] < end[i]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent


def innermost_containing(iv_start: np.ndarray, iv_end: np.ndarray, iv_group: np.ndarray,
                         q_start: np.ndarray, q_end: np.ndarray, q_group: np.ndarray) -> np.ndarray:
    """For each query interval, the innermost interval of its group that contains it.

    Algorithm:
        1. Sort intervals by (group, start, longest first) and find each one's enclosing interval
           with a stack (nesting: innermost = latest-starting container).
        2. Per group, ``searchsorted`` gives the latest interval starting at or before each query.
        3. While that candidate ends before the query ends, replace it by its parent; every step
           moves one nesting level out, so this runs at most "nesting depth" vectorized rounds.

    Args:
        iv_start: Interval starts (ns).
        iv_end: Interval ends (ns).
        iv_group: Interval group (thread code); containment only within one group.
        q_start: Query starts (ns).
        q_end: Query ends (ns).
        q_group: Query groups.

    Returns:
        For each query, the position (in the input order) of the innermost containing interval, or -1.
    """
    iv_start, iv_end, iv_group = (np.asarray(a, dtype=np.int64) for a in (iv_start, iv_end, iv_group))
    q_start, q_end, q_group = (np.asarray(a, dtype=np.int64) for a in (q_start, q_end, q_group))
    result = np.full(len(q_start), -1, dtype=np.int64)
    if len(iv_start) == 0 or len(q_start) == 0:
        return result
    order = np.lexsort((-iv_end, iv_start, iv_group))
    s, e, g = iv_start[order], iv_end[order], iv_group[order]
    parent = _parents(s.tolist(), e.tolist(), g.tolist())
    bounds = np.flatnonzero(np.r_[True, g[1:] != g[:-1], True])
    for lo, hi in itertools.pairwise(bounds):
        qi = np.flatnonzero(q_group == g[lo])
        if len(qi) == 0:
            continue
        cand = np.searchsorted(s[lo:hi], q_start[qi], side="right") - 1 + lo
        cand[cand < lo] = -1
        while True:
            live = cand >= 0
            bad = np.zeros(len(cand), dtype=bool)
            bad[live] = e[cand[live]] < q_end[qi][live]
            if not bad.any():
                break
            cand[bad] = parent[cand[bad]]
        result[qi] = np.where(cand >= 0, order[np.maximum(cand, 0)], -1)
    return result


def _thread_codes(*pairs: tuple[np.ndarray, np.ndarray]) -> list[np.ndarray]:
    """One int code per (pid, tid), consistent across the given frames."""
    pid = np.concatenate([np.asarray(p, dtype=np.int64) for p, _ in pairs])
    tid = np.concatenate([np.asarray(t, dtype=np.int64) for _, t in pairs])
    codes, _ = pd.factorize(pd.MultiIndex.from_arrays([pid, tid]))
    out, at = [], 0
    for p, _ in pairs:
        out.append(codes[at:at + len(p)])
        at += len(p)
    return out


def _name_at(names: pd.Series, idx: np.ndarray) -> np.ndarray:
    table = np.array([*names.to_numpy(dtype=object), None], dtype=object)
    return table[np.where(idx >= 0, idx, len(table) - 1)]


def build(trace: Trace) -> pd.DataFrame:
    """Kernels of one rank with their place in the hierarchy.

    Algorithm:
        1. Class each kernel by name (HTA three-way ``kernel_class`` and finer ``kernel_type``).
        2. Join the launching runtime call by ``correlation``: ``launch_ts_ns``, ``launch_thread``.
        3. ``cpu_op``: innermost ``cpu_op`` on the launching (pid, tid) containing the runtime call.
        4. ``layer``: innermost ``user_annotation`` (record_function; not ProfilerStep, not the
           optimizer) or ``nn.Module:`` range on that thread containing the runtime call.
        5. ``phase``: "optimizer" inside an ``Optimizer.step`` / optimizer range; else "backward" when
           inside an ``autograd::engine`` / ``*Backward`` op or an op a ``fwdbwd`` flow ends on (the
           autograd thread); else "forward"; "unknown" without a launch to link.
        6. ``iteration``: N of the ``ProfilerStep#N`` whose interval contains the launch start (any
           thread: backward launches run on the autograd thread, outside the step's own thread), -1 if none.

    Args:
        trace: One rank's trace.

    Returns:
        ``trace.kernels`` with :data:`HIERARCHY_COLUMNS` added (launch_ts_ns, launch_thread and
        iteration are -1 where unknown; cpu_op and layer None).
    """
    k = trace.kernels.copy()
    k["kernel_class"], k["kernel_type"] = classify_names(k["name"])
    rt = trace.runtime[trace.runtime["correlation"] >= 0].drop_duplicates("correlation").set_index("correlation")
    corr = k["correlation"]
    linked = corr.isin(rt.index).to_numpy() & (corr >= 0).to_numpy()
    lk = rt.reindex(corr.where(linked, -10**18).to_numpy())
    l_ts = lk["ts_ns"].fillna(-1).to_numpy(dtype=np.int64)
    l_end = lk["end_ns"].fillna(-1).to_numpy(dtype=np.int64)
    l_pid = lk["pid"].fillna(-1).to_numpy(dtype=np.int64)
    l_tid = lk["tid"].fillna(-1).to_numpy(dtype=np.int64)
    ops = trace.cpu_ops
    op_thread, q_thread = _thread_codes((ops["pid"].to_numpy(), ops["tid"].to_numpy()), (l_pid, l_tid))
    q_thread = np.where(linked, q_thread, -1)  # never matches a real thread

    def innermost(mask: np.ndarray, q_s: np.ndarray = l_ts, q_e: np.ndarray = l_end,
                  q_g: np.ndarray = q_thread, iv_g: np.ndarray = op_thread) -> np.ndarray:
        sel = np.flatnonzero(mask)
        hit = innermost_containing(ops["ts_ns"].to_numpy()[sel], ops["end_ns"].to_numpy()[sel], iv_g[sel],
                                   q_s, q_e, q_g)
        if len(sel) == 0:
            return hit
        return np.where(hit >= 0, sel[np.maximum(hit, 0)], -1)

    cat = ops["cat"].to_numpy(dtype=object)
    # Each distinct op name is matched once (a trace repeats a few hundred names millions of times).
    codes, distinct = pd.factorize(ops["name"].astype(str), use_na_sentinel=False)
    distinct = pd.Series(distinct, dtype=object)
    is_step = distinct.str.match(_STEP.pattern).to_numpy(dtype=bool)[codes]
    is_opt = distinct.str.contains(_OPTIMIZER).to_numpy(dtype=bool)[codes]
    is_module = distinct.str.startswith("nn.Module:").to_numpy(dtype=bool)[codes]
    is_layer = ((cat == "user_annotation") & ~is_step & ~is_opt) | is_module
    k["cpu_op"] = _name_at(ops["name"], innermost(cat == "cpu_op"))
    k["layer"] = _name_at(ops["name"], innermost(is_layer))

    fl = trace.flows
    bwd_ends = fl[(fl["cat"] == "fwdbwd") & (fl["phase"] == "f")]
    bwd_keys = set(zip(bwd_ends["pid"], bwd_ends["tid"], bwd_ends["ts_ns"], strict=True))
    flow_bwd = np.array([key in bwd_keys for key in zip(ops["pid"], ops["tid"], ops["ts_ns"], strict=True)],
                        dtype=bool) if bwd_keys else np.zeros(len(ops), dtype=bool)
    in_opt = innermost(is_opt) >= 0
    in_bwd = innermost(distinct.str.contains(_BACKWARD).to_numpy(dtype=bool)[codes] | flow_bwd) >= 0
    k["phase"] = np.where(~linked, "unknown", np.where(in_opt, "optimizer", np.where(in_bwd, "backward", "forward")))

    step_idx = innermost(is_step, q_s=l_ts, q_e=l_ts, q_g=np.where(linked, 0, -1), iv_g=np.zeros(len(ops), np.int64))
    step_of_name = pd.to_numeric(distinct.str.extract(_STEP)[0], errors="coerce").fillna(-1)
    step_no = step_of_name.to_numpy(dtype=np.int64)[codes]
    # A trace without CPU ops has no ProfilerStep to look up: every kernel is outside any iteration.
    k["iteration"] = np.where(step_idx >= 0, step_no[np.maximum(step_idx, 0)], -1) if step_no.size else -1
    k["launch_ts_ns"] = l_ts
    k["launch_thread"] = l_tid
    k["rank"] = trace.rank
    return k
