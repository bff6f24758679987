"""Step summaries shaped like the agent's, for aggregator tests: healthy ranks and a hot GPU."""
from __future__ import annotations

from chopper.proto.chopper.v1 import agent_pb2 as pb

NS = 1_000_000_000
MAX_CLOCK = 2100.0


def summary(job: str, rank: int, step: int, *, hot: bool = False, node: str | None = None, skew_s: float = 0.0,
            flops: bool = True) -> pb.StepSummary:
    """One rank's step of 1 s, closed on its own clock (``skew_s`` shifts that clock).

    A healthy rank computes 0.80 s at full clock and waits 0.15 s in collectives; the hot rank
    computes 0.90 s at a thermally throttled clock (0.10 s DVFS loss, thermal residency) and
    waits only 0.05 s, because every other rank waits for it.
    """
    begin = int((1_000_000 + step + skew_s) * NS)
    idle, exposed, compute = (0.05, 0.05, 0.90) if hot else (0.05, 0.15, 0.80)
    clock = 1890.0 if hot else MAX_CLOCK
    dvfs = compute * (1 - clock / MAX_CLOCK)
    ideal = 0.5 if flops else float("nan")
    at_clock = compute - dvfs
    s = pb.StepSummary(
        job=job, node=node or f"node{rank // 8}", rank=rank, gpu=rank % 8, step=step, begin_ns=begin,
        end_ns=begin + NS, step_time_s=1.0, flops=5e14 if flops else 0.0, tokens=4096,
        mean_gfx_clock_mhz=clock, min_gfx_clock_mhz=clock - 50, energy_j=700.0, max_temp_c=98.0 if hot else 70.0,
        busy_ratio=0.95, ideal_s=ideal, matrix_util_loss_s=at_clock - 0.5 if flops else float("nan"),
        compute_at_clock_s=at_clock, dvfs_loss_s=dvfs, dvfs_thermal_s=dvfs, exposed_comm_s=exposed, idle_s=idle,
        mfu=0.5 if flops else float("nan"), tokens_per_s=4096.0, tokens_per_j=4096 / 700.0,
    )
    if not flops:
        s.flags.append("no_flops")
    return s
