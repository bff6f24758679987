"""Alert rules: what pages a platform or training engineer, each with its runbook in docs/ALERTS.md.

Every threshold and duration is a ``RuleParams`` field; ``params`` on each ``Alert`` names the
ones it uses, for ``docs/ALERTS.md``. Expressions read the recording rules where those exist
(``dashboards/recording.py``), so rules and dashboards agree on what "throttled" or "busy" means.
The GPU health alerts are in ``dashboards/health_alerts.py``. Every ``by`` and ``on`` list keeps
``cluster`` (``dashboards/cluster.py``).
"""
from __future__ import annotations

from dataclasses import replace

from dashboards.cluster import keep_cluster
from dashboards.health_alerts import health_alerts
from dashboards.model import Alert
from dashboards.names import C
from dashboards.params import RuleParams
from dashboards.recording import GPU_BUSY, GPU_CLOCK, GPU_THROTTLE, JOB_MFU


def _dvfs(p: RuleParams) -> Alert:
    # The dominant cause is the one with the most residency over the window; a GPU whose clock is low
    # with no residency at all (a cause the backend cannot read) is labelled "unknown".
    low = (f"({GPU_CLOCK} < {p.dvfs_clock_ratio})\n"
           f"  and on (node, gpu) ({GPU_BUSY} > {p.dvfs_busy_ratio})")
    cause = (f"(topk by (node, gpu) (1, {GPU_THROTTLE} > 0) * 0 + 1)\n"
             f"  or on (node, gpu)\n"
             f"  label_replace({GPU_CLOCK} * 0 + 1, \"cause\", \"unknown\", \"\", \"\")")
    return Alert(
        "ChopperGPUThrottling",
        f"(\n  {low}\n)\n* on (node, gpu) group_left (cause) (\n  {cause}\n)",
        p.dvfs_for, "warning",
        "GPU {{ $labels.gpu }} on {{ $labels.node }} is throttled ({{ $labels.cause }}) while busy",
        "GPU {{ $labels.gpu }} on {{ $labels.node }} ran at {{ $value | humanizePercentage }} of its maximum "
        "clock while busy; the throttle cause with the most residency is {{ $labels.cause }}.",
        "1. Open the GPU / node dashboard for this node and GPU: throttle residency by cause, power vs cap, "
        "temperature. 2. power: check the power cap (nvidia-smi -q -d POWER / amd-smi metric --power) against "
        "the model's TDP and whether a site policy lowered it; power-delivery or PSU faults show on every GPU "
        "of a node. 3. thermal: check fans, inlet temperature and airflow; one hot GPU among cool neighbours "
        "is a cooling fault, a whole node is the rack or the room. 4. current/other/unknown: check firmware "
        "and driver logs (dmesg, nvidia-smi -q -d PERFORMANCE). 5. If the job is slowed (Job dashboard, "
        "DVFS loss in the step time), drain the node or move the job.",
        ("rate_window", "dvfs_clock_ratio", "dvfs_busy_ratio", "dvfs_for"),
    )


