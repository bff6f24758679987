"""Validation and per-rank bookkeeping of the markers trainers push to the agent.

``MarkerIngest.ingest`` takes one decoded ``MarkerBatch`` and returns what it accepted, what it
rejected (each with a reason key for metrics and a message naming the problem and the fix) and
the steps that closed. Algorithm, per batch:

Each check refuses the smallest unit that holds the problem, with a counted, named reason:

1. Check the batch header: a job name, a rank, a size limit. These name every marker of the
   batch, so a bad one rejects the whole batch.
1a. Resolve the rank's GPU (docs/IDENTITY.md): a ``device_uuid`` the node has names its GPU and
   wins over ``gpu``; a UUID it does not have, a client's ``unresolved:`` report or an index
   that is not one of this node's GPUs makes the GPU -1 and flags the rank's steps
   ``unknown_device`` (never another GPU), with one warning per rank and problem in
   ``IngestResult.warnings``.
2. Per marker, check kind, step, timestamp plausibility and, for phases and collectives, the
   name (``chopper.identity.jobname``): what places the marker; a bad one rejects that marker
   (``REJECTION_REASONS``). A payload that is negative or not finite (``flops``, ``tokens``,
   ``bytes``), or a bad name on a step marker (which needs none), is a bad *field*: it is
   cleared from the stored marker, which is kept, counted in ``IngestResult.dropped_fields``,
   and the step it describes flagged (``FIELD_FLAGS``: a step_end's flops or tokens, a
   collective's bytes), so the step's FLOPs count as missing (``no_flops``) rather than
   losing the step.
3. Track each ``(job, rank)``: the open step and its open phases/collectives. A ``step_end``
   for a step that never began, or a ``phase_end`` without its begin, is rejected; a
   ``step_begin`` while a step is open abandons the open one (counted, not summarised).
4. Detect lost batches from gaps in the per-sender ``seq`` and remember each sender's
   cumulative client-side drop count.

Markers are handled as rows (``agent.marker_wire``), never as a message each. Nearly every batch
passes step 2 whole: that is checked once per batch on its columns (``_passes_whole``: the set
of kinds, the extremes of steps, timestamps and payloads, each distinct name once), and then only
step 3 runs per marker. A batch that fails it goes through step 2 marker by marker, which finds
the culprits and gives each its message.

Plain data in, plain data out: no I/O, no locks (the caller serialises calls).
"""
from __future__ import annotations

import functools
import itertools
import math
from collections import Counter, deque
from dataclasses import dataclass, field
from operator import itemgetter

from agent.marker_wire import MarkerRow, marker_message, message_row, record_bytes
from chopper.identity.device import UNRESOLVED, canonical_uuid, match_uuid
from chopper.identity.jobname import job_name_problem, marker_name_problem
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.schema import MAX_MARKERS_PER_BATCH, MarkerKind, marker_count

# Phases and collectives begun and not yet ended, per rank: real loops hold a handful, so this
# only bounds the agent's memory against a client that begins and never ends.
MAX_OPEN_INTERVALS = 4096
# Timestamps further than this from the agent's clock are garbled, not late.
MAX_CLOCK_SKEW_NS = 24 * 3600 * 10**9
MAX_ERRORS_REPORTED = 8
# The ClosedStep flag of a rank whose GPU could not be resolved (docs/ATTRIBUTION.md, docs/IDENTITY.md).
UNKNOWN_DEVICE = "unknown_device"
# Sender processes remembered per (job, rank) for gap detection and client drop counts.
MAX_SENDERS_PER_RANK = 64
# Job names checked once and remembered; a flood of new names clears the set, never grows it past this.
MAX_JOBS_REMEMBERED = 4096
_DEVICE_FIX = ("list this node's devices in that variable, call chopper.init() after torch.cuda.set_device(), or "
               "set CHOPPER_GPU; the training log's event=identity line names the variable")

