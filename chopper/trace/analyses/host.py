"""Host side of one rank, as the Nsight Systems walkthrough reads it.

Per-thread time in CPU ops (main vs autograd thread), time blocked in synchronize calls, and the
share of GPU time spent on memory transfers.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from chopper.trace.analyses.temporal import gpu_activity, union_ns
from chopper.trace.classify import COMMUNICATION, COMPUTATION, MEMORY
from chopper.trace.reader import Trace

_US = 1000.0
# Runtime / driver calls that block the calling thread until the GPU catches up.
SYNC_PATTERN = re.compile(r"^(?:cuda|hip|cu)(?:Device|Stream|Event|Ctx)Synchronize|^(?:cuda|hip)ThreadSynchronize")
_STEP = re.compile(r"^ProfilerStep#\d+")
_AUTOGRAD = re.compile(r"^autograd::engine|Backward\d*$")
THREAD_COLUMNS: tuple[str, ...] = ("pid", "tid", "label", "cpu_ops", "cpu_op_us", "sync_calls", "sync_us")
SYNC_COLUMNS: tuple[str, ...] = ("name", "calls", "total_us", "mean_us", "max_us")


def _per_thread_union(frame: pd.DataFrame) -> pd.Series:
    # One vectorized union per thread; a rank has a handful of threads.
    return pd.Series({key: union_ns(d["ts_ns"].to_numpy(np.int64), d["end_ns"].to_numpy(np.int64))
                      for key, d in frame.groupby(["pid", "tid"], sort=True)}, dtype=np.int64)


def sync_calls(trace: Trace) -> pd.DataFrame:
    """Synchronize calls (cudaDeviceSynchronize, cudaStreamSynchronize, hipDeviceSynchronize, ...).

    Args:
        trace: One rank's trace.

    Returns:
        :data:`SYNC_COLUMNS` (µs), one row per call name, most time first.
    """
    rt = trace.runtime
    s = rt[rt["name"].astype(str).str.contains(SYNC_PATTERN)]
    g = s.groupby("name")["dur_ns"].agg(["size", "sum", "mean", "max"]).reset_index()
    out = pd.DataFrame({"name": g["name"], "calls": g["size"].astype(np.int64), "total_us": g["sum"] / _US,
                        "mean_us": g["mean"] / _US, "max_us": g["max"] / _US}, columns=list(SYNC_COLUMNS))
    return out.sort_values(["total_us", "name"], ascending=[False, True], ignore_index=True)


def threads(trace: Trace) -> pd.DataFrame:
    """Time each host thread spent in CPU ops and blocked in synchronize calls.

    Algorithm:
        1. CPU-op time of a thread = length of the union of its ``cpu_op`` ranges, which is the sum
           of its top-level ops (nested ops add nothing).
        2. Sync time = length of the union of its synchronize runtime calls (:data:`SYNC_PATTERN`).
        3. Label: "main" for threads holding ``ProfilerStep#N`` ranges (without any, the thread with
           the most CPU-op time); "autograd" for other threads running ``autograd::engine`` or
           ``*Backward`` ops (PyTorch runs backward on its own thread); else "other".

    Args:
        trace: One rank's trace.

    Returns:
        :data:`THREAD_COLUMNS` (µs), most CPU-op time first.
    """
    ops, rt = trace.cpu_ops, trace.runtime
    names = ops["name"].astype(str)
    is_op = (ops["cat"] == "cpu_op").to_numpy()
    keys = pd.MultiIndex.from_frame(pd.concat([ops[["pid", "tid"]], rt[["pid", "tid"]]]).drop_duplicates()
                                    .sort_values(["pid", "tid"]))
    busy = _per_thread_union(ops[is_op]).reindex(keys, fill_value=0)
    count = ops[is_op].groupby(["pid", "tid"]).size().reindex(keys, fill_value=0)
    syncs = rt[rt["name"].astype(str).str.contains(SYNC_PATTERN)]
    sync_ns = _per_thread_union(syncs).reindex(keys, fill_value=0)
    sync_n = syncs.groupby(["pid", "tid"]).size().reindex(keys, fill_value=0)
    main = set(map(tuple, ops.loc[names.str.match(_STEP.pattern).to_numpy(), ["pid", "tid"]].to_numpy().tolist()))
    if not main and len(busy):
        main = {tuple(busy.idxmax())}
    autograd = set(map(tuple, ops.loc[names.str.contains(_AUTOGRAD).to_numpy(), ["pid", "tid"]].to_numpy().tolist()))
    label = ["main" if k in main else "autograd" if k in autograd else "other" for k in keys]
    out = pd.DataFrame({
        "pid": keys.get_level_values(0).astype(np.int64), "tid": keys.get_level_values(1).astype(np.int64),
        "label": label, "cpu_ops": count.to_numpy(dtype=np.int64), "cpu_op_us": busy.to_numpy() / _US,
        "sync_calls": sync_n.to_numpy(dtype=np.int64), "sync_us": sync_ns.to_numpy() / _US,
    }, columns=list(THREAD_COLUMNS))
    return out.sort_values(["cpu_op_us", "tid"], ascending=[False, True], ignore_index=True)


def memory_transfer(trace: Trace) -> dict[str, float]:
    """Share of GPU time spent on memcpy / memset.

    Algorithm:
        1. Select GPU activity as the temporal breakdown does (HTA classes, rounding, ProfilerStep rule).
        2. Memory time = length of the union of MEMORY (memcpy / memset) intervals.
        3. Kernel time = length of the union of COMPUTATION, COMMUNICATION and MEMORY intervals: the
           total of HTA's kernel-type breakdown, so ``memory_transfer_pct`` is its "MEMORY" share
           when memory overlaps nothing (a100_alexnet: 83.9 %).
        4. Also the share of the kernel span (first start to last end, idle included).

    Args:
        trace: One rank's trace.

    Returns:
        ``memory_us``, ``kernel_busy_us``, ``span_us`` (µs), ``memory_transfer_pct`` (% of kernel
        time), ``memory_span_pct`` (% of the span).
    """
    act = gpu_activity(trace)
    start, end = act["start_ns"].to_numpy(np.int64), act["end_ns"].to_numpy(np.int64)
    cls = act["kernel_class"]
    mem = cls.eq(MEMORY).to_numpy()
    kern = cls.isin([COMPUTATION, COMMUNICATION, MEMORY]).to_numpy()
    memory, busy = union_ns(start[mem], end[mem]), union_ns(start[kern], end[kern])
    span = int(end.max() - start.min()) if len(act) else 0
    return {"memory_us": memory / _US, "kernel_busy_us": busy / _US, "span_us": span / _US,
            "memory_transfer_pct": 100.0 * memory / busy if busy else 0.0,
            "memory_span_pct": 100.0 * memory / span if span else 0.0}


def summary(trace: Trace) -> dict[str, object]:
    """Host view of one rank: threads, synchronize calls and memory-transfer share.

    Args:
        trace: One rank's trace.

    Returns:
        ``threads`` and ``sync_calls`` (lists of row dicts), ``sync_blocked_us`` (µs, summed over
        threads), and the keys of :func:`memory_transfer`.
    """
    th = threads(trace)
    return {"threads": th.to_dict("records"), "sync_calls": sync_calls(trace).to_dict("records"),
            "sync_blocked_us": float(th["sync_us"].sum()), **memory_transfer(trace)}
