"""The trace side of ``chopper report``: find a job's Kineto traces, read them with progress, and run
every trace analysis once into the frames the trace figures and tables draw from.

``analyze_traces`` does, in order:

1. read each file (``chopper.trace.load_trace``), one progress stage per file, and check that the
   set is one job (distinct ranks, one world size), as ``chopper.trace.load_traces`` does;
2. per rank, one progress stage: build the hierarchy and run the single-rank analyses (temporal
   breakdown, kernel-type breakdown, top kernels, comm–compute overlap and its per-kernel
   distribution, launch overhead, idle split, per-iteration table, host view);
3. with two or more ranks, one more stage: the cross-rank straggler lead.

All times are µs, shares %, as in ``chopper trace``.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from chopper.trace import Trace, check_one_job, load_trace
from chopper.trace.analyses import host, idle, kernel_types, launch, overlap, straggler, tables, temporal, top_kernels
from chopper.trace.analyses.temporal import gpu_activity, merge_intervals
from chopper.trace.classify import COMMUNICATION, COMPUTATION
from chopper.trace.hierarchy import build
from chopper.trace.report import launch_wait

_US = 1000.0
OVERLAP_COLUMNS: tuple[str, ...] = ("rank", "name", "start_ns", "end_ns", "dur_us", "overlapped_us", "fraction")

# (stage name): called before each stage; the caller counts the stages.
Stage = Callable[[str], None]


def comm_overlap_fractions(activity: pd.DataFrame) -> pd.DataFrame:
    """For every communication kernel, the fraction of its duration during which computation ran.

    Algorithm:
        1. ``activity`` is one rank's GPU activity as HTA selects it
           (:func:`chopper.trace.analyses.temporal.gpu_activity`): all streams, HTA classes.
        2. Merge the COMPUTATION intervals into a sorted disjoint union and take the running total
           of their lengths, so ``covered(t)`` (computation time before ``t``) is one
           ``searchsorted`` away.
        3. Each COMMUNICATION kernel ``[a, b)``: overlapped = covered(b) − covered(a);
           fraction = overlapped ÷ (b − a) (0 for a zero-length kernel).

    Weighted by duration, the fractions give HTA's comm–compute overlap % whenever communication
    kernels do not overlap one another; unweighted, their distribution shows whether overlap is
    spread over all collectives or concentrated in a few.

    Args:
        activity: Columns ``start_ns``, ``end_ns``, ``kernel_class``, ``name``.

    Returns:
        ``name``, ``start_ns``, ``end_ns``, ``dur_us``, ``overlapped_us`` (µs), ``fraction`` (0–1),
        one row per communication kernel in time order.
    """
    start = activity["start_ns"].to_numpy(np.int64)
    end = activity["end_ns"].to_numpy(np.int64)
    cls = activity["kernel_class"].to_numpy()
    ms, me = merge_intervals(start[cls == COMPUTATION], end[cls == COMPUTATION])
    lengths = me - ms
    before = np.concatenate(([0], np.cumsum(lengths)))  # computation time before each merged interval

    def covered(t: np.ndarray) -> np.ndarray:
        """Computation time in (-inf, t], ns."""
        if not len(ms):
            return np.zeros(len(t), dtype=np.int64)
        i = np.searchsorted(ms, t, side="right") - 1  # the last merged interval starting at or before t
        j = np.maximum(i, 0)
        return np.where(i >= 0, before[j] + np.clip(t - ms[j], 0, lengths[j]), 0)

    comm = cls == COMMUNICATION
    a, b = start[comm], end[comm]
    order = np.argsort(a, kind="stable")
    a, b = a[order], b[order]
    ov = covered(b) - covered(a)
    dur = b - a
    return pd.DataFrame({
        "name": activity["name"].to_numpy()[comm][order], "start_ns": a, "end_ns": b, "dur_us": dur / _US,
        "overlapped_us": ov / _US, "fraction": np.where(dur > 0, ov / np.where(dur > 0, dur, 1), 0.0),
    })


@dataclass
class TraceSet:
    """One job's traces and every analysis the report draws, one row per rank (or per rank and item).

    Attributes:
        traces: The traces, sorted by rank.
        ranks: Their ranks, in that order.
        temporal: ``rank`` + :func:`temporal.breakdown` (HTA idle / compute / non-compute, µs and %).
        kernel_types: ``rank``, ``kernel_type``, ``time_us``, ``percentage`` (exclusive combinations).
        top_kernels: ``rank`` + ``top_kernels.TOP_KERNEL_COLUMNS``, every kernel name.
        overlap_pct: HTA comm–compute overlap % per rank, None without communication.
        comm_overlap: ``rank`` + :func:`comm_overlap_fractions`.
        launch_by_op: ``rank`` + ``launch.BY_OP_COLUMNS`` (per-kernel launch delay: median, p95, max µs).
        launch_totals: ``rank`` + :func:`launch.totals` + ``chopper.trace.report.launch_wait`` (GPU
            time waiting on launches, µs and % of the kernel span).
        idle_split: ``rank`` + :func:`idle.split` (µs and % of idle).
        iterations: ``rank`` + ``tables.ITERATION_COLUMNS``.
        host: ``rank``, ``sync_blocked_us``, ``memory_transfer_pct``, ``memory_us``.
        stragglers: ``straggler.LEAD_COLUMNS`` (empty with one rank).
        kernels: Kernel count per rank.
    """

    traces: list[Trace]
    ranks: list[int]
    temporal: pd.DataFrame
    kernel_types: pd.DataFrame
    top_kernels: pd.DataFrame
    overlap_pct: dict[int, float | None]
    comm_overlap: pd.DataFrame
    launch_by_op: pd.DataFrame
    launch_totals: pd.DataFrame
    idle_split: pd.DataFrame
    iterations: pd.DataFrame
    host: pd.DataFrame
    stragglers: pd.DataFrame
    kernels: dict[int, int] = field(default_factory=dict)

    @property
    def warnings(self) -> list[str]:
        """What the reader could not link, per file."""
        return [f"rank {t.rank} ({t.path.name}): {w}" for t in self.traces for w in t.warnings]


def _with_rank(frame: pd.DataFrame, rank: int) -> pd.DataFrame:
    return frame.assign(rank=rank)[["rank", *frame.columns]]


def load(files: Sequence[Path], stage: Stage, require_gpu: bool = True) -> list[Trace]:
    """Read ``files`` (one progress stage each) and check they are one job; sorted by rank.

    Args:
        files: Trace files.
        stage: Called with the stage name before each file.
        require_gpu: Refuse CPU-only traces (``chopper.trace.load_trace``).

    Raises:
        TraceError: a file is bad (the message names it), or the set mixes jobs.
    """
    traces = []
    for f in files:
        stage(f"reading trace {f.name}")
        traces.append(load_trace(f, require_gpu))
    traces.sort(key=lambda t: t.rank)
    check_one_job(traces)
    return traces


def analyze_traces(traces: Sequence[Trace], stage: Stage) -> TraceSet:
    """Every analysis the trace figures draw: one stage per rank, plus the straggler lead with ≥2 ranks.

    Args:
        traces: One job's traces, sorted by rank (:func:`load`).
        stage: Called with the stage name before each stage.

    Returns:
        The :class:`TraceSet`.
    """
    parts: dict[str, list[pd.DataFrame]] = {k: [] for k in (
        "temporal", "kernel_types", "top_kernels", "comm_overlap", "launch_by_op", "launch_totals", "idle_split",
        "iterations", "host")}
    overlap_pct: dict[int, float | None] = {}
    hierarchies = []
    counts: dict[int, int] = {}
    for t in traces:
        stage(f"analyzing rank {t.rank}")
        k = build(t)
        hierarchies.append(k)
        counts[t.rank] = len(k)
        r = t.rank
        tb = temporal.breakdown(t)
        split = idle.split(t)
        parts["temporal"].append(pd.DataFrame([{"rank": r, **tb}]))
        parts["kernel_types"].append(_with_rank(kernel_types.breakdown(t).to_frame(), r))
        parts["top_kernels"].append(_with_rank(top_kernels.top_kernels(k, None), r))
        overlap_pct[r] = overlap.comm_comp_overlap_pct(t)
        parts["comm_overlap"].append(_with_rank(comm_overlap_fractions(gpu_activity(t)), r))
        launches = launch.per_kernel(t, k)
        parts["launch_by_op"].append(_with_rank(launch.by_op(launches), r))
        parts["launch_totals"].append(pd.DataFrame([{"rank": r, **launch.totals(launches),
                                                     **launch_wait(split, tb["kernel_time_us"])}]))
        parts["idle_split"].append(pd.DataFrame([{"rank": r, **split}]))
        parts["iterations"].append(_with_rank(tables.per_iteration(k), r))
        threads = host.threads(t)
        mem = host.memory_transfer(t)
        parts["host"].append(pd.DataFrame([{"rank": r, "sync_blocked_us": float(threads["sync_us"].sum()),
                                            "memory_transfer_pct": mem["memory_transfer_pct"],
                                            "memory_us": mem["memory_us"]}]))
    if len(traces) >= 2:
        stage("straggler lead across ranks")
        lead = straggler.leads(list(traces), hierarchies)
    else:
        lead = pd.DataFrame({c: pd.Series(dtype=object) for c in straggler.LEAD_COLUMNS})
    frames = {name: pd.concat(p, ignore_index=True) for name, p in parts.items()}
    return TraceSet(traces=list(traces), ranks=[t.rank for t in traces], overlap_pct=overlap_pct,
                    stragglers=lead, kernels=counts, **frames)