# Every reason a marker can be rejected for: the ``reason`` label of
# ``chopper_agent_markers_rejected_total``, documented in docs/METRICS.md.
REJECTION_REASONS: dict[str, str] = {
    "bad_job": "the batch names no job, or an unprintable or over-long one (chopper/identity/jobname.py; whole batch)",
    "bad_rank": "the batch names a negative rank (whole batch)",
    "batch_too_large": f"the batch holds more than {MAX_MARKERS_PER_BATCH} markers (whole batch)",
    "bad_columns": "the batch's marker columns differ in length or name a name it does not hold (whole batch)",
    "bad_kind": "unknown marker kind (client newer than the agent)",
    "bad_step": "negative step number",
    "bad_timestamp": "timestamp more than a day from the agent's clock, or a step ending before it began",
    "bad_name": "phase or collective without a name, or an unprintable or over-long name (chopper/identity/jobname.py)",
    "step_never_began": "step_end for a step that has no step_begin on that rank",
    "end_without_begin": "phase_end or collective_end without its begin",
    "too_many_open": f"phase_begin or collective_begin while the rank has {MAX_OPEN_INTERVALS} begun and not ended",
}
# Rejection reasons of the agent's admission of new ranks (agent.daemon), beside the ingest's own.
ADMISSION_REASONS: dict[str, str] = {
    "too_many_ranks": "the batch is the first of a new (job, rank) while max_ranks are tracked and none can make room: "
                      "each has a step open and spoke within rank_idle_s (whole batch)",
}


# The flag a step gets when a field describing it was dropped (docs/ATTRIBUTION.md), by field.
FIELD_FLAGS: dict[str, str] = {
    "flops": "bad_flops",  # the step_end's flops was negative or not finite: dropped, the step has no FLOPs
    "tokens": "bad_tokens",  # the step_end's tokens was negative: dropped (0)
    "bytes": "bad_bytes",  # a collective of the step carried negative bytes: dropped (0)
}
# The marker kinds each field describes the step of; elsewhere a dropped field flags nothing.
_FLAGGED_KINDS: dict[str, tuple[int, ...]] = {
    "flops": (pb.MARKER_KIND_STEP_END,),
    "tokens": (pb.MARKER_KIND_STEP_END,),
    "bytes": (pb.MARKER_KIND_COLLECTIVE_BEGIN, pb.MARKER_KIND_COLLECTIVE_END),
}
_STEP_KINDS = (pb.MARKER_KIND_STEP_BEGIN, pb.MARKER_KIND_STEP_END)
_IS_COLLECTIVE = itemgetter(0)  # of a ClosedStep interval
# Kind by wire value: a dict lookup per marker, where MarkerKind(value) is an enum call.
_KINDS: dict[int, MarkerKind] = {k.value: k for k in MarkerKind}
_KIND_VALUES = frozenset(_KINDS)
_ROW_KIND = itemgetter(1)
# Names of phases and collectives remembered as checked, like job names.
MAX_NAMES_REMEMBERED = 4096
# A row's fields by name, for the per-marker checks of step 2.
_ROW_FIELDS = {"flops": 4, "tokens": 5, "bytes": 6, "name": 3}
_CLEARED = {"flops": 0.0, "tokens": 0, "bytes": 0, "name": ""}


@dataclass(frozen=True, slots=True)
class ClosedStep:
    """A step that began and ended on one rank; the agent summarises it once samples cover it."""

    job: str
    rank: int
    gpu: int
    step: int
    begin_ns: int
    end_ns: int
    flops: float
    tokens: int
    # (is_collective, begin_ns, end_ns, name, bytes), clipped to the step; bytes are the end marker's
    # (0 for phases), as offline.
    intervals: tuple[tuple[bool, int, int, str, int], ...]
    device_clock: bool
    # Flags the ingest raised on this step (docs/ATTRIBUTION.md), added to the model's own.
    flags: tuple[str, ...] = ()

    @property
    def phases(self) -> int:
        return len(self.intervals) - self.collectives

    @property
    def collectives(self) -> int:
        return sum(map(_IS_COLLECTIVE, self.intervals))


@dataclass(slots=True)
class _OpenStep:
    step: int
    begin_ns: int
    device_clock: bool
    intervals: list[tuple[bool, int, int, str, int]] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)  # FIELD_FLAGS raised by its markers so far


