"""Where the ranks of a job are, in one line: the text of ``chopper steps``, the aggregator and the docs.

A ``chopper.v1.RankPosition`` (docs/HANGS.md) says what one rank had open when its agent read it:
the step, the innermost phase and the innermost collective, each with when it began. This module
reduces one position to *where* the rank is (:func:`where`) and many to a sentence that groups the
ranks that wait in the same place (:func:`describe`), e.g.::

    ranks 0-6 inside collective all_reduce of step 1234 for 120 s; rank 7 inside phase backward of step 1234 for 121 s

Pure and light: no grpc, protobuf or numpy import at run time.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: a position is read by its fields, and nothing here needs protobuf
    from chopper.proto.chopper.v1.agent_pb2 import RankPosition as Position

# What a rank is inside, innermost first: the label values of ``chopper_rank_position_seconds{kind}``.
COLLECTIVE, PHASE, STEP, BETWEEN_STEPS = "collective", "phase", "step", "between_steps"
KINDS = (COLLECTIVE, PHASE, STEP, BETWEEN_STEPS)
# Groups a description names at most (the largest first); the rest are counted, so a job whose
# ranks are scattered over many places still gets one bounded line.
MAX_GROUPS = 6
NS = 1_000_000_000


@dataclass(frozen=True)
class Where:
    """Where one rank is: ``kind`` (one of ``KINDS``), its ``name`` ("" for a step), the step, since when (ns).

    ``step`` is the open step, or for ``between_steps`` the last step finished (-1: none yet);
    ``since_ns`` is when the interval began, or for ``between_steps`` the rank's last marker.
    """

    kind: str
    name: str
    step: int
    since_ns: int

    def seconds(self, as_of_ns: int) -> float:
        """How long the rank has been there at ``as_of_ns``, s (never negative)."""
        return max(0.0, (as_of_ns - self.since_ns) / NS)


def where(p: Position) -> Where:
    """The innermost interval a rank has open: the later begun of its open collective and phase, else its step.

    A rank with no step open is ``between_steps`` (data loading outside the step, or a job that ended).
    """
    if p.step < 0:
        return Where(BETWEEN_STEPS, "", p.last_step, p.last_marker_ns)
    if p.collective and (not p.phase or p.collective_begin_ns >= p.phase_begin_ns):
        return Where(COLLECTIVE, p.collective, p.step, p.collective_begin_ns)
    if p.phase:
        return Where(PHASE, p.phase, p.step, p.phase_begin_ns)
    return Where(STEP, "", p.step, p.step_begin_ns)


def rank_ranges(ranks: Iterable[int]) -> str:
    """Ranks as sorted runs: ``[0, 1, 2, 3, 7, 9, 10]`` -> ``"0-3,7,9-10"``."""
    ordered = sorted(set(ranks))
    runs: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)


def _place(w: Where) -> str:
    if w.kind == BETWEEN_STEPS:
        return "between steps" + (f" after step {w.step}" if w.step >= 0 else " before its first step")
    return f"inside {w.kind} {w.name} of step {w.step}" if w.name else f"inside step {w.step}"


def _duration(low: float, high: float) -> str:
    lo, hi = round(low), round(high)
    return f"for {hi} s" if lo == hi else f"for {lo}-{hi} s"


def describe(positions: Sequence[Position], max_groups: int = MAX_GROUPS) -> str:
    """One line saying where every rank is, ranks in the same place grouped, the largest group first.

    Ranks are grouped by (kind, name, step); each group says how long its ranks have been there
    at the time their agents read them (``as_of_ns``; a range when they differ). At most
    ``max_groups`` groups are named; the rest are summed up as "N more ranks elsewhere".
    "" when there is no position.
    """
    groups: dict[tuple[str, str, int], list[tuple[int, float]]] = {}
    for p in positions:
        w = where(p)
        groups.setdefault((w.kind, w.name, w.step), []).append((p.rank, w.seconds(p.as_of_ns)))
    # The biggest group first; among equals, the innermost kind, then the lowest rank.
    order = sorted(groups.items(), key=lambda kv: (-len(kv[1]), KINDS.index(kv[0][0]), min(r for r, _ in kv[1])))
    parts = []
    for (kind, name, step), members in order[:max_groups]:
        ranks = [r for r, _ in members]
        seconds = [s for _, s in members]
        label = "rank" if len(ranks) == 1 else "ranks"
        parts.append(f"{label} {rank_ranges(ranks)} {_place(Where(kind, name, step, 0))} "
                     f"{_duration(min(seconds), max(seconds))}")
    rest = sum(len(members) for _, members in order[max_groups:])
    if rest:
        parts.append(f"{rest} more rank{'s' if rest > 1 else ''} elsewhere")
    return "; ".join(parts)


class StallNotice:
    """When a follower of step summaries says where a job's ranks are: once it has not stepped for ``after_s``.

    A job is *stalled* when no summary of it arrived for ``after_s`` (counted from the first
    time its positions were seen, for a job that never finished a step here) while at least one of
    its ranks is inside a step. Each stalled job gets a line at most every ``after_s``, so a hang
    that lasts prints its growing durations, not a flood.

    Args:
        after_s: Seconds without a step before a job counts as stalled.
        clock: Monotonic seconds (injected in tests).
    """

    def __init__(self, after_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.after_s = after_s
        self._clock = clock
        self._stepped: dict[str, float] = {}  # job -> when its last summary (or its first position) came
        self._said: dict[str, float] = {}  # job -> when its last line was printed

    def stepped(self, job: str) -> None:
        """A summary of ``job`` arrived."""
        self._stepped[job] = self._clock()
        self._said.pop(job, None)

    def lines(self, positions: Sequence[Position]) -> list[str]:
        """A line for every stalled job among ``positions`` that is due one, e.g. ``job j: no step for 12 s; ...``."""
        now = self._clock()
        by_job: dict[str, list[Position]] = {}
        for p in positions:
            by_job.setdefault(p.job, []).append(p)
        for job in [j for j in self._stepped if j not in by_job]:  # jobs the agent forgot
            del self._stepped[job]
            self._said.pop(job, None)
        out = []
        for job, ranks in sorted(by_job.items()):
            quiet_s = now - self._stepped.setdefault(job, now)
            if quiet_s < self.after_s or all(p.step < 0 for p in ranks):
                continue
            if now - self._said.get(job, -float("inf")) < self.after_s:
                continue
            self._said[job] = now
            out.append(f"job {job}: no step for {quiet_s:.0f} s; {describe(ranks)}")
        return out
