"""The job-level view: ranks joined by ``(job, step)``, steps finalized, rolled up over time.

Pure: no I/O, no threads, no clock of its own. Every call takes ``now_ns``, the aggregator's
receive time (``time.time_ns()`` in the daemon, any integer in tests). Node timestamps
(``begin_ns``/``end_ns`` of a summary) are carried into the rows but never compared across
nodes, so a node whose clock is off by ±30 s changes nothing here.

Algorithm (``JobTable.add`` and ``JobTable.expire``):

1. A summary is validated (a job name that ``chopper.identity.jobname`` accepts, rank ≥ 0, step ≥ 0,
   a finite step time ≥ 0, each cause's seconds NaN or within it, energy NaN or finite ≥ 0;
   otherwise rejected as ``invalid``). A summary for a job not seen yet opens a new job, unless
   ``max_jobs`` jobs are live (rejected as ``job_limit``).
2. The job's *expected ranks* are the distinct ranks that reported so far (the contract carries
   no world size). A rank first seen after the job's join period is a *rank-set change*
   (counted); so is a rank dropped from the expected set after missing ``vanish_after_steps``
   finalized steps in a row (a vanished rank; it rejoins, counted again, if it reports again).
3. A step of a rank is taken in once, whoever delivers it. A summary whose ``(job, rank, step)``
   is already in an open step, or in a finalized one (``aggregator.stepindex.StepIndex``, which
   outlives jobs and restarts), is a *copy*: with the same content (``stepindex.digest``) it is a
   duplicate, counted (``duplicate_rank_step``) and dropped; with other content it is a
   *conflict*, counted and returned in ``Finalized.aside`` flagged ``conflict`` (the first copy
   stands). A summary for a step older than the index remembers for its job cannot be told from
   a copy: counted (``unverifiable``) and set aside the same way, flagged ``unverifiable``.
4. Otherwise the summary joins the open step ``(job, step)``; the step's clock starts at its
   first summary's receive time. A summary of a rank missing from a step already finalized is
   *late*: counted per job (``late_total``) and returned as a row flagged ``late`` with the
   step's job-level figures, without re-finalizing the step (its ``straggler_wait_s`` stays 0).
5. A step is finalized *complete* when every expected rank reported, once the job is past its
   join period (``join_s`` after its first summary: until then the rank set is still being
   discovered, and a step must not complete with only the ranks of the fastest node); or
   *incomplete* ``step_timeout_s`` after its first summary (counted in ``incomplete_total``,
   its missing ranks in ``missing_rank_steps_total`` and per rank). More than
   ``max_open_steps`` open steps in one job finalize the oldest early, as incomplete. With
   ``finalize_every_s`` > 0, ``add`` gathers ready steps and finalizes them together at most that
   often (``expire`` always does), so step 6 runs once for many small steps. Each finalized
   step's ranks and digests go to the step index.
6. Finalized steps of one call are attributed together, vectorized: ``compute_s = step time −
   idle − exposed`` (before the split), then ``chopper.attribution.straggler.straggler_wait``
   and ``slowest_ranks``. Job step time is the largest rank step time; the straggler score is
   the slowest rank's compute excess over the median compute ÷ the median step time.
7. Each finalized row adds its seconds by cause to its rank's counters, and the job's sums to the
   job's counters (``JobState.totals``): seconds by cause, the step time of rows whose ideal
   time is known (the MFU denominator, so steps without FLOPs do not dilute it), and energy
   and tokens of rows with both known. PromQL divides their rates: MFU ``Σ ideal / Σ step
   time`` of rows with known ideal, energy per token ``Σ energy / Σ tokens``. The same sums go
   to rolling-window buckets (one per second of receive time, kept ``WINDOWS_S[-1]``) for the
   deprecated window gauges (``JobState.mfu``, ``JobState.energy_per_token``).

Memory: a job holds its open steps (bounded by the timeout and ``max_open_steps``), a bounded
record of recently finalized step numbers, one bucket per second of the longest window, and a
fixed-size record per rank; the step index is bounded by its own limits. Finalized rows leave
in the returned ``Finalized.rows`` (for the store); no step history is kept here.

A job that sends nothing for ``job_expiry_s`` and has no open step is forgotten, freeing its
slot under ``max_jobs`` (its ranks count as retired, reason ``job_expired``). Within a live job, a
rank that left the expected set (step 2) and has sent nothing for ``rank_expiry_s`` is forgotten
with its series (reason ``idle``), unless it is in an open step; a rejoining rank starts afresh.
A job holds at most ``max_ranks_per_job`` ranks: a summary of a further new rank is rejected
(``rank_limit``).
"""
from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from aggregator.stepindex import UNKNOWN_DIGEST, Seen, StepIndex, digest
from chopper.attribution import straggler
from chopper.attribution.columns import DVFS_CAUSES, STEP_COLUMNS
from chopper.identity.jobname import job_name_problem
from chopper.proto.chopper.v1 import agent_pb2 as pb