@dataclass(slots=True)
class RankState:
    """What the agent knows of one ``(job, rank)``."""

    gpu: int = -1
    device_flags: tuple[str, ...] = ()  # UNKNOWN_DEVICE while the rank's GPU is unresolved
    device_warning: str = ""  # the device problem last warned about, so each is warned once
    open_step: _OpenStep | None = None
    # Begun, not yet ended, by name: FIFO of (step, begin_ns), paired first-in first-out as offline.
    open_phases: dict[str, deque[tuple[int, int]]] = field(default_factory=dict)
    open_collectives: dict[str, deque[tuple[int, int]]] = field(default_factory=dict)
    open_intervals: int = 0  # entries of both, bounded by MAX_OPEN_INTERVALS
    received: Counter[MarkerKind] = field(default_factory=Counter)
    last_seq: dict[int, int] = field(default_factory=dict)  # by sender pid, the most recent last
    client_dropped: dict[int, int] = field(default_factory=dict)  # by sender pid, cumulative
    client_dropped_retired: int = 0  # what senders forgotten past MAX_SENDERS_PER_RANK had dropped
    batches_lost: int = 0
    steps_abandoned: int = 0
    last_step: int = -1
    last_step_time_s: float = math.nan

    @property
    def client_dropped_total(self) -> int:
        return self.client_dropped_retired + sum(self.client_dropped.values())


@dataclass(slots=True)
class IngestResult:
    """Outcome of one batch."""

    # The batch's markers as stored (bad fields cleared), in order, as rows (agent.marker_wire);
    # ``records``/``encoded_records`` add who sent them.
    accepted: list[MarkerRow] = field(default_factory=list)
    job: str = ""
    node: str = ""
    rank: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    closed_steps: list[ClosedStep] = field(default_factory=list)
    gpu: int = -1  # the batch's GPU as resolved (step 1a)
    warnings: list[str] = field(default_factory=list)  # device problems, each once per rank, for the log
    dropped_fields: Counter[str] = field(default_factory=Counter)  # fields cleared from accepted markers
    field_problems: list[str] = field(default_factory=list)  # the first few, each naming the fix

    def markers(self) -> list[pb.Marker]:
        """The accepted markers as messages."""
        return [marker_message(row) for row in self.accepted]

    def records(self) -> list[pb.MarkerRecord]:
        """The accepted markers as the records subscribers get."""
        return [pb.MarkerRecord(job=self.job, node=self.node, rank=self.rank, gpu=self.gpu, marker=m)
                for m in self.markers()]

    def encoded_records(self) -> list[bytes]:
        """``records()`` in wire form, built without a message object per marker (``agent.marker_wire``)."""
        return record_bytes(_record_prefix(self.job, self.node, self.rank, self.gpu), self.accepted)

    def reject(self, reason: str, message: str, count: int = 1) -> None:
        self.rejected[reason] += count
        if len(self.errors) < MAX_ERRORS_REPORTED:
            self.errors.append(message)

    def drop_field(self, name: str, message: str) -> None:
        self.dropped_fields[name] += 1
        if len(self.field_problems) < MAX_ERRORS_REPORTED:
            self.field_problems.append(message)


