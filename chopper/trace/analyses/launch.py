"""Launch overhead per kernel, split as the Chopper paper splits it: CPU-late and launch-to-start.

Per-kernel delays are summarized by their distribution (median, p95, max), never by their sum: a
sum over kernels counts every stream that waits at the same moment, so on a busy rank it exceeds the
trace span many times over. The time the GPU as a whole waited for launches is the idle split's
host-wait (:func:`chopper.trace.analyses.idle.split`), which is bounded by the span.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from chopper.trace.reader import Trace

_US = 1000.0
LAUNCH_COLUMNS: tuple[str, ...] = (
    "name", "device", "stream", "ts_ns", "end_ns", "launch_ts_ns", "launch_end_ns", "cpu_op",
    "cpu_late_us", "launch_to_start_us", "queue_us", "launch_latency_us", "launch_overhead_us",
)
BY_OP_COLUMNS: tuple[str, ...] = (
    "cpu_op", "kernels", "cpu_late_kernels", "launch_delay_median_us", "launch_delay_p95_us", "launch_delay_max_us",
)


def join_launch(runtime: pd.DataFrame,
                correlation: pd.Series | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start and end (ns) of the runtime call that launched each GPU event, by ``correlation``.

    Times stay int64: epoch nanoseconds (~1.7e18) do not fit a float64 exactly.

    Args:
        runtime: ``Trace.runtime``.
        correlation: Correlation ids of the GPU events (-1 where the trace has none).

    Returns:
        ``(launch_ts_ns, launch_end_ns, linked)``: int64 times (-1 where unlinked) and the mask of
        events whose correlation matches a runtime call.
    """
    rt = runtime[runtime["correlation"] >= 0].drop_duplicates("correlation").set_index("correlation")
    corr = pd.Series(np.asarray(correlation, dtype=np.int64))
    linked = corr.isin(rt.index).to_numpy() & (corr >= 0).to_numpy()
    ts = corr.map(rt["ts_ns"]).fillna(-1).to_numpy(dtype=np.int64)
    end = corr.map(rt["end_ns"]).fillna(-1).to_numpy(dtype=np.int64)
    return np.where(linked, ts, -1), np.where(linked, end, -1), linked


def per_kernel(trace: Trace, kernels: pd.DataFrame | None = None) -> pd.DataFrame:
    """CPU-late and launch-to-start time of every kernel.

    Algorithm:
        1. Join each kernel (memcpys and memsets too) to its launching runtime call by ``correlation``.
        2. Per (device, stream), sort by start; ``prev_end`` = the latest end of the kernels before
           it on that stream (a running maximum, so an overlapping pair cannot make it go back).
        3. CPU-late = max(0, launch start − prev_end): the stream had finished its previous work and
           sat idle because the host had not yet *called* the launch. 0 for a stream's first kernel.
        4. Launch-to-start = max(0, kernel start − launch end): queueing behind earlier work on the
           stream plus the launch latency itself. It is split further into latency = max(0, start −
           max(launch end, prev_end)) (the stream was free, the kernel still had not begun) and
           queue = launch-to-start − latency (the stream was still running earlier kernels).
        5. Launch overhead = CPU-late + launch-to-start. Kernels without a launch to link get NaN
           (and launch times of -1) and are left out of every sum.

    Args:
        trace: One rank's trace.
        kernels: The hierarchy frame of ``trace`` (adds ``cpu_op``); ``trace.kernels`` when None.

    Returns:
        :data:`LAUNCH_COLUMNS`, in the kernels' order; times in µs (``*_us``) or ns (``*_ns``).
    """
    k = trace.kernels if kernels is None else kernels
    launch_ts, launch_end, linked = join_launch(trace.runtime, k["correlation"])
    start = k["ts_ns"].to_numpy(dtype=np.int64)
    end = k["end_ns"].to_numpy(dtype=np.int64)
    order = np.lexsort((start, k["stream"].to_numpy(), k["device"].to_numpy()))
    dev_s, str_s = k["device"].to_numpy()[order], k["stream"].to_numpy()[order]
    new_stream = np.r_[True, (dev_s[1:] != dev_s[:-1]) | (str_s[1:] != str_s[:-1])]
    # Running max of ends within each stream: shift each stream by its own offset (int64, relative
    # to the first start) so that one cumulative maximum never carries across streams.
    base = int(start.min()) if len(start) else 0
    rel_end = end[order] - base
    offset = (np.cumsum(new_stream) - 1) * (int(rel_end.max(initial=0)) + 1)
    run_max = np.maximum.accumulate(rel_end + offset) - offset + base
    prev_end = np.empty(len(k), dtype=np.int64)
    prev_end[order] = np.r_[-1, run_max[:-1]]
    first = np.zeros(len(k), dtype=bool)
    first[order] = new_stream
    late_ns = np.where(first, 0, np.maximum(0, launch_ts - prev_end)).astype(np.float64)
    cpu_late = np.where(linked, late_ns, np.nan)
    to_start = np.where(linked, np.maximum(0, start - launch_end).astype(np.float64), np.nan)
    free_at = np.where(first, launch_end, np.maximum(launch_end, prev_end))
    latency = np.where(linked, np.maximum(0, start - free_at).astype(np.float64), np.nan)
    return pd.DataFrame({
        "name": k["name"].to_numpy(), "device": k["device"].to_numpy(), "stream": k["stream"].to_numpy(),
        "ts_ns": start, "end_ns": end, "launch_ts_ns": launch_ts, "launch_end_ns": launch_end,
        "cpu_op": k["cpu_op"].to_numpy() if "cpu_op" in k else np.full(len(k), None, dtype=object),
        "cpu_late_us": cpu_late / _US, "launch_to_start_us": to_start / _US,
        "queue_us": (to_start - latency) / _US, "launch_latency_us": latency / _US,
        "launch_overhead_us": (cpu_late + to_start) / _US,
    }, columns=list(LAUNCH_COLUMNS))


