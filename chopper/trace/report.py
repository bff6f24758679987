"""``chopper trace``: every kernel-level analysis of a job's traces, as one JSON document or text tables."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from chopper.trace.analyses import host, idle, kernel_types, launch, overlap, straggler, tables, temporal, top_kernels
from chopper.trace.hierarchy import build
from chopper.trace.reader import Trace

DEFAULT_TOP = 10


def _plain(obj: Any) -> Any:
    """numpy / pandas values → JSON types; NaN → None (JSON has no NaN)."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if isinstance(obj, pd.DataFrame):
        return _plain(obj.to_dict("records"))
    if isinstance(obj, np.integer | np.bool_):
        return obj.item()
    if isinstance(obj, float | np.floating):
        v = float(obj)
        return None if math.isnan(v) else v
    return obj


def launch_wait(idle_split: dict[str, float | int], span_us: float) -> dict[str, float]:
    """Time the GPU (all streams merged) sat idle waiting for the host to call a launch.

    It is the idle split's host-wait (:func:`chopper.trace.analyses.idle.split`), so it lies inside
    the kernel span and is never a sum over streams or kernels.

    Returns:
        ``gpu_wait_on_launch_us`` (µs) and ``gpu_wait_on_launch_pct`` (% of the kernel span).
    """
    wait = float(idle_split["host_wait_us"])
    return {"gpu_wait_on_launch_us": wait, "gpu_wait_on_launch_pct": 100.0 * wait / span_us if span_us else 0.0}


def analyze_rank(trace: Trace, kernels: pd.DataFrame, top: int = DEFAULT_TOP) -> dict[str, Any]:
    """All single-rank analyses of one trace.

    Args:
        trace: One rank's trace.
        kernels: Its hierarchy frame (:func:`chopper.trace.hierarchy.build`).
        top: Rows of the top-kernel and launch-by-op tables.

    Returns:
        The rank's entry of :func:`analyze` (µs throughout, shares in %).
    """
    kt = kernel_types.breakdown(trace)
    launches = launch.per_kernel(trace, kernels)
    host_view = host.summary(trace)
    tb = temporal.breakdown(trace)
    idle_split = idle.split(trace)
    return {
        "rank": trace.rank, "path": str(trace.path), "device_type": trace.device_type,
        "world_size": trace.world_size,
        **tb,
        "comm_comp_overlap_pct": overlap.comm_comp_overlap_pct(trace),
        "kernel_types": kt.times(),
        "kernel_types_pct": kt.percentages(),
        "top_kernels": top_kernels.top_kernels(kernels, top),
        "launch": {**launch.totals(launches), **launch_wait(idle_split, tb["kernel_time_us"])},
        "launch_by_op": launch.by_op(launches).head(top),
        "iterations": tables.per_iteration(kernels),
        "phases": tables.per_phase(kernels),
        "idle_split": idle_split,
        "idle_by_stream": idle.per_stream(trace),
        "host": {k: host_view[k] for k in ("threads", "sync_calls", "sync_blocked_us")},
        "memory_transfer_pct": host_view["memory_transfer_pct"],
        "memory_transfer": {k: host_view[k] for k in ("memory_us", "kernel_busy_us", "span_us",
                                                      "memory_transfer_pct", "memory_span_pct")},
        "warnings": list(trace.warnings),
    }


def analyze(traces: Sequence[Trace], top: int = DEFAULT_TOP) -> dict[str, Any]:
    """Every analysis of one job's traces (one per rank), JSON-ready.

    Algorithm:
        1. Build each rank's hierarchy once and run the single-rank analyses on it.
        2. With two or more ranks, add the cross-rank straggler lead: per rank ``straggler_lead_us``
           (mean lead), ``straggler_max_lead_us``, ``straggler_slowest_ops``; the largest leads in
           ``stragglers``.

    Args:
        traces: The ranks' traces (:func:`chopper.trace.load_traces`).
        top: Rows of each top-N table.

    Returns:
        ``{"ranks": [...], "stragglers": [...]}``; plain JSON types, NaN as None.
    """
    kernels = [build(t) for t in traces]
    ranks = [analyze_rank(t, k, top) for t, k in zip(traces, kernels, strict=True)]
    out: dict[str, Any] = {"ranks": ranks}
    if len(traces) >= 2:
        lead = straggler.leads(list(traces), kernels)
        by_rank = straggler.per_rank(lead).set_index("rank")
        for r in ranks:
            if r["rank"] in by_rank.index:
                row = by_rank.loc[r["rank"]]
                r["straggler_lead_us"] = float(row["mean_lead_us"])
                r["straggler_max_lead_us"] = float(row["max_lead_us"])
                r["straggler_slowest_ops"] = list(row["slowest_ops"])
        out["stragglers"] = lead.head(top)
    return _plain(out)


# --- text ---------------------------------------------------------------------------------------

Column = tuple[str, str, Callable[[Any], str]]


def _num(digits: int = 1) -> Callable[[Any], str]:
    return lambda v: "-" if v is None else f"{v:,.{digits}f}"


def _text(width: int) -> Callable[[Any], str]:
    return lambda v: (str(v) if len(str(v)) <= width else str(v)[: width - 1] + "…")