class MarkerIngest:
    """Validates marker batches and tracks every rank's open step.

    Args:
        node: This node's name, stamped on every stored marker.
        gpu_count: Number of local GPUs; a batch naming another index is rejected.
        device_uuids: This node's device UUIDs, each mapped to its GPU index (``MarkerBatch.device_uuid``).
    """

    def __init__(self, node: str, gpu_count: int, device_uuids: dict[str, int] | None = None) -> None:
        self.node = node
        self.gpu_count = gpu_count
        self._canonical: dict[str, int] = {}
        self.device_uuids = device_uuids if device_uuids is not None else {}
        self.ranks: dict[tuple[str, int], RankState] = {}
        self._jobs_ok: set[str] = set()  # job names that passed job_name_problem
        self._names_ok: set[str] = set()  # phase and collective names that passed marker_name_problem

    @property
    def device_uuids(self) -> dict[str, int]:
        return self._device_uuids

    @device_uuids.setter
    def device_uuids(self, uuids: dict[str, int]) -> None:
        # Compared in one canonical form: torch names a GPU without NVML's "GPU-" prefix.
        self._device_uuids = uuids
        self._canonical = {canonical_uuid(u): gpu for u, gpu in uuids.items()}

    def ingest(self, batch: pb.MarkerBatch, now_ns: int) -> IngestResult:
        """Validate one batch against the per-rank state; see the module docstring."""
        result = IngestResult()
        header_error = self._check_header(batch)
        if header_error is not None:
            reason, message = header_error
            result.reject(reason, message, max(1, marker_count(batch)))
            return result
        state = self.ranks.setdefault((batch.job, batch.rank), RankState())
        state.gpu, state.device_flags, warning = self._device(batch)
        result.gpu, result.job, result.node, result.rank = state.gpu, batch.job, self.node, batch.rank
        if warning != state.device_warning:
            state.device_warning = warning
            if warning:
                result.warnings.append(warning)
        self._track_sender(state, batch)
        rows = batch_rows(batch)
        if self._passes_whole(rows, now_ns):
            self._apply_all(state, batch, rows, result)
        else:
            self._check_each(state, batch, rows, now_ns, result)
        return result

    def _passes_whole(self, rows: list[MarkerRow], now_ns: int) -> bool:
        """Whether no marker of ``rows`` fails step 2 (``_check_marker``) or has a bad field (``_bad_fields``).

        The same conditions, over whole columns: a few calls in C per batch instead of a few
        comparisons in Python per marker. NaN fails ``min(...) >= 0`` when it comes first and
        makes the sum NaN otherwise; a sum that overflows to infinity sends the batch to the
        per-marker checks, which then pass it.
        """
        if not rows:
            return True
        ts, kinds, steps, names, flops, tokens, nbytes, _ = zip(*rows, strict=True)
        if not (_KIND_VALUES.issuperset(kinds) and min(steps) >= 0 and min(tokens) >= 0 and min(nbytes) >= 0
                and now_ns - MAX_CLOCK_SKEW_NS <= min(ts) and max(ts) <= now_ns + MAX_CLOCK_SKEW_NS
                and min(flops) >= 0.0 and sum(flops) < math.inf):
            return False
        for kind, name in set(zip(kinds, names, strict=True)):
            if not name:
                if kind in _STEP_KINDS:
                    continue  # a step's marker needs no name
                return False
            if name not in self._names_ok:
                if marker_name_problem(name) is not None:
                    return False
                if len(self._names_ok) >= MAX_NAMES_REMEMBERED:
                    self._names_ok.clear()
                self._names_ok.add(name)
        return True

    def _apply_all(self, state: RankState, batch: pb.MarkerBatch, rows: list[MarkerRow], result: IngestResult) -> None:
        """Step 3 for rows that passed step 2 whole."""
        apply = self._apply
        accepted = result.accepted
        for row in rows:
            error = apply(state, batch, row, result)
            if error is None:
                accepted.append(row)
            else:
                reason, message = error
                result.reject(reason, f"job {batch.job!r} rank {batch.rank}: {message}")
        state.received.update(map(_KINDS.__getitem__, map(_ROW_KIND, accepted)))  # counted in C

    def _check_each(self, state: RankState, batch: pb.MarkerBatch, rows: list[MarkerRow], now_ns: int,
                    result: IngestResult) -> None:
        """Steps 2 and 3 marker by marker: each bad marker rejected, each bad field dropped, with its message."""
        for original in rows:
            row = original
            bad: tuple[str, ...] = ()
            error = self._check_marker(row, now_ns)
            if error is None:
                bad = _bad_fields(row)
                flags: tuple[str, ...] = ()
                if bad:
                    row = _without(row, bad)
                    flags = tuple(FIELD_FLAGS[f] for f in bad if f in FIELD_FLAGS and row[1] in _FLAGGED_KINDS[f])
                error = self._apply(state, batch, row, result, flags)
            if error is not None:
                reason, message = error
                result.reject(reason, f"job {batch.job!r} rank {batch.rank}: {message}")
                continue
            for name in bad:
                result.drop_field(name, f"job {batch.job!r} rank {batch.rank}: {_field_problem(original, name)}")
            state.received[_KINDS[row[1]]] += 1
            result.accepted.append(row)

    def _device(self, batch: pb.MarkerBatch) -> tuple[int, tuple[str, ...], str]:
        """(GPU, flags, warning or "") of a batch whose header passed (module docstring, step 1a)."""
        uuid = batch.device_uuid
        if not uuid and -1 <= batch.gpu < self.gpu_count:  # the usual batch: an index the node has
            return batch.gpu, (), ""
        who = f"job {batch.job!r} rank {batch.rank}"
        fix = _DEVICE_FIX
        if uuid.startswith(UNRESOLVED):
            why = uuid.removeprefix(UNRESOLVED)
            return -1, (UNKNOWN_DEVICE,), (
                f"{who} cannot tell which GPU it drives ({why}); its steps are flagged {UNKNOWN_DEVICE} and carry "
                f"no GPU; {fix}")
        if uuid:
            gpu = match_uuid(uuid, self._canonical)
            if gpu is None:
                return -1, (UNKNOWN_DEVICE,), (
                    f"{who} drives device {uuid[:80]!r}, which is not a GPU of node {self.node!r} "
                    f"({len(self._canonical)} GPUs; a MIG instance or another node's GPU?); its steps are flagged "
                    f"{UNKNOWN_DEVICE} and carry no GPU; {fix}")
            if 0 <= batch.gpu != gpu:
                return gpu, (), (
                    f"{who}'s device {uuid[:80]} is GPU {gpu} of this node, but its environment gave GPU {batch.gpu}; "
                    f"using GPU {gpu}. Indices in CUDA_VISIBLE_DEVICES follow CUDA_DEVICE_ORDER (set "
                    "CUDA_DEVICE_ORDER=PCI_BUS_ID for the agent's order) and count only the devices a cgroup shows")
            return gpu, (), ""
        if batch.gpu >= self.gpu_count or batch.gpu < -1:
            return -1, (UNKNOWN_DEVICE,), (
                f"{who} names GPU {batch.gpu}, but node {self.node!r} has GPUs 0..{self.gpu_count - 1} (-1 for none); "
                f"its steps are flagged {UNKNOWN_DEVICE} and carry no GPU; {fix}")
        return batch.gpu, (), ""

    def _check_header(self, batch: pb.MarkerBatch) -> tuple[str, str] | None:
        job = batch.job
        if job not in self._jobs_ok:  # every batch of a rank names its job: check each name once
            job_problem = job_name_problem(job)
            if job_problem is not None:
                return "bad_job", (
                    f"marker batch has job {job[:40]!r}: {job_problem}; pass chopper.init(job=...) or set CHOPPER_JOB"
                )
            if len(self._jobs_ok) >= MAX_JOBS_REMEMBERED:
                self._jobs_ok.clear()
            self._jobs_ok.add(job)
        if batch.rank < 0:
            return "bad_rank", f"marker batch has rank {batch.rank}: ranks are >= 0; pass chopper.init(rank=...)"
        count = marker_count(batch)
        if count > MAX_MARKERS_PER_BATCH:
            return "batch_too_large", (
                f"marker batch holds {count} markers, more than {MAX_MARKERS_PER_BATCH}; send smaller batches"
            )
        problem = _columns_problem(batch.columns)
        if problem is not None:
            return "bad_columns", f"marker batch's columns {problem}; send every column with one entry per marker"
        return None

    @staticmethod
    def _track_sender(state: RankState, batch: pb.MarkerBatch) -> None:
        last = state.last_seq.get(batch.pid)
        if last is not None and batch.seq > last + 1:
            state.batches_lost += batch.seq - last - 1
        state.last_seq.pop(batch.pid, None)  # re-inserted last: the dicts are ordered by last batch
        state.last_seq[batch.pid] = max(batch.seq, last or 0)
        state.client_dropped[batch.pid] = batch.client_dropped_total
        while len(state.last_seq) > MAX_SENDERS_PER_RANK:
            # A rank restarted many times (or a client inventing pids) must not grow these without
            # bound; the counter keeps what a forgotten sender dropped, so it never goes down.
            oldest = next(iter(state.last_seq))
            del state.last_seq[oldest]
            state.client_dropped_retired += state.client_dropped.pop(oldest, 0)

    @staticmethod
    def _check_marker(row: MarkerRow, now_ns: int) -> tuple[str, str] | None:
        ts, kind_value, step, name = row[:4]
        if kind_value not in _KINDS:
            return "bad_kind", f"marker kind {kind_value} is unknown; upgrade the agent or the client"
        if step < 0:
            return "bad_step", f"step {step} is negative; step numbers start at 0"
        if abs(ts - now_ns) > MAX_CLOCK_SKEW_NS:
            return "bad_timestamp", (
                f"timestamp {ts} ns is more than a day from the agent's clock ({now_ns} ns); "
                "timestamps are CLOCK_REALTIME nanoseconds"
            )
        if kind_value in _STEP_KINDS:
            return None  # a step marker's name names nothing: a bad one is a bad field
        kind = _KINDS[kind_value]
        if not name:
            return "bad_name", f"{kind.label} has no name; name the phase or collective, e.g. 'forward'"
        problem = marker_name_problem(name)
        if problem is not None:
            return "bad_name", f"{kind.label} of step {step} named {name[:40]!r}...: {problem}; rename it"
        return None

    @staticmethod
    def _apply(state: RankState, batch: pb.MarkerBatch, row: MarkerRow, result: IngestResult,
               flags: tuple[str, ...] = ()) -> tuple[str, str] | None:
        """Advance the rank's open-step state machine by one valid marker; ``flags`` go on the step it describes."""
        ts, kind_value, step, name, flops, tokens, nbytes, clock = row
        kind = _KINDS[kind_value]
        open_step = state.open_step
        if kind is MarkerKind.STEP_BEGIN:
            if open_step is not None:
                state.steps_abandoned += 1
            state.open_step = _OpenStep(step, ts, clock == pb.CLOCK_SOURCE_DEVICE)
            state.open_phases.clear()
            state.open_collectives.clear()
            state.open_intervals = 0
            return None
        if kind is MarkerKind.STEP_END:
            if open_step is None or open_step.step != step:
                return "step_never_began", (
                    f"step_end for step {step} that never began on this agent; wrap the step in "
                    f"`with chopper.step({step})` (after an agent restart or client drops, expected once)"
                )
            if ts < open_step.begin_ns:
                return "bad_timestamp", f"step {step} ends before it began; timestamps must not go backwards"
            state.open_step = None
            state.last_step = step
            state.last_step_time_s = (ts - open_step.begin_ns) / 1e9
            step_flags = dict.fromkeys((*state.device_flags, *open_step.flags, *flags))  # ordered, once each
            result.closed_steps.append(
                ClosedStep(
                    batch.job, batch.rank, state.gpu, step, open_step.begin_ns, ts, flops, tokens,
                    tuple(open_step.intervals), open_step.device_clock and clock == pb.CLOCK_SOURCE_DEVICE,
                    tuple(step_flags),
                )
            )
            return None
        is_collective = kind in (MarkerKind.COLLECTIVE_BEGIN, MarkerKind.COLLECTIVE_END)
        table = state.open_collectives if is_collective else state.open_phases
        if kind in (MarkerKind.PHASE_BEGIN, MarkerKind.COLLECTIVE_BEGIN):
            if state.open_intervals >= MAX_OPEN_INTERVALS:
                return "too_many_open", (
                    f"{kind.label} {name!r} of step {step}: {state.open_intervals} phases and collectives are "
                    "begun and not ended; end each one (the `with chopper.phase(...)` and `chopper.collective(...)` "
                    "blocks do)"
                )
            opened = table.get(name)
            if opened is None:  # not setdefault: that would make a deque for every marker
                opened = table[name] = deque()
            opened.append((step, ts))
            state.open_intervals += 1
            if flags:
                _flag_open_step(state, step, flags)
            return None
        # Pair within the step, as offline: the oldest open begin of the same step and name.
        opened = table.get(name)
        if opened is None:
            match = None
        elif opened[0][0] == step:  # nearly always: begun and ended in order, within the step
            match = 0
        else:
            match = next((i for i, (begun, _) in enumerate(opened) if begun == step), None)
        if opened is None or match is None:
            helper = "phase" if kind is MarkerKind.PHASE_END else "collective"
            return "end_without_begin", (
                f"{kind.label} {name!r} of step {step} without its begin; use "
                f"`with chopper.{helper}({name!r})` (after an agent restart or client drops, expected once)"
            )
        _, begin_ns = opened[match]
        del opened[match]
        if not opened:  # names seen once must not accumulate
            del table[name]
        state.open_intervals -= 1
        if open_step is not None and open_step.step == step and ts > open_step.begin_ns:
            open_step.intervals.append((is_collective, max(begin_ns, open_step.begin_ns), ts, name, nbytes))
        if flags:
            _flag_open_step(state, step, flags)
        return None


