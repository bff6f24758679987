"""Per-step summaries: what one rank's step cost on its GPU, from the samples that cover it.

A closed step is summarised once a sample of its GPU at or after the step's end has arrived (or
after ``SummaryQueue.max_wait_ns``, with whatever samples there are), so that the last sample
interval of the window is known. Figures use ``chopper.windows`` (overlap-weighted means,
interpolated cumulative counters). Ranks that drive no GPU (``gpu == -1``) get step time,
FLOPs, tokens and counts only; GPU figures are NaN.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

import numpy as np

from agent.markers import ClosedStep
from chopper import windows
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.schema import Sample

NAN = math.nan


def summarize(step: ClosedStep, node: str, samples: list[Sample], period_ns: int) -> pb.StepSummary:
    """Step summary of ``step`` from its GPU's samples (time-sorted, may extend past the window)."""
    b, e = step.begin_ns, step.end_ns
    summary = pb.StepSummary(
        job=step.job, node=node, rank=step.rank, gpu=step.gpu, step=step.step, begin_ns=b, end_ns=e,
        step_time_s=(e - b) / 1e9, flops=step.flops, tokens=step.tokens, phases=step.phases,
        collectives=step.collectives,
        clock=pb.CLOCK_SOURCE_DEVICE if step.device_clock else pb.CLOCK_SOURCE_CPU,
        mean_gfx_clock_mhz=NAN, min_gfx_clock_mhz=NAN, mean_power_w=NAN, energy_j=NAN, max_temp_c=NAN,
        busy_ratio=NAN,
    )
    if not samples:
        return summary
    ts = np.fromiter((s.ts_ns for s in samples), dtype=np.int64, count=len(samples))

    def column(name: str) -> np.ndarray:
        return np.fromiter((getattr(s, name) for s in samples), dtype=np.float64, count=len(samples))

    w = windows.overlap_seconds(ts, b, e, period_ns)
    clock, busy = column("gfx_clock_mhz"), column("busy_ratio")
    summary.busy_ratio = windows.weighted_mean(busy, w)
    # The clock that matters is the clock while busy: weight by busy time where busy is known.
    busy_w = w * np.nan_to_num(busy, nan=1.0)
    summary.mean_gfx_clock_mhz = windows.weighted_mean(clock, busy_w if busy_w.sum() > 0 else w)
    summary.min_gfx_clock_mhz = windows.window_extreme(clock, w, largest=False)
    summary.mean_power_w = windows.weighted_mean(column("power_w"), w)
    summary.energy_j = windows.counter_delta(ts, column("energy_j"), b, e)
    summary.max_temp_c = windows.window_extreme(column("temp_c"), w, largest=True)
    return summary


class SummaryQueue:
    """Closed steps waiting for the samples that cover them.

    Args:
        max_wait_ns: Summarise anyway once a step ended this long ago (backend down, no GPU).
    """

    def __init__(self, max_wait_ns: int = 2 * 10**9) -> None:
        self.max_wait_ns = max_wait_ns
        self._pending: deque[ClosedStep] = deque()

    def add(self, steps: Iterable[ClosedStep]) -> None:
        self._pending.extend(steps)

    def __len__(self) -> int:
        return len(self._pending)

    def ready(self, latest_sample_ns: dict[int, int], now_ns: int) -> list[ClosedStep]:
        """Pop steps whose GPU has a sample at or after their end, or that waited long enough."""
        done: list[ClosedStep] = []
        waiting: deque[ClosedStep] = deque()
        for step in self._pending:
            covered = step.gpu >= 0 and latest_sample_ns.get(step.gpu, -1) >= step.end_ns
            if covered or step.gpu < 0 or now_ns - step.end_ns >= self.max_wait_ns:
                done.append(step)
            else:
                waiting.append(step)
        self._pending = waiting
        return done
