"""Render an ``Attribution`` for people (a fixed-width table) and for programs (JSON).

JSON shape (``chopper attribute --json``)::

    {"steps": [{"job", "rank", "step", "node", "gpu", "step_time_s", "ideal_s",
                "matrix_util_loss_s", "dvfs_loss_s", "dvfs_by_cause": {"power", "thermal",
                "current", "other", "unattributed"}, "exposed_comm_s", "straggler_wait_s",
                "idle_s", "mfu", "busy_ratio", "matrix_ratio", "mean_gfx_clock_mhz",
                "min_gfx_clock_mhz", "max_temp_c", "energy_j", "tokens_per_s", "tokens_per_j",
                "flags": [...], "phase_s": {"forward": 0.012, ...},
                "collectives": {"source", "collective_s", "bytes", "inspector_s",
                                "inspector_bytes", "inspector_count", "disagreement_s"},
                "links": {"tx_bytes", "rx_bytes"}}, ...],
     "summary": {"jobs": [...per job totals...], "ranks": [...per rank totals...],
                 "stragglers": [...slowest rank per step...], "problems": [...]}}

Unknown values (NaN) are ``null``. Totals are sums of seconds; ``mfu`` of a total is
``Σ ideal / Σ step time`` over the steps whose ideal time is known. ``phase_s`` of a step maps
each phase name to the union of its windows in the step, s (phases may nest, so they need not
add up to the step time); of a total, the sum over its steps. ``collectives`` (runs, not the
aggregator's store) says where the step's collectives came from (``columns.COLLECTIVE_COLUMNS``):
``source`` is ``markers``, ``inspector`` or ``none``. ``links`` (runs) holds the NVLink / XGMI
bytes of the step's GPU over the step window, all links (``columns.LINK_COLUMNS``).
"""
from __future__ import annotations

import math
from typing import Any

import pandas as pd

from chopper.attribution.columns import COLLECTIVE_COLUMNS, DVFS_CAUSES
from chopper.attribution.model import Attribution

TERMS = ("step_time_s", "ideal_s", "matrix_util_loss_s", "dvfs_loss_s", "exposed_comm_s", "straggler_wait_s", "idle_s")
# JSON names of columns.COLLECTIVE_COLUMNS inside a step's "collectives".
COLLECTIVE_KEYS = dict(zip(COLLECTIVE_COLUMNS, ("source", "collective_s", "bytes", "inspector_s", "inspector_bytes",
                                                "inspector_count", "disagreement_s"), strict=True))
# How the table names each collective source.
SOURCE_WORDS = (("markers", "the markers"), ("inspector", "the Inspector"), ("none", "no collective"))
EXTRA = ("node", "gpu", "busy_ratio", "matrix_ratio", "mean_gfx_clock_mhz", "min_gfx_clock_mhz", "max_temp_c",
         "energy_j", "flops", "tokens", "tokens_per_s", "tokens_per_j")


def _clean(value: Any) -> Any:
    """JSON-safe scalar: numpy types to Python, NaN to None."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _totals(group: pd.DataFrame) -> dict[str, Any]:
    known = group[group["ideal_s"].notna()]
    out: dict[str, Any] = {"steps": len(group)}
    for term in (*TERMS, *(f"dvfs_{c}_s" for c in DVFS_CAUSES), "energy_j", "tokens"):
        out[term] = _clean(group[term].sum(min_count=1))
    time_known = known["step_time_s"].sum()
    out["mfu"] = _clean(known["ideal_s"].sum() / time_known) if time_known > 0 else None
    out["mean_step_time_s"] = _clean(group["step_time_s"].mean())
    out["flagged_steps"] = int((group["flags"].map(len) > 0).sum())
    out["phase_s"] = phase_totals(group["phase_s"])
    return out


def phase_totals(per_step: pd.Series) -> dict[str, float]:
    """Seconds by phase name summed over steps, names sorted."""
    totals: dict[str, float] = {}
    for times in per_step:
        for name, seconds in times.items():
            totals[name] = totals.get(name, 0.0) + seconds
    return dict(sorted(totals.items()))


def summary(result: Attribution) -> dict[str, Any]:
    """Per-job and per-rank totals, the slowest rank of every step, and marker problems."""
    steps = result.steps
    jobs = [{"job": job, **_totals(g)} for job, g in steps.groupby("job", sort=True)]
    ranks = [{"job": job, "rank": int(rank), **_totals(g)} for (job, rank), g in steps.groupby(["job", "rank"],
                                                                                                sort=True)]
    stragglers = [{k: _clean(v) for k, v in row.items()} for row in result.stragglers.to_dict("records")]
    return {"jobs": jobs, "ranks": ranks, "stragglers": stragglers, "problems": list(result.problems)}


def to_json(result: Attribution) -> dict[str, Any]:
    """The ``--json`` document (module docstring)."""
    rows = []
    for row in result.steps.to_dict("records"):
        item = {"job": row["job"], "rank": int(row["rank"]), "step": int(row["step"])}
        item.update({t: _clean(row[t]) for t in TERMS})
        item["dvfs_by_cause"] = {c: _clean(row[f"dvfs_{c}_s"]) for c in DVFS_CAUSES}
        item["mfu"] = _clean(row["mfu"])
        item.update({k: _clean(row[k]) for k in EXTRA})
        item["flags"] = list(row["flags"])
        item["phase_s"] = dict(row["phase_s"])
        if "collective_source" in row:
            item["collectives"] = {key: _clean(row[column]) for column, key in COLLECTIVE_KEYS.items()}
        if "link_tx_bytes" in row:
            item["links"] = {"tx_bytes": _clean(row["link_tx_bytes"]), "rx_bytes": _clean(row["link_rx_bytes"])}
        if "gpu_errors" in row:
            item["gpu_errors"] = list(row["gpu_errors"])
        rows.append(item)
    return {"steps": rows, "summary": summary(result)}


TABLE = (
    ("job", "{:<10.10}", 10), ("rank", "{:>4}", 4), ("step", "{:>6}", 6), ("step_ms", "{:>8.1f}", 8),
    ("ideal", "{:>7.1f}", 7), ("matrix", "{:>7.1f}", 7), ("dvfs", "{:>7.1f}", 7), ("comm", "{:>7.1f}", 7),
    ("wait", "{:>7.1f}", 7), ("idle", "{:>7.1f}", 7), ("mfu%", "{:>5.1f}", 5), ("clk_MHz", "{:>7.0f}", 7),
    ("flags", "{}", 0),
)


def _collective_line(steps: pd.DataFrame) -> str:
    """Where one job's collectives came from, and how far the markers and the Inspector disagree."""
    counts = steps["collective_source"].value_counts()
    line = "  collectives: " + ", ".join(f"{counts[source]} rank-steps from {words}"
                                         for source, words in SOURCE_WORDS if source in counts)
    disagreement = steps["collective_disagreement_s"].dropna()
    if len(disagreement):
        line += (f"; markers and Inspector differ by {1e3 * disagreement.mean():.1f} ms per rank-step "
                 f"(mean of {len(disagreement)})")
    return line


