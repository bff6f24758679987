"""Job dashboard (variable ``job``, a value of ``training_job``): where one job's step time goes, rank by rank.

Step time and MFU over time, marker MFU against the GPUs' own FLOP counters, the step time split by
cause and by phase, straggler wait per rank (rank × time), the slowest rank with its hardware
evidence, collectives exposed vs hidden behind compute, tokens/s and tokens/J, and the job's ranks
with their GPUs. Step figures come from the aggregator, which joins ranks by step; tokens, per-rank
step times and collective time from the agents. A rank's row links to its GPU's dashboard.
"""
from __future__ import annotations

from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards import gpu
from dashboards.names import C
from dashboards.panels import (
    RATE,
    Board,
    drill_down,
    heatmap_panel,
    label_variable,
    query,
    stat_panel,
    table_panel,
    timeseries_panel,
)
from dashboards.params import RuleParams
from dashboards.recording import (
    GPU_CLOCK,
    GPU_THROTTLE,
    JOB_CAUSE,
    JOB_ENERGY_PER_TOKEN,
    JOB_MFU,
    JOB_MFU_GAP,
    JOB_SECONDS,
    JOB_TOKENS,
    RANK_CAUSE,
    RANK_MFU,
    RANK_MFU_GAP,
)

UID = "chopper-job"
J = '{training_job="$job"}'
# The slowest rank of the last step with its node, gpu and throttle cause: value 1, one series per job.
SLOWEST = (f"(max by (training_job, rank, node, gpu) ({C.job_rank_slowest}{J}) == 1)\n"
           f"* on (training_job) group_left (cause)\n"
           f"(max by (training_job, cause) ({C.job_slowest_rank_cause}{J}) == 1)")
# A table row's GPU, for the links to the GPU dashboard.
TO_GPU = {"node": "${__data.fields.node}", "gpu": "${__data.fields.gpu}"}


def _on_slowest(expr: str, on: str = "node, gpu") -> str:
    """``expr`` (one series per ``on``) given the slowest rank's labels, for the evidence table."""
    return f"{expr}\n* on ({on}) group_right () (\n{SLOWEST}\n)"


def _evidence() -> list[Dataquery]:
    return [
        query(SLOWEST, instant=True, table_format=True),
        query(_on_slowest(GPU_CLOCK), instant=True, table_format=True),
        query(_on_slowest(f"max by (node, gpu) ({C.gpu_temperature_celsius})"), instant=True, table_format=True),
        query(_on_slowest(f"max by (node, gpu) ({C.gpu_power_watts})\n/ max by (node, gpu) ({C.gpu_power_cap_watts})"),
              instant=True, table_format=True),
        query(_on_slowest(f"sum by (node, gpu) ({GPU_THROTTLE})"), instant=True, table_format=True),
        query(_on_slowest(f"max by (training_job, rank) ({C.job_rank_compute_excess_seconds}{J})",
                          on="training_job, rank"),
              instant=True, table_format=True),
    ]


EVIDENCE_COLUMNS = {"Value #B": "clock / max", "Value #C": "temperature °C", "Value #D": "power / cap",
                    "Value #E": "throttled share", "Value #F": "compute excess s"}


