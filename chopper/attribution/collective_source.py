"""Which collectives a step's communication terms come from: the job's markers or the Inspector.

A rank's collectives can be seen twice: through the job's own collective markers
(``chopper.collective`` or the one-line hooks) and through NCCL's / RCCL's Inspector profiler
plugin, which the agent reads without any code change (docs/INSPECTOR.md). The rule, applied
live (``agent/steps.py``) and offline (``chopper attribute``) alike, per step:

1. The step's source is ``MARKERS`` when it has at least one marked collective interval, else
   ``INSPECTOR`` when it has at least one Inspector interval, else ``NONE`` (the proto enum
   ``CollectiveSource``).
2. ``collective_s`` is the union of the chosen source's intervals and ``exposed_s`` the part of
   it outside every phase (``exposed_comm.collective_seconds``, uncapped); ``collective_bytes`` is
   the chosen intervals' bytes (0 under ``NONE``). So a job that marks collectives keeps the
   account it always had, and a job that marks nothing gets exposed communication from the
   Inspector.
3. The Inspector's own view is kept beside it whatever the source: the union of its intervals
   (``inspector_collective_s``), their bytes and how many records ended in the step. Where no
   Inspector feed covers the rank (``has_feed`` false) the time and bytes are NaN ("not seen",
   not "none"), the count 0.
4. ``disagreement_s = |marked union − Inspector union|`` on steps that have marked collectives
   and an Inspector feed, NaN elsewhere. A feed that recorded nothing in a step the job marked
   a collective in disagrees by the whole marked union: that is the largest disagreement, not an
   absent one.

``clip_to_steps`` places one rank's Inspector records on its step windows: a record is cut at
step boundaries into one interval per step it overlaps, and its bytes and its count go to the
piece in the step where it ended (the collective completed there). Time outside every step
window (between steps, before the first) belongs to no step and is dropped.

Nanoseconds in, seconds out; bytes as given.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from chopper.attribution.exposed_comm import collective_seconds
from chopper.attribution.timeline import F64

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

# The values of chopper.v1.CollectiveSource (agent.proto); the proto module is not imported here,
# so the offline model stays free of grpc/protobuf. tests/attribution/test_collective_source.py
# checks that the two agree.
SOURCE_NONE = 1
SOURCE_MARKERS = 2
SOURCE_INSPECTOR = 3
# Labels of the recorded-run and report column ``collective_source``, by enum value.
SOURCE_LABELS: dict[int, str] = {SOURCE_NONE: "none", SOURCE_MARKERS: "markers", SOURCE_INSPECTOR: "inspector"}


class Intervals(NamedTuple):
    """Collective (or phase) intervals of many steps, each clipped to its step.

    Attributes:
        row: The step (row ``0..n_steps-1`` of the caller's steps) each interval belongs to.
        lo_ns, hi_ns: The interval, ns, ``lo_ns <= hi_ns``.
        bytes: Payload bytes each interval carries; NaN counts as 0 (a marker without bytes).
            Ignored for phases.
        counted: Whether the interval counts as one collective of its step (``clip_to_steps``
            counts a record that spans steps once, where it ended); None: every interval counts.
    """

    row: I64
    lo_ns: I64
    hi_ns: I64
    bytes: F64
    counted: B | None = None

    @classmethod
    def empty(cls) -> Intervals:
        """No intervals."""
        none = np.zeros(0, np.int64)
        return cls(none, none, none, np.zeros(0))

    @classmethod
    def spans(cls, row: I64, lo_ns: I64, hi_ns: I64) -> Intervals:
        """Intervals without bytes (phases)."""
        return cls(row, lo_ns, hi_ns, np.zeros(np.shape(row)))

    @classmethod
    def join(cls, parts: list[Intervals]) -> Intervals:
        """The intervals of all ``parts``, in order."""
        if not parts:
            return cls.empty()
        counted = None if all(p.counted is None for p in parts) else np.concatenate(
            [np.ones(p.row.size, bool) if p.counted is None else p.counted for p in parts])
        return cls(np.concatenate([p.row for p in parts]), np.concatenate([p.lo_ns for p in parts]),
                   np.concatenate([p.hi_ns for p in parts]), np.concatenate([p.bytes for p in parts]), counted)

    def select(self, keep: B) -> Intervals:
        """The intervals where ``keep`` holds."""
        counted = None if self.counted is None else self.counted[keep]
        return Intervals(self.row[keep], self.lo_ns[keep], self.hi_ns[keep], self.bytes[keep], counted)


def step_collectives(n_steps: int, marked: Intervals, inspector: Intervals, phase: Intervals,
                     has_feed: B) -> dict[str, npt.NDArray[Any]]:
    """Per step, the collective terms from the chosen source and the Inspector's view (module docstring).

    Args:
        n_steps: Number of steps; every ``row`` is in ``0..n_steps-1``.
        marked: The job's collective intervals (from collective markers).
        inspector: The Inspector's collective intervals (``clip_to_steps``).
        phase: Phase intervals (``bytes`` ignored): what hides communication.
        has_feed: Per step, whether an Inspector feed covers the step's rank.

    Returns:
        Arrays of ``n_steps``: ``source`` (int, ``SOURCE_*``), ``collective_s``, ``exposed_s``
        (uncapped: ``exposed_comm.cap_exposed`` applies the idle cap), ``collective_bytes``,
        ``inspector_collective_s`` and ``inspector_bytes`` (NaN without a feed),
        ``inspector_count`` (int), ``disagreement_s`` (NaN unless marked and fed).
    """
    has_marked = np.bincount(marked.row, minlength=n_steps) > 0
    has_insp = np.bincount(inspector.row, minlength=n_steps) > 0
    source = np.where(has_marked, SOURCE_MARKERS, np.where(has_insp, SOURCE_INSPECTOR, SOURCE_NONE))
    # A step's Inspector intervals stand in only where the job marked none.
    chosen = Intervals.join([marked, inspector.select(~has_marked[inspector.row])])
    n_coll = chosen.row.size
    exposed_s, collective_s = collective_seconds(
        n_steps, np.concatenate((chosen.row, phase.row)),
        np.concatenate((np.ones(n_coll, bool), np.zeros(phase.row.size, bool))),
        np.concatenate((chosen.lo_ns, phase.lo_ns)), np.concatenate((chosen.hi_ns, phase.hi_ns)),
    )
    insp_s = collective_seconds(n_steps, inspector.row, np.ones(inspector.row.size, bool),
                                inspector.lo_ns, inspector.hi_ns)[1]
    insp_bytes = _sum_bytes(n_steps, inspector)
    counted = np.ones(inspector.row.size, bool) if inspector.counted is None else inspector.counted
    nan = np.full(n_steps, np.nan)
    return {
        "source": source,
        "collective_s": collective_s,
        "exposed_s": exposed_s,
        "collective_bytes": np.where(has_marked, _sum_bytes(n_steps, marked), np.where(has_insp, insp_bytes, 0.0)),
        "inspector_collective_s": np.where(has_feed, insp_s, nan),
        "inspector_bytes": np.where(has_feed, insp_bytes, nan),
        "inspector_count": np.bincount(inspector.row[counted], minlength=n_steps).astype(np.int64),
        # Where the step has marked collectives, collective_s is the marked union.
        "disagreement_s": np.where(has_marked & has_feed, np.abs(collective_s - insp_s), nan),
    }


def clip_to_steps(step_begin_ns: I64, step_end_ns: I64, lo_ns: I64, hi_ns: I64, nbytes: F64) -> Intervals:
    """One rank's collective records cut into per-step intervals (module docstring).

    Args:
        step_begin_ns, step_end_ns: The rank's step windows, sorted, not overlapping; interval
            ``row`` values are positions in these arrays.
        lo_ns, hi_ns: Each record's interval, ns.
        nbytes: Each record's bytes.

    Returns:
        One interval per (record, step window it overlaps); ``counted`` marks the piece in the
        last such window, which carries the record's bytes (the others carry 0).
    """
    # The first window ending after the record begins, and the last one beginning before it ends.
    first = np.searchsorted(step_end_ns, lo_ns, side="right")
    last = np.searchsorted(step_begin_ns, hi_ns, side="left") - 1
    pieces = np.maximum(last - first + 1, 0)
    record = np.repeat(np.arange(lo_ns.size), pieces)
    # Each piece's window: the record's first window plus the piece's rank among its record's pieces.
    offset = np.arange(record.size) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    window = first[record] + offset
    lo = np.maximum(lo_ns[record], step_begin_ns[window])
    hi = np.minimum(hi_ns[record], step_end_ns[window])
    is_last = offset == pieces[record] - 1
    # A record of no length inside a step still counts there (its piece has no length either).
    keep = (hi > lo) | is_last
    return Intervals(window[keep].astype(np.int64), lo[keep], hi[keep],
                     np.where(is_last, nbytes[record], 0.0)[keep], is_last[keep])


def _sum_bytes(n_steps: int, iv: Intervals) -> F64:
    return np.bincount(iv.row, weights=np.nan_to_num(iv.bytes, nan=0.0), minlength=n_steps).astype(np.float64)

