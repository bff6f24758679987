"""The agent's metric catalog: every name it exports, with type, unit, help and labels.

This table is the single source of metric names: the collector builds families from it (with
``chopper.daemon.exposition``, shared with the aggregator), the docs (``docs/METRICS.md``) are
rendered from it, and dashboards and alert rules import it.
Names follow ``chopper_<subsystem>_<name>_<unit>`` with base units; counters end in ``_total``;
step numbers are never labels.
"""
from __future__ import annotations

from chopper.daemon.exposition import MetricSpec, catalog_doc, reason_table

GPU = ("node", "gpu", "vendor", "model")
RANK = ("node", "training_job", "rank", "gpu")
NODE = ("node",)

# The sections of ``AgentCollector.collect()``, each built on its own (``Sections``), and the series
# each one holds: the values of the ``section`` label of ``chopper_agent_metrics_section_errors_total``.
SECTIONS: dict[str, str] = {
    "gpus": "`chopper_gpu_*` but `chopper_gpu_workload_info` and the health series: each device's identity and "
            "latest sample",
    "workloads": "`chopper_gpu_workload_info`, `chopper_agent_workload_*`",
    "host": "`chopper_host_*`",
    "ranks": "`chopper_rank_*` but the positions",
    "positions": "`chopper_rank_open_step`, `chopper_rank_position_seconds`: where each rank is (docs/HANGS.md)",
    "self": "the other `chopper_agent_*`: identity, backend health, sampler, buffers, markers, access checks, "
            "streams, ranks",
    "reloads": "`chopper_agent_token_file_reloads*`, `chopper_agent_tls_reloads*`",
    "delivery": "`chopper_agent_delivery_*`",
    "inspector": "`chopper_inspector_*`: the NCCL/RCCL Inspector records read from inspector_dir (docs/INSPECTOR.md)",
    "health": "`chopper_gpu_health_status` and the error counters (`chopper_gpu_xid_errors_total`, "
              "`chopper_gpu_ecc_errors_total`, ...): each device's health (docs/HEALTH.md)",
}

