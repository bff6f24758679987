"""A fixed-width, live table of step summaries, one line per rank and step (demo and CLI).

Times are milliseconds of the step, split by the attribution model's per-rank terms (straggler
wait needs all ranks and appears offline, in ``chopper attribute``). ``dvfs_by`` names the
throttle cause with the most DVFS loss in the step (``-`` when the step lost none). A line is 99
characters wide.
"""
from __future__ import annotations

import math

from chopper.proto.chopper.v1 import agent_pb2 as pb

COLUMNS = (
    ("job", 6, "{:<6.6}"), ("rank", 4, "{:>4}"), ("step", 5, "{:>5}"), ("step_ms", 7, "{:>7.1f}"),
    ("ideal", 6, "{:>6.1f}"), ("matrix", 6, "{:>6.1f}"), ("dvfs", 6, "{:>6.1f}"), ("comm", 6, "{:>6.1f}"),
    ("idle", 6, "{:>6.1f}"), ("mfu%", 5, "{:>5.1f}"), ("gpu", 3, "{:>3}"), ("clk_MHz", 7, "{:>7.0f}"),
    ("pwr_W", 5, "{:>5.0f}"), ("temp_C", 6, "{:>6.1f}"), ("dvfs_by", 7, "{:>7.7}"),
)
# StepSummary fields of the DVFS loss by cause, and the name each prints as.
CAUSES = (("dvfs_power_s", "power"), ("dvfs_thermal_s", "thermal"), ("dvfs_current_s", "current"),
          ("dvfs_other_s", "other"), ("dvfs_unattributed_s", "unattr"))


def header() -> str:
    return " ".join(f"{name:>{width}}" if i else f"{name:<{width}}" for i, (name, width, _) in enumerate(COLUMNS))


def dvfs_cause(s: pb.StepSummary) -> str:
    """The cause with the most DVFS loss in the step, ``-`` when there was none."""
    lost = [(getattr(s, field), name) for field, name in CAUSES if getattr(s, field) > 0]  # NaN is not > 0
    return max(lost)[1] if lost else "-"


def row(s: pb.StepSummary) -> str:
    """One table line; values a backend could not read print as ``-``."""
    values = (
        s.job, s.rank, s.step, s.step_time_s * 1e3, s.ideal_s * 1e3, s.matrix_util_loss_s * 1e3,
        s.dvfs_loss_s * 1e3, s.exposed_comm_s * 1e3, s.idle_s * 1e3, s.mfu * 100, s.gpu, s.mean_gfx_clock_mhz,
        s.mean_power_w, s.max_temp_c, dvfs_cause(s),
    )
    cells = []
    for (_, width, fmt), value in zip(COLUMNS, values, strict=True):
        missing = isinstance(value, float) and math.isnan(value)
        cells.append(f"{'-':>{width}}" if missing else fmt.format(value))
    return " ".join(cells)
