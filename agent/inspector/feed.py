"""Inspector records → collectives on the timelines of the ranks that ran them, and their totals.

The NCCL / RCCL Inspector plugin writes one record per collective per communicator, naming the
process (hostname, pid) and its rank in that communicator, never the job (docs/INSPECTOR.md).
``InspectorFeed.add`` maps each record, first rule that applies:

1. ``registration``: exactly one ``(job, rank)`` of this node sent markers from the record's pid
   (``MarkerBatch.pid``): that job, rank and GPU.
2. ``directory``: the record's file lies in a sub-directory of ``inspector_dir``: its first path
   component is the job (the recipes point ``NCCL_INSPECTOR_DUMP_DIR`` at ``inspector_dir/<job>``);
   the rank is the process's rank in the largest communicator it has reported (its world rank
   once it reported the world communicator); GPU -1.
3. else ``unmapped``: job "" and rank -1; the record counts in the per-collective totals only.

A pid registered by more than one ``(job, rank)`` (trainers in containers with their own pid
namespaces) is ambiguous and falls through to rule 2. A record of a pid nobody registered yet is
held up to ``HOLD_NS`` first: NCCL's first collectives (communicator set-up, the first step's) can
be dumped before the trainer's first marker batch reaches the agent, and they belong to its rank.
A registration within that time claims them (rule 1); after it, rules 2 and 3 apply.

Each mapped record becomes one interval ``[begin_ns, end_ns]`` of its rank (``CollectiveRecord``):
the plugin's event timestamps where it wrote them (verbose dumps, ``placed``), else ending at its
dump time and lasting its execution time (not placed: late by up to the plugin's dump interval).
What the step account takes from them is ``collectives_in``; when a step summary may be written
is ``covers``: once the rank's records were dumped past the step's end. A rank whose process turned
the plugin on (``MarkerBatch.inspector_enabled``) is waited for from its first step, before any of
its records arrived (the plugin's first dump comes after that step's end); one whose records have
not come ``EXPECT_NS`` after it registered is ``silent`` and no longer waited for.

Totals by ``(job, collective, size bucket)`` feed ``/metrics``: count, execution seconds, bytes,
and bus bytes (bus bandwidth × execution time, so rate(bus bytes) / rate(seconds) is the
time-weighted mean bus bandwidth). Memory is bounded whatever the plugin writes: ``max_ranks``
ranks of ``MAX_INTERVALS_PER_RANK`` intervals, ``MAX_JOBS`` jobs in the totals (the job idle
longest goes first), ``KNOWN_COLLECTIVES`` names (others are ``other``), ``SIZE_BUCKETS`` buckets,
``MAX_PIDS`` remembered processes.

Thread safety: ``add`` runs on the watcher's thread, the rest on the sampler's and gRPC threads;
one lock guards everything.
"""
from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import PurePath

from chopper.inspector.format import KNOWN_COLLECTIVES, InspectorRecord
from chopper.proto.chopper.v1 import agent_pb2 as pb

# Intervals kept per rank: at ~100 collectives a step and one step a second, over a minute of steps,
# far more than the summary queue ever waits for.
MAX_INTERVALS_PER_RANK = 8192
# Jobs with per-collective totals on /metrics; an older job's series go when a new one arrives.
MAX_JOBS = 64
# How long a record of an unregistered pid waits for its registration, and how many wait at most
# (beyond, the oldest is mapped by rules 2-3 at once).
HOLD_NS = 5 * 10**9
MAX_HELD = 8192
# How long a rank that turned the plugin on is waited for before its first record; after it the rank is
# silent (its NCCL_INSPECTOR_DUMP_DIR lies outside inspector_dir, or its NCCL loads no profiler plugin).
EXPECT_NS = 30 * 10**9
# Processes whose largest communicator is remembered (rule 2).
MAX_PIDS = 4096
# Intervals that ended this long before a window's begin are not looked at (records of several
# communicators arrive out of order by about one dump interval).
LOOKBACK_SLACK_NS = 30 * 10**9
# Upper bounds of the message-size buckets, bytes, and their labels (the last is open).
SIZE_BUCKETS: tuple[tuple[float, str], ...] = (
    (64 * 2**10, "lt64KiB"), (2**20, "64KiB-1MiB"), (16 * 2**20, "1-16MiB"), (256 * 2**20, "16-256MiB"),
    (float("inf"), "ge256MiB"),
)
# How each record found its rank: the ``via`` label of chopper_inspector_records_mapped_total.
MAPPINGS: dict[str, str] = {
    "registration": "one (job, rank) of this node sent markers from the record's pid",
    "directory": "the record's file lies in inspector_dir/<job>/; rank from the process's largest communicator",
    "unmapped": "neither: counted in the per-collective totals under job \"\" only",
}