def build(p: RuleParams) -> Dashboard:
    share = f"{JOB_CAUSE}{J}\n/ ignoring (cause) group_left {JOB_SECONDS}{J}"
    exposed = f'{C.rank_step_seconds_total}{{training_job="$job", cause="exposed_comm"}}'
    slowest = table_panel("Slowest rank and its evidence", "The slowest rank of the last finalized step, the "
                          "throttle cause the aggregator found, and its GPU now: clock against max, "
                          "temperature, power against cap, throttle residency, and the rank's compute excess "
                          "over the median (decayed). The row links to its GPU's dashboard.", *_evidence(),
                          rename=EVIDENCE_COLUMNS)
    ranks = table_panel("Ranks and their GPUs", "Every rank of the job the agents track, its node and GPU, and "
                        "the last step it completed. A row links to its GPU's dashboard.",
                        query(f"max by (training_job, rank, node, gpu) ({C.rank_last_step}{J})", instant=True,
                              table_format=True), rename={"Value": "last step"})
    return (
        Board("Chopper / Job", UID, "One training job: step time, MFU, attribution by cause, stragglers.")
        .variable(label_variable("job", "Job", f"label_values({C.job_ranks}, training_job)"))
        .row("Step time and efficiency")
        .add(timeseries_panel("Step time", "Last finalized step (slowest rank, aggregator) and each rank's last "
                              "step (agents).", "s",
                              query(f"{C.job_step_time_seconds}{J}", "job (slowest rank)"),
                              query(f"{C.rank_step_time_seconds}{J}", "rank {{rank}}")))
        .add(timeseries_panel("MFU", f"Model FLOPs utilisation over {p.rate_window}: ideal compute time / step "
                              "time of the steps with known FLOPs, of all ranks (aggregator) and of each rank "
                              "(agents).", "percentunit",
                              query(JOB_MFU + J, "job"), query(RANK_MFU + J, "rank {{rank}}")))
        .add(timeseries_panel("Counter FLOP utilisation minus marker MFU", "What the GPUs' matrix activity "
                              "counters say they did (activity x clock / max clock) minus the MFU the job's declared "
                              "FLOPs give, for the ranks whose GPU reads the counter: above 0 the matrix units did "
                              "work the FLOPs leave out (recomputation, padding, a FLOP formula that undercounts); "
                              "below 0 the FLOPs or the peak are too high. Watch how it changes "
                              "(docs/ALERTS.md).", "percentunit",
                              query(f"{JOB_MFU_GAP}{J}", "job"), query(f"{RANK_MFU_GAP}{J}", "rank {{rank}}")),
             w=24)
        .add(timeseries_panel("Step time by cause", "Share of all ranks' step time by cause of the attribution "
                              "model (docs/ATTRIBUTION.md); the stack is the whole step time.", "percentunit",
                              query(share, "{{cause}}"), stack=True, max_value=1), w=24)
        .add(timeseries_panel("Time by phase", "Mean seconds per rank-step in each named phase (forward, "
                              "backward, optimizer and the job's own chopper.phase names; agents): the line that "
                              "rises with the step time is the phase that grew. A phase's time is the union of its "
                              "windows in the step, so nested phases each have a line (docs/METRICS.md).", "s",
                              query(f"sum by (training_job, phase) (rate({C.rank_phase_seconds_total}{J}[{RATE}]))\n"
                                    f"/ ignoring (phase) group_left\n"
                                    f"sum by (training_job) (rate({C.rank_steps_total}{J}[{RATE}]))",
                                    "{{phase}}")), w=24)
        .add(timeseries_panel("Tokens per second", "Tokens of all ranks' summarised steps per second.", "short",
                              query(JOB_TOKENS + J, "tokens/s")))
        .add(timeseries_panel("Tokens per joule", f"Tokens per joule of GPU energy over {p.rate_window} "
                              "(aggregator).", "short",
                              query(f"1 / {JOB_ENERGY_PER_TOKEN}{J}", "tokens/J")))
        .row("Stragglers")
        .add(heatmap_panel("Straggler wait per rank", "Share of each rank's time spent waiting for the slowest "
                           "rank at collectives (rank × time).", "short",
                           query(f'{RANK_CAUSE}{{training_job="$job", cause="straggler_wait"}}', "{{rank}}")))
        .add(timeseries_panel("Straggler score and compute excess", "Slowest rank's compute excess over the "
                              "median, as a share of the step time; and each rank's decayed excess, s.",
                              "short",
                              query(f"{C.job_straggler_score_ratio}{J}", "straggler score"),
                              query(f"{C.job_rank_compute_excess_seconds}{J}", "excess rank {{rank}}, s")))
        .add(drill_down(slowest, "GPU ${__data.fields.gpu} on ${__data.fields.node}", gpu.UID, TO_GPU), w=18, h=6)
        .add(stat_panel("Slowest rank", "Rank number of the slowest rank of the last finalized step.", "none",
                        query(f"max({C.job_slowest_rank}{J})", instant=True)), w=6, h=6)
        .row("Communication")
        .add(timeseries_panel("Exposed communication and straggler wait", "Share of all ranks' step time spent "
                              "in collectives that no compute phase hides (exposed_comm) and waiting for the "
                              "slowest rank (straggler_wait).",
                              "percentunit",
                              query(f'{JOB_CAUSE}{{training_job="$job", cause=~"exposed_comm|straggler_wait"}}\n'
                                    f"/ ignoring (cause) group_left {JOB_SECONDS}{J}", "{{cause}}"),
                              stack=True))
        .add(timeseries_panel("Collectives: exposed vs hidden", "Share of the ranks' step time spent in "
                              "collectives, split into the part no compute phase covered (exposed, at the agents: "
                              "it still includes straggler wait) and the part that ran behind forward, backward "
                              "or the optimizer (hidden).", "percentunit",
                              query(f"sum (rate({exposed}[{RATE}]))\n"
                                    f"/ sum (rate({C.rank_step_seconds_total}{J}[{RATE}]))", "exposed"),
                              query(f"clamp_min(\n  sum (rate({C.rank_collective_seconds_total}{J}[{RATE}]))\n"
                                    f"  - sum (rate({exposed}[{RATE}])),\n  0\n)\n"
                                    f"/ sum (rate({C.rank_step_seconds_total}{J}[{RATE}]))",
                                    "hidden"),
                              stack=True))
        .add(timeseries_panel("Collectives per step", "Collectives each rank ran per step.", "short",
                              query(f'sum by (rank) (rate({C.rank_markers_received_total}{{training_job="$job", '
                                    f'kind="collective_end"}}[{RATE}]))\n'
                                    f"/ sum by (rank) (rate({C.rank_steps_total}{J}[{RATE}]))", "rank {{rank}}")))
        .add(timeseries_panel("Link traffic of the job's GPUs", "XGMI/NVLink bytes sent per second by the GPU "
                              "of each rank.", "Bps",
                              query(f"sum by (rank) (\n  rate({C.gpu_link_tx_bytes_total}[{RATE}])\n"
                                    f"  * on (node, gpu) group_left (rank)\n"
                                    f"  (max by (node, gpu, rank) ({C.rank_last_step}{J}) * 0 + 1)\n)",
                                    "rank {{rank}}")), w=24)
        .row("Ranks")
        .add(drill_down(ranks, "GPU ${__data.fields.gpu} on ${__data.fields.node}", gpu.UID, TO_GPU), w=24, h=8)
        .build()
    )