def _delay_stats(delay_us: pd.Series) -> dict[str, float]:
    """Median, 95th percentile and maximum of per-kernel launch delays (µs); 0 for no kernels."""
    v = delay_us.to_numpy(np.float64)
    if not len(v):
        return {"launch_delay_median_us": 0.0, "launch_delay_p95_us": 0.0, "launch_delay_max_us": 0.0}
    return {"launch_delay_median_us": float(np.median(v)), "launch_delay_p95_us": float(np.percentile(v, 95)),
            "launch_delay_max_us": float(v.max())}


def by_op(launches: pd.DataFrame) -> pd.DataFrame:
    """Launch delay per CPU op (the operation that launched the kernels), as a distribution.

    Algorithm:
        1. Keep kernels with a linked launch; kernels whose launch lies in no CPU op are grouped
           under "(no cpu_op)".
        2. Per op: kernel count, kernels that were CPU-late (their stream sat idle before the
           launch call began), and the median, 95th percentile and maximum launch delay
           (launch-to-start: kernel start − end of its launch call, µs).
        3. Sort by p95, then median, largest first: the ops whose kernels wait longest.

    Args:
        launches: Output of :func:`per_kernel`.

    Returns:
        :data:`BY_OP_COLUMNS` (µs).
    """
    d = launches[launches["launch_overhead_us"].notna()].copy()
    d["cpu_op"] = d["cpu_op"].fillna("(no cpu_op)")
    rows = [{"cpu_op": op, "kernels": len(g), "cpu_late_kernels": int((g["cpu_late_us"] > 0).sum()),
             **_delay_stats(g["launch_to_start_us"])}
            for op, g in d.groupby("cpu_op", sort=False)]
    out = pd.DataFrame(rows, columns=list(BY_OP_COLUMNS))
    return out.sort_values(["launch_delay_p95_us", "launch_delay_median_us", "cpu_op"],
                           ascending=[False, False, True], ignore_index=True)


def totals(launches: pd.DataFrame) -> dict[str, float | int]:
    """Rank summary of :func:`per_kernel`: how long a kernel typically waits after its launch call.

    Args:
        launches: Output of :func:`per_kernel`.

    Returns:
        ``kernels`` (linked), ``unlinked_kernels``, ``cpu_late_kernels`` (kernels that found their
        stream idle when the launch call began), and per kernel ``launch_delay_median_us``,
        ``launch_delay_p95_us``, ``launch_delay_max_us`` (launch-to-start, µs), plus
        ``cpu_late_median_us`` over the CPU-late kernels (µs the stream sat idle before the call).
    """
    linked = launches["launch_overhead_us"].notna()
    d = launches[linked]
    late = d.loc[d["cpu_late_us"] > 0, "cpu_late_us"]
    return {
        "kernels": int(linked.sum()),
        "unlinked_kernels": int((~linked).sum()),
        "cpu_late_kernels": len(late),
        **_delay_stats(d["launch_to_start_us"]),
        "cpu_late_median_us": float(late.median()) if len(late) else 0.0,
    }