def _straggler(p: RuleParams) -> Alert:
    return Alert(
        "ChopperThermalPowerStraggler",
        # One series per job on each side: after a re-shard the old aggregator replica exports a job until
        # it expires, and two series of one job would fail the whole rule (many-to-many matching).
        f"(max by (training_job) (avg_over_time({C.job_straggler_score_ratio}[{p.rate_window}])) "
        f"> {p.straggler_score_ratio})\n"
        f"* on (training_job) group_left (rank, node, gpu)\n"
        f"  topk by (training_job) (1, max by (training_job, rank, node, gpu) ({C.job_rank_slowest}) == 1)\n"
        f"* on (training_job) group_left (cause)\n"
        f"  topk by (training_job) (1, max by (training_job, cause) "
        f"({C.job_slowest_rank_cause}{{cause=~\"power|thermal\"}}) == 1)",
        p.straggler_for, "warning",
        "Job {{ $labels.training_job }} waits on rank {{ $labels.rank }} ({{ $labels.cause }} throttling)",
        "Rank {{ $labels.rank }} of job {{ $labels.training_job }} (GPU {{ $labels.gpu }} on {{ $labels.node }}) "
        "computes {{ $value | humanizePercentage }} of a step longer than the median rank, and its GPU "
        "throttled for {{ $labels.cause }}: every other rank waits for it at each collective.",
        "1. Job dashboard: the slowest rank and its evidence (clock, temperature, throttle cause), straggler "
        "wait per rank. 2. GPU / node dashboard for that node and GPU: confirm the clock deficit and the "
        "cause. 3. Follow the ChopperGPUThrottling runbook for the cause. 4. The whole job runs at the "
        "straggler's pace: drain the node (or exclude the GPU) and restart from the last checkpoint if the "
        "loss is worth a restart.",
        ("rate_window", "straggler_score_ratio", "straggler_for"),
    )


def _mfu_drop(p: RuleParams) -> Alert:
    return Alert(
        "ChopperMFUDrop",
        f"{JOB_MFU}\n< (1 - {p.mfu_drop_ratio})\n"
        f"  * quantile_over_time(0.5, {JOB_MFU}[{p.mfu_baseline_window}])",
        p.mfu_for, "warning",
        "MFU of job {{ $labels.training_job }} dropped below its recent baseline",
        f"Job {{{{ $labels.training_job }}}} runs at {{{{ $value | humanizePercentage }}}} MFU (over {p.rate_window}), "
        f"more than {p.mfu_drop_ratio:.0%} below its median over the last {p.mfu_baseline_window}.",
        "1. Job dashboard: which cause grew in the step-time attribution (dvfs_* = throttling, "
        "straggler_wait = a slow rank, exposed_comm = network, idle = input pipeline or host). 2. dvfs_*: "
        "see ChopperGPUThrottling; straggler_wait: see ChopperThermalPowerStraggler; exposed_comm: check the "
        "fabric (link traffic on the GPU / node dashboard, switch counters); idle: data loader, storage, "
        "host CPU. 3. A change the training engineer made on purpose (batch size, model) resets the "
        "baseline within the window.",
        ("rate_window", "mfu_drop_ratio", "mfu_baseline_window", "mfu_for"),
    )


# Where every rank of the alert's job is, from the agents' position series (docs/HANGS.md): one clause per
# place the ranks are in (at most 8, the most crowded first), naming up to 16 of its ranks, its step and
# how long. Prometheus runs these queries when the alert fires; a job without positions adds nothing.
WHERE_RANKS_ARE = (
    '{{ range $i, $place := printf "sort_desc(topk(8, count by (kind, name) (' + C.rank_position_seconds
    + '{training_job=%q})))" $labels.training_job | query }}{{ if $i }}; {{ end }}'
    '{{ $kind := .Labels.kind }}{{ $name := .Labels.name }}'
    '{{ .Value }} {{ if eq .Value 1.0 }}rank{{ else }}ranks{{ end }} ('
    '{{ range $j, $rank := printf "bottomk(16, ' + C.rank_position_seconds + '{training_job=%q, kind=%q, name=%q})"'
    ' $labels.training_job $kind $name | query | sortByLabel "rank" }}{{ if $j }} {{ end }}{{ .Labels.rank }}'
    '{{ end }}) '
    '{{ if eq $kind "between_steps" }}between steps{{ else if eq $kind "step" }}inside step'
    '{{ else }}inside {{ $kind }} {{ $name }} of step{{ end }}'
    '{{ with printf "max(' + C.rank_open_step + '{training_job=%q} and on (node, training_job, rank, gpu) '
    + C.rank_position_seconds + '{training_job=%q, kind=%q, name=%q})" $labels.training_job $labels.training_job'
    ' $kind $name | query }}'
    ' {{ . | first | value }}{{ end }}'
    '{{ with printf "max(' + C.rank_position_seconds + '{training_job=%q, kind=%q, name=%q})" $labels.training_job'
    ' $kind $name'
    ' | query }} for up to {{ . | first | value | humanizeDuration }}{{ end }}{{ end }}'
)


