"""A fixed-width, live table of step summaries, one line per rank and step (demo and CLI)."""
from __future__ import annotations

import math

from chopper.proto.chopper.v1 import agent_pb2 as pb

COLUMNS = (
    ("job", 10, "{:<10.10}"), ("rank", 4, "{:>4}"), ("step", 6, "{:>6}"), ("step_ms", 8, "{:>8.1f}"),
    ("phases", 6, "{:>6}"), ("colls", 5, "{:>5}"), ("gpu", 3, "{:>3}"), ("clk_MHz", 7, "{:>7.0f}"),
    ("power_W", 7, "{:>7.1f}"), ("temp_C", 6, "{:>6.1f}"), ("energy_J", 8, "{:>8.2f}"), ("tok/s", 8, "{:>8.0f}"),
)


def header() -> str:
    return " ".join(f"{name:>{width}}" if i else f"{name:<{width}}" for i, (name, width, _) in enumerate(COLUMNS))


def row(s: pb.StepSummary) -> str:
    """One table line; values a backend could not read print as ``-``."""
    tokens_per_s = s.tokens / s.step_time_s if s.step_time_s > 0 else math.nan
    values = (
        s.job, s.rank, s.step, s.step_time_s * 1e3, s.phases, s.collectives, s.gpu, s.mean_gfx_clock_mhz,
        s.mean_power_w, s.max_temp_c, s.energy_j, tokens_per_s,
    )
    cells = []
    for (_, width, fmt), value in zip(COLUMNS, values, strict=True):
        missing = isinstance(value, float) and math.isnan(value)
        cells.append(f"{'-':>{width}}" if missing else fmt.format(value))
    return " ".join(cells)
