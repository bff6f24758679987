"""A fixed-width, live table of step summaries, one line per rank and step (demo and CLI).

Times are milliseconds of the step, split by the attribution model's per-rank terms (straggler
wait needs all ranks and appears offline, in ``chopper attribute``).
"""
from __future__ import annotations

import math

from chopper.proto.chopper.v1 import agent_pb2 as pb

COLUMNS = (
    ("job", 8, "{:<8.8}"), ("rank", 4, "{:>4}"), ("step", 5, "{:>5}"), ("step_ms", 8, "{:>8.1f}"),
    ("ideal", 6, "{:>6.1f}"), ("matrix", 6, "{:>6.1f}"), ("dvfs", 6, "{:>6.1f}"), ("comm", 6, "{:>6.1f}"),
    ("idle", 6, "{:>6.1f}"), ("mfu%", 5, "{:>5.1f}"), ("gpu", 3, "{:>3}"), ("clk_MHz", 7, "{:>7.0f}"),
    ("power_W", 7, "{:>7.1f}"), ("temp_C", 6, "{:>6.1f}"), ("tok/s", 7, "{:>7.0f}"),
)


def header() -> str:
    return " ".join(f"{name:>{width}}" if i else f"{name:<{width}}" for i, (name, width, _) in enumerate(COLUMNS))


def row(s: pb.StepSummary) -> str:
    """One table line; values a backend could not read print as ``-``."""
    values = (
        s.job, s.rank, s.step, s.step_time_s * 1e3, s.ideal_s * 1e3, s.matrix_util_loss_s * 1e3,
        s.dvfs_loss_s * 1e3, s.exposed_comm_s * 1e3, s.idle_s * 1e3, s.mfu * 100, s.gpu, s.mean_gfx_clock_mhz,
        s.mean_power_w, s.max_temp_c, s.tokens_per_s,
    )
    cells = []
    for (_, width, fmt), value in zip(COLUMNS, values, strict=True):
        missing = isinstance(value, float) and math.isnan(value)
        cells.append(f"{'-':>{width}}" if missing else fmt.format(value))
    return " ".join(cells)
