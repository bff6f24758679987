"""From marker rows to step windows and the phase and collective intervals inside them.

Algorithm:

1. Steps: for each ``(job, rank, step)`` the first ``step_begin`` and the first ``step_end``
   after it make the window ``[b, e]``; FLOPs and tokens come from the ``step_end``. A step with
   only one of the two, or with ``e < b``, is skipped and reported in ``problems``.
2. Phases and collectives: per ``(job, rank, kind, name, step)`` in time order, the k-th begin
   pairs with the k-th end (FIFO). Pairing within a step keeps one lost marker from shifting
   every later pair of that name. Unpaired ends or begins are skipped and reported.
3. Each interval belongs to the step its markers name and is clipped to that step's window.

Everything is vectorised with pandas; the output frames are sorted by ``(job, rank, step)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

STEP_KEY = ["job", "rank", "step"]


@dataclass
class MarkerTables:
    """Step windows and intervals of one run.

    Attributes:
        steps: One row per step: job, rank, step, node, gpu, begin_ns, end_ns, flops, tokens.
        intervals: One row per phase or collective: job, rank, step, is_collective, name,
            begin_ns, end_ns (clipped to the step window).
        problems: Human-readable descriptions of markers that could not be paired.
    """

    steps: pd.DataFrame
    intervals: pd.DataFrame
    problems: list[str] = field(default_factory=list)


def _describe(rows: pd.DataFrame, what: str) -> list[str]:
    """One line per (job, rank): how many markers of a kind were skipped, and the first steps."""
    out = []
    for (job, rank), group in rows.groupby(["job", "rank"], sort=True):
        steps = sorted(set(group["step"].tolist()))
        where = ", ".join(map(str, steps[:5])) + (", ..." if len(steps) > 5 else "")
        out.append(f"job {job!r} rank {rank}: {len(group)} {what} (steps {where}); skipped")
    return out


def step_windows(markers: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Pair step_begin/step_end into windows (see the module docstring, step 1)."""
    problems: list[str] = []
    begins = markers[markers["kind"] == "step_begin"]
    ends = markers[markers["kind"] == "step_end"]
    first_begin = begins.sort_values("ts_ns").drop_duplicates(STEP_KEY, keep="first")
    first_end = ends.sort_values("ts_ns").drop_duplicates(STEP_KEY, keep="first")
    merged = first_begin[[*STEP_KEY, "node", "gpu", "ts_ns"]].merge(
        first_end[[*STEP_KEY, "ts_ns", "flops", "tokens"]], on=STEP_KEY, how="outer",
        suffixes=("_begin", "_end"), indicator=True,
    )
    no_end = merged[merged["_merge"] == "left_only"]
    no_begin = merged[merged["_merge"] == "right_only"]
    problems += _describe(no_end, "step_begin markers without a step_end")
    problems += _describe(no_begin, "step_end markers without a step_begin")
    both = merged[merged["_merge"] == "both"]
    backwards = both[both["ts_ns_end"] < both["ts_ns_begin"]]
    problems += _describe(backwards, "steps that end before they begin")
    duplicated = len(begins) - len(first_begin) + len(ends) - len(first_end)
    if duplicated:
        problems.append(f"{duplicated} repeated step_begin/step_end markers for the same step; the first was used")
    good = both[both["ts_ns_end"] >= both["ts_ns_begin"]]
    steps = pd.DataFrame({
        "job": good["job"].to_numpy(), "rank": good["rank"].to_numpy(dtype=np.int64),
        "step": good["step"].to_numpy(dtype=np.int64), "node": good["node"].to_numpy(),
        "gpu": good["gpu"].to_numpy(dtype=np.int64), "begin_ns": good["ts_ns_begin"].to_numpy(dtype=np.int64),
        "end_ns": good["ts_ns_end"].to_numpy(dtype=np.int64), "flops": good["flops"].to_numpy(dtype=np.float64),
        "tokens": good["tokens"].to_numpy(dtype=np.float64),
    })
    return steps.sort_values(STEP_KEY, ignore_index=True), problems


def paired_intervals(markers: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Pair phase and collective begin/end markers FIFO per (job, rank, kind, name, step)."""
    problems: list[str] = []
    kinds = markers["kind"]
    span = markers[kinds.isin(("phase_begin", "phase_end", "collective_begin", "collective_end"))].copy()
    span["is_collective"] = span["kind"].str.startswith("collective")
    span["is_begin"] = span["kind"].str.endswith("_begin")
    span = span.sort_values("ts_ns", kind="stable")
    key = ["job", "rank", "is_collective", "name", "step"]
    span["nth"] = span.groupby([*key, "is_begin"], sort=False).cumcount()
    begin = span[span["is_begin"]]
    end = span[~span["is_begin"]]
    merged = begin[[*key, "nth", "ts_ns"]].merge(
        end[[*key, "nth", "ts_ns"]], on=[*key, "nth"], how="outer", suffixes=("_begin", "_end"), indicator=True
    )
    problems += _describe(merged[merged["_merge"] == "left_only"], "phase/collective begins without an end")
    problems += _describe(merged[merged["_merge"] == "right_only"], "phase/collective ends without a begin")
    both = merged[(merged["_merge"] == "both") & (merged["ts_ns_end"] >= merged["ts_ns_begin"])]
    intervals = pd.DataFrame({
        "job": both["job"].to_numpy(), "rank": both["rank"].to_numpy(dtype=np.int64),
        "step": both["step"].to_numpy(dtype=np.int64), "is_collective": both["is_collective"].to_numpy(dtype=bool),
        "name": both["name"].to_numpy(dtype=object), "begin_ns": both["ts_ns_begin"].to_numpy(dtype=np.int64),
        "end_ns": both["ts_ns_end"].to_numpy(dtype=np.int64),
    })
    return intervals, problems


def marker_tables(markers: pd.DataFrame) -> MarkerTables:
    """Steps and their clipped intervals (module docstring, steps 1-3)."""
    steps, problems = step_windows(markers)
    intervals, more = paired_intervals(markers)
    inside = intervals.merge(steps[[*STEP_KEY, "begin_ns", "end_ns"]], on=STEP_KEY, suffixes=("", "_step"))
    inside["begin_ns"] = np.maximum(inside["begin_ns"], inside["begin_ns_step"])
    inside["end_ns"] = np.minimum(inside["end_ns"], inside["end_ns_step"])
    inside = inside[inside["end_ns"] > inside["begin_ns"]]
    return MarkerTables(steps, inside[["job", "rank", "step", "is_collective", "name", "begin_ns", "end_ns"]],
                        problems + more)