NS = 1_000_000_000
# Seconds by cause; they add up to the step time of every row (``compute_unknown`` holds
# ``compute_at_clock_s`` of rows whose ideal time is unknown).
CAUSES: tuple[str, ...] = (
    "ideal", "matrix_util_loss", *(f"dvfs_{c}" for c in DVFS_CAUSES), "exposed_comm", "straggler_wait", "idle",
    "compute_unknown",
)
WINDOWS_S: tuple[int, ...] = (60, 300)
# Columns of a stored row beyond the attribution contract.
# ``wal_id`` is the summary's id in the aggregator's write-ahead log (``aggregator.wal.summary_id``; -1
# without a log): recovery reads it back to skip summaries already stored. ``digest`` is
# ``stepindex.digest`` of the summary: the step index is rebuilt from it at start.
JOB_COLUMNS: tuple[str, ...] = (
    "job_step_time_s", "straggler_score", "slowest", "late", "complete", "received_ns", "wal_id", "digest",
)
ROW_COLUMNS: tuple[str, ...] = (*STEP_COLUMNS, *JOB_COLUMNS)
REJECTION_REASONS: dict[str, str] = {
    "invalid": "a job name chopper/identity/jobname.py refuses (empty, unprintable, too long for the store), "
               "a negative rank "
               "or step, a step time that is negative or not finite, seconds by cause outside [0, step time], or "
               "energy that is negative or infinite",
    "job_limit": "a new job while max_jobs jobs are live",
    "rank_limit": "a new rank of a job that already holds max_ranks_per_job ranks",
    "duplicate_rank_step": "a (job, rank, step) already taken in, from any agent or incarnation, with the same "
                           "content: dropped and acknowledged (the first copy stands)",
    "conflict": "a (job, rank, step) already taken in with other content: set aside in store_dir/_conflicts, "
                "flagged conflict (the first copy stands)",
    "unverifiable": "a step older than the step index remembers for its job (it may be a copy): set aside in "
                    "store_dir/_conflicts, flagged unverifiable",
}

# StepSummary fields copied into float64 columns (``tokens`` too: offline rows carry NaN there).
_FLOATS = tuple(c for c in STEP_COLUMNS if c not in ("job", "node", "rank", "gpu", "step", "begin_ns", "end_ns",
                                                     "straggler_wait_s", "flags", "phase_s"))
_INTS = ("rank", "gpu", "step", "begin_ns", "end_ns")
# Seconds of a step by cause that may be NaN (unknown) in a summary, else within the step time.
_CAUSE_FIELDS = ("ideal_s", "matrix_util_loss_s", "compute_at_clock_s", "dvfs_loss_s",
                 *(f"dvfs_{c}_s" for c in DVFS_CAUSES), "idle_s")
# Layout of a job's sums (``JobState.totals`` and each window bucket): known ideal, time with known
# ideal, all time, seconds by cause, energy and tokens of rows with both known.
_W_IDEAL, _W_TIME_KNOWN, _W_TIME = 0, 1, 2
_W_CAUSE = 3
_W_ENERGY = _W_CAUSE + len(CAUSES)
_W_TOKENS = _W_ENERGY + 1
_W_SIZE = _W_TOKENS + 1
# Finalized step numbers remembered per job to tell a late summary from a new step.
FINALIZED_MEMORY = 4096
# Top-k ranking of ranks decays compute excess with this time constant.
EXCESS_TAU_S = 60.0


