"""Recording rules: the cluster-wide aggregations that dashboards and alerts read.

Each record keeps only the labels its users group by, so a fleet panel reads one small series per
GPU or job instead of every raw series on every refresh. Names follow Prometheus'
``level:metric:operations`` convention and carry no window, so dashboards work with any
``rate_window``; the window is a parameter (``RuleParams.rate_window``).

A GPU is keyed by ``(node, gpu)``: the labels the agent puts on every GPU series; a training job
by ``training_job``. ``max by`` rather than ``sum by`` keeps a misconfigured pair of agents that
claim the same node name from doubling a ratio. Every ``by`` and ``on`` list also keeps
``cluster`` where Prometheus adds one (``dashboards/cluster.py``).

``MFU_GAP_DOC`` says what the marker-against-counter records mean (docs/ALERTS.md prints it).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from dashboards.cluster import keep_cluster
from dashboards.names import C
from dashboards.params import RuleParams

GPU_THROTTLE = "node_gpu_cause:chopper_gpu_throttle_seconds:rate"
GPU_CLOCK = "node_gpu:chopper_gpu_gfx_clock:ratio"
GPU_BUSY = "node_gpu:chopper_gpu_busy:ratio"
JOB_CAUSE = "training_job_cause:chopper_job_step_seconds:rate"
JOB_SECONDS = "training_job:chopper_job_step_seconds:rate"
JOB_STEPS = "training_job:chopper_job_steps_finalized:rate"
RANK_CAUSE = "training_job_rank_cause:chopper_job_rank_step_seconds:rate"
JOB_TOKENS = "training_job:chopper_rank_tokens:rate"
JOB_MFU = "training_job:chopper_job_mfu:ratio"
JOB_ENERGY_PER_TOKEN = "training_job:chopper_job_energy_per_token_joules:ratio"
RANK_MFU = "node_gpu_training_job_rank:chopper_rank_mfu:ratio"
RANK_MFU_GAP = "node_gpu_training_job_rank:chopper_mfu_counter_gap:ratio"
JOB_MFU_GAP = "training_job:chopper_mfu_counter_gap:ratio"
MFU_GAP_DOC = (
    f"`{RANK_MFU_GAP}` and `{JOB_MFU_GAP}` set marker MFU against the hardware's own count. "
    f"`{RANK_MFU}` is the model FLOPs a rank declares over its step time and peak; "
    "`chopper_gpu_counter_flops_ratio` is what its GPU's matrix activity counter says it did (activity x clock / "
    "max clock), with no markers, where the backend reads such a counter. A rank's GPU is found through the rank "
    "series' `(node, gpu)` labels, the agent's device index as on the GPU series, within one `cluster`. The "
    "difference, counter minus marker, per rank and as the mean over a job's ranks whose GPU reads the counter, is "
    "what the declared FLOPs do not explain: above 0 the matrix units did work the FLOPs leave out (activation "
    "recomputation, padding, a FLOP formula that undercounts); below 0 the FLOPs or the peak are too high. Its "
    "level depends on the model and the counter's definition, so watch how it changes: a step in the gap with "
    "steady MFU is a change in the work, not in the hardware.")


@dataclass(frozen=True)
class Record:
    """One recording rule; ``help`` states what the series means, with its unit."""

    record: str
    expr: str
    help: str


def records(p: RuleParams) -> list[Record]:
    """The recording rules, in evaluation order (later ones read earlier ones in the same group)."""
    return [replace(r, expr=keep_cluster(r.expr)) for r in _records(p)]


def _ratio(by: str, numerator: str, denominator: str, w: str) -> str:
    """``Σ rate(numerator) / Σ rate(denominator)`` per ``by``, over the window ``w``.

    Sums, not ``max by``: a pair of agents that claim one node name doubles both sides alike. A
    denominator that did not grow in the window (no step with FLOPs, no tokens) gives no series
    rather than NaN or +Inf.
    """
    return (f"sum by ({by}) (rate({numerator}[{w}]))\n"
            f"/ (sum by ({by}) (rate({denominator}[{w}])) > 0)")


def _records(p: RuleParams) -> list[Record]:
    w = p.rate_window
    rank = "node, gpu, training_job, rank"
    gpu_flops = f"max by (node, gpu) (avg_over_time({C.gpu_counter_flops_ratio}[{w}]))"
    return [
        Record(GPU_THROTTLE, f"sum by (node, gpu, cause) (rate({C.gpu_throttle_seconds_total}[{w}]))",
               "throttle residency by cause: seconds throttled per second, 0-1"),
        Record(GPU_CLOCK, f"max by (node, gpu) (avg_over_time({C.gpu_gfx_clock_hertz}[{w}]))\n"
                          f"/ max by (node, gpu) ({C.gpu_gfx_clock_max_hertz})",
               "mean graphics clock over the window as a fraction of the maximum, 0-1"),
        Record(GPU_BUSY, f"max by (node, gpu) (avg_over_time({C.gpu_busy_ratio}[{w}]))",
               "mean engine activity over the window, 0-1"),
        Record(JOB_CAUSE, f"sum by (training_job, cause) (rate({C.job_step_seconds_total}[{w}]))",
               "step time of all ranks by cause, seconds per second (a job of N busy ranks sums to N)"),
        Record(JOB_SECONDS, f"sum by (training_job) ({JOB_CAUSE})",
               "step time of all ranks, seconds per second"),
        Record(JOB_STEPS, f"sum by (training_job) (rate({C.job_steps_finalized_total}[{w}]))",
               "steps finalized by the aggregator per second; > 0 while a job trains"),
        Record(RANK_CAUSE, f"sum by (training_job, rank, cause) (rate({C.job_rank_step_seconds_total}[{w}]))",
               "a rank's step time by cause (straggler_wait included), seconds per second, 0-1"),
        Record(JOB_TOKENS, f"sum by (training_job) (rate({C.rank_tokens_total}[{w}]))",
               "tokens per second of all ranks of a job, from the agents"),
        Record(JOB_MFU, _ratio("training_job", f'{C.job_step_seconds_total}{{cause="ideal"}}',
                               C.job_flops_step_seconds_total, w),
               "model FLOPs utilisation of all ranks of a job over the window: ideal compute time / step time of "
               "the steps with known FLOPs, 0-1 (aggregator)"),
        Record(JOB_ENERGY_PER_TOKEN, _ratio("training_job", C.job_energy_joules_total, C.job_tokens_total, w),
               "GPU energy per token of all ranks of a job over the window, J, over the steps whose energy and "
               "tokens are both known (aggregator)"),
        Record(RANK_MFU, _ratio(rank, f'{C.rank_step_seconds_total}{{cause="ideal"}}',
                                C.rank_flops_step_seconds_total, w),
               "a rank's marker MFU over the window: ideal compute time / step time of its steps with known "
               "FLOPs, 0-1 (agents)"),
        Record(RANK_MFU_GAP, f"{gpu_flops}\n- on (node, gpu) group_right\n{RANK_MFU}",
               "counter-derived FLOP utilisation of a rank's GPU minus the rank's marker MFU, both over the "
               "window, -1 to 1; only ranks whose GPU reads a matrix activity counter"),
        Record(JOB_MFU_GAP, f"avg by (training_job) ({RANK_MFU_GAP})",
               "mean over a job's ranks of that gap: what the job's declared FLOPs do not explain, -1 to 1"),
    ]