METRICS: tuple[MetricSpec, ...] = (
    # GPUs: the latest sample of each device.
    MetricSpec(
        "chopper_gpu_info", "info",
        "GPU identity, one series per device; value is always 1. Join it onto any GPU series on (node, gpu) for "
        "its UUID and PCI bus id. A partition (MIG instance, AMD CPX/DPX) names its chip: chip_uuid, partition, "
        "the chip's memory_partition (NPS) and compute_share (the fraction of the chip's compute it holds).",
        (*GPU, "uuid", "pci_bus_id", "partition", "memory_partition", "chip_uuid", "compute_share"),
    ),
    MetricSpec("chopper_gpu_gfx_clock_hertz", "gauge", "Mean graphics/SM clock over the last interval, Hz.", GPU),
    MetricSpec("chopper_gpu_gfx_clock_max_hertz", "gauge", "Maximum graphics/SM clock of the device, Hz.", GPU),
    MetricSpec("chopper_gpu_mem_clock_hertz", "gauge", "Mean memory clock over the last sample interval, Hz.", GPU),
    MetricSpec("chopper_gpu_busy_ratio", "gauge", "Graphics/compute engine activity over the last interval, 0-1.", GPU),
    MetricSpec("chopper_gpu_matrix_busy_ratio", "gauge", "Matrix-core/tensor activity, last interval, 0-1.", GPU),
    MetricSpec("chopper_gpu_mem_busy_ratio", "gauge", "Memory controller activity over the last interval, 0-1.", GPU),
    MetricSpec("chopper_gpu_power_watts", "gauge", "Mean board/socket power over the last interval, W.", GPU),
    MetricSpec("chopper_gpu_power_cap_watts", "gauge", "Power cap of the device, W.", GPU),
    MetricSpec("chopper_gpu_energy_joules_total", "counter", "Energy used by the device, J.", GPU),
    MetricSpec("chopper_gpu_temperature_celsius", "gauge",
               "GPU temperature, degrees Celsius: the hotspot sensor on AMD, the GPU die sensor on NVIDIA (NVML has "
               "no hotspot).", GPU),
    MetricSpec("chopper_gpu_memory_temperature_celsius", "gauge",
               "Hottest HBM/memory temperature sensor, degrees Celsius; where the backend reads it.", GPU),
    MetricSpec("chopper_gpu_vr_temperature_celsius", "gauge",
               "Hottest voltage-regulator temperature sensor, degrees Celsius; where the backend reads it (AMD).", GPU),
    MetricSpec("chopper_gpu_memory_used_bytes", "gauge", "Device memory in use, bytes.", GPU),
    MetricSpec("chopper_gpu_memory_total_bytes", "gauge", "Device memory, bytes.", GPU),
    MetricSpec("chopper_gpu_peak_flops_per_second", "gauge", "Peak dense BF16 FLOP/s at max clock.", GPU),
    MetricSpec("chopper_gpu_link_tx_bytes_total", "counter", "Bytes sent over XGMI/NVLink.", GPU),
    MetricSpec("chopper_gpu_link_rx_bytes_total", "counter", "Bytes received over XGMI/NVLink.", GPU),
    MetricSpec(
        "chopper_gpu_link_bytes_total", "counter",
        "Bytes over one XGMI/NVLink link, by the vendor's link index and direction (tx sent, rx received); "
        "one series per link the backend reads (at most 64), which add up to chopper_gpu_link_{tx,rx}_bytes_total.",
        (*GPU, "link", "direction"),
    ),
    MetricSpec("chopper_gpu_pcie_tx_bytes_total", "counter", "Bytes sent over PCIe.", GPU),
    MetricSpec("chopper_gpu_pcie_rx_bytes_total", "counter", "Bytes received over PCIe.", GPU),
    MetricSpec(
        "chopper_gpu_throttle_seconds_total", "counter",
        "Time the clock was held down, by cause (power, thermal, current, other), s.", (*GPU, "cause"),
    ),
    MetricSpec(
        "chopper_gpu_counter_flops_ratio", "gauge",
        "Counter-derived FLOP utilisation over the last interval, 0-1: matrix/tensor activity x (graphics clock / "
        "max clock), from the hardware's own activity counter (NVML GPM on Hopper and newer), with no markers; "
        "absent where the backend reads no matrix activity counter (docs/HEALTH.md).", GPU,
    ),
    # GPU health and errors (docs/HEALTH.md): read at most once per health_interval_s, cumulative as the
    # vendor library reports them. scope is "device", or "chip" for a counter of the whole chip that a
    # partition reports (on the chip's first partition only, never repeated per partition).
    MetricSpec("chopper_gpu_xid_errors_total", "counter",
               "NVIDIA XID events the driver reported since the agent started, by XID code (at most 32 codes; "
               "the rest as other).", (*GPU, "xid", "scope")),
    MetricSpec(
        "chopper_gpu_ecc_errors_total", "counter",
        "ECC errors by severity (corrected, uncorrected, deferred), window (volatile: since the driver loaded; "
        "aggregate: the device's lifetime) and block (an AMD RAS block such as umc, gfx, xgmi_wafl; total for "
        "the device-wide count).", (*GPU, "severity", "window", "block", "scope"),
    ),
    MetricSpec("chopper_gpu_retired_pages", "gauge",
               "Device memory pages retired by the NVIDIA driver, by cause (single_bit, double_bit).",
               (*GPU, "cause", "scope")),
    MetricSpec("chopper_gpu_bad_pages", "gauge",
               "AMD HBM pages in the bad-page table, by status (retired, pending, unreservable).",
               (*GPU, "status", "scope")),
    MetricSpec("chopper_gpu_remapped_rows", "gauge",
               "HBM rows remapped by the NVIDIA driver (Ampere and newer), by the error class that caused them "
               "(correctable, uncorrectable).", (*GPU, "class", "scope")),
    MetricSpec(
        "chopper_gpu_memory_repair_state", "gauge",
        "1 while a memory repair is in the given state (retirement_pending, remap_pending: takes effect at the "
        "next GPU reset; remap_failed: the device needs service), else 0.", (*GPU, "state", "scope"),
    ),
    MetricSpec("chopper_gpu_pcie_replays_total", "counter", "PCIe replays (retransmitted TLPs) of the device's link.",
               (*GPU, "scope")),
    MetricSpec("chopper_gpu_pcie_naks_total", "counter", "PCIe NAKs of the device's link, by direction (sent, "
               "received) (AMD).", (*GPU, "direction", "scope")),
    MetricSpec(
        "chopper_gpu_link_errors_total", "counter",
        "NVLink errors summed over the device's links, by type (crc_flit, crc_data, replay, recovery).",
        (*GPU, "type", "scope"),
    ),
    MetricSpec("chopper_gpu_xgmi_error_state", "gauge",
               "AMD XGMI error status: 0 none, 1 one error, 2 several since it was last cleared.", (*GPU, "scope")),
    MetricSpec(
        "chopper_gpu_health_status", "gauge",
        "GPU health from its error counters and repair states: 0 healthy, 1 warning (a correctable error "
        "counter moved within the last 10 minutes, or a repair is pending), 2 critical (an uncorrectable "
        "error, a critical XID or a failed remap within the last 10 minutes); rules in docs/HEALTH.md.", GPU,
    ),
    MetricSpec(
        "chopper_gpu_workload_info", "info",
        "Who holds the GPU as the scheduler sees it: a Slurm job id, hpc_job as dcgm-exporter names it (source "
        "jobmap), or a pod's container (source podresources); value is always 1.",
        ("node", "gpu", "hpc_job", "pod", "namespace", "container", "source"),
    ),
    # Host.
    MetricSpec("chopper_host_cpu_busy_ratio", "gauge", "CPU busy over the last interval, all cores, 0-1.", NODE),
    MetricSpec("chopper_host_memory_used_bytes", "gauge", "Host memory in use, bytes.", NODE),
    MetricSpec("chopper_host_memory_total_bytes", "gauge", "Host memory, bytes.", NODE),
    MetricSpec("chopper_host_network_tx_bytes_total", "counter", "Bytes sent on non-loopback interfaces.", NODE),
    MetricSpec("chopper_host_network_rx_bytes_total", "counter", "Bytes received on non-loopback interfaces.", NODE),
    MetricSpec("chopper_host_load1", "gauge", "One-minute load average, runnable tasks.", NODE),
    # Training ranks that push markers to this agent.
    MetricSpec(
        "chopper_rank_markers_received_total", "counter",
        "Markers accepted from a rank, by kind (step_begin, phase_end, ...).", (*RANK, "kind"),
    ),
    MetricSpec("chopper_rank_steps_total", "counter", "Steps a rank completed (step_end accepted).", RANK),
    MetricSpec("chopper_rank_last_step", "gauge", "Number of the last step a rank completed.", RANK),
    MetricSpec("chopper_rank_step_time_seconds", "gauge", "Duration of the last completed step, s.", RANK),
    MetricSpec("chopper_rank_steps_abandoned_total", "counter", "Steps begun but never ended before the next.", RANK),
    MetricSpec(
        "chopper_rank_client_dropped_markers_total", "counter",
        "Markers the rank's client dropped (queue full or agent unreachable), as it reports.", RANK,
    ),
    MetricSpec("chopper_rank_batches_lost_total", "counter", "Marker batches missing from a rank's sequence.", RANK),
    MetricSpec(
        "chopper_rank_step_seconds_total", "counter",
        "Step time by cause of the attribution model (ideal, matrix_util_loss, dvfs_<cause>, exposed_comm, idle, "
        "compute_unknown), s.", (*RANK, "cause"),
    ),
    MetricSpec(
        "chopper_rank_phase_seconds_total", "counter",
        "Time in each named phase of the rank's summarised steps (the union of that name's windows per step, "
        "so nested phases each count), s; the first 32 names per rank have their own series, later ones add "
        "to phase=\"other\".", (*RANK, "phase"),
    ),
    MetricSpec(
        "chopper_rank_collective_seconds_total", "counter",
        "Time inside the union of the steps' collective windows, s; minus the exposed_comm cause of "
        "chopper_rank_step_seconds_total it is the communication hidden behind compute.", RANK,
    ),
    MetricSpec(
        "chopper_rank_inspector_collective_seconds_total", "counter",
        "Time inside the union of the Inspector's collective intervals of the rank's summarised steps, s, whether "
        "or not the job marks collectives (docs/INSPECTOR.md).", RANK,
    ),
    MetricSpec(
        "chopper_rank_collective_bytes_total", "counter",
        "Bytes the rank's summarised steps' collectives moved by their own account: the marked collectives' bytes, "
        "else the Inspector's.", RANK,
    ),
    MetricSpec(
        "chopper_rank_collective_disagreement_seconds_total", "counter",
        "Over steps with both marked collectives and Inspector records: the sum of |marked collective time - "
        "Inspector collective time|, s (unions of each source's windows).", RANK,
    ),
    MetricSpec(
        "chopper_rank_collective_source_steps_total", "counter",
        "Summarised steps by what their collective and exposed-communication time came from: markers, inspector "
        "or none.", (*RANK, "source"),
    ),
    MetricSpec("chopper_rank_flops_step_seconds_total", "counter",
               "Step time of the rank's summarised steps with known FLOPs (known ideal time), s: the MFU "
               "denominator beside chopper_rank_step_seconds_total{cause=\"ideal\"}, so steps without FLOPs do "
               "not dilute MFU.", RANK),
    MetricSpec("chopper_rank_mfu_ratio", "gauge",
               "Deprecated, goes in the next release: use the recording rule "
               "node_gpu_training_job_rank:chopper_rank_mfu:ratio (the rate of "
               "chopper_rank_step_seconds_total{cause=\"ideal\"} over that of "
               "chopper_rank_flops_step_seconds_total). Model FLOPs utilisation over the steps of the last minute, "
               "0-1.", RANK),
    MetricSpec(
        "chopper_rank_link_bytes_total", "counter",
        "XGMI/NVLink bytes of the rank's GPU over its summarised steps, all links, by direction (tx, rx): the "
        "GPU's counters, so ranks sharing a GPU each count its traffic; beside chopper_rank_collective_bytes_total "
        "it shows traffic no collective claims.", (*RANK, "direction"),
    ),
    MetricSpec("chopper_rank_tokens_total", "counter", "Tokens the rank's summarised steps processed.", RANK),
    MetricSpec("chopper_rank_flagged_steps_total", "counter", "Summarised steps carrying a flag, by flag.",
               (*RANK, "flag")),
    # Where each rank is now (docs/HANGS.md): what a job that stopped stepping waits in.
    MetricSpec("chopper_rank_open_step", "gauge",
               "Number of the step a rank has open (begun, not ended); absent while no step is open.", RANK),
    MetricSpec(
        "chopper_rank_position_seconds", "gauge",
        "How long a rank has been inside the innermost interval it has open, s: kind collective or phase (the "
        "later begun of its open collective and phase, name it), step (neither open, name \"\"), or between_steps "
        "(no step open: since its last marker). One series per rank.", (*RANK, "kind", "name"),
    ),
    # The agent itself.
    MetricSpec("chopper_agent_info", "info", "Agent identity; value is always 1.", (*NODE, "backend", "version")),
    MetricSpec("chopper_agent_backend_up", "gauge", "1 when the backend's last sample succeeded.", (*NODE, "backend")),
    MetricSpec(
        "chopper_agent_backend_errors_total", "counter", "Backend failures, by kind (device_lost, error, open).",
        (*NODE, "backend", "kind"),
    ),
    MetricSpec(
        "chopper_agent_backend_sample_seconds", "gauge", "Duration of the backend's last sample call, s.",
        (*NODE, "backend"),
    ),
    MetricSpec("chopper_agent_sample_rate_hertz", "gauge", "Current sampling rate (raised during captures), Hz.", NODE),
    MetricSpec("chopper_agent_sampler_ticks_total", "counter", "Sampling ticks run.", NODE),
    MetricSpec("chopper_agent_sampler_missed_ticks_total", "counter", "Ticks skipped: the sampler ran late.", NODE),
    MetricSpec("chopper_agent_sampler_lag_seconds", "gauge", "How late the last tick started, s.", NODE),
    MetricSpec("chopper_agent_buffer_items", "gauge", "Items held in a ring buffer.", (*NODE, "buffer")),
    MetricSpec("chopper_agent_buffer_capacity_items", "gauge", "Most items a ring buffer holds.", (*NODE, "buffer")),
    MetricSpec("chopper_agent_buffer_bytes", "gauge", "Memory a ring buffer's items are counted at (encoded), bytes.",
               (*NODE, "buffer")),
    MetricSpec("chopper_agent_buffer_capacity_bytes", "gauge",
               "Memory a ring buffer may take (its *_buffer_mib setting), bytes.", (*NODE, "buffer")),
    MetricSpec(
        "chopper_agent_buffer_overwritten_total", "counter",
        "Oldest items dropped when a buffer reached its item or memory bound.", (*NODE, "buffer"),
    ),
    MetricSpec(
        "chopper_agent_markers_rejected_total", "counter", "Markers rejected, by reason (see docs/METRICS.md).",
        (*NODE, "reason"),
    ),
    MetricSpec(
        "chopper_agent_marker_fields_dropped_total", "counter",
        "Marker fields dropped (negative or non-finite flops, tokens or bytes; a bad name), the marker kept, by "
        "field.", (*NODE, "field"),
    ),
    MetricSpec(
        "chopper_agent_messages_undecodable_total", "counter",
        "gRPC messages (and marker socket datagrams, as PushMarkers; control socket datagrams that are not a "
        "ControlHello with a job, as Control) that were not valid protobuf.",
        (*NODE, "method"),
    ),
    MetricSpec(
        "chopper_agent_rpc_refused_total", "counter",
        "RPCs refused by the access checks, by RPC and reason; the marker socket's refused connections and datagrams "
        "count as PushMarkers, the control socket's connections as Control (see docs/METRICS.md, docs/SECURITY.md).",
        (*NODE, "rpc", "reason"),
    ),
    MetricSpec("chopper_agent_token_file_reloads_total", "counter",
               "Changes of token_file taken up while running (its new tokens in force); with token_file set.", NODE),
    MetricSpec("chopper_agent_token_file_reloads_refused_total", "counter",
               "Changes of token_file refused, by reason (see below): the previous tokens stay in force.",
               (*NODE, "reason")),
    MetricSpec("chopper_agent_tls_reloads_total", "counter",
               "Changed TLS file sets taken up while running: files=tls (tls_*, the gRPC listener) or "
               "aggregator_tls (aggregator_tls_*, delivery); with those set.", (*NODE, "files")),
    MetricSpec("chopper_agent_tls_reloads_refused_total", "counter",
               "Changed TLS file sets refused, by reason (see below): the previous certificates stay in use.",
               (*NODE, "files", "reason")),
    MetricSpec("chopper_agent_socket_recreated_total", "counter",
               "Times the trainers' unix socket was served again after its file was removed.", NODE),
    MetricSpec("chopper_agent_marker_streams", "gauge",
               "Open marker streams from trainers: PushMarkers calls and marker socket connections.", NODE),
    MetricSpec("chopper_agent_subscribers", "gauge", "Open Subscribe streams from consumers.", NODE),
    MetricSpec("chopper_agent_step_summaries_total", "counter", "Step summaries computed.", NODE),
    MetricSpec("chopper_agent_ranks", "gauge", "(job, rank)s the agent tracks: each has chopper_rank_* series.",
               NODE),
    MetricSpec(
        "chopper_agent_ranks_retired_total", "counter",
        "(job, rank)s forgotten with their series, by reason: idle (the job sent no marker for rank_idle_s) or "
        "limit (max_ranks were tracked and a new rank came; one without an open step, or silent for rank_idle_s, "
        "went).", (*NODE, "reason"),
    ),
    MetricSpec(
        "chopper_agent_workload_source_up", "gauge",
        "1 when the last reading of a GPU-owner source (jobmap, podresources) succeeded.", (*NODE, "source"),
    ),
    MetricSpec(
        "chopper_agent_workload_errors_total", "counter",
        "Failed readings of a GPU-owner source, by kind (unreadable, bad_file, unavailable, error).",
        (*NODE, "source", "kind"),
    ),
    MetricSpec(
        "chopper_agent_metrics_section_errors_total", "counter",
        "Scrapes that left out a section of the agent's series because building it failed, by section (see below).",
        (*NODE, "section"),
    ),
    # NCCL / RCCL Inspector records (docs/INSPECTOR.md); training_job="" holds records mapped to no job.
    MetricSpec(
        "chopper_inspector_collectives_total", "counter",
        "Collectives the Inspector reported, by job, collective (NCCL's name, or other) and message-size bucket.",
        (*NODE, "training_job", "collective", "size"),
    ),
    MetricSpec(
        "chopper_inspector_collective_seconds_total", "counter",
        "Execution time of those collectives as the Inspector timed them (its coll_timing_source), s.",
        (*NODE, "training_job", "collective", "size"),
    ),
    MetricSpec(
        "chopper_inspector_collective_bytes_total", "counter", "Message bytes of those collectives.",
        (*NODE, "training_job", "collective", "size"),
    ),
    MetricSpec(
        "chopper_inspector_bus_bytes_total", "counter",
        "Bus bandwidth x execution time of those collectives, bytes: its rate over the rate of "
        "chopper_inspector_collective_seconds_total is their time-weighted mean bus bandwidth, B/s.",
        (*NODE, "training_job", "collective", "size"),
    ),
    MetricSpec(
        "chopper_inspector_records_mapped_total", "counter",
        "Inspector records by how they found their job and rank: registration, directory or unmapped (see below).",
        (*NODE, "via"),
    ),
    MetricSpec(
        "chopper_inspector_records_unplaced_total", "counter",
        "Inspector records without event timestamps (not verbose): placed to end at their dump time.", NODE,
    ),
    MetricSpec("chopper_inspector_records_held_items", "gauge",
               "Inspector records of a process that has not registered yet, waiting (up to 5 s) for the trainer's "
               "first markers to name its rank.", NODE),
    MetricSpec("chopper_inspector_ranks_silent", "gauge",
               "Ranks whose process turned the Inspector on (NCCL_INSPECTOR_ENABLE=1) but none of whose records was "
               "read within 30 s of its first markers: point the job's NCCL_INSPECTOR_DUMP_DIR into inspector_dir and "
               "check that its NCCL (>= 2.23) loads NCCL_PROFILER_PLUGIN. Their steps are no longer held back.", NODE),
    MetricSpec("chopper_inspector_dir_present", "gauge", "1 while inspector_dir exists and can be listed.", NODE),
    MetricSpec("chopper_inspector_files", "gauge",
               "Dump files of inspector_dir, by state: tracked (being read), open (a handle held), untracked (beyond "
               "the watcher's file limit).", (*NODE, "state")),
    MetricSpec("chopper_inspector_read_bytes_total", "counter", "Bytes read from dump files.", NODE),
    MetricSpec("chopper_inspector_skipped_bytes_total", "counter",
               "Bytes of dump files jumped over: a file further behind than the watcher reads in a poll (its "
               "oldest backlog).", NODE),
    MetricSpec("chopper_inspector_records_total", "counter", "Inspector records read and accepted.", NODE),
    MetricSpec("chopper_inspector_lines_rejected_total", "counter",
               "Dump lines refused, by reason (see below); reading goes on at the next line.", (*NODE, "reason")),
    MetricSpec("chopper_inspector_versions_refused_total", "counter",
               "Lines of an inspector_output_format_version the agent does not read, by version (8 kept, then "
               "other).", (*NODE, "version")),
    MetricSpec("chopper_inspector_plugin_dropped_total", "counter",
               "Operations the plugin itself dropped before dumping them, as its dump_stats lines report.", NODE),
    MetricSpec("chopper_inspector_file_restarts_total", "counter",
               "Dump files read again from their start, by cause: truncated (shorter than read so far) or rotated "
               "(a new file under the same name).", (*NODE, "cause")),
    MetricSpec("chopper_inspector_errors_total", "counter",
               "Failures of the Inspector reader, by kind: poll (listing or reading failed) or consumer (mapping "
               "records raised); the next poll goes on.", (*NODE, "kind")),
    # Delivery of step summaries to aggregator replicas (replica="" counts summaries never routed).
    MetricSpec(
        "chopper_agent_delivery_sent_total", "counter",
        "Step summaries sent to an aggregator replica, resends included.",
        (*NODE, "replica"),
    ),
    MetricSpec(
        "chopper_agent_delivery_acked_total", "counter", "Step summaries an aggregator replica acknowledged.",
        (*NODE, "replica"),
    ),
    MetricSpec(
        "chopper_agent_delivery_lost_total", "counter",
        "Step summaries overwritten in the buffer before their replica acknowledged them.", (*NODE, "replica"),
    ),
    MetricSpec(
        "chopper_agent_delivery_connected", "gauge",
        "1 while the stream to an aggregator replica is acknowledging; 0 also while no stream is open because "
        "the replica is owed nothing (a stream opens when it owns one of this node's jobs, agent/delivery.py).",
        (*NODE, "replica"),
    ),
    MetricSpec(
        "chopper_agent_delivery_pending_items", "gauge", "Step summaries routed to a replica and not yet acknowledged.",
        (*NODE, "replica"),
    ),
)

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}


