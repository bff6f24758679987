"""Prometheus exposition of the agent: one custom collector that reads the agent's view at scrape time.

Per the house style (prometheus/client_python), ``collect()`` builds fresh metric families from
the catalog on every scrape; there are no module-global gauges and the registry is passed in.
Each section of a scrape (``fills``, documented by ``catalog.SECTIONS``) is built on its own: one
that raises loses its own series only, counted in
``chopper_agent_metrics_section_errors_total{section}`` and logged.
The collector is given the agent's view (``agent.state.AgentView``) and nothing else of the agent,
so a new metric touches the view and this module. Clocks are exported in hertz (base units) although
samples carry MHz.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from agent.catalog import BY_NAME
from agent.positions import NameLabels
from chopper import __version__
from chopper.daemon.auth import Reloaded
from chopper.daemon.exposition import Families, Sections
from chopper.daemon.labels import JOB_LABEL
from chopper.daemon.text_format import Family
from chopper.positions import where
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.schema import THROTTLE_CAUSES, ErrorCount, MarkerKind

if TYPE_CHECKING:
    from agent.state import AgentView

MHZ = 1e6
# ErrorCount kinds -> the metric that carries them; the labels after GPU are _health_labels'.
HEALTH_METRICS: dict[str, str] = {
    "xid": "chopper_gpu_xid_errors_total",
    **dict.fromkeys(("ecc_corrected", "ecc_uncorrected", "ecc_deferred"), "chopper_gpu_ecc_errors_total"),
    "retired_pages": "chopper_gpu_retired_pages",
    "bad_pages": "chopper_gpu_bad_pages",
    "remapped_rows": "chopper_gpu_remapped_rows",
    **dict.fromkeys(("retirement_pending", "remap_pending", "remap_failed"), "chopper_gpu_memory_repair_state"),
    "pcie_replay": "chopper_gpu_pcie_replays_total",
    **dict.fromkeys(("pcie_nak_sent", "pcie_nak_received"), "chopper_gpu_pcie_naks_total"),
    **dict.fromkeys(("link_crc", "link_replay", "link_recovery"), "chopper_gpu_link_errors_total"),
    "xgmi_error": "chopper_gpu_xgmi_error_state",
}


def _health_labels(e: ErrorCount) -> tuple[str, ...]:
    """The catalog labels of ``e``'s metric between the GPU's and ``scope``."""
    kind = e.kind
    if kind.startswith("ecc_"):
        return kind.removeprefix("ecc_"), e.window, e.detail or "total"
    if kind in ("retirement_pending", "remap_pending", "remap_failed"):
        return (kind,)
    if kind.startswith("pcie_nak_"):
        return (kind.removeprefix("pcie_nak_"),)
    if kind == "link_crc":
        return (f"crc_{e.detail}" if e.detail else "crc",)
    if kind.startswith("link_"):
        return (kind.removeprefix("link_"),)
    return () if kind in ("pcie_replay", "xgmi_error") else (e.detail,)
# Every RPC of the Agent service, each with its undecodable-message count (0 until one arrives).
AGENT_METHODS = tuple(m.name for m in pb.DESCRIPTOR.services_by_name["Agent"].methods)

logger = logging.getLogger("agent.metrics")


class AgentCollector:
    """Exports GPU, host, rank and self metrics of one agent, read through its view only.

    Args:
        view: The agent's view (``Agent.view``); the collector holds nothing else of the agent.
        clock: Monotonic seconds, for the rate at which failing sections are logged.
        job_label: The label the training job is exported under (the ``job_label`` setting).
        exported: The catalog names to export (``agent.fields.selected``); None: every one.

    Attributes:
        view: What every scrape reads.
        files: The file sets the running agent re-reads, by name: ``token_file``, ``tls`` (its gRPC
            listener's) and ``aggregator_tls`` (delivery's), those that are set; filled in once the
            agent serves (``agent/main.py``; /metrics starts first). Their reloads are counted there.
    """

    def __init__(self, view: AgentView, clock: Callable[[], float] = time.monotonic,
                 job_label: str = JOB_LABEL, exported: frozenset[str] | None = None) -> None:
        self.view = view
        self.job_label = job_label
        self.exported = exported
        self.files: dict[str, Reloaded] = {}
        # In the order of catalog.SECTIONS, which documents them (a test keeps the two equal).
        self.fills: dict[str, Callable[[Families], None]] = {
            "gpus": self._gpus, "workloads": self._workloads, "host": self._host, "ranks": self._ranks,
            "positions": self._positions, "self": self._self, "reloads": self._reloads, "delivery": self._delivery,
            "inspector": self._inspector, "health": self._health,
        }
        self.sections = Sections(self.fills, logger, clock)
        self._position_names = NameLabels()

    def collect(self) -> Iterator[Family]:
        """Every section on its own (one that raises is counted and left out), then the failure counts."""
        fam = Families(BY_NAME, self.job_label, self.exported)
        for name, fill in self.fills.items():
            self.sections.run(fam, name, fill)
        self.sections.export(fam, "chopper_agent_metrics_section_errors_total", (self.view.node,))
        return iter(fam)

    def _gpus(self, fam: Families) -> None:
        latest = self.view.latest_samples
        for d in self.view.devices:
            gl = (d.node, str(d.gpu), d.vendor, d.model)
            fam.add("chopper_gpu_info", (*gl, d.uuid, d.pci_bus_id, d.partition, d.memory_partition,
                                         d.chip_uuid or d.uuid, f"{d.compute_share:g}"), 1.0)
            fam.add("chopper_gpu_gfx_clock_max_hertz", gl, d.max_gfx_clock_mhz * MHZ)
            fam.add("chopper_gpu_power_cap_watts", gl, d.power_cap_w)
            fam.add("chopper_gpu_memory_total_bytes", gl, float(d.memory_bytes))
            fam.add("chopper_gpu_peak_flops_per_second", gl, d.peak_flops)
            s = latest.get(d.gpu)
            if s is None:
                continue
            for name, value in (
                ("chopper_gpu_gfx_clock_hertz", s.gfx_clock_mhz * MHZ),
                ("chopper_gpu_mem_clock_hertz", s.mem_clock_mhz * MHZ),
                ("chopper_gpu_busy_ratio", s.busy_ratio),
                ("chopper_gpu_matrix_busy_ratio", s.matrix_ratio),
                ("chopper_gpu_mem_busy_ratio", s.mem_busy_ratio),
                ("chopper_gpu_power_watts", s.power_w),
                ("chopper_gpu_energy_joules_total", s.energy_j),
                ("chopper_gpu_temperature_celsius", s.temp_c),
                ("chopper_gpu_memory_temperature_celsius", s.mem_temp_c),
                ("chopper_gpu_vr_temperature_celsius", s.vr_temp_c),
                ("chopper_gpu_memory_used_bytes", s.mem_used_bytes),
                ("chopper_gpu_link_tx_bytes_total", s.link_tx_bytes),
                ("chopper_gpu_link_rx_bytes_total", s.link_rx_bytes),
                ("chopper_gpu_pcie_tx_bytes_total", s.pcie_tx_bytes),
                ("chopper_gpu_pcie_rx_bytes_total", s.pcie_rx_bytes),
            ):
                fam.add(name, gl, value)
            if d.max_gfx_clock_mhz > 0:  # NaN matrix activity (no counter) leaves the series out
                fam.add("chopper_gpu_counter_flops_ratio", gl, s.matrix_ratio * s.gfx_clock_mhz / d.max_gfx_clock_mhz)
            for cause in THROTTLE_CAUSES:
                fam.add("chopper_gpu_throttle_seconds_total", (*gl, cause), getattr(s, f"throttle_{cause}_s"))
            for link, tx, rx in s.links:
                fam.add("chopper_gpu_link_bytes_total", (*gl, str(link), "tx"), tx)
                fam.add("chopper_gpu_link_bytes_total", (*gl, str(link), "rx"), rx)

    def _health(self, fam: Families) -> None:
        health = self.view.gpu_health
        for d in self.view.devices:
            counters, status = health.get(d.gpu, ((), None))
            gl = (d.node, str(d.gpu), d.vendor, d.model)
            if status is not None:
                fam.add("chopper_gpu_health_status", gl, float(status))
            for e in counters:
                name = HEALTH_METRICS.get(e.kind)
                if name is not None:  # a kind newer than this agent's table is left out
                    fam.add(name, (*gl, *_health_labels(e), "chip" if e.chip_wide else "device"), e.value)

    def _workloads(self, fam: Families) -> None:
        node = self.view.node
        for gpu, owners in self.view.workload_owners.items():
            for w in owners:
                fam.add("chopper_gpu_workload_info", (node, str(gpu), w.job, w.pod, w.namespace, w.container, w.source),
                        1.0)
        for name, health in self.view.workload_sources.items():
            fam.add("chopper_agent_workload_source_up", (node, name), 1.0 if health.up else 0.0)
            for kind, count in sorted(health.errors.items()):
                fam.add("chopper_agent_workload_errors_total", (node, name, kind), float(count))

    def _host(self, fam: Families) -> None:
        h = self.view.host
        if h is None:
            return
        node = (self.view.node,)
        fam.add("chopper_host_cpu_busy_ratio", node, h.cpu_ratio)
        fam.add("chopper_host_memory_used_bytes", node, h.mem_used_bytes)
        fam.add("chopper_host_memory_total_bytes", node, h.mem_total_bytes)
        fam.add("chopper_host_network_tx_bytes_total", node, h.net_tx_bytes)
        fam.add("chopper_host_network_rx_bytes_total", node, h.net_rx_bytes)
        fam.add("chopper_host_load1", node, h.load1)

    def _ranks(self, fam: Families) -> None:
        node = self.view.node
        figures = self.view.rank_figures
        for (job, rank), st in self.view.rank_states:
            rl = (node, job, str(rank), str(st.gpu))
            for kind, count in st.received.items():
                fam.add("chopper_rank_markers_received_total", (*rl, kind.label), float(count))
            fam.add("chopper_rank_steps_total", rl, float(st.received.get(MarkerKind.STEP_END, 0)))
            if st.last_step >= 0:
                fam.add("chopper_rank_last_step", rl, float(st.last_step))
                fam.add("chopper_rank_step_time_seconds", rl, st.last_step_time_s)
            fam.add("chopper_rank_steps_abandoned_total", rl, float(st.steps_abandoned))
            fam.add("chopper_rank_client_dropped_markers_total", rl, float(st.client_dropped_total))
            fam.add("chopper_rank_batches_lost_total", rl, float(st.batches_lost))
            if (job, rank) in figures:
                now = figures[(job, rank)]
                for cause, value in now.seconds.items():
                    fam.add("chopper_rank_step_seconds_total", (*rl, cause), value)
                for phase, value in sorted(now.phase_s.items()):
                    fam.add("chopper_rank_phase_seconds_total", (*rl, phase), value)
                fam.add("chopper_rank_collective_seconds_total", rl, now.collective_s)
                fam.add("chopper_rank_inspector_collective_seconds_total", rl, now.inspector_collective_s)
                fam.add("chopper_rank_collective_bytes_total", rl, now.collective_bytes)
                fam.add("chopper_rank_collective_disagreement_seconds_total", rl, now.disagreement_s)
                for source, count in sorted(now.collective_sources.items()):
                    fam.add("chopper_rank_collective_source_steps_total", (*rl, source), float(count))
                fam.add("chopper_rank_flops_step_seconds_total", rl, now.flops_step_s)
                fam.add("chopper_rank_mfu_ratio", rl, now.mfu)
                fam.add("chopper_rank_tokens_total", rl, now.tokens)
                for direction, value in now.link_bytes.items():
                    fam.add("chopper_rank_link_bytes_total", (*rl, direction), value)
                for flag, count in sorted(now.flags.items()):
                    fam.add("chopper_rank_flagged_steps_total", (*rl, flag), float(count))

    def _positions(self, fam: Families) -> None:
        for p in self.view.rank_positions:
            rl = (p.node, p.job, str(p.rank), str(p.gpu))
            if p.step >= 0:
                fam.add("chopper_rank_open_step", rl, float(p.step))
            w = where(p)
            fam.add("chopper_rank_position_seconds", (*rl, w.kind, self._position_names.label(w.name)),
                    w.seconds(p.as_of_ns))

    def _self(self, fam: Families) -> None:
        view = self.view
        node, backend = view.node, view.backend
        fam.add("chopper_agent_info", (node, backend, __version__), 1.0)
        fam.add("chopper_agent_backend_up", (node, backend), 1.0 if view.backend_up else 0.0)
        errors = view.backend_errors
        for kind in ("open", "device_lost", "error"):
            fam.add("chopper_agent_backend_errors_total", (node, backend, kind), float(errors.get(kind, 0)))
        fam.add("chopper_agent_backend_sample_seconds", (node, backend), view.backend_sample_s)
        fam.add("chopper_agent_sample_rate_hertz", (node,), view.sample_rate_hz)
        fam.add("chopper_agent_sampler_ticks_total", (node,), float(view.sampler_ticks_total))
        fam.add("chopper_agent_sampler_missed_ticks_total", (node,), float(view.sampler_missed_ticks_total))
        fam.add("chopper_agent_sampler_lag_seconds", (node,), view.sampler_lag_s)
        for name, fill in view.buffers.items():
            fam.add("chopper_agent_buffer_items", (node, name), float(fill.items))
            fam.add("chopper_agent_buffer_capacity_items", (node, name), float(fill.capacity))
            fam.add("chopper_agent_buffer_bytes", (node, name), float(fill.bytes_held))
            fam.add("chopper_agent_buffer_capacity_bytes", (node, name), float(fill.max_bytes))
            fam.add("chopper_agent_buffer_overwritten_total", (node, name), float(fill.overwritten_total))
        for reason, count in sorted(view.markers_rejected.items()):
            fam.add("chopper_agent_markers_rejected_total", (node, reason), float(count))
        for name, count in sorted(view.marker_fields_dropped.items()):
            fam.add("chopper_agent_marker_fields_dropped_total", (node, name), float(count))
        undecodable = view.messages_undecodable
        for method in AGENT_METHODS:
            fam.add("chopper_agent_messages_undecodable_total", (node, method), float(undecodable.get(method, 0)))
        for (rpc, reason), count in sorted(view.rpc_refused.items()):
            fam.add("chopper_agent_rpc_refused_total", (node, rpc, reason), float(count))
        fam.add("chopper_agent_socket_recreated_total", (node,), float(view.socket_recreated_total))
        fam.add("chopper_agent_marker_streams", (node,), float(view.marker_streams))
        fam.add("chopper_agent_subscribers", (node,), float(view.subscribers))
        fam.add("chopper_agent_step_summaries_total", (node,), float(view.step_summaries_total))
        fam.add("chopper_agent_ranks", (node,), float(view.tracked_ranks))
        for reason, count in sorted(view.ranks_retired.items()):
            fam.add("chopper_agent_ranks_retired_total", (node, reason), float(count))

    def _delivery(self, fam: Families) -> None:
        node = self.view.node
        for replica, d in sorted(self.view.delivery.items()):
            rl = (node, replica)
            fam.add("chopper_agent_delivery_sent_total", rl, float(d["sent"]))
            fam.add("chopper_agent_delivery_acked_total", rl, float(d["acked"]))
            fam.add("chopper_agent_delivery_lost_total", rl, float(d["lost"]))
            fam.add("chopper_agent_delivery_connected", rl, d["connected"])
            fam.add("chopper_agent_delivery_pending_items", rl, float(d["pending"]))

    def _inspector(self, fam: Families) -> None:
        counts = self.view.inspector
        if counts is None:
            return
        node = self.view.node
        for (job, collective, size), totals in sorted(counts.totals.items()):
            key = (node, job, collective, size)
            fam.add("chopper_inspector_collectives_total", key, float(totals.count))
            fam.add("chopper_inspector_collective_seconds_total", key, totals.seconds)
            fam.add("chopper_inspector_collective_bytes_total", key, totals.bytes)
            fam.add("chopper_inspector_bus_bytes_total", key, totals.bus_bytes)
        for via, count in sorted(counts.mapped.items()):
            fam.add("chopper_inspector_records_mapped_total", (node, via), float(count))
        fam.add("chopper_inspector_records_unplaced_total", (node,), float(counts.unplaced))
        fam.add("chopper_inspector_records_held_items", (node,), float(counts.held))
        fam.add("chopper_inspector_ranks_silent", (node,), float(counts.silent))
        h = self.view.inspector_reader
        if h is None:
            return
        fam.add("chopper_inspector_dir_present", (node,), 1.0 if h.directory_present else 0.0)
        for state, n in (("tracked", h.files_tracked), ("open", h.files_open), ("untracked", h.files_untracked)):
            fam.add("chopper_inspector_files", (node, state), float(n))
        fam.add("chopper_inspector_read_bytes_total", (node,), float(h.bytes_read_total))
        fam.add("chopper_inspector_skipped_bytes_total", (node,), float(h.bytes_skipped_total))
        fam.add("chopper_inspector_records_total", (node,), float(h.records_total))
        for reason, n in sorted(h.rejected.items()):
            fam.add("chopper_inspector_lines_rejected_total", (node, reason), float(n))
        for version, n in sorted(h.refused_versions.items()):
            fam.add("chopper_inspector_versions_refused_total", (node, version), float(n))
        fam.add("chopper_inspector_plugin_dropped_total", (node,), float(h.plugin_dropped_total))
        fam.add("chopper_inspector_file_restarts_total", (node, "truncated"), float(h.truncations_total))
        fam.add("chopper_inspector_file_restarts_total", (node, "rotated"), float(h.rotations_total))
        fam.add("chopper_inspector_errors_total", (node, "poll"), float(h.poll_errors_total))
        fam.add("chopper_inspector_errors_total", (node, "consumer"), float(h.callback_errors_total))

    def _reloads(self, fam: Families) -> None:
        node = self.view.node
        for name, files in sorted(self.files.items()):
            if name == "token_file":
                fam.add("chopper_agent_token_file_reloads_total", (node,), float(files.reloads))
                for reason, count in sorted(files.refused.items()):
                    fam.add("chopper_agent_token_file_reloads_refused_total", (node, reason), float(count))
                continue
            fam.add("chopper_agent_tls_reloads_total", (node, name), float(files.reloads))
            for reason, count in sorted(files.refused.items()):
                fam.add("chopper_agent_tls_reloads_refused_total", (node, name, reason), float(count))
