"""Fleet dashboard: every job and GPU of the cluster at a glance.

Jobs training, MFU per job, the GPU time lost across the cluster by cause, GPUs throttling now,
GPUs in poor health and energy per token. Job-level figures come from the aggregator
(``chopper_job_*``), GPU figures from the agents through the recording rules. A job's series
link to the Job dashboard, a GPU's to the GPU dashboard.
"""
from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards import gpu, job
from dashboards.names import C
from dashboards.panels import Board, PanelT, drill_down, query, stat_panel, timeseries_panel
from dashboards.params import RuleParams
from dashboards.recording import GPU_THROTTLE, JOB_CAUSE, JOB_ENERGY_PER_TOKEN, JOB_MFU, JOB_STEPS

UID = "chopper-fleet"
JOB = "{{training_job}}"


def to_job(panel: PanelT) -> PanelT:
    """``panel``, whose series are jobs, linked to each job's Job dashboard."""
    return drill_down(panel, "Job ${__field.labels.training_job}", job.UID, {"job": "${__field.labels.training_job}"})


def to_gpu(panel: PanelT) -> PanelT:
    """``panel``, whose series are GPUs, linked to each GPU's GPU dashboard."""
    return drill_down(panel, "GPU ${__field.labels.gpu} on ${__field.labels.node}", gpu.UID,
                      {"node": "${__field.labels.node}", "gpu": "${__field.labels.gpu}"})


def build(p: RuleParams) -> Dashboard:
    lost = f'{JOB_CAUSE}{{cause!="ideal"}}'
    return (
        Board("Chopper / Fleet", UID, "Jobs, MFU, time lost by cause and throttling GPUs across the cluster.")
        .row("Now")
        .add(stat_panel("Jobs training", "Jobs whose aggregator finalized steps over the last "
                        f"{p.rate_window}.", "none", query(f"count({JOB_STEPS} > 0)", instant=True)), w=3, h=4)
        .add(stat_panel("GPUs reporting", "GPUs the agents export.", "none",
                        query(f"count({C.gpu_info})", instant=True)), w=3, h=4)
        .add(stat_panel("GPUs throttling now", f"GPUs that accrued throttle residency (any cause) over the last "
                        f"{p.rate_window}.", "none",
                        query(f"count(sum by (node, gpu) ({GPU_THROTTLE}) > 0)", instant=True)), w=3, h=4)
        .add(stat_panel("GPUs unhealthy", "GPUs whose health status is warning or critical now "
                        "(docs/HEALTH.md).", "none",
                        *(query(f"count(max by (node, gpu) ({C.gpu_health_status}) == {status})", legend=name,
                                instant=True) for status, name in ((1, "warning"), (2, "critical")))), w=3, h=4)
        .add(stat_panel("Step time lost", "Share of all ranks' step time that is not ideal compute "
                        "(1 - cluster MFU).", "percentunit",
                        query(f"sum({lost}) / sum({JOB_CAUSE})", instant=True)), w=3, h=4)
        .add(stat_panel("GPU power", "Power drawn by every GPU of the fleet.", "watt",
                        query(f"sum({C.gpu_power_watts})", instant=True)), w=3, h=4)
        .add(stat_panel("Chopper alerts firing", "Chopper alerts firing now, by name.", "none",
                        query('count by (alertname) (ALERTS{alertname=~"Chopper.*", alertstate="firing"})',
                              legend="{{alertname}}", instant=True)), w=6, h=4)
        .row("Jobs")
        .add(to_job(timeseries_panel("MFU per job", f"Model FLOPs utilisation of each job over {p.rate_window}: "
                                     "ideal compute time / step time of all ranks' steps with known FLOPs "
                                     "(aggregator). A job's line links to its Job dashboard.", "percentunit",
                                     query(JOB_MFU, JOB))))
        .add(timeseries_panel("GPU time lost per cause across the cluster", "Step time of all ranks of all jobs "
                              "that is not ideal compute, by cause, in GPU-seconds per second (1 = one GPU's "
                              "worth of time lost).", "short",
                              query(f"sum by (cause) ({lost})", "{{cause}}"), stack=True))
        .add(to_job(timeseries_panel("Energy per token", f"GPU energy per token processed, per job, over "
                                     f"{p.rate_window} (aggregator).", "joule",
                                     query(JOB_ENERGY_PER_TOKEN, JOB))))
        .add(to_job(timeseries_panel("Job steps per second", "Steps the aggregator finalized per second, per job.",
                                     "short", query(JOB_STEPS, JOB))))
        .row("GPUs")
        .add(timeseries_panel("Throttle residency across the fleet, by cause", "Seconds throttled per second "
                              "summed over all GPUs (1 = one GPU throttled all the time).", "short",
                              query(f"sum by (cause) ({GPU_THROTTLE})", "{{cause}}"), stack=True))
        .add(to_gpu(timeseries_panel("Most throttled GPUs", "The ten GPUs with the most throttle residency (all "
                                     "causes), share of time. A GPU's line links to its GPU dashboard.",
                                     "percentunit",
                                     query(f"topk(10, sum by (node, gpu) ({GPU_THROTTLE}))", "{{node}} / {{gpu}}"))))
        .add(to_gpu(timeseries_panel("GPU health", "Health status of the GPUs that are not healthy: 1 warning, 2 "
                                     "critical (docs/HEALTH.md). A GPU's line links to its GPU dashboard.", "none",
                                     query(f"max by (node, gpu) ({C.gpu_health_status}) > 0", "{{node}} / {{gpu}}"))),
             w=24)
        .build()
    )