@functools.lru_cache(maxsize=4096)
def _record_prefix(job: str, node: str, rank: int, gpu: int) -> bytes:
    """A ``MarkerRecord``'s fields other than its marker, encoded: the same for every marker of a rank."""
    return pb.MarkerRecord(job=job, node=node, rank=rank, gpu=gpu).SerializeToString()


def batch_rows(batch: pb.MarkerBatch) -> list[MarkerRow]:
    """A batch's markers as rows (``agent.marker_wire``): ``markers``, then those of ``columns`` (checked first).

    Columns become rows in C: each column copied out of protobuf at once (a slice), then zipped;
    an empty payload column stands for zeros, an empty clock column for the CPU's clock.
    """
    rows = [message_row(m) for m in batch.markers]
    columns = batch.columns
    count = len(columns.ts_ns)
    if count:
        names = columns.names[:]
        rows += zip(columns.ts_ns[:], columns.kind[:], columns.step[:], map(names.__getitem__, columns.name[:]),
                    columns.flops[:] or itertools.repeat(0.0, count), columns.tokens[:] or itertools.repeat(0, count),
                    columns.bytes[:] or itertools.repeat(0, count),
                    columns.clock[:] or itertools.repeat(pb.CLOCK_SOURCE_CPU, count), strict=True)
    return rows