@dataclass
class RankState:
    """What ``/metrics`` shows of one rank: counters since it joined, its last step, its excess."""

    node: str
    gpu: int
    last_ns: int = 0  # receive time of its last summary
    seconds: np.ndarray = field(default_factory=lambda: np.zeros(len(CAUSES)))
    last_step_time_s: float = math.nan
    missing_steps: int = 0
    miss_streak: int = 0
    # Compute excess over the step's median, s, decayed with EXCESS_TAU_S; at ``excess_ns``.
    excess_s: float = 0.0
    excess_ns: int = 0

    def excess_at(self, now_ns: int) -> float:
        """The decayed compute excess at ``now_ns``, s."""
        return self.excess_s * math.exp(-max(0, now_ns - self.excess_ns) / NS / EXCESS_TAU_S)


@dataclass
class _Final:
    """A finalized step as late summaries need it."""

    job_step_time_s: float
    straggler_score: float
    complete: bool


@dataclass
class JobState:
    """Everything held for one live job."""

    job: str
    first_ns: int
    last_ns: int
    ranks: dict[int, RankState] = field(default_factory=dict)
    expected: set[int] = field(default_factory=set)
    open: dict[int, tuple[int, dict[int, pb.StepSummary]]] = field(default_factory=dict)
    # Write-ahead-log ids of the open steps' summaries, step -> rank -> id, in arrival order.
    open_ids: dict[int, dict[int, int]] = field(default_factory=dict)
    finalized: OrderedDict[int, _Final] = field(default_factory=OrderedDict)
    steps_finalized_total: int = 0
    incomplete_total: int = 0
    late_total: int = 0
    missing_rank_steps_total: int = 0
    rank_set_changes_total: int = 0
    duplicate_total: int = 0
    # Sums since the job started, in the window vector layout (module step 7).
    totals: np.ndarray = field(default_factory=lambda: np.zeros(_W_SIZE))
    buckets: deque[tuple[int, np.ndarray]] = field(default_factory=deque)
    last_step: int = -1
    last_step_time_s: float = math.nan
    last_straggler_score: float = math.nan
    # (rank, node, gpu, cause) of the slowest rank of the last finalized multi-rank step.
    last_slowest: tuple[int, str, int, str] | None = None

    @property
    def seconds(self) -> np.ndarray:
        """Step time of all ranks by cause (``CAUSES`` order) since the job started, s."""
        return self.totals[_W_CAUSE:_W_ENERGY]

    @property
    def flops_step_seconds(self) -> float:
        """Step time of all ranks' steps whose ideal time is known, since the job started, s."""
        return float(self.totals[_W_TIME_KNOWN])

    @property
    def energy_joules(self) -> float:
        """Energy of all ranks' steps whose energy and tokens are both known, since the job started, J."""
        return float(self.totals[_W_ENERGY])

    @property
    def tokens(self) -> float:
        """Tokens of all ranks' steps whose energy and tokens are both known, since the job started."""
        return float(self.totals[_W_TOKENS])

    def window(self, now_ns: int, seconds: int) -> np.ndarray:
        """Sum of the buckets received in the last ``seconds`` (window vector layout)."""
        lo = now_ns // NS - seconds
        total = np.zeros(_W_SIZE)
        for sec, vec in reversed(self.buckets):
            if sec <= lo:
                break
            total += vec
        return total

    def mfu(self, now_ns: int, seconds: int) -> float:
        """``Σ ideal / Σ step time`` over rows with known ideal time in the window, 0-1 (NaN: none).

        Deprecated with ``chopper_job_mfu_ratio``: PromQL divides the rates of the counters instead.
        """
        w = self.window(now_ns, seconds)
        return float(w[_W_IDEAL] / w[_W_TIME_KNOWN]) if w[_W_TIME_KNOWN] > 0 else math.nan

    def shares(self, now_ns: int, seconds: int) -> dict[str, float]:
        """Seconds by cause ÷ all step seconds in the window, 0-1 each (empty: no step)."""
        w = self.window(now_ns, seconds)
        if w[_W_TIME] <= 0:
            return {}
        return {c: float(w[_W_CAUSE + i] / w[_W_TIME]) for i, c in enumerate(CAUSES)}

    def energy_per_token(self, now_ns: int, seconds: int) -> float:
        """``Σ energy / Σ tokens`` over rows with both known in the window, J (NaN: none).

        Deprecated with ``chopper_job_energy_per_token_joules``: PromQL divides the counters' rates instead.
        """
        w = self.window(now_ns, seconds)
        return float(w[_W_ENERGY] / w[_W_TOKENS]) if w[_W_TOKENS] > 0 else math.nan