def size_bucket(nbytes: float) -> str:
    """The label of the message-size bucket of ``nbytes``."""
    return next(label for bound, label in SIZE_BUCKETS if nbytes < bound)


def collective_label(name: str) -> str:
    """The ``collective`` label: the plugin's name when it is one NCCL writes, else "other" (a garbled
    dump cannot grow /metrics)."""
    return name if name in KNOWN_COLLECTIVES else "other"


@dataclass(frozen=True, slots=True)
class CollectiveInterval:
    """One collective of one rank, ns on CLOCK_REALTIME; ``placed`` as in the module docstring."""

    begin_ns: int
    end_ns: int
    bytes: int
    collective: str
    placed: bool


@dataclass(frozen=True, slots=True)
class StepPiece:
    """The part of one collective inside one step, ns; ``counted``: the collective ended in this step."""

    lo_ns: int
    hi_ns: int
    bytes: int
    counted: bool
    placed: bool


@dataclass(slots=True)
class CollectiveTotals:
    """What the records of one ``(job, collective, size bucket)`` add up to; seconds, bytes."""

    count: int = 0
    seconds: float = 0.0
    bytes: float = 0.0
    bus_bytes: float = 0.0


@dataclass(slots=True)
class _RankRecords:
    gpu: int
    intervals: deque[CollectiveInterval] = field(default_factory=lambda: deque(maxlen=MAX_INTERVALS_PER_RANK))
    latest_dump_ns: int = 0  # the newest record's dump time: every collective that ended before it is in


@dataclass(frozen=True)
class FeedCounts:
    """A consistent copy of the feed's counters, for one scrape."""

    mapped: dict[str, int]
    totals: dict[tuple[str, str, str], CollectiveTotals]
    ranks: int
    unplaced: int
    held: int
    silent: int  # ranks that turned the plugin on and sent no record within EXPECT_NS


