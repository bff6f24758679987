"""Live per-step summaries: the attribution model applied to each step as it closes.

A closed step is summarised once a sample of its GPU at or after the step's end has arrived (or
after ``SummaryQueue.max_wait_ns``, with whatever samples there are), so that the last sample
interval of the window is known. The arithmetic is ``chopper.attribution``'s numpy core, the
same that ``chopper attribute`` runs offline on a recorded run, so live and offline figures of
the same steps agree. Ranks that drive no GPU (``gpu == -1``) get step time, FLOPs, tokens and
counts; their GPU terms are NaN or 0 and flagged. Each summary carries its phase times
(``chopper.attribution.phases``: per phase name, the union of its windows in the step).
"""
from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.health import HealthTracker
from agent.history import SampleWindow
from agent.inspector.feed import InspectorFeed
from agent.markers import ClosedStep
from chopper.attribution import phases
from chopper.attribution.collective_source import Intervals, step_collectives
from chopper.attribution.terms import COUNTERS, FIGURES, RATIOS, ROW_FLAGS, flag_tuples, rank_terms, window_figures
from chopper.attribution.timeline import GpuTimeline
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.schema import DeviceInfo

# The flag of a step that took an Inspector record without event timestamps (placed by its dump time).
INSPECTOR_UNPLACED = "inspector_unplaced"
GPU_ERRORS = "gpu_errors"
# StepSummary fields filled straight from the model's columns of the same name.
SUMMARY_TERMS = (
    "step_time_s", "ideal_s", "matrix_util_loss_s", "compute_at_clock_s", "dvfs_loss_s", "dvfs_power_s",
    "dvfs_thermal_s", "dvfs_current_s", "dvfs_other_s", "dvfs_unattributed_s", "exposed_comm_s", "idle_s", "mfu",
    "busy_ratio", "matrix_ratio", "mean_gfx_clock_mhz", "min_gfx_clock_mhz", "max_temp_c", "energy_j",
    "tokens_per_s", "tokens_per_j", "link_tx_bytes", "link_rx_bytes",
)


def _timeline(window: SampleWindow, base_ns: int, period_ns: int) -> GpuTimeline:
    ts = (window.ts_ns - base_ns).astype(np.float64)
    cols = window.columns
    return GpuTimeline.build(ts, {c: cols[c] for c in RATIOS}, {c: cols[c] for c in COUNTERS}, period_ns)


def _collectives(steps: Sequence[ClosedStep], inspector: InspectorFeed | None) -> tuple[
        Intervals, Intervals, Intervals, list[str], npt.NDArray[np.bool_], list[bool]]:
    """The steps' marked collectives, Inspector collectives and phases as interval arrays, the phases'
    names, which steps an Inspector feed covers, and which used an Inspector record without event
    timestamps (``agent.inspector.feed``)."""
    marked: list[tuple[int, int, int, int]] = []
    spans: list[tuple[int, int, int]] = []
    names: list[str] = []
    for i, s in enumerate(steps):
        for coll, lo, hi, name, nbytes in s.intervals:
            if coll:
                marked.append((i, lo, hi, nbytes))
            else:
                spans.append((i, lo, hi))
                names.append(name)
    fed = np.zeros(len(steps), dtype=bool)
    unplaced = [False] * len(steps)
    pieces: list[tuple[int, int, int, int, bool]] = []
    if inspector is not None:
        for i, s in enumerate(steps):
            fed[i] = inspector.has_feed(s.job, s.rank)
            for piece in inspector.collectives_in(s.job, s.rank, s.begin_ns, s.end_ns):
                pieces.append((i, piece.lo_ns, piece.hi_ns, piece.bytes, piece.counted))
                unplaced[i] = unplaced[i] or not piece.placed
    m = np.array(marked, dtype=np.int64).reshape(-1, 4)
    q = np.array(pieces, dtype=np.int64).reshape(-1, 5)
    ph = np.array(spans, dtype=np.int64).reshape(-1, 3)
    return (Intervals(m[:, 0], m[:, 1], m[:, 2], m[:, 3].astype(np.float64)),
            Intervals(q[:, 0], q[:, 1], q[:, 2], q[:, 3].astype(np.float64), q[:, 4].astype(bool)),
            Intervals.spans(ph[:, 0], ph[:, 1], ph[:, 2]), names, fed, unplaced)