@dataclass
class StepResult:
    """One finalized step at job level (becomes a ``chopper.v1.JobStep``)."""

    job: str
    step: int
    complete: bool
    ranks_reported: int
    ranks_expected: int
    job_step_time_s: float
    slowest_rank: int
    straggler_score: float
    slowest_cause: str
    # Positions of this step's rows in ``Finalized.rows``.
    index: np.ndarray


@dataclass
class Finalized:
    """What one ``add``/``expire``/``close`` call finalized.

    Attributes:
        rows: One row per rank of each finalized step, plus late rows, with ``ROW_COLUMNS``.
        steps: The finalized steps (late rows belong to none).
        aside: Conflicting and unverifiable copies (module step 3), with ``ROW_COLUMNS``; for
            ``store_dir/_conflicts``, never for the job's figures. None: none.
    """

    rows: pd.DataFrame
    steps: list[StepResult]
    aside: pd.DataFrame | None = None


def _empty_rows() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object if c in ("job", "node", "flags", "phase_s") else float)
                         for c in ROW_COLUMNS})


# Returned, read-only, by every call that finalized nothing: building an empty frame costs ~1 ms.
_NOTHING = _empty_rows()


class JobTable:
    """Joins step summaries of many jobs by ``(job, step)`` (module docstring, steps 1-6).

    Args:
        step_timeout_s: A step still missing ranks this long after its first summary is
            finalized as incomplete, s.
        max_jobs: Live jobs held at most; summaries of further new jobs are rejected.
        join_s: Rank-discovery period after a job's first summary, s; None: ``step_timeout_s``.
        vanish_after_steps: A rank missing this many finalized steps in a row leaves the
            expected set.
        max_open_steps: Open steps held per job at most.
        job_expiry_s: A job silent this long with no open step is forgotten, s.
        rank_expiry_s: A rank out of the expected set and silent this long is forgotten, s.
        max_ranks_per_job: Ranks held per job at most; summaries of further new ranks are rejected.
        index: The keys already taken in (module step 3); None: a new, empty one.
        finalize_every_s: ``add`` finalizes the steps it completed at most this often (they
            wait, still open, for the next ``add`` or ``expire``), s: attributing many steps in
            one vectorized pass costs about what one step does, so many small batches of small
            jobs need this. 0: at once.
    """

    def __init__(
        self,
        step_timeout_s: float,
        max_jobs: int = 10_000,
        join_s: float | None = None,
        vanish_after_steps: int = 3,
        max_open_steps: int = 256,
        job_expiry_s: float = 900.0,
        finalize_every_s: float = 0.0,
        rank_expiry_s: float = 300.0,
        max_ranks_per_job: int = 65_536,
        index: StepIndex | None = None,
    ) -> None:
        self.step_timeout_ns = int(step_timeout_s * NS)
        self.join_ns = self.step_timeout_ns if join_s is None else int(join_s * NS)
        self.max_jobs = max_jobs
        self.vanish_after_steps = vanish_after_steps
        self.max_open_steps = max_open_steps
        self.job_expiry_ns = int(job_expiry_s * NS)
        self.rank_expiry_ns = int(rank_expiry_s * NS)
        self.max_ranks_per_job = max_ranks_per_job
        self.index = index if index is not None else StepIndex()
        self.jobs: dict[str, JobState] = {}
        self.ranks_retired: dict[str, int] = {"idle": 0, "job_expired": 0}
        self.rejected: dict[str, int] = dict.fromkeys(REJECTION_REASONS, 0)
        self.jobs_expired_total = 0
        self.finalize_every_ns = int(finalize_every_s * NS)
        self._last_finalize_ns: int | None = None
        # Steps found ready by ``add`` and not finalized yet: (job, step) -> complete.
        self._pending: dict[tuple[str, int], bool] = {}

    # Ingest ---------------------------------------------------------------------------------

    def add(self, summaries: Iterable[pb.StepSummary], now_ns: int, ids: Iterable[int] | None = None) -> Finalized:
        """Join summaries received at ``now_ns``; return the steps this completed and late rows.

        Args:
            summaries: The summaries, in arrival order.
            now_ns: Receive time, ns since the epoch.
            ids: An opaque, increasing id per summary (its write-ahead-log id), carried into the
                ``wal_id`` column of its row and reported by ``oldest_open_id``; None: -1.
        """
        late: list[tuple[JobState, pb.StepSummary, int]] = []
        aside: list[tuple[pb.StepSummary, int, str]] = []
        touched: dict[str, JobState] = {}
        for s, sid in zip(summaries, ids, strict=True) if ids is not None else ((s, -1) for s in summaries):
            if _invalid(s):
                self.rejected["invalid"] += 1
                continue
            job = self.jobs.get(s.job)
            opened = job.open.get(s.step) if job is not None else None
            seen = (digest(opened[1][s.rank]) if s.rank in opened[1] else Seen.NEW_RANK) if opened is not None else (
                self.index.lookup(s.job, s.step, s.rank))
            if not isinstance(seen, Seen) or seen is Seen.BEYOND:
                reason = self._copy(s, seen, job)
                if reason is not None:
                    aside.append((s, sid, reason))
                continue
            if job is None:
                if len(self.jobs) >= self.max_jobs:
                    self.rejected["job_limit"] += 1
                    continue
                job = self.jobs[s.job] = JobState(s.job, now_ns, now_ns)
            if s.rank not in job.ranks and len(job.ranks) >= self.max_ranks_per_job:
                self.rejected["rank_limit"] += 1
                continue
            job.last_ns = now_ns
            touched[job.job] = job
            self._join_rank(job, s, now_ns)
            if opened is None:
                if seen is Seen.NEW_RANK:
                    job.late_total += 1
                    late.append((job, s, sid))
                    # Held at once: a second copy in this same call is a copy, not late again.
                    self.index.add(s.job, s.step, np.array([s.rank]), np.array([digest(s)]))
                    continue
                opened = job.open[s.step] = (now_ns, {})
            opened[1][s.rank] = s
            if sid >= 0:
                job.open_ids.setdefault(s.step, {})[s.rank] = sid
        for job in touched.values():
            for _, step, complete in self._ready(job, now_ns):
                self._pending[(job.job, step)] = complete
        last = self._last_finalize_ns
        done = Finalized(_NOTHING, [])
        if late or last is None or now_ns - last >= self.finalize_every_ns:
            done = self._finalize(self._take_pending(), late, now_ns)
        if aside:
            done.aside = _aside_frame(aside, now_ns)
        return done

    def _copy(self, s: pb.StepSummary, seen: int | Seen, job: JobState | None) -> str | None:
        """Count a copy of a key already taken in (module step 3); the reason to set it aside, or None (dropped)."""
        if seen is Seen.BEYOND:
            reason: str | None = "unverifiable"
        elif seen == digest(s) or seen == UNKNOWN_DIGEST:
            reason = None
            if job is not None:
                job.duplicate_total += 1
        else:
            reason = "conflict"
        self.rejected[reason or "duplicate_rank_step"] += 1
        return reason

    def oldest_open_id(self) -> int | None:
        """The smallest id of a summary in an open step (None: none has one).

        Ids increase in arrival order and a step's ids are kept in arrival order, so each open
        step's first id is its smallest: this costs one look per open step, not per rank.
        """
        return min((next(iter(ids.values())) for job in self.jobs.values() for ids in job.open_ids.values() if ids),
                   default=None)

    def _take_pending(self) -> list[tuple[JobState, int, bool]]:
        out = [(self.jobs[job], step, complete) for (job, step), complete in self._pending.items()]
        self._pending.clear()
        return out

    def expire(self, now_ns: int) -> Finalized:
        """Finalize steps that timed out or completed (a rank vanished); forget silent jobs."""
        for job in self.jobs.values():
            for _, step, complete in self._ready(job, now_ns):
                self._pending[(job.job, step)] = complete
        out = self._finalize(self._take_pending(), [], now_ns)
        for name in [n for n, j in self.jobs.items() if not j.open and now_ns - j.last_ns >= self.job_expiry_ns]:
            self.ranks_retired["job_expired"] += len(self.jobs.pop(name).ranks)
            self.jobs_expired_total += 1
        for job in self.jobs.values():
            if len(job.ranks) > len(job.expected):  # only a rank out of the expected set can go
                self._retire_ranks(job, now_ns)
        return out

    def _retire_ranks(self, job: JobState, now_ns: int) -> None:
        """Forget the ranks of ``job`` out of its expected set, silent for ``rank_expiry_s``, in no open step."""
        in_open = {r for _, rows in job.open.values() for r in rows}
        gone = [r for r, st in job.ranks.items()
                if r not in job.expected and r not in in_open and now_ns - st.last_ns >= self.rank_expiry_ns]
        for rank in gone:
            del job.ranks[rank]
        self.ranks_retired["idle"] += len(gone)

    def close(self, now_ns: int) -> Finalized:
        """Finalize every open step (shutdown): complete ones as such, the rest as incomplete."""
        self._pending.clear()
        ready = [(job, step, len(job.open[step][1]) >= len(job.expected))
                 for job in self.jobs.values() for step in sorted(job.open)]
        return self._finalize(ready, [], now_ns)

    def _join_rank(self, job: JobState, s: pb.StepSummary, now_ns: int) -> None:
        state = job.ranks.get(s.rank)
        if state is None:
            state = job.ranks[s.rank] = RankState(s.node, s.gpu, excess_ns=now_ns)
        else:
            # A rank moved to another node/GPU (restarted elsewhere): its series follow it.
            state.node, state.gpu = s.node, s.gpu
        state.last_ns = now_ns
        state.miss_streak = 0
        if s.rank not in job.expected:
            # Strictly after: with join_s=0 the ranks of the job's first batch are its rank set.
            if now_ns - job.first_ns > self.join_ns:
                job.rank_set_changes_total += 1
            job.expected.add(s.rank)

    def _ready(self, job: JobState, now_ns: int) -> list[tuple[JobState, int, bool]]:
        """Open steps of ``job`` to finalize now, each with whether it is complete."""
        joined = now_ns - job.first_ns >= self.join_ns
        want = len(job.expected)
        out = []
        for step, (first_ns, rows) in job.open.items():
            if joined and len(rows) >= want:
                out.append((job, step, True))
            elif now_ns - first_ns >= self.step_timeout_ns:
                out.append((job, step, False))
        excess = len(job.open) - len(out) - self.max_open_steps
        if excess > 0:
            chosen = {s for _, s, _ in out}
            oldest = sorted((first_ns, step) for step, (first_ns, _) in job.open.items() if step not in chosen)
            out += [(job, step, False) for _, step in oldest[:excess]]
        return out

    # Finalize -------------------------------------------------------------------------------

    def _finalize(
        self, ready: list[tuple[JobState, int, bool]], late: list[tuple[JobState, pb.StepSummary, int]], now_ns: int
    ) -> Finalized:
        self._last_finalize_ns = now_ns
        if not ready and not late:
            return Finalized(_NOTHING, [])
        # Oldest steps first so that per-job "last" figures end on the newest step.
        ready.sort(key=lambda r: (r[0].job, r[1]))
        summaries: list[pb.StepSummary] = []
        wal_ids: list[int] = []
        meta: list[tuple[JobState, int, bool, int, int, int]] = []
        for job, step, complete in ready:
            _, rows = job.open.pop(step)
            ids = job.open_ids.pop(step, {})
            meta.append((job, step, complete, len(summaries), len(rows), max(len(job.expected), len(rows))))
            order = sorted(rows)
            summaries.extend(rows[r] for r in order)
            wal_ids.extend(ids.get(r, -1) for r in order)
            self._account_missing(job, rows, complete)
        frame = _frame(summaries)
        frame["compute_s"] = _compute_s(frame)
        frame = straggler.straggler_wait(frame)
        slow = straggler.slowest_ranks(frame)
        keys = frame.groupby(["job", "step"], sort=False)
        frame["job_step_time_s"] = keys["step_time_s"].transform("max")
        median_step = keys["step_time_s"].transform("median").to_numpy()
        excess = frame["compute_s"].to_numpy() - keys["compute_s"].transform("median").to_numpy()
        slow_at = {(r.job, int(r.step)): r for r in slow.itertuples(index=False)}
        slowest = np.zeros(len(frame), dtype=bool)
        score = np.full(len(frame), math.nan)
        results: list[StepResult] = []
        ranks, digests = frame["rank"].to_numpy(), frame["digest"].to_numpy()
        for job, step, complete, start, n, expected in meta:
            index = np.arange(start, start + n)
            self.index.add(job.job, step, ranks[index], digests[index])
            s = slow_at.get((job.job, step))
            med = median_step[start]
            if s is not None:
                pos = start + int(np.flatnonzero(ranks[index] == s.rank)[0])
                slowest[pos] = True
                step_score = float(s.compute_excess_s / med) if med > 0 else math.nan
                slowest_rank, cause = int(s.rank), str(s.cause)
                job.last_slowest = (slowest_rank, str(s.node), int(s.gpu), cause)
            else:
                step_score, slowest_rank, cause = 0.0, -1, "none"
            score[index] = step_score
            job_time = float(frame["job_step_time_s"].iat[start])
            results.append(StepResult(job.job, step, complete, n, expected, job_time,
                                      slowest_rank, step_score, cause, index))
            self._remember(job, step, _Final(job_time, step_score, complete))
            job.steps_finalized_total += 1
            if not complete:
                job.incomplete_total += 1
            if step >= job.last_step:
                job.last_step, job.last_step_time_s, job.last_straggler_score = step, job_time, step_score
        frame["straggler_score"] = score
        frame["slowest"] = slowest
        frame["late"] = False
        frame["complete"] = np.repeat([m[2] for m in meta], [m[4] for m in meta]).astype(bool)
        frame["flags"] = [(*f, "slowest_rank") if sl else f for f, sl in zip(frame["flags"], slowest, strict=True)]
        frame["wal_id"] = np.asarray(wal_ids, dtype=np.int64)
        if late:
            finals = [job.finalized.get(s.step) for job, s, _ in late]
            side = _side_frame([s for _, s, _ in late], [sid for _, _, sid in late], finals, late=True)
            frame = pd.concat([frame, side], ignore_index=True) if len(frame) else side
            excess = np.concatenate([excess, np.zeros(len(late))])
        frame["received_ns"] = np.int64(now_ns)
        self._account_rows(frame, excess, now_ns)
        return Finalized(frame[list(ROW_COLUMNS)], results)

    def _remember(self, job: JobState, step: int, final: _Final) -> None:
        job.finalized[step] = final
        while len(job.finalized) > FINALIZED_MEMORY:
            job.finalized.popitem(last=False)

    def _account_missing(self, job: JobState, rows: dict[int, pb.StepSummary], complete: bool) -> None:
        """Count the ranks missing from an incomplete step; drop ranks that keep missing."""
        if complete:
            return
        for rank in [r for r in job.expected if r not in rows]:
            state = job.ranks[rank]
            state.missing_steps += 1
            state.miss_streak += 1
            job.missing_rank_steps_total += 1
            if state.miss_streak >= self.vanish_after_steps:
                job.expected.discard(rank)
                job.rank_set_changes_total += 1

    def _account_rows(self, frame: pd.DataFrame, excess: np.ndarray, now_ns: int) -> None:
        """Rank counters, job counters and this second's window bucket (module step 7)."""
        ideal = frame["ideal_s"].to_numpy(dtype=float)
        known = ~np.isnan(ideal)
        step_s = frame["step_time_s"].to_numpy(dtype=float)
        cause = np.column_stack([
            np.nan_to_num(ideal),
            np.nan_to_num(frame["matrix_util_loss_s"].to_numpy(dtype=float)),
            *(np.nan_to_num(frame[f"dvfs_{c}_s"].to_numpy(dtype=float)) for c in DVFS_CAUSES),
            frame["exposed_comm_s"].to_numpy(dtype=float),
            frame["straggler_wait_s"].to_numpy(dtype=float),
            np.nan_to_num(frame["idle_s"].to_numpy(dtype=float)),
            np.where(known, 0.0, np.nan_to_num(frame["compute_at_clock_s"].to_numpy(dtype=float))),
        ])
        energy = frame["energy_j"].to_numpy(dtype=float)
        tokens = frame["tokens"].to_numpy(dtype=float)
        both = ~np.isnan(energy) & (tokens > 0)
        jobs = frame["job"].to_numpy()
        ranks = frame["rank"].to_numpy()
        second = now_ns // NS
        for name, idx in pd.Series(np.arange(len(frame))).groupby(jobs, sort=False).groups.items():
            job = self.jobs[str(name)]
            rows = np.asarray(idx)
            vec = np.zeros(_W_SIZE)
            vec[_W_IDEAL] = ideal[rows][known[rows]].sum()
            vec[_W_TIME_KNOWN] = step_s[rows][known[rows]].sum()
            vec[_W_TIME] = step_s[rows].sum()
            vec[_W_CAUSE:_W_ENERGY] = cause[rows].sum(axis=0)
            vec[_W_ENERGY] = energy[rows][both[rows]].sum()
            vec[_W_TOKENS] = tokens[rows][both[rows]].sum()
            job.totals += vec
            if job.buckets and job.buckets[-1][0] == second:
                job.buckets[-1][1][:] += vec
            else:
                job.buckets.append((second, vec))
            while job.buckets and job.buckets[0][0] <= second - WINDOWS_S[-1]:
                job.buckets.popleft()
            for i in rows:
                state = job.ranks[int(ranks[i])]
                state.seconds += cause[i]
                state.last_step_time_s = float(step_s[i])
                state.excess_s = state.excess_at(now_ns) + max(0.0, float(excess[i]))
                state.excess_ns = now_ns


