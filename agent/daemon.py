"""The agent's core: one object that owns the backend, buffers, marker state and step summaries.

It does no networking: ``agent.server`` decodes gRPC into calls on it, ``agent.metrics`` reads
it at scrape time through ``Agent.view`` (``agent.state.AgentView``) and ``agent.sampler``
drives ``tick``; the backend's health and reopen backoff are the sampler's
(``agent.sampler.BackendSampler``). Locks: ``_marker_lock`` serialises the
marker state machine (many trainer streams), ``_state_lock`` guards the latest-sample tables,
pending summaries and per-rank totals shared by the sampler thread and the gRPC threads; where
both are held, ``_marker_lock`` is taken first.

Finished jobs retire: a ``(job, rank)`` (its marker state, its totals and so its ``/metrics``
series) is forgotten once no rank of its job has sent a marker for ``rank_idle_s`` (reason
``idle``; a rank with a step open or summaries pending stays). At most ``max_ranks`` are tracked,
so every per-rank structure (marker state, totals, ``/metrics`` series, activity) is bounded by it,
whatever a client sends. A batch of a new ``(job, rank)`` when that many are tracked makes room:

1. the rank silent longest that has no step open and no summary pending goes (reason ``limit``),
   looking at the ``ROOM_SCAN`` oldest such ranks at most;
2. else the rank silent longest that has no step open goes, its summaries pending or not: those
   are still made, counted and sent to subscribers, but no longer feed its (forgotten) series.
   Summaries are made every ``SUMMARY_INTERVAL_NS``, so waiting for them would refuse a rank that
   comes within a second of another's last step;
3. else the rank silent longest, step open or not, goes if it has been silent ``rank_idle_s``
   (a trainer that died inside a step);
4. else the batch is refused before it is read: its markers are rejected as ``too_many_ranks``
   (counted, and answered to the trainer), and the ranks that are live keep their state.

So a flood of made-up ranks displaces finished ranks and its own, never a rank inside a step
that spoke within ``rank_idle_s``. A retired rank that sends again starts afresh.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agent.backends.base import Backend, MarkerObserver
from agent.buffers import ProtoCodec, RingBuffer
from agent.capture import CaptureManager
from agent.config import AgentSettings
from agent.delivery import Forwarder, delivery_tls
from agent.health import HealthTracker
from agent.history import SampleHistory
from agent.inspector.feed import InspectorFeed
from agent.inspector.watch import DumpDirWatcher
from agent.markers import ClosedStep, IngestResult, MarkerIngest, RankState
from agent.podresources import device_ids
from agent.positions import position
from agent.sample_wire import sample_wire
from agent.sampler import BackendSampler, FixedRateTicker
from agent.state import AgentView
from agent.steps import RankFigures, RankFiguresNow, SummaryQueue, summarize
from agent.workload import PciAddressed, build_tracker
from chopper import __version__
from chopper.daemon.access import Refusals
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.schema import DeviceInfo, ErrorCount, Sample, marker_count

if TYPE_CHECKING:
    from agent.host import HostSample, HostSampler
    from chopper.inspector.format import InspectorRecord

log = logging.getLogger(__name__)

# Samples kept per GPU for step summaries: steps longer than this get partial GPU figures.
STEP_HISTORY_S = 120.0
# Host metrics move slowly and psutil reads several /proc files: sample them at most this often.
HOST_INTERVAL_NS = 10**9
# Silent ranks are looked for at most this often.
RETIRE_INTERVAL_NS = 10**9
# Closed steps are summarised together at most this often (ns). A summary call costs about 0.4 ms
# of numpy overhead whatever its size and 20-50 us per step on top (agent.steps), so one call per
# tick for each step would cost most of a core at 100 Hz and a few hundred steps/s; coalesced, a
# summary is at most this much later than its covering sample. 1 s rather than 0.5 s took 0.07 %
# of a core off the agent at 10 Hz with a rank stepping 10 times a second (benchmarks/bench_agent_cpu.py,
# three interleaved pairs), a call per GPU fewer each second; nothing reads summaries more often
# (subscribers get a batch a second, agent.server; Prometheus scrapes every 15 s).
SUMMARY_INTERVAL_NS = 1_000_000_000
# Samples are read on every tick but filed (history, latest, health, sample buffer) once per this
# many ns of ticks. At 8 GPUs and 100 Hz, filing on every tick cost the agent 1 % of a core more
# than filing every tenth (benchmarks/bench_agent_cpu.py): the same work done on each of 100
# wake-ups a second runs several times slower than in a batch. Nothing reads samples sooner than
# this: subscribers get a batch every second at most (agent.server), summaries come every second.
FILE_INTERVAL_NS = 100_000_000
# Ranks without an open step looked at for one with no summary pending, to make room for a new rank
# (module docstring): the oldest almost never wait, and the bound keeps the search O(1) when all do
# (the oldest of them then goes).
ROOM_SCAN = 64
RankKey = tuple[str, int]
# Where the ranks are is read again once the last read is this old (ns): readers ask about once a second.
POSITIONS_MAX_AGE_NS = 250_000_000


class _Threaded(Protocol):
    """A part of the agent that runs on its own thread between ``start()`` and ``stop()``."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class RankActivity:
    """When each ``(job, rank)`` last sent markers (oldest first), which have no open step, each job's latest, ns."""

    def __init__(self) -> None:
        self.ranks: OrderedDict[RankKey, int] = OrderedDict()
        self.closed: OrderedDict[RankKey, None] = OrderedDict()  # ranks without an open step, oldest first
        self._jobs: dict[str, list[int]] = {}  # job -> [latest ns, ranks tracked]

    def __len__(self) -> int:
        return len(self.ranks)

    def __contains__(self, key: RankKey) -> bool:
        return key in self.ranks

    def seen(self, key: RankKey, now_ns: int, step_open: bool) -> None:
        job = self._jobs.setdefault(key[0], [now_ns, 0])
        if key not in self.ranks:
            job[1] += 1
        job[0] = max(job[0], now_ns)
        self.ranks[key] = now_ns
        self.ranks.move_to_end(key)
        if step_open:
            self.closed.pop(key, None)
        else:
            self.closed[key] = None
            self.closed.move_to_end(key)

    def forget(self, key: RankKey) -> None:
        del self.ranks[key]
        self.closed.pop(key, None)
        job = self._jobs[key[0]]
        job[1] -= 1
        if not job[1]:
            del self._jobs[key[0]]

    def idle(self, before_ns: int) -> list[RankKey]:
        """Ranks whose whole job has been silent since before ``before_ns``, oldest first."""
        out = []
        for key, seen_ns in self.ranks.items():
            if seen_ns >= before_ns:
                break
            if self._jobs[key[0]][0] < before_ns:
                out.append(key)
        return out

    def oldest(self) -> tuple[RankKey, int] | None:
        """The rank silent longest and when it last sent, or None."""
        return next(iter(self.ranks.items()), None)