def summarize(
    steps: Sequence[ClosedStep], node: str, samples: SampleWindow | None, device: DeviceInfo | None, period_ns: int,
    inspector: InspectorFeed | None = None, health: HealthTracker | None = None,
) -> list[pb.StepSummary]:
    """Summaries of steps that ran on one GPU, from that GPU's samples (``agent.history``), for ranks it
    covers the Inspector's collectives (``chopper.attribution.collective_source``), and the GPU's
    health counters that moved during each step (flag ``gpu_errors``, ``agent.health``)."""
    n = len(steps)
    base = min(steps[0].begin_ns, int(samples.ts_ns[0])) if samples else steps[0].begin_ns
    b = np.array([s.begin_ns - base for s in steps], dtype=np.float64)
    e = np.array([s.end_ns - base for s in steps], dtype=np.float64)
    if samples:
        fig = window_figures(_timeline(samples, base, period_ns), b, e)
    else:
        fig = {k: np.full(n, np.nan) for k in FIGURES}
    marked, insp, phase, phase_names, fed, unplaced = _collectives(steps, inspector)
    coll = step_collectives(n, marked, insp, phase, fed)
    exposed = coll["exposed_s"]
    phase_times = phases.phase_seconds(n, phase.row, phase_names, phase.lo_ns, phase.hi_ns)
    nan = float("nan")
    terms = rank_terms(
        (e - b) / 1e9, fig, exposed, np.full(n, device.max_gfx_clock_mhz if device else nan),
        np.array([s.flops for s in steps], dtype=np.float64), np.full(n, device.peak_flops if device else nan),
        np.array([s.tokens for s in steps], dtype=np.float64),
    )
    flags = flag_tuples({k: terms[k] for k in ROW_FLAGS})
    out = []
    for i, s in enumerate(steps):
        figures: dict[str, Any] = {name: float(terms[name][i]) for name in SUMMARY_TERMS}
        summary = pb.StepSummary(
            job=s.job, node=node, rank=s.rank, gpu=s.gpu, step=s.step, begin_ns=s.begin_ns, end_ns=s.end_ns,
            flops=s.flops, tokens=s.tokens, phases=s.phases, collectives=s.collectives,
            clock=pb.CLOCK_SOURCE_DEVICE if s.device_clock else pb.CLOCK_SOURCE_CPU,
            collective_s=float(coll["collective_s"][i]), collective_bytes=float(coll["collective_bytes"][i]),
            inspector_collective_s=float(coll["inspector_collective_s"][i]),
            inspector_bytes=float(coll["inspector_bytes"][i]), inspector_collectives=int(coll["inspector_count"][i]),
            collective_source=pb.CollectiveSource.Name(int(coll["source"][i])), **figures,
        )
        summary.mean_power_w = summary.energy_j / summary.step_time_s if summary.step_time_s > 0 else float("nan")
        summary.flags.extend(flags[i] if s.device_clock else (*flags[i], "cpu_clock"))
        summary.flags.extend(s.flags)
        if unplaced[i]:
            summary.flags.append(INSPECTOR_UNPLACED)
        moved = health.moved_between(s.gpu, s.begin_ns, s.end_ns) if health is not None else ()
        if moved:
            summary.gpu_errors.extend(moved)
            summary.flags.append(GPU_ERRORS)
        summary.phase_times.extend(pb.PhaseTime(name=k, seconds=v) for k, v in phase_times[i].items())
        out.append(summary)
    return out


