"""From marker rows to step windows and the phase and collective intervals inside them.

Algorithm:

1. Steps: for each ``(job, rank, step)`` the first ``step_begin`` and the first ``step_end``
   after it make the window ``[b, e]``; FLOPs and tokens come from the ``step_end``. A step with
   only one of the two, or with ``e < b``, is skipped and reported in ``problems``.
2. Phases and collectives: per ``(job, rank, kind, name, step)`` in time order, the k-th begin
   pairs with the k-th end (FIFO). Pairing within a step keeps one lost marker from shifting
   every later pair of that name. Unpaired ends or begins are skipped and reported.
3. Each interval belongs to the step its markers name and is clipped to that step's window. A
   collective's bytes are its begin marker's, else its end marker's (the client sends them on both).

Inspector collectives (the run's ``collectives`` table) are placed on the same step windows
(``inspector_intervals``):

4. A record names its rank by ``(job, rank)``. One whose ``(job, rank)`` has no steps in the run
   (rank -1 or no job: the agent could not tell) takes the rank that drove its ``(node, gpu)``,
   where exactly one rank with steps did; any other record is reported and not used.
5. Per rank, its records are cut at its step windows in time order
   (``collective_source.clip_to_steps``); a rank whose windows overlap (step numbers reused)
   cannot place them and is reported. A step that holds a piece of a record the plugin gave no
   event timestamps (``placed`` false: it ends at its dump time) is marked ``unplaced``.

Everything is vectorised with pandas; the output frames are sorted by ``(job, rank, step)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import pandas as pd

from chopper.attribution.collective_source import Intervals, clip_to_steps

STEP_KEY = ["job", "rank", "step"]
RANK_KEY = ["job", "rank"]


@dataclass
class MarkerTables:
    """Step windows and intervals of one run.

    Attributes:
        steps: One row per step: job, rank, step, node, gpu, begin_ns, end_ns, flops, tokens.
        intervals: One row per phase or collective: job, rank, step, is_collective, name,
            begin_ns, end_ns (clipped to the step window), bytes (NaN where neither marker has any).
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
    merged = begin[[*key, "nth", "ts_ns", "bytes"]].merge(
        end[[*key, "nth", "ts_ns", "bytes"]], on=[*key, "nth"], how="outer", suffixes=("_begin", "_end"), indicator=True
    )
    problems += _describe(merged[merged["_merge"] == "left_only"], "phase/collective begins without an end")
    problems += _describe(merged[merged["_merge"] == "right_only"], "phase/collective ends without a begin")
    both = merged[(merged["_merge"] == "both") & (merged["ts_ns_end"] >= merged["ts_ns_begin"])]
    intervals = pd.DataFrame({
        "job": both["job"].to_numpy(), "rank": both["rank"].to_numpy(dtype=np.int64),
        "step": both["step"].to_numpy(dtype=np.int64), "is_collective": both["is_collective"].to_numpy(dtype=bool),
        "name": both["name"].to_numpy(dtype=object), "begin_ns": both["ts_ns_begin"].to_numpy(dtype=np.int64),
        "end_ns": both["ts_ns_end"].to_numpy(dtype=np.int64),
        "bytes": both["bytes_begin"].fillna(both["bytes_end"]).to_numpy(dtype=np.float64),
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
    return MarkerTables(steps, inside[["job", "rank", "step", "is_collective", "name", "begin_ns", "end_ns", "bytes"]],
                        problems + more)


class InspectorSteps(NamedTuple):
    """The Inspector's records of a run on its steps (``inspector_intervals``).

    Attributes:
        intervals: The records cut at the step windows; ``row`` is a position in the steps given.
        has_feed: Per step, whether an Inspector record was matched to its rank.
        unplaced: Per step, whether it holds a piece of a record without event timestamps.
        problems: One line per group of records not used.
    """

    intervals: Intervals
    has_feed: npt.NDArray[np.bool_]
    unplaced: npt.NDArray[np.bool_]
    problems: list[str]


def inspector_intervals(steps: pd.DataFrame, collectives: pd.DataFrame) -> InspectorSteps:
    """Inspector records on the step windows of their ranks (module docstring, steps 4-5).

    Args:
        steps: One row per step: job, rank, node, gpu, begin_ns, end_ns (any order).
        collectives: The run's collectives table (``chopper.runs.rundir.COLLECTIVE_COLUMNS``).
    """
    has_feed, unplaced_rows = np.zeros(len(steps), bool), np.zeros(len(steps), bool)
    if collectives.empty or steps.empty:
        return InspectorSteps(Intervals.empty(), has_feed, unplaced_rows, [])
    steps = steps.reset_index(drop=True)
    records = collectives[["job", "rank", "node", "gpu", "begin_ns", "end_ns", "bytes", "placed"]].astype(
        {"node": str, "gpu": np.int64, "rank": np.int64})
    ranks = steps[RANK_KEY].drop_duplicates()
    named = records.merge(ranks.assign(stepped=True), on=RANK_KEY, how="left")["stepped"].notna().to_numpy()
    # A GPU driven by exactly one rank with steps lends it to the records that name none.
    owners = steps[["node", "gpu", *RANK_KEY]].astype({"node": str}).drop_duplicates()
    owners = owners[~owners.duplicated(["node", "gpu"], keep=False)]
    lent = records[~named].reset_index(drop=True)
    owner = lent[["node", "gpu"]].merge(owners, on=["node", "gpu"], how="left")
    unplaced = owner["rank"].isna().to_numpy()
    problems = [
        f"{len(g)} Inspector collective records of node {node!r} gpu {gpu} name job {job!r} rank {rank}, which has "
        "no steps in this run, and no single rank with steps drove that GPU: not used. Record the job's markers "
        "on that node, or check the agent's mapping of processes to ranks (docs/INSPECTOR.md)"
        for (node, gpu, job, rank), g in lent[unplaced].groupby(["node", "gpu", "job", "rank"], sort=True)
    ]
    lent[RANK_KEY] = owner[RANK_KEY]
    placed = pd.concat([records[named], lent[~unplaced].astype({"rank": np.int64})], ignore_index=True)
    # Plain arrays, records grouped by rank: the loop below costs a few numpy calls per rank.
    step_begin, step_end = steps["begin_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64)
    lo, hi = placed["begin_ns"].to_numpy(np.int64), placed["end_ns"].to_numpy(np.int64)
    nbytes, timed = placed["bytes"].to_numpy(np.float64), placed["placed"].to_numpy(bool)
    pieces: list[Intervals] = []
    step_rows = steps.groupby(RANK_KEY, sort=False).indices
    for key, idx in placed.groupby(RANK_KEY, sort=True).indices.items():
        rows = step_rows[key]
        rows = rows[np.argsort(step_begin[rows], kind="stable")]
        begin, end = step_begin[rows], step_end[rows]
        if np.any(end[:-1] > begin[1:]):
            problems.append(f"job {key[0]!r} rank {key[1]}: step windows overlap (step numbers reused?), so its "
                            f"{len(idx)} Inspector collective records cannot be placed on steps: not used")
            continue
        iv = clip_to_steps(begin, end, lo[idx], hi[idx], nbytes[idx])
        pieces.append(Intervals(rows[iv.row].astype(np.int64), iv.lo_ns, iv.hi_ns, iv.bytes, iv.counted))
        late = idx[~timed[idx]]
        if late.size:
            unplaced_rows[rows[clip_to_steps(begin, end, lo[late], hi[late], nbytes[late]).row]] = True
        has_feed[rows] = True
    return InspectorSteps(Intervals.join(pieces), has_feed, unplaced_rows, problems)