def _stalled(p: RuleParams) -> Alert:
    def by(selector: str) -> str:
        return f"sum by (node, training_job, rank) ({selector})"

    begun = by(f'{C.rank_markers_received_total}{{kind="step_begin"}}')
    ended = by(f'{C.rank_markers_received_total}{{kind="step_end"}}')
    # A rank that never finished a step has no step_end series: count it as 0 ended.
    open_steps = f"{begun}\n  - ({ended} or {begun} * 0)\n  - {by(C.rank_steps_abandoned_total)}"
    # Equal totals now and stall_window ago: no marker arrived since (and the rank existed then).
    total, before = C.rank_markers_received_total, f"{C.rank_markers_received_total} offset {p.stall_window}"
    silent = f"{by(total)}\n  == {by(before)}"
    return Alert(
        "ChopperJobStalled",
        f"(\n  {open_steps}\n) > 0\nand on (node, training_job, rank) (\n  {silent}\n)",
        p.stall_for, "critical",
        "Rank {{ $labels.rank }} of job {{ $labels.training_job }} is stuck inside a step",
        "Rank {{ $labels.rank }} of job {{ $labels.training_job }} on {{ $labels.node }} began a step and sent no "
        f"marker for {p.stall_window}, while its agent is up (the rank's series exist only while the "
        "agent is scraped). Where the job's ranks are: " + WHERE_RANKS_ARE,
        "1. A hang inside a step is usually a collective waiting for a rank that died or hangs: the "
        "description says where each rank is; the ranks outside the collective the others wait in are the "
        "suspects (`chopper steps` on their node, or the aggregator's QuerySteps, says the same, docs/HANGS.md). "
        "Check every rank of the job (Job dashboard, step time per rank; which ranks still send markers). 2. Look for "
        "NCCL/RCCL timeouts, Xid / GPU reset messages (dmesg) and OOM kills on the nodes of the silent "
        "ranks. 3. py-spy dump the rank's process to see where it waits. 4. A job killed mid-step also "
        "looks like this until the agent restarts: confirm the process is alive before restarting the job.",
        ("stall_window", "stall_for"),
        "The description says where every rank of the job is, from the agents' `chopper_rank_open_step` and "
        "`chopper_rank_position_seconds` (docs/HANGS.md): Prometheus runs its queries when the alert fires. "
        "At most 8 places are named, the most crowded first, each with up to 16 of its ranks, e.g. \"Where the "
        "job's ranks are: 3 ranks (0 1 2) inside collective all_reduce of step 7 for up to 12m 0s; 1 rank (3) "
        "inside phase backward of step 7 for up to 12m 30s\": rank 3 is the one to look at.",
    )


def _down(name: str, what: str, selector: str, p: RuleParams) -> Alert:
    return Alert(
        name,
        f"up{{{selector}}} == 0",
        p.down_for, "critical",
        f"Chopper {what} {{{{ $labels.instance }}}} is down",
        f"Prometheus cannot scrape the Chopper {what} at {{{{ $labels.instance }}}}: its telemetry is "
        "missing from every dashboard and no other alert can fire for what it watches.",
        f"1. Is the process running (systemctl status chopper-{what} / kubectl get pods)? Its log (journalctl -u "
        f"chopper-{what}) names the reason it stopped; a bad setting exits with status 2 and the key. 2. If "
        "it runs, check that Prometheus reaches its metrics port (firewall, NetworkPolicy, listen address). "
        f"3. Training is not affected by a missing {what}: markers are held, then dropped and counted.",
        ("down_for", f"{what}_selector"),
    )