class SummaryQueue:
    """Closed steps waiting for the samples, and the Inspector records, that cover them.

    Args:
        max_wait_ns: Summarise anyway once a step ended this long ago without covering samples
            (backend down, no GPU).
        inspector_wait_ns: Likewise without the Inspector records of a rank that has them (the
            plugin writes on its dump interval; ``agent.inspector.feed.InspectorFeed.covers``).
    """

    def __init__(self, max_wait_ns: int = 2 * 10**9, inspector_wait_ns: int = 0) -> None:
        self.max_wait_ns = max_wait_ns
        self.inspector_wait_ns = inspector_wait_ns
        self._pending: deque[ClosedStep] = deque()
        # Waiting steps per (job, rank): asked for every rank retirement looks at, so kept, not counted.
        self._waiting: Counter[tuple[str, int]] = Counter()

    def add(self, steps: Iterable[ClosedStep]) -> None:
        for step in steps:
            self._pending.append(step)
            self._waiting[(step.job, step.rank)] += 1

    def __len__(self) -> int:
        return len(self._pending)

    def waiting(self, key: tuple[str, int]) -> bool:
        """Whether a step of ``key`` = ``(job, rank)`` waits here."""
        return key in self._waiting

    def ready(self, latest_sample_ns: dict[int, int], now_ns: int,
              inspected: Callable[[ClosedStep], bool] | None = None) -> list[ClosedStep]:
        """Pop steps whose GPU has a sample at or after their end and whose Inspector records are in
        (``inspected``, None: not waited for), each or both after waiting long enough."""
        done: list[ClosedStep] = []
        waiting: deque[ClosedStep] = deque()
        for step in self._pending:
            waited = now_ns - step.end_ns
            sampled = step.gpu < 0 or latest_sample_ns.get(step.gpu, -1) >= step.end_ns or waited >= self.max_wait_ns
            if sampled and (inspected is None or waited >= self.inspector_wait_ns or inspected(step)):
                done.append(step)
                key = (step.job, step.rank)
                self._waiting[key] -= 1
                if not self._waiting[key]:
                    del self._waiting[key]
            else:
                waiting.append(step)
        self._pending = waiting
        return done


# Causes of chopper_rank_step_seconds_total, each from the StepSummary field of that name + "_s";
# "compute_unknown" holds compute_at_clock_s of steps without FLOPs, so the causes always add up
# to the step time.
STEP_CAUSES = ("ideal", "matrix_util_loss", "dvfs_power", "dvfs_thermal", "dvfs_current", "dvfs_other",
               "dvfs_unattributed", "exposed_comm", "idle")
MFU_WINDOW_NS = 60 * 10**9
# The MFU window is kept as sums per second of step end: at most 61 entries per rank, whatever its
# step rate and however long nobody scrapes.
MFU_BUCKET_NS = 10**9
# Phase names per rank with a series of their own on /metrics; the time of later names goes to
# phases.OTHER, so a client that invents names cannot grow the scrape without bound.
MAX_PHASE_SERIES = 32
# The ``source`` label of chopper_rank_collective_source_steps_total, by StepSummary.collective_source.
COLLECTIVE_SOURCES = {pb.COLLECTIVE_SOURCE_NONE: "none", pb.COLLECTIVE_SOURCE_MARKERS: "markers",
                      pb.COLLECTIVE_SOURCE_INSPECTOR: "inspector"}


@dataclass(frozen=True)
class RankFiguresNow:
    """One rank's totals at one instant (:meth:`RankFigures.snapshot`); seconds, tokens, 0-1, counts."""

    seconds: dict[str, float]
    phase_s: dict[str, float]
    collective_s: float
    inspector_collective_s: float
    collective_bytes: float
    disagreement_s: float
    collective_sources: dict[str, int]
    tokens: float
    flops_step_s: float
    mfu: float
    flags: dict[str, int]
    link_bytes: dict[str, float]