def _gpu_errors_line(steps: pd.DataFrame) -> list[str]:
    """One job's rank-steps whose GPU's health counters moved, with the kinds and ranks; none: no line."""
    flagged = steps[steps["gpu_errors"].map(bool)]
    if flagged.empty:
        return []
    kinds = sorted({k for ks in flagged["gpu_errors"] for k in ks})
    ranks = " ".join(str(r) for r in sorted(flagged["rank"].unique()))
    return [f"  GPU errors during {len(flagged)} rank-steps (flag gpu_errors): {', '.join(kinds)}; ranks {ranks}"]


def format_table(result: Attribution) -> str:
    """Per-step table (milliseconds per term), then per-job totals, stragglers and problems."""
    head = " ".join(f"{name:<{w}}" if i == 0 else f"{name:>{w}}" for i, (name, _, w) in enumerate(TABLE))
    lines = [head]
    for r in result.steps.itertuples(index=False):
        values = (r.job, r.rank, r.step, r.step_time_s * 1e3, r.ideal_s * 1e3, r.matrix_util_loss_s * 1e3,
                  r.dvfs_loss_s * 1e3, r.exposed_comm_s * 1e3, r.straggler_wait_s * 1e3, r.idle_s * 1e3,
                  r.mfu * 100, r.mean_gfx_clock_mhz, ",".join(r.flags))
        cells = [("-".rjust(w) if isinstance(v, float) and math.isnan(v) else fmt.format(v))
                 for (_, fmt, w), v in zip(TABLE, values, strict=True)]
        lines.append(" ".join(cells).rstrip())
    info = summary(result)
    for job in info["jobs"]:
        t = job["step_time_s"] or 0.0
        shares = ", ".join(
            f"{name} {100 * (job[key] or 0.0) / t:.1f}%" for name, key in (
                ("ideal", "ideal_s"), ("matrix", "matrix_util_loss_s"), ("dvfs", "dvfs_loss_s"),
                ("comm", "exposed_comm_s"), ("wait", "straggler_wait_s"), ("idle", "idle_s"))
        ) if t > 0 else "no time"
        mfu = f"{100 * job['mfu']:.1f}%" if job["mfu"] is not None else "unknown"
        lines.append(f"\njob {job['job']}: {job['steps']} rank-steps, {t:.3f} s, MFU {mfu}; {shares}")
        causes = ", ".join(f"{c} {1e3 * (job[f'dvfs_{c}_s'] or 0.0):.1f} ms" for c in DVFS_CAUSES)
        lines.append(f"  dvfs by cause: {causes}")
        if job["phase_s"]:
            per_step = ", ".join(f"{name} {1e3 * seconds / job['steps']:.1f} ms"
                                 for name, seconds in job["phase_s"].items())
            lines.append(f"  phases, mean per rank-step: {per_step}")
        if "collective_source" in result.steps:
            lines.append(_collective_line(result.steps[result.steps["job"] == job["job"]]))
        if "gpu_errors" in result.steps:
            lines += _gpu_errors_line(result.steps[result.steps["job"] == job["job"]])
    slow = result.stragglers
    if len(slow):
        worst = slow.sort_values("compute_excess_s", ascending=False).head(5)
        lines.append("\nslowest ranks (largest compute excess over the job median):")
        for s in worst.itertuples(index=False):
            lines.append(
                f"  job {s.job} step {s.step}: rank {s.rank} (node {s.node} gpu {s.gpu})"
                f" +{1e3 * s.compute_excess_s:.1f} ms compute, clock {s.mean_gfx_clock_mhz:.0f}"
                f" vs median {s.job_median_gfx_clock_mhz:.0f} MHz,"
                f" max {s.max_temp_c:.0f} C, cause {s.cause}"
                + (f", GPU errors {','.join(s.gpu_errors)}" if getattr(s, "gpu_errors", ()) else "")
            )
    if result.problems:
        lines.append("\nmarkers and Inspector records not used:")
        lines += [f"  {p}" for p in result.problems]
    return "\n".join(lines)