class Agent:
    """Samples the backend, ingests markers and summarises steps.

    Args:
        settings: Validated settings.
        backend: An unopened backend.
        host: Host metrics sampler, or None to skip host metrics.
        realtime_ns: CLOCK_REALTIME source (injected in tests).
        notify: Called whenever new telemetry is buffered (wakes subscribers).
    """

    def __init__(
        self,
        settings: AgentSettings,
        backend: Backend,
        host: HostSampler | None = None,
        realtime_ns: Callable[[], int] = time.time_ns,
        notify: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        # isinstance on a runtime-checkable Protocol inspects attributes: decide once, not per batch.
        self._observer = backend if isinstance(backend, MarkerObserver) else None
        self._host = host
        self._realtime_ns = realtime_ns
        # Reads the backend on each tick; owns its health and reopen backoff.
        self.sampler = BackendSampler(backend, self._set_devices, realtime_ns)
        self.devices: list[DeviceInfo] = []
        self._devices_by_gpu: dict[int, DeviceInfo] = {}
        self.samples: RingBuffer[pb.Sample] = _proto_ring(pb.Sample, settings.sample_buffer,
                                                          settings.sample_buffer_mib, notify)
        self.markers: RingBuffer[pb.MarkerRecord] = _proto_ring(pb.MarkerRecord, settings.marker_buffer,
                                                                settings.marker_buffer_mib, notify)
        self.summaries: RingBuffer[pb.StepSummary] = _proto_ring(pb.StepSummary, settings.summary_buffer,
                                                                 settings.summary_buffer_mib, notify)
        # NCCL/RCCL Inspector records mapped to ranks (docs/INSPECTOR.md), sent to subscribers with the markers.
        self.collectives: RingBuffer[pb.CollectiveRecord] = _proto_ring(
            pb.CollectiveRecord, settings.marker_buffer, settings.collective_buffer_mib, notify)
        self.inspector = InspectorFeed(settings.node, settings.max_ranks)
        self.inspector_watch = (
            DumpDirWatcher(Path(settings.inspector_dir), self._add_inspector_records, poll_s=settings.inspector_poll_s)
            if settings.inspector_dir else None
        )
        self.latest: dict[int, Sample] = {}
        # Error counters and their growth per GPU (docs/HEALTH.md); under _state_lock.
        self.health = HealthTracker()
        self.latest_host: HostSample | None = None
        # Attribution totals per (job, rank), guarded by the state lock.
        self._rank_figures: dict[tuple[str, int], RankFigures] = {}
        self.rejected: Counter[str] = Counter()
        self.fields_dropped: Counter[str] = Counter()  # marker fields cleared, the markers kept, by field
        self.undecodable: Counter[str] = Counter()
        # Calls and connections refused by the access checks (chopper.daemon.access), for the metrics.
        self.refusals = Refusals()
        self.summaries_total = 0
        # Times the trainers' socket was served again after its file was removed (agent.unix_socket.SocketKeeper).
        self.socket_recreated = 0
        # Open streams by RPC ("PushMarkers", "Subscribe"), changed from many gRPC threads.
        self.open_streams: Counter[str] = Counter()
        self._count_lock = threading.Lock()
        self.ticker = FixedRateTicker(settings.sample_hz, self.tick, realtime_ns=realtime_ns)
        # On-demand captures raise the ticker's rate for their window (docs/CAPTURE.md).
        self.captures = CaptureManager(self.ticker, realtime_ns)
        self._history = SampleHistory(max(16, int(STEP_HISTORY_S * settings.sample_hz)))
        self._pending = SummaryQueue(inspector_wait_ns=int(settings.inspector_wait_s * 1e9))
        self._last_host_ns = 0
        self._ingest = MarkerIngest(settings.node, 0)
        self._marker_lock = threading.Lock()
        self._state_lock = threading.Lock()
        # Last marker per (job, rank), guarded by the marker lock; what retirement goes by.
        self._activity = RankActivity()
        # The last read of where the ranks are, (agent clock ns, positions), shared by its readers.
        self._positions: tuple[int, list[pb.RankPosition]] = (0, [])
        self._next_retire_ns = 0
        self._next_summary_ns = 0
        self._unfiled: list[Sample] = []  # read on ticks not yet filed (FILE_INTERVAL_NS)
        self._ticks_unfiled = 0
        self.ranks_retired: Counter[str] = Counter({"idle": 0, "limit": 0})
        # Who holds each GPU per Slurm or the kubelet, read on its own thread (agent/workload.py).
        self.workloads = build_tracker(
            settings.job_mapping_dir, settings.pod_resources_socket, settings.workload_refresh_s
        )
        # Step summaries (and where the ranks are) to the aggregator replicas, from its own threads
        # (never the sampler's).
        self.delivery: Forwarder | None = None
        if settings.aggregators:
            self.delivery = Forwarder(
                self.summaries, settings.node, settings.aggregators, batch=settings.delivery_batch,
                interval_s=settings.delivery_interval_s, resolve_s=settings.delivery_resolve_s,
                tls=delivery_tls(settings), positions=self.rank_positions,
            )
        # The threads of the parts above, started and stopped together.
        self._threads: list[_Threaded] = [
            part for part in (self.ticker, self.delivery, self.workloads, self.inspector_watch) if part is not None
        ]
        # What /metrics reads (agent.state).
        self.view = AgentView(self)

    # -- lifecycle ---------------------------------------------------------------------------

    def open_backend(self) -> None:
        """Open the backend; errors other than ``BackendUnavailable`` leave it down for retries."""
        self.sampler.open()

    def _set_devices(self, devices: list[DeviceInfo]) -> None:
        if self.settings.peak_flops > 0:
            devices = [dataclasses.replace(d, peak_flops=self.settings.peak_flops) for d in devices]
        self.devices = devices
        self._devices_by_gpu = {d.gpu: d for d in devices}
        self._ingest.gpu_count = max((d.gpu for d in devices), default=-1) + 1
        self._ingest.device_uuids = {d.uuid: d.gpu for d in devices if d.uuid}
        if self.workloads is not None:
            bus_ids = self.backend.pci_bus_ids() if isinstance(self.backend, PciAddressed) else {}
            self.workloads.set_device_ids(device_ids({d.gpu: d.uuid for d in devices}, bus_ids))

    def start(self) -> None:
        for part in self._threads:
            part.start()

    def stop(self) -> None:
        for part in self._threads:
            part.stop()
        self.sampler.close()

    # -- sampling ----------------------------------------------------------------------------

    def tick(self, now_ns: int) -> None:
        """One sampling tick: backend and host; every ``FILE_INTERVAL_NS`` of ticks, the samples read since into
        the buffers, then any step summaries now covered."""
        samples = self.sampler.sample(now_ns)
        if self._host is not None and now_ns - self._last_host_ns >= HOST_INTERVAL_NS:
            self._last_host_ns = now_ns
            try:
                self.latest_host = self._host.sample(now_ns)
            except Exception as exc:  # host metrics are a side dish; never let them stop GPU sampling
                log.warning("event=host_sample_failed error=%r", str(exc))
        # Filed every FILE_INTERVAL_NS worth of ticks (every tick at 10 Hz and below).
        self._unfiled += samples
        self._ticks_unfiled += 1
        if self._ticks_unfiled < FILE_INTERVAL_NS // self.ticker.period_ns:
            return
        samples, self._unfiled, self._ticks_unfiled = self._unfiled, [], 0
        with self._state_lock:
            self._history.extend(samples)
            for s in samples:
                self.latest[s.gpu] = s
                if s.errors:
                    self.health.update(s.gpu, s.ts_ns, s.errors)
            ready: list[ClosedStep] = []
            if now_ns >= self._next_summary_ns:
                self._next_summary_ns = now_ns + SUMMARY_INTERVAL_NS
                latest_ns = {gpu: s.ts_ns for gpu, s in self.latest.items()}
                ready = self._pending.ready(latest_ns, now_ns, self._inspected)
            summaries = []
            for gpu, steps in _by_gpu(ready).items():
                first = min(s.begin_ns for s in steps)
                summaries += summarize(
                    steps, self.settings.node, self._history.window(gpu, first), self._devices_by_gpu.get(gpu),
                    self.ticker.period_ns, self.inspector, self.health,
                )
            # Under the same lock as the pop, so retirement never sees a step in neither place. A rank
            # forgotten to make room (module docstring) while its summaries waited gets no series back;
            # reading _activity without the marker lock is safe here, as ranks are forgotten under both.
            for summary in summaries:
                key = (summary.job, summary.rank)
                if key in self._activity:
                    self._rank_figures.setdefault(key, RankFigures()).add(summary)
        if samples:
            jobs = self.workloads.jobs() if self.workloads is not None else {}
            self.samples.extend_encoded([sample_wire(s, jobs.get(s.gpu, "")) for s in samples])
        if summaries:
            self.summaries_total += len(summaries)
            self.summaries.extend(summaries)
        if now_ns >= self._next_retire_ns:
            self._next_retire_ns = now_ns + RETIRE_INTERVAL_NS
            self.retire_idle(now_ns)
            placed = self.inspector.expire()
            if placed:
                self.collectives.extend(placed)

    def gpu_health(self) -> dict[int, tuple[tuple[ErrorCount, ...], int | None]]:
        """Per GPU with health readings: its latest counters and its status (``agent.health``)."""
        now_ns = self._realtime_ns()
        with self._state_lock:
            return {gpu: (self.health.counters(gpu), self.health.status(gpu, now_ns)) for gpu in self.latest}

    def _inspected(self, step: ClosedStep) -> bool:
        """Whether the Inspector records that cover ``step``'s end are in (True for a rank without any)."""
        return self.inspector.covers(step.job, step.rank, step.end_ns)

    # -- markers -----------------------------------------------------------------------------

    def push_markers(self, batch: pb.MarkerBatch) -> IngestResult:
        """Validate and store one batch from a trainer; forwards markers to a simulating backend."""
        now_ns = self._realtime_ns()
        key = (batch.job, batch.rank)
        with self._marker_lock:
            if key not in self._activity and len(self._activity) >= self.settings.max_ranks \
                    and not self._make_room(now_ns):
                result = self._refuse(batch)
                self.rejected.update(result.rejected)
                return result
            result = self._ingest.ingest(batch, now_ns)
            if result.rejected:  # Counter.update costs a few µs even when empty: it is per batch
                self.rejected.update(result.rejected)
            if result.dropped_fields:
                self.fields_dropped.update(result.dropped_fields)
            state = self._ingest.ranks.get(key)
            if state is not None:  # a batch whose header was refused made no state
                self._activity.seen(key, now_ns, state.open_step is not None)
                claimed = self.inspector.register(batch.pid, batch.job, batch.rank, state.gpu,
                                                 batch.inspector_enabled)
                if claimed:
                    self.collectives.extend(claimed)
            if result.closed_steps:
                # Still under the marker lock, so retirement sees these steps pending.
                with self._state_lock:
                    self._pending.add(result.closed_steps)
        if result.accepted:
            self.markers.extend_encoded(result.encoded_records())
            if self._observer is not None and result.gpu >= 0:
                self._observer.observe_markers(result.gpu, result.accepted)
        return result

    def _add_inspector_records(self, records: list[InspectorRecord], path: str) -> None:
        """Map one file's new Inspector records to ranks (the watcher's thread) and buffer them for subscribers."""
        self.collectives.extend(self.inspector.add(records, path))

    # -- retirement (module docstring) -------------------------------------------------------

    def retire_idle(self, now_ns: int) -> int:
        """Forget the ranks of jobs silent for ``rank_idle_s``, but not one with a step open or pending."""
        before_ns = now_ns - int(self.settings.rank_idle_s * 1e9)
        retired = 0
        with self._marker_lock:
            candidates = self._activity.idle(before_ns)
            if not candidates:
                return 0
            with self._state_lock:
                for key in candidates:
                    state = self._ingest.ranks.get(key)
                    if self._pending.waiting(key) or (state is not None and state.open_step is not None):
                        continue
                    self._forget(key)
                    retired += 1
            self.ranks_retired["idle"] += retired
        if retired:
            log.info("event=ranks_retired reason=idle ranks=%d tracked=%d", retired, len(self._activity))
        return retired

    def _make_room(self, now_ns: int) -> bool:
        """Forget one rank for a new one, per the module docstring; False when none may go (marker lock held)."""
        activity = self._activity
        with self._state_lock:
            key = next((k for k in itertools.islice(activity.closed, ROOM_SCAN) if not self._pending.waiting(k)),
                       next(iter(activity.closed), None))
            oldest = activity.oldest()
            if key is None and oldest is not None and oldest[1] < now_ns - int(self.settings.rank_idle_s * 1e9):
                key = oldest[0]
            if key is None:
                return False
            self._forget(key)
        self.ranks_retired["limit"] += 1
        if self.ranks_retired["limit"] == 1:  # the counter tells the rest; a flood must not flood the log
            log.warning("event=ranks_retired reason=limit job=%r rank=%d max_ranks=%d note='raise max_ranks if "
                        "this node runs that many ranks at once'", key[0], key[1], self.settings.max_ranks)
        return True

    def _refuse(self, batch: pb.MarkerBatch) -> IngestResult:
        """A new rank's batch that found no room: every marker rejected as ``too_many_ranks``."""
        result = IngestResult()
        result.reject("too_many_ranks", (
            f"job {batch.job[:40]!r} rank {batch.rank}: the agent tracks max_ranks={self.settings.max_ranks} ranks, "
            "each inside a step and active within rank_idle_s, so this new rank is refused; raise max_ranks if this "
            "node runs that many ranks at once"), max(1, marker_count(batch)))
        return result

    def _forget(self, key: RankKey) -> None:
        """Drop every trace of one rank (caller holds both locks)."""
        self._activity.forget(key)
        self._ingest.ranks.pop(key, None)
        self._rank_figures.pop(key, None)
        self.inspector.forget(*key)

    def tracked_ranks(self) -> int:
        with self._marker_lock:
            return len(self._activity)

    def rank_figures_now(self) -> dict[tuple[str, int], RankFiguresNow]:
        """Per (job, rank): seconds by cause, collective seconds, tokens, rolling MFU and flag counts, consistently."""
        now = self._realtime_ns()
        with self._state_lock:
            return {k: f.snapshot(now) for k, f in self._rank_figures.items()}

    def socket_served_again(self) -> None:
        """Count one recreation of the trainers' socket (``agent.unix_socket.SocketKeeper``, its only caller)."""
        self.socket_recreated += 1

    def count(self, counter: Counter[str], key: str, delta: int = 1) -> None:
        """Change a counter shared by gRPC threads (``+=`` on a Counter is not atomic)."""
        with self._count_lock:
            counter[key] += delta

    def rank_states(self) -> list[tuple[tuple[str, int], RankState]]:
        """A consistent copy of every rank's counters, keyed by ``(job, rank)``, for the metrics."""
        with self._marker_lock:
            return [
                (key, dataclasses.replace(st, received=Counter(st.received), client_dropped=dict(st.client_dropped)))
                for key, st in self._ingest.ranks.items()
            ]

    def rank_positions(self) -> list[pb.RankPosition]:
        """Where every tracked rank is (``agent.positions``), read at most every ``POSITIONS_MAX_AGE_NS``.

        Every reader (each scrape, each subscriber of step summaries, each delivery stream, about once a
        second each) shares one read, so the marker lock is held for one pass over the ranks however many
        read; the list is shared: do not change it.
        """
        now_ns = self._realtime_ns()
        read_ns, positions = self._positions
        if 0 <= now_ns - read_ns < POSITIONS_MAX_AGE_NS:
            return positions
        node = self.settings.node
        with self._marker_lock:
            seen = self._activity.ranks
            positions = [position(key[0], node, key[1], st, seen.get(key, 0), now_ns)
                         for key, st in self._ingest.ranks.items()]
        self._positions = (now_ns, positions)  # one tuple: readers on other threads see both or neither
        return positions

    def info(self) -> pb.AgentInfo:
        return pb.AgentInfo(
            node=self.settings.node, backend=self.backend.name, version=__version__,
            sample_hz=self.settings.sample_hz, devices=[pb.DeviceInfo(**dataclasses.asdict(d)) for d in self.devices],
        )


def _proto_ring(cls: Any, items: int, mib: float, notify: Callable[[], None] | None) -> RingBuffer[Any]:
    """A buffer of ``cls`` messages held encoded, bounded by ``items`` and ``mib`` MiB (agent/buffers.py)."""
    return RingBuffer(items, notify, max_bytes=int(mib * 2**20), codec=ProtoCodec(cls))


def _by_gpu(steps: list[ClosedStep]) -> dict[int, list[ClosedStep]]:
    groups: dict[int, list[ClosedStep]] = {}
    for step in steps:
        groups.setdefault(step.gpu, []).append(step)
    return groups