def _side_frame(summaries: list[pb.StepSummary], sids: list[int], finals: list[_Final | None],
                late: bool) -> pd.DataFrame:
    """Rows of summaries that take no part in a step's finalization: late ones (with the step's
    job-level figures in ``finals`` where remembered) or copies set aside."""
    frame = _frame(summaries)
    frame["compute_s"] = _compute_s(frame)
    frame["straggler_wait_s"] = 0.0
    frame["job_step_time_s"] = [f.job_step_time_s if f else math.nan for f in finals]
    frame["straggler_score"] = [f.straggler_score if f else math.nan for f in finals]
    frame["complete"] = [f.complete if f else False for f in finals]
    frame["slowest"] = False
    frame["late"] = late
    frame["wal_id"] = np.asarray(sids, dtype=np.int64)
    return frame


def _aside_frame(aside: list[tuple[pb.StepSummary, int, str]], now_ns: int) -> pd.DataFrame:
    """``Finalized.aside``: the copies set aside, each flagged with its reason (module step 3)."""
    frame = _side_frame([s for s, _, _ in aside], [sid for _, sid, _ in aside], [None] * len(aside), late=False)
    frame["flags"] = [(*f, reason) for f, (_, _, reason) in zip(frame["flags"], aside, strict=True)]
    frame["received_ns"] = np.int64(now_ns)
    return frame[list(ROW_COLUMNS)]


