"""The report's scaling figure: predicted step time against world size, the measured step marked.

The prediction is ``chopper.predict`` of the report's run (``ReportData.scaling``,
``chopper.predict.curve``): the time that is not communication kept as measured, communication
from the α–β fit of the run's own collectives (docs/PREDICT.md). It is drawn only when the run's
collectives support a fit: one message size at one world size cannot separate latency from
bandwidth (``chopper predict`` says so, and pools runs of several sizes).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from matplotlib.figure import Figure

from chopper.report.spec import FigureSpec, ReportData, new_figure

if TYPE_CHECKING:
    from chopper.predict.curve import ScalingCurve

SCALING_SECTION = "Scaling prediction"


def predicted_step_time(curve: ScalingCurve) -> Figure:
    """Step time (ms) predicted at each world size of ``curve``, ±1 sd, with the measured median step."""
    fig = new_figure(7.0, 3.6)
    n = np.array([w for w, _ in curve.points], dtype=float)
    step = np.array([1e3 * p.step_time_s for _, p in curve.points])
    unc = np.array([1e3 * p.uncertainty_s for _, p in curve.points])
    ax = fig.add_subplot()
    ax.fill_between(n, step - unc, step + unc, color="#90caf9", alpha=0.5, label="±1 sd")
    ax.plot(n, step, color="#1565c0", marker=".", label="predicted step time")
    ax.plot(n, [1e3 * p.noncomm_s for _, p in curve.points], color="#2e7d32", linestyle="--",
            label="not communication (as measured)")
    ax.plot([curve.world_size], [1e3 * curve.measured_step_s], "o", color="#c62828", label="measured (median step)")
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel("step time (ms)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right", fontsize="small")
    return fig


def _curve(data: ReportData) -> ScalingCurve:
    assert data.scaling is not None
    return data.scaling


PREDICT_FIGURES: list[FigureSpec] = [
    FigureSpec(
        "scaling-prediction", SCALING_SECTION, "Predicted step time against world size",
        "Step time (ms) predicted by chopper predict at other world sizes with the same per-rank batch (weak "
        "scaling): the time that is not communication kept as measured (dashed), each collective timed by an α–β "
        "fit of the run's own collectives at the new size, its exposed share kept. The band is one standard "
        "deviation (fit residuals and step-to-step spread); the red point is the run's measured median step. "
        "docs/PREDICT.md has the method; chopper predict pools runs of several sizes and bandwidths.",
        ("scaling",), lambda d: predicted_step_time(_curve(d)),
    ),
]
