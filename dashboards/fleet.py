"""Fleet dashboard: every job and GPU of the cluster at a glance.

Jobs training, MFU per job, the GPU time lost across the cluster by cause, GPUs throttling now and
energy per token. Job-level figures come from the aggregator (``chopper_job_*``), GPU figures
from the agents through the recording rules.
"""
from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.names import C
from dashboards.panels import Board, query, stat_panel, timeseries_panel
from dashboards.params import RuleParams
from dashboards.recording import GPU_THROTTLE, JOB_CAUSE, JOB_STEPS

UID = "chopper-fleet"


def build(p: RuleParams) -> Dashboard:
    lost = f'{JOB_CAUSE}{{cause!="ideal"}}'
    return (
        Board("Chopper / Fleet", UID, "Jobs, MFU, time lost by cause and throttling GPUs across the cluster.")
        .row("Now")
        .add(stat_panel("Jobs training", "Jobs whose aggregator finalized steps over the last "
                        f"{p.rate_window}.", "none", query(f"count({JOB_STEPS} > 0)", instant=True)), w=4, h=4)
        .add(stat_panel("GPUs reporting", "GPUs the agents export.", "none",
                        query(f"count({C.gpu_info})", instant=True)), w=4, h=4)
        .add(stat_panel("GPUs throttling now", f"GPUs that accrued throttle residency (any cause) over the last "
                        f"{p.rate_window}.", "none",
                        query(f"count(sum by (node, gpu) ({GPU_THROTTLE}) > 0)", instant=True)), w=4, h=4)
        .add(stat_panel("Step time lost", "Share of all ranks' step time that is not ideal compute "
                        "(1 - cluster MFU).", "percentunit",
                        query(f"sum({lost}) / sum({JOB_CAUSE})", instant=True)), w=4, h=4)
        .add(stat_panel("GPU power", "Power drawn by every GPU of the fleet.", "watt",
                        query(f"sum({C.gpu_power_watts})", instant=True)), w=4, h=4)
        .add(stat_panel("Chopper alerts firing", "Chopper alerts firing now, by name.", "none",
                        query('count by (alertname) (ALERTS{alertname=~"Chopper.*", alertstate="firing"})',
                              legend="{{alertname}}", instant=True)), w=4, h=4)
        .row("Jobs")
        .add(timeseries_panel("MFU per job", "Model FLOPs utilisation of each job over the aggregator's 5 minute "
                              "window: ideal compute time / step time of all ranks.", "percentunit",
                              query(f'{C.job_mfu_ratio}{{window="5m"}}', "{{job}}")))
        .add(timeseries_panel("GPU time lost per cause across the cluster", "Step time of all ranks of all jobs "
                              "that is not ideal compute, by cause, in GPU-seconds per second (1 = one GPU's "
                              "worth of time lost).", "short",
                              query(f"sum by (cause) ({lost})", "{{cause}}"), stack=True))
        .add(timeseries_panel("Energy per token", "GPU energy per token processed, per job, over the aggregator's "
                              "5 minute window.", "joule",
                              query(f'{C.job_energy_per_token_joules}{{window="5m"}}', "{{job}}")))
        .add(timeseries_panel("Job steps per second", "Steps the aggregator finalized per second, per job.",
                              "short", query(JOB_STEPS, "{{job}}")))
        .row("GPUs")
        .add(timeseries_panel("Throttle residency across the fleet, by cause", "Seconds throttled per second "
                              "summed over all GPUs (1 = one GPU throttled all the time).", "short",
                              query(f"sum by (cause) ({GPU_THROTTLE})", "{{cause}}"), stack=True))
        .add(timeseries_panel("Most throttled GPUs", "The ten GPUs with the most throttle residency (all "
                              "causes), share of time.", "percentunit",
                              query(f"topk(10, sum by (node, gpu) ({GPU_THROTTLE}))", "{{node}} / {{gpu}}")))
        .build()
    )