def _backend(p: RuleParams) -> Alert:
    return Alert(
        "ChopperBackendFailing",
        f"{C.agent_backend_up} == 0",
        p.backend_for, "warning",
        "GPU backend {{ $labels.backend }} on {{ $labels.node }} is failing",
        "The agent on {{ $labels.node }} cannot read its GPUs through {{ $labels.backend }}; it keeps "
        "serving and retries with backoff, but GPU metrics and step attribution of that node are missing.",
        "1. The agent's log says why (event=backend_down ... error=...); the Telemetry health dashboard shows "
        "backend errors by kind. 2. device_lost: a GPU fell off the bus: check dmesg for Xid 79 / PCIe errors "
        "and the driver (nvidia-smi / amd-smi). 3. open/error: driver or library mismatch after an upgrade, "
        "or missing device permissions for the agent's user. 4. The agent reopens the backend by itself once "
        "the GPU answers again; restart it after a driver upgrade.",
        ("backend_for",),
    )


def _loss(p: RuleParams) -> Alert:
    w = p.rate_window

    def tagged(expr: str, loss: str) -> str:
        return f'label_replace({expr}, "loss", "{loss}", "", "")'

    missed, ticks = (f"rate({C.agent_sampler_missed_ticks_total}[{w}])", f"rate({C.agent_sampler_ticks_total}[{w}])")
    parts = [
        tagged(f"sum by (node, replica) (increase({C.agent_delivery_lost_total}[{w}])) > 0", "delivery"),
        tagged(f"sum by (node, training_job, rank) (increase({C.rank_client_dropped_markers_total}[{w}])) > 0",
               "client_dropped_markers"),
        tagged(f"sum by (node, training_job, rank) (increase({C.rank_batches_lost_total}[{w}])) > 0", "marker_batches"),
        tagged(f"sum by (instance) (increase({C.aggregator_store_rows_dropped_total}[{w}])) > 0", "store_rows"),
        tagged(f"sum by (node) ({missed})\n  / sum by (node) ({ticks} + {missed})\n  > {p.missed_ticks_ratio}",
               "sampler_ticks"),
    ]
    return Alert(
        "ChopperTelemetryLoss",
        "\nor ".join(parts),
        "0s", "warning",
        "Chopper is losing telemetry ({{ $labels.loss }})",
        "Telemetry is being lost: {{ $labels.loss }} ({{ $labels.node }}{{ $labels.instance }}"
        "{{ with $labels.training_job }} job {{ . }}{{ end }}{{ with $labels.rank }} rank {{ . }}{{ end }}).",
        "The loss label says where. delivery: step summaries were overwritten in the agent's buffer before "
        "an aggregator acknowledged them: check the aggregator is up and reachable, and summary_buffer. "
        "client_dropped_markers: the training process dropped markers (agent unreachable or queue full): "
        "check the agent socket. marker_batches: batches went missing between a rank and its agent (a "
        "client restart or a broken stream). store_rows: the aggregator could not write Parquet for long "
        "enough to drop rows: check disk space and the store directory. sampler_ticks: the agent's sampler "
        "runs late: the node's CPUs are saturated or a backend call is slow (chopper_agent_backend_sample_"
        "seconds); lower sample_hz. The Telemetry health dashboard shows every counter.",
        ("rate_window", "missed_ticks_ratio"),
    )


def alerts(p: RuleParams) -> list[Alert]:
    """Every alert rule, as the rules file lists them, each keeping ``cluster``."""
    rules = [
        _dvfs(p), _straggler(p), _mfu_drop(p), _stalled(p),
        _down("ChopperAgentDown", "agent", p.agent_selector, p),
        _down("ChopperAggregatorDown", "aggregator", p.aggregator_selector, p),
        _backend(p), _loss(p), *health_alerts(p),
    ]
    return [replace(a, expr=keep_cluster(a.expr)) for a in rules]