class InspectorFeed:
    """Maps Inspector records to ranks and keeps each rank's recent collectives (module docstring).

    Args:
        node: This node's name, on every ``CollectiveRecord``.
        max_ranks: Ranks whose intervals are kept; the one updated longest ago goes first.
    """

    def __init__(self, node: str, max_ranks: int, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.node = node
        self.max_ranks = max_ranks
        self._clock = clock
        self._lock = threading.Lock()
        self._held: deque[tuple[int, InspectorRecord, str]] = deque()  # (arrival ns, record, directory job)
        self._pids: dict[int, set[tuple[str, int, int]]] = {}  # pid -> registered (job, rank, gpu)
        self._registered: dict[tuple[str, int], tuple[int, int]] = {}  # (job, rank) -> its (pid, gpu) in _pids
        self._world: OrderedDict[int, tuple[int, int]] = OrderedDict()  # pid -> (largest comm size, rank in it)
        self._ranks: OrderedDict[tuple[str, int], _RankRecords] = OrderedDict()
        # (job, rank) that turned the plugin on and has no record yet -> when it registered, ns.
        self._expected: dict[tuple[str, int], int] = {}
        self._totals: OrderedDict[str, dict[tuple[str, str], CollectiveTotals]] = OrderedDict()
        self._mapped: Counter[str] = Counter(dict.fromkeys(MAPPINGS, 0))
        self._unplaced = 0

    # -- registration (from the marker path) ---------------------------------------------------

    def register(self, pid: int, job: str, rank: int, gpu: int,
                 inspector_enabled: bool = False) -> list[pb.CollectiveRecord]:
        """Note that ``(job, rank)`` on GPU ``gpu`` sends markers from process ``pid`` (called for every
        batch; a registration that did not change costs a lookup) and, with ``inspector_enabled``, that
        its records are to be waited for; the held records it claims and those whose hold ran out,
        placed, in their wire form."""
        if pid <= 0:
            return []
        key = (job, rank)
        with self._lock:
            if inspector_enabled and key not in self._ranks and key not in self._expected:
                self._expected[key] = self._clock()
            if self._registered.get(key) == (pid, gpu):
                return []
            self._unregister(key)
            self._registered[key] = (pid, gpu)
            self._pids.setdefault(pid, set()).add((job, rank, gpu))
            out = self._expire(self._clock())
            if any(r.pid == pid for _, r, _ in self._held):
                claimed = [h for h in self._held if h[1].pid == pid]
                self._held = deque(h for h in self._held if h[1].pid != pid)
                out += [self._place(r, directory_job) for _, r, directory_job in claimed]
            return out

    def forget(self, job: str, rank: int) -> None:
        """Drop a retired rank: its registration and its intervals."""
        with self._lock:
            self._ranks.pop((job, rank), None)
            self._expected.pop((job, rank), None)
            self._unregister((job, rank))

    def _unregister(self, key: tuple[str, int]) -> None:
        """Drop the registration of ``key`` = ``(job, rank)``, if any (caller holds the lock): a restarted
        trainer's old pid no longer names the rank."""
        old = self._registered.pop(key, None)
        if old is None:
            return
        pid, gpu = old
        owners = self._pids[pid]
        owners.discard((*key, gpu))
        if not owners:
            del self._pids[pid]

    # -- records (from the watcher) --------------------------------------------------------------

    def add(self, records: Iterable[InspectorRecord], path: str = "") -> list[pb.CollectiveRecord]:
        """Map records read from ``path`` (relative to ``inspector_dir``); their wire form, for subscribers."""
        directory_job = PurePath(path).parts[0] if len(PurePath(path).parts) > 1 else ""
        now = self._clock()
        with self._lock:
            out = self._expire(now)
            for r in records:
                if r.pid in self._pids:
                    out.append(self._place(r, directory_job))
                    continue
                self._held.append((now, r, directory_job))
                if len(self._held) > MAX_HELD:
                    _, old, old_job = self._held.popleft()
                    out.append(self._place(old, old_job))
        return out

    def expire(self) -> list[pb.CollectiveRecord]:
        """Place the held records whose hold ran out, in their wire form (the agent calls it about once a second)."""
        with self._lock:
            return self._expire(self._clock())

    def _expire(self, now_ns: int) -> list[pb.CollectiveRecord]:
        """Place the held records whose hold ran out (caller holds the lock)."""
        out = []
        while self._held and self._held[0][0] <= now_ns - HOLD_NS:
            _, r, directory_job = self._held.popleft()
            out.append(self._place(r, directory_job))
        return out

    def _place(self, r: InspectorRecord, directory_job: str) -> pb.CollectiveRecord:
        """Map one record, add it to its rank and the totals; its wire form (caller holds the lock)."""
        job, rank, gpu, via = self._map(r, directory_job)
        self._mapped[via] += 1
        begin_ns, end_ns, placed = _interval(r)
        self._unplaced += not placed
        self._add_totals(job, r)
        if rank >= 0:
            self._add_interval(job, rank, gpu, CollectiveInterval(begin_ns, end_ns, r.bytes, r.collective, placed),
                               r.dump_ns)
        return pb.CollectiveRecord(
            job=job, node=self.node, rank=rank, gpu=gpu, collective=r.collective, begin_ns=begin_ns, end_ns=end_ns,
            placed=placed, exec_s=r.exec_s, timing_source=r.timing_source, bytes=r.bytes,
            algo_bandwidth_gbs=r.algo_gbs, bus_bandwidth_gbs=r.bus_gbs, comm_id=r.comm_id, comm_rank=r.comm_rank,
            comm_ranks=r.comm_ranks, comm_nodes=r.comm_nodes, seq=r.seq, pid=r.pid, format_version=r.version,
        )

    def _map(self, r: InspectorRecord, directory_job: str) -> tuple[str, int, int, str]:
        """(job, rank, gpu, via) of one record (caller holds the lock)."""
        largest = self._world.get(r.pid)
        if largest is None or r.comm_ranks > largest[0]:
            largest = (r.comm_ranks, r.comm_rank)
        self._world[r.pid] = largest
        self._world.move_to_end(r.pid)
        while len(self._world) > MAX_PIDS:
            self._world.popitem(last=False)
        owners = self._pids.get(r.pid, ())
        if len(owners) == 1:
            job, rank, gpu = next(iter(owners))
            return job, rank, gpu, "registration"
        if directory_job:
            return directory_job, largest[1], -1, "directory"
        return "", -1, -1, "unmapped"

    def _add_interval(self, job: str, rank: int, gpu: int, interval: CollectiveInterval, dump_ns: int) -> None:
        key = (job, rank)
        ranks = self._ranks
        entry = ranks.get(key)
        if entry is None:
            entry = ranks[key] = _RankRecords(gpu)
            self._expected.pop(key, None)
            while len(ranks) > self.max_ranks:
                ranks.popitem(last=False)
        ranks.move_to_end(key)
        entry.gpu = gpu
        entry.intervals.append(interval)
        entry.latest_dump_ns = max(entry.latest_dump_ns, dump_ns)

    def _add_totals(self, job: str, r: InspectorRecord) -> None:
        jobs = self._totals
        if job not in jobs:
            jobs[job] = {}
            while len(jobs) > MAX_JOBS:
                jobs.popitem(last=False)
        jobs.move_to_end(job)
        t = jobs[job].setdefault((collective_label(r.collective), size_bucket(r.bytes)), CollectiveTotals())
        t.count += 1
        t.seconds += r.exec_s
        t.bytes += r.bytes
        t.bus_bytes += r.bus_gbs * 1e9 * r.exec_s

    # -- what the step account reads -------------------------------------------------------------

    def has_feed(self, job: str, rank: int) -> bool:
        """Whether any Inspector record was mapped to ``(job, rank)`` (and is still kept)."""
        with self._lock:
            return (job, rank) in self._ranks

    def covers(self, job: str, rank: int, end_ns: int) -> bool:
        """True when ``(job, rank)`` has no Inspector feed and expects none (or is silent), or its records
        were dumped at or after ``end_ns``."""
        with self._lock:
            entry = self._ranks.get((job, rank))
            if entry is not None:
                return entry.latest_dump_ns >= end_ns
            since = self._expected.get((job, rank))
            return since is None or self._clock() - since > EXPECT_NS

    def collectives_in(self, job: str, rank: int, begin_ns: int, end_ns: int) -> list[StepPiece]:
        """The rank's intervals that overlap the step ``[begin_ns, end_ns]``, clipped to it.

        As offline (``chopper.attribution.collective_source.clip_to_steps``), a record counts, with its
        bytes, in the step where it ended; a piece of one that ended later carries no bytes and no count.
        """
        with self._lock:
            entry = self._ranks.get((job, rank))
            if entry is None:
                return []
            picked = []
            for iv in reversed(entry.intervals):
                if iv.end_ns < begin_ns - LOOKBACK_SLACK_NS:
                    break
                ends_here = begin_ns <= iv.end_ns <= end_ns
                if ends_here or (iv.end_ns > begin_ns and iv.begin_ns < end_ns):
                    picked.append(StepPiece(max(iv.begin_ns, begin_ns), min(iv.end_ns, end_ns),
                                            iv.bytes if ends_here else 0, ends_here, iv.placed))
        picked.reverse()
        return picked

    def counts(self) -> FeedCounts:
        with self._lock:
            totals = {(job, coll, bucket): CollectiveTotals(t.count, t.seconds, t.bytes, t.bus_bytes)
                      for job, by_key in self._totals.items() for (coll, bucket), t in by_key.items()}
            now = self._clock()
            silent = sum(now - since > EXPECT_NS for since in self._expected.values())
            return FeedCounts(dict(self._mapped), totals, len(self._ranks), self._unplaced, len(self._held), silent)


def _interval(r: InspectorRecord) -> tuple[int, int, bool]:
    """``(begin_ns, end_ns, placed)`` of one record (module docstring)."""
    if r.begin_ns is not None and r.end_ns is not None and r.end_ns >= r.begin_ns:
        return r.begin_ns, r.end_ns, True
    end_ns = r.dump_ns
    return end_ns - round(r.exec_s * 1e9), end_ns, False