def _table(rows: list[dict[str, Any]], columns: Sequence[Column], indent: str = "    ") -> list[str]:
    """Fixed-width table: text columns left-aligned, numbers right-aligned."""
    cells = [[fmt(r.get(key)) for key, _, fmt in columns] for r in rows]
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, (_, h, _) in enumerate(columns)]
    numeric = [all(isinstance(r.get(key), int | float) or r.get(key) is None for r in rows) and bool(rows)
               for key, _, _ in columns]

    def line(vals: Sequence[str]) -> str:
        return indent + "  ".join(v.rjust(w) if n else v.ljust(w)
                                  for v, w, n in zip(vals, widths, numeric, strict=True)).rstrip()

    return [line([h for _, h, _ in columns]), *(line(c) for c in cells)]


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def format_text(result: dict[str, Any]) -> str:
    """Human rendering of :func:`analyze`: a block of fixed-width tables per rank.

    Args:
        result: Output of :func:`analyze`.

    Returns:
        The text, ending in a newline.
    """
    out: list[str] = []
    for r in result["ranks"]:
        span = r["kernel_time_us"]
        world = f", world size {r['world_size']}" if r.get("world_size") else ""
        overlap_txt = "-" if r["comm_comp_overlap_pct"] is None else f"{r['comm_comp_overlap_pct']:.2f}%"
        out += [f"rank {r['rank']}  {r['path']}  ({r['device_type']}{world})",
                f"  kernel span {span:,.1f} µs   idle {r['idle_time_us']:,.1f} µs ({_pct(r['idle_time_us'], span)})"
                f"   compute {r['compute_time_us']:,.1f} µs ({_pct(r['compute_time_us'], span)})"
                f"   non-compute {r['non_compute_time_us']:,.1f} µs ({_pct(r['non_compute_time_us'], span)})",
                f"  comm-comp overlap {overlap_txt}   memory transfer {r['memory_transfer_pct']:.1f}% of kernel time"
                f"   sync blocked {r['host']['sync_blocked_us']:,.1f} µs"]
        s = r["idle_split"]
        out.append(f"  idle split: host-wait {s['host_wait_us']:,.1f} µs ({s['host_wait_pct']:.1f}%)   kernel-wait "
                   f"{s['kernel_wait_us']:,.1f} µs ({s['kernel_wait_pct']:.1f}%)   unattributed "
                   f"{s['unattributed_us']:,.1f} µs   over {s['gaps']} gaps")
        la = r["launch"]
        out += [f"  GPU waited on launches {la['gpu_wait_on_launch_us']:,.1f} µs ({la['gpu_wait_on_launch_pct']:.1f}% "
                f"of the span)   CPU-late kernels {la['cpu_late_kernels']} of {la['kernels']}",
                f"  launch delay per kernel (start − end of its launch call): median "
                f"{la['launch_delay_median_us']:,.1f} µs, p95 {la['launch_delay_p95_us']:,.1f} µs, max "
                f"{la['launch_delay_max_us']:,.1f} µs"]
        if "straggler_lead_us" in r:
            out.append(f"  straggler lead: mean {r['straggler_lead_us']:,.1f} µs, max {r['straggler_max_lead_us']:,.1f}"
                       f" µs ({', '.join(map(str, r['straggler_slowest_ops']))})")
        out += ["", "  kernel types"]
        out += _table([{"kernel_type": k, "time_us": v, "pct": r["kernel_types_pct"][k]}
                       for k, v in r["kernel_types"].items()],
                      [("kernel_type", "combination", _text(40)), ("time_us", "time_us", _num()),
                       ("pct", "%", _num())])
        out += ["", "  top kernels"]
        out += _table(r["top_kernels"], [
            ("short_name", "kernel", _text(50)), ("kernel_type", "type", _text(13)), ("count", "count", str),
            ("total_us", "total_us", _num()), ("mean_us", "mean_us", _num()), ("share_pct", "share_%", _num())])
        out += ["", "  launch delay by CPU op (per kernel: start − end of its launch call)"]
        out += _table(r["launch_by_op"], [
            ("cpu_op", "cpu_op", _text(40)), ("kernels", "kernels", str), ("cpu_late_kernels", "cpu_late", str),
            ("launch_delay_median_us", "median_delay_us", _num()), ("launch_delay_p95_us", "p95_delay_us", _num()),
            ("launch_delay_max_us", "max_delay_us", _num())])
        out += ["", "  iterations"]
        out += _table(r["iterations"], [
            ("iteration", "iteration", str), ("kernels", "kernels", str), ("span_us", "span_us", _num()),
            ("kernel_us", "kernel_us", _num()), ("computation_us", "compute_us", _num()),
            ("communication_us", "comm_us", _num()), ("memory_us", "memory_us", _num()),
            ("idle_us", "idle_us", _num())])
        out += ["", "  phases"]
        out += _table(r["phases"], [("phase", "phase", str), ("kernels", "kernels", str),
                                    ("kernel_us", "kernel_us", _num()), ("share_pct", "share_%", _num())])
        out += ["", "  host threads"]
        out += _table(r["host"]["threads"], [
            ("tid", "tid", str), ("label", "label", str), ("cpu_ops", "cpu_ops", str),
            ("cpu_op_us", "cpu_op_us", _num()), ("sync_calls", "syncs", str), ("sync_us", "sync_us", _num())])
        out.append("")
    if result.get("stragglers"):
        out.append("largest straggler leads (end of op after the iteration start, minus the fastest rank's)")
        out += _table(result["stragglers"], [
            ("iteration", "iteration", str), ("op", "op", _text(50)), ("rank", "rank", str),
            ("end_us", "end_us", _num()), ("lead_us", "lead_us", _num())], indent="  ")
        out.append("")
    return "\n".join(out)