def batch_markers(batch: pb.MarkerBatch) -> list[pb.Marker]:
    """A batch's markers as ``Marker`` messages, in ``batch_rows``'s order (for readers of recorded batches)."""
    return [marker_message(row) for row in batch_rows(batch)]


def _columns_problem(columns: pb.MarkerColumns) -> str | None:
    """What makes a batch's ``MarkerColumns`` unreadable (proto comment of the message), or None."""
    count = len(columns.ts_ns)
    if not len(columns.kind) == len(columns.step) == len(columns.name) == count:
        return (f"ts_ns, kind, step and name hold {len(columns.ts_ns)}, {len(columns.kind)}, {len(columns.step)} "
                f"and {len(columns.name)} entries")
    for field_name in ("flops", "tokens", "bytes", "clock"):
        entries = len(getattr(columns, field_name))
        if entries not in (0, count):
            return f"{field_name} holds {entries} entries for {count} markers (it takes one per marker or none)"
    if count and max(columns.name) >= len(columns.names):
        return f"name index {max(columns.name)} is beyond its {len(columns.names)} names"
    return None


def _flag_open_step(state: RankState, step: int, flags: tuple[str, ...]) -> None:
    open_step = state.open_step
    if open_step is not None and open_step.step == step:
        open_step.flags.extend(f for f in flags if f not in open_step.flags)