def _invalid(s: pb.StepSummary) -> bool:
    """A summary the job view cannot take (module step 1).

    A job name the store cannot name a directory for would fail every write, of every job; a step
    time or a cause outside ``[0, step time]`` (beyond rounding) would turn the job's rolling
    shares into infinities or NaN for the whole window.
    """
    if s.rank < 0 or s.step < 0 or job_name_problem(s.job):
        return True
    total = s.step_time_s
    if not 0 <= total < math.inf:
        return True
    top = total * (1 + 1e-6) + 1e-9
    if not (0 <= s.exposed_comm_s <= top and (math.isnan(s.energy_j) or 0 <= s.energy_j < math.inf)):
        return True
    # NaN where the agent could not tell (no FLOPs, no samples); otherwise a share of the step.
    return any(not (math.isnan(v) or 0 <= v <= top) for v in (getattr(s, c) for c in _CAUSE_FIELDS))


def _compute_s(frame: pd.DataFrame) -> pd.Series:
    """Compute time before the straggler split, s: step time − idle − exposed communication.

    Idle is NaN for a rank without GPU samples (no GPU, or a backend down); it counts as 0 here as
    in the rolling windows, so the slowest rank of a step is found among finite figures.
    """
    return frame["step_time_s"] - frame["idle_s"].fillna(0.0) - frame["exposed_comm_s"]


def _frame(summaries: list[pb.StepSummary]) -> pd.DataFrame:
    """Rank rows of ``summaries`` with the attribution columns (straggler wait still 0)."""
    data: dict[str, Any] = {
        "job": [s.job for s in summaries],
        "node": [s.node for s in summaries],
        **{c: np.fromiter((getattr(s, c) for s in summaries), dtype=np.int64, count=len(summaries)) for c in _INTS},
        **{c: np.fromiter((getattr(s, c) for s in summaries), dtype=np.float64, count=len(summaries))
           for c in _FLOATS},
        "straggler_wait_s": np.zeros(len(summaries)),
        "digest": np.fromiter((digest(s) for s in summaries), dtype=np.int64, count=len(summaries)),
        "flags": [tuple(s.flags) for s in summaries],
        "phase_s": [{p.name: p.seconds for p in s.phase_times} for s in summaries],
    }
    return pd.DataFrame(data)
