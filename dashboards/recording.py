"""Recording rules: the cluster-wide aggregations that dashboards and alerts read.

Each record keeps only the labels its users group by, so a fleet panel reads one small series per
GPU or job instead of every raw series on every refresh. Names follow Prometheus'
``level:metric:operations`` convention and carry no window, so dashboards work with any
``rate_window``; the window is a parameter (``RuleParams.rate_window``).

A GPU is keyed by ``(node, gpu)``: the labels the agent puts on every GPU series. ``max by``
rather than ``sum by`` keeps a misconfigured pair of agents that claim the same node name from
doubling a ratio.
"""
from __future__ import annotations

from dataclasses import dataclass

from dashboards.names import C
from dashboards.params import RuleParams

GPU_THROTTLE = "node_gpu_cause:chopper_gpu_throttle_seconds:rate"
GPU_CLOCK = "node_gpu:chopper_gpu_gfx_clock:ratio"
GPU_BUSY = "node_gpu:chopper_gpu_busy:ratio"
JOB_CAUSE = "job_cause:chopper_job_step_seconds:rate"
JOB_SECONDS = "job:chopper_job_step_seconds:rate"
JOB_STEPS = "job:chopper_job_steps_finalized:rate"
RANK_CAUSE = "job_rank_cause:chopper_job_rank_step_seconds:rate"
JOB_TOKENS = "job:chopper_rank_tokens:rate"


@dataclass(frozen=True)
class Record:
    """One recording rule; ``help`` states what the series means, with its unit."""

    record: str
    expr: str
    help: str


def records(p: RuleParams) -> list[Record]:
    """The recording rules, in evaluation order (later ones read earlier ones in the same group)."""
    w = p.rate_window
    return [
        Record(GPU_THROTTLE, f"sum by (node, gpu, cause) (rate({C.gpu_throttle_seconds_total}[{w}]))",
               "throttle residency by cause: seconds throttled per second, 0-1"),
        Record(GPU_CLOCK, f"max by (node, gpu) (avg_over_time({C.gpu_gfx_clock_hertz}[{w}]))\n"
                          f"/ max by (node, gpu) ({C.gpu_gfx_clock_max_hertz})",
               "mean graphics clock over the window as a fraction of the maximum, 0-1"),
        Record(GPU_BUSY, f"max by (node, gpu) (avg_over_time({C.gpu_busy_ratio}[{w}]))",
               "mean engine activity over the window, 0-1"),
        Record(JOB_CAUSE, f"sum by (job, cause) (rate({C.job_step_seconds_total}[{w}]))",
               "step time of all ranks by cause, seconds per second (a job of N busy ranks sums to N)"),
        Record(JOB_SECONDS, f"sum by (job) ({JOB_CAUSE})",
               "step time of all ranks, seconds per second"),
        Record(JOB_STEPS, f"sum by (job) (rate({C.job_steps_finalized_total}[{w}]))",
               "steps finalized by the aggregator per second; > 0 while a job trains"),
        Record(RANK_CAUSE, f"sum by (job, rank, cause) (rate({C.job_rank_step_seconds_total}[{w}]))",
               "a rank's step time by cause (straggler_wait included), seconds per second, 0-1"),
        Record(JOB_TOKENS, f"sum by (job) (rate({C.rank_tokens_total}[{w}]))",
               "tokens per second of all ranks of a job, from the agents"),
    ]