def _bad_fields(row: MarkerRow) -> tuple[str, ...]:
    """The fields of a placed marker to drop (module docstring, step 2); () for nearly every marker."""
    _, kind, _, name, flops, tokens, nbytes, _ = row
    bad = []
    if not 0.0 <= flops < math.inf:  # NaN fails it too
        bad.append("flops")
    if tokens < 0:
        bad.append("tokens")
    if nbytes < 0:
        bad.append("bytes")
    if name and kind in _STEP_KINDS and marker_name_problem(name) is not None:
        bad.append("name")
    return tuple(bad)


def _without(row: MarkerRow, fields: tuple[str, ...]) -> MarkerRow:
    """``row`` with ``fields`` cleared to their defaults."""
    clean = list(row)
    for name in fields:
        clean[_ROW_FIELDS[name]] = _CLEARED[name]
    return tuple(clean)  # type: ignore[return-value]  # the same eight fields


def _field_problem(row: MarkerRow, name: str) -> str:
    """Why field ``name`` of ``row`` (as received) was dropped, and the fix, for ``IngestResult.field_problems``."""
    kind, step = row[1], row[2]
    where = f"{MarkerKind(kind).label} of step {step}"
    if name == "name":
        return f"{where} carried the name {row[3][:40]!r}...: a step needs none; dropped, the marker kept"
    kept = f"the marker kept and step {step} flagged {FIELD_FLAGS[name]}" if kind in _FLAGGED_KINDS[name] else (
        "the marker kept")
    rule = "a finite number >= 0 (the step's model FLOPs on this rank)" if name == "flops" else "an integer >= 0"
    return f"{where} carried {name}={row[_ROW_FIELDS[name]]!r}; {name} must be {rule}: dropped, {kept}"
