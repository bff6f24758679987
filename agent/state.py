"""A narrow, read-only view of the agent's state: exactly what ``/metrics`` exports, by name and unit.

``AgentView`` reads the running ``agent.daemon.Agent`` when a property is read, never before,
so a scrape sees the present and one part that fails to read costs only the series built from
it. Every mapping and sequence it returns is a copy (or immutable), so the exporter can neither
change the agent nor trip over a table another thread is changing. Counters are totals since
the agent started.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING

from agent.inspector.feed import FeedCounts
from agent.inspector.watch import WatcherHealth
from agent.markers import RankState
from agent.steps import RankFiguresNow
from agent.workload import SourceHealth, Workload
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.schema import DeviceInfo, ErrorCount, Sample

if TYPE_CHECKING:
    from agent.daemon import Agent
    from agent.host import HostSample


@dataclasses.dataclass(frozen=True)
class BufferFill:
    """One ring buffer at one instant: items held, its capacity in items, items dropped since start,
    and the memory its items are counted at and may take, bytes (agent/buffers.py)."""

    items: int
    capacity: int
    overwritten_total: int
    bytes_held: int
    max_bytes: int


class AgentView:
    """What the agent's metrics read, and nothing else.

    Args:
        agent: The agent to read.
    """

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    # -- identity ----------------------------------------------------------------------------

    @property
    def node(self) -> str:
        """The node name every series carries."""
        return self._agent.settings.node

    @property
    def backend(self) -> str:
        """The GPU backend's name (``amd``, ``nvidia``, ``simulated``, ``replay``)."""
        return self._agent.backend.name

    # -- GPUs and host -----------------------------------------------------------------------

    @property
    def devices(self) -> tuple[DeviceInfo, ...]:
        """One row per GPU from the last successful backend open (clocks MHz, memory bytes, power W, FLOP/s)."""
        return tuple(self._agent.devices)

    @property
    def latest_samples(self) -> dict[int, Sample]:
        """GPU index → its latest sample (clocks MHz, ratios 0–1, watts, joules, bytes, celsius, seconds)."""
        return dict(self._agent.latest)

    @property
    def gpu_health(self) -> dict[int, tuple[tuple[ErrorCount, ...], int | None]]:
        """GPU index → its latest health counters (``Sample.errors`` values) and status (0 healthy, 1
        warning, 2 critical, None before a reading; ``agent.health``)."""
        return self._agent.gpu_health()

    @property
    def host(self) -> HostSample | None:
        """The latest host sample (ratios 0–1, bytes, load average), or None before the first."""
        return self._agent.latest_host

    @property
    def workload_owners(self) -> Mapping[int, tuple[Workload, ...]]:
        """GPU index → its owners per Slurm or the kubelet; empty when no source is configured."""
        tracker = self._agent.workloads
        return {} if tracker is None else tracker.table()

    @property
    def workload_sources(self) -> dict[str, SourceHealth]:
        """Source name → whether its last read succeeded and its errors by kind; empty when none is configured."""
        tracker = self._agent.workloads
        if tracker is None:
            return {}
        return {s.name: SourceHealth(s.health.up, Counter(s.health.errors)) for s in tracker.sources}

    # -- ranks -------------------------------------------------------------------------------

    @property
    def rank_states(self) -> list[tuple[tuple[str, int], RankState]]:
        """``(job, rank)`` → its marker counters, last step and step time (seconds), a consistent copy."""
        return self._agent.rank_states()

    @property
    def rank_positions(self) -> list[pb.RankPosition]:
        """Where each tracked rank is now (``agent.positions``): open step, innermost phase and collective, ns."""
        return self._agent.rank_positions()

    @property
    def rank_figures(self) -> dict[tuple[str, int], RankFiguresNow]:
        """``(job, rank)`` → seconds by cause and phase, collective seconds, tokens, MFU (0–1), flag counts."""
        return self._agent.rank_figures_now()

    @property
    def tracked_ranks(self) -> int:
        """``(job, rank)`` pairs tracked now (at most ``max_ranks``)."""
        return self._agent.tracked_ranks()

    @property
    def ranks_retired(self) -> dict[str, int]:
        """Ranks forgotten since start, by reason (``idle``, ``limit``)."""
        return dict(self._agent.ranks_retired)

    # -- the agent itself --------------------------------------------------------------------

    @property
    def backend_up(self) -> bool:
        """Whether the backend's last read (or open) succeeded."""
        return self._agent.sampler.health.up

    @property
    def backend_errors(self) -> dict[str, int]:
        """Backend failures since start by kind (``open``, ``device_lost``, ``error``)."""
        return dict(self._agent.sampler.health.errors)

    @property
    def backend_sample_s(self) -> float:
        """Seconds the latest successful backend read took; NaN before one."""
        return self._agent.sampler.health.last_sample_s

    @property
    def sample_rate_hz(self) -> float:
        """The sampler's current rate, ticks per second (raised during a capture)."""
        return self._agent.ticker.hz

    @property
    def sampler_ticks_total(self) -> int:
        """Ticks run since start."""
        return self._agent.ticker.ticks_total

    @property
    def sampler_missed_ticks_total(self) -> int:
        """Ticks skipped since start because the sampler ran late."""
        return self._agent.ticker.missed_ticks_total

    @property
    def sampler_lag_s(self) -> float:
        """Seconds the latest tick started after it was due."""
        return self._agent.ticker.last_lag_s

    @property
    def buffers(self) -> dict[str, BufferFill]:
        """Ring buffer name (``samples``, ``markers``, ``step_summaries``, ``collectives``) → its fill."""
        agent = self._agent
        return {name: BufferFill(len(buf), buf.capacity, buf.overwritten_total, buf.bytes_held, buf.max_bytes or 0)
                for name, buf in (("samples", agent.samples), ("markers", agent.markers),
                                  ("step_summaries", agent.summaries), ("collectives", agent.collectives))}

    @property
    def markers_rejected(self) -> dict[str, int]:
        """Markers rejected since start, by reason."""
        return dict(self._agent.rejected)

    @property
    def marker_fields_dropped(self) -> dict[str, int]:
        """Marker fields cleared (their markers kept) since start, by field."""
        return dict(self._agent.fields_dropped)

    @property
    def messages_undecodable(self) -> dict[str, int]:
        """Requests that were not valid protobuf since start, by RPC."""
        return dict(self._agent.undecodable)

    @property
    def rpc_refused(self) -> dict[tuple[str, str], int]:
        """Calls refused by the access checks since start, by (RPC, reason)."""
        return self._agent.refusals.snapshot()

    @property
    def socket_recreated_total(self) -> int:
        """Times the trainers' socket was served again after its file was removed."""
        return self._agent.socket_recreated

    @property
    def marker_streams(self) -> int:
        """Open ``PushMarkers`` streams (trainers connected)."""
        return self._agent.open_streams["PushMarkers"]

    @property
    def subscribers(self) -> int:
        """Open ``Subscribe`` streams."""
        return self._agent.open_streams["Subscribe"]

    @property
    def step_summaries_total(self) -> int:
        """Step summaries made since start."""
        return self._agent.summaries_total

    @property
    def inspector(self) -> FeedCounts | None:
        """The Inspector records' totals and mapping counts (``agent.inspector.feed``); None without inspector_dir."""
        return None if self._agent.inspector_watch is None else self._agent.inspector.counts()

    @property
    def inspector_reader(self) -> WatcherHealth | None:
        """The dump-directory watcher's health (``agent.inspector.watch``); None without inspector_dir."""
        watch = self._agent.inspector_watch
        return None if watch is None else watch.health()

    @property
    def delivery(self) -> dict[str, dict[str, float]]:
        """Aggregator replica → items ``sent``, ``acked``, ``lost``, ``pending`` and ``connected`` (0 or 1).

        Empty when no aggregator is configured.
        """
        delivery = self._agent.delivery
        return {} if delivery is None else delivery.snapshot()