def markdown() -> str:
    """``docs/METRICS.md``: the catalog as tables (regenerate with ``python -m agent.catalog``)."""
    from agent.inspector.feed import MAPPINGS
    from agent.markers import ADMISSION_REASONS, REJECTION_REASONS
    from agent.positions import MAX_POSITION_NAMES
    from agent.steps import MAX_PHASE_SERIES
    from chopper.attribution.phases import MAX_PHASES_PER_STEP, OTHER
    from chopper.inspector.format import REJECTION_REASONS as INSPECTOR_REASONS

    own = ["", "## Job labels (`training_job`, `hpc_job`)", "",
           "`training_job` is the job's name as its trainer declares it (`chopper.init(job=...)`), on every",
           "`chopper_rank_*` and `chopper_inspector_*` series and on the aggregator's. No series has a `job`",
           "label, which is Prometheus' scrape job: a plain scrape config keeps every label",
           "(deploy/prometheus/prometheus.yml). `chopper_gpu_workload_info` names the scheduler's job id",
           "`hpc_job`, dcgm-exporter's label for the same `--hpc-job-mapping-dir` files, so its series join",
           "with dcgm-exporter's and neither is confused with the trainer's name. `job_label: job` (both",
           "daemons, for one release) exports `training_job` as `job` as earlier releases did; that needs",
           "`honor_labels: true`, and the shipped rules and dashboards do not read it. `hpc_job` stays.", "",
           "## Phase time (`chopper_rank_phase_seconds_total{phase}`)", "",
           "Per rank, the seconds each named phase took over the summarised steps: per step the union of that",
           "name's windows (a phase entered twice counts both, nested phases each count, so phases need not add",
           "up to the step time), as in `StepSummary.phase_times` and `chopper attribute --json` (`phase_s`).",
           "There is no step label: `rate()` of it next to `chopper_rank_step_seconds_total` shows which phase",
              f"grew when steps got slower. The first {MAX_PHASE_SERIES} names a rank sends get their own series; the",
              f"time of later names adds to `phase=\"{OTHER}\"` (a phase a user names `{OTHER}` shares it), so a",
           "client that invents names cannot grow the scrape. A summary itself keeps a step's",
              f"{MAX_PHASES_PER_STEP} longest names, the rest summed as `{OTHER}`.", "",
           "## Rank positions (`chopper_rank_open_step`, `chopper_rank_position_seconds{kind,name}`)", "",
           "Where each tracked rank is at the scrape, from the markers the agent holds (docs/HANGS.md): the open",
           "step's number, and one series per rank naming the innermost interval it has open and how long it",
           "has been in it. A rank of a hung job shows where it waits, e.g. `kind=\"collective\", name=\"all_reduce\"`",
           "for 120 s while another shows `kind=\"phase\", name=\"backward\"`. Bounded: one series of each per",
           f"tracked rank (so `max_ranks` bounds them); the first {MAX_POSITION_NAMES} phase and collective names",
           f"the agent sees keep their own `name`, later ones read `name=\"{OTHER}\"`. The step number is a value,",
           "never a label. The stalled-job alert quotes these series in its description (docs/ALERTS.md).", "",
           "## Retired ranks (`chopper_agent_ranks_retired_total{reason}`)", "",
           "A `(job, rank)` and all its `chopper_rank_*` series go once no rank of its job has sent a marker for",
           "`rank_idle_s` (reason `idle`; a rank with a step open stays, and steps waiting for samples are",
           "summarised first). At most `max_ranks` are tracked, so they bound every per-rank series and all the",
           "agent's per-rank state. A new rank when that many are tracked makes room (reason `limit`): the rank",
           "silent longest without an open step and without a summary pending goes, else the one silent longest",
           "without an open step (its pending summaries are still made and sent to subscribers, but feed no",
           "series), else the one silent longest if it has been silent `rank_idle_s` (a trainer that died inside",
           "a step); else the new rank's batch is",
           "refused, its markers rejected as `too_many_ranks`, and the live ranks keep their state. A rank that",
           "sends again starts from zero, as after an agent restart; Prometheus' `rate()` and `increase()` handle",
           "the reset (docs/CONFIG.md)."]
    own += reason_table("Rejection reasons (`chopper_agent_markers_rejected_total{reason}`)",
                        {**REJECTION_REASONS, **ADMISSION_REASONS})
    own += reason_table("Inspector lines refused (`chopper_inspector_lines_rejected_total{reason}`)",
                        INSPECTOR_REASONS)
    own += reason_table("Inspector record mapping (`chopper_inspector_records_mapped_total{via}`)", MAPPINGS)
    return catalog_doc("Metric catalog", "agent.catalog", "A value a backend cannot read (for example matrix activity "
                       "on MI300X) is left out of the scrape rather than exported as NaN.", METRICS, own, SECTIONS)


if __name__ == "__main__":
    print(markdown(), end="")