class RankFigures:
    """Running totals of one rank's step summaries, for ``/metrics``.

    Seconds by cause, seconds by phase name (the first ``MAX_PHASE_SERIES`` names seen; later
    names add to ``phases.OTHER``), collective seconds (the union of collective windows, hidden or
    not), tokens and NVLink / XGMI bytes by direction (``tx``, ``rx``: the growth of the GPU's
    summed link counters over the step windows; steps that read none add nothing) are counters;
    so is the step time of steps whose ideal time is known (``flops_step_s``, s): the MFU
    denominator beside the ``ideal`` seconds, whose rates PromQL divides. The deprecated rolling
    MFU (``mfu``, with ``chopper_rank_mfu_ratio``) is over the steps that ended in the last
    ``MFU_WINDOW_NS``: ``Σ ideal / Σ step time`` over steps whose ideal time is known, summed per
    ``MFU_BUCKET_NS`` of step end (a step counts while its second is in the window). Memory per
    rank is bounded: ``MAX_PHASE_SERIES`` + 1 phase names, the flags the model and ingest raise, and
    at most ``MFU_WINDOW_NS / MFU_BUCKET_NS + 1`` buckets.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys((*STEP_CAUSES, "compute_unknown"), 0.0)
        self.phase_s: dict[str, float] = {}
        self.collective_s = 0.0
        self.inspector_collective_s = 0.0
        self.collective_bytes = 0.0
        self.disagreement_s = 0.0
        self.collective_sources: dict[str, int] = {}
        self.tokens = 0.0
        self.flops_step_s = 0.0
        self.flags: dict[str, int] = {}
        self.link_bytes: dict[str, float] = {"tx": 0.0, "rx": 0.0}
        self._recent: deque[list[float]] = deque()  # [bucket of end_ns, Σ ideal_s, Σ step_time_s], oldest first

    def add(self, s: pb.StepSummary) -> None:
        known = not np.isnan(s.ideal_s)
        for cause in STEP_CAUSES:
            value = getattr(s, f"{cause}_s")
            if not np.isnan(value):
                self.seconds[cause] += value
        if not known:
            self.seconds["compute_unknown"] += s.compute_at_clock_s
        else:
            self.flops_step_s += s.step_time_s
            bucket = s.end_ns // MFU_BUCKET_NS
            if self._recent and bucket <= self._recent[-1][0]:  # a late step joins the newest second
                self._recent[-1][1] += s.ideal_s
                self._recent[-1][2] += s.step_time_s
            else:
                self._recent.append([bucket, s.ideal_s, s.step_time_s])
            self._expire(s.end_ns)
        for p in s.phase_times:
            name = p.name if p.name in self.phase_s or len(self.phase_s) < MAX_PHASE_SERIES else phases.OTHER
            self.phase_s[name] = self.phase_s.get(name, 0.0) + p.seconds
        self.collective_s += s.collective_s
        self.collective_bytes += s.collective_bytes
        if not np.isnan(s.inspector_collective_s):
            self.inspector_collective_s += s.inspector_collective_s
            if s.collective_source == pb.COLLECTIVE_SOURCE_MARKERS:
                self.disagreement_s += abs(s.collective_s - s.inspector_collective_s)
        source = COLLECTIVE_SOURCES.get(s.collective_source, "none")
        self.collective_sources[source] = self.collective_sources.get(source, 0) + 1
        self.tokens += s.tokens
        for direction, value in (("tx", s.link_tx_bytes), ("rx", s.link_rx_bytes)):
            if not np.isnan(value):
                self.link_bytes[direction] += value
        for flag in s.flags:
            self.flags[flag] = self.flags.get(flag, 0) + 1

    def snapshot(self, now_ns: int) -> RankFiguresNow:
        """A copy of the totals for one scrape, MFU over the window ending at ``now_ns``."""
        return RankFiguresNow(dict(self.seconds), dict(self.phase_s), self.collective_s, self.inspector_collective_s,
                              self.collective_bytes, self.disagreement_s, dict(self.collective_sources), self.tokens,
                              self.flops_step_s, self.mfu(now_ns), dict(self.flags), dict(self.link_bytes))

    def mfu(self, now_ns: int) -> float:
        """MFU over the window ending at ``now_ns``, 0-1 (NaN: no step with known ideal time in it).

        Deprecated with ``chopper_rank_mfu_ratio``: PromQL divides the counters' rates instead.
        """
        self._expire(now_ns)
        time_s = sum(t for _, _, t in self._recent)
        return sum(i for _, i, _ in self._recent) / time_s if time_s > 0 else float("nan")

    def _expire(self, now_ns: int) -> None:
        """Drop the seconds that ended before the window ending at ``now_ns``."""
        first = (now_ns - MFU_WINDOW_NS) // MFU_BUCKET_NS
        while self._recent and self._recent[0][0] < first:
            self._recent.popleft()
