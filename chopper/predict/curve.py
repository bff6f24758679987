"""A recorded run's predicted step time at other world sizes, for the report's scaling figure.

``run_curve`` predicts (``model.predict``, the run's own observations only) at 1 and every
``max(1, N/4)``-th size up to ``fit.MAX_WORLD_FACTOR`` × the run's ``N``, and keeps the sizes
that are not refused. A run whose collectives cannot support a fit (one message size at one
world size: latency and bandwidth cannot be told apart) has no curve: None.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from chopper.predict.fit import MAX_WORLD_FACTOR
from chopper.predict.inputs import PredictInputError, from_run
from chopper.predict.model import Prediction, scaling_curve

if TYPE_CHECKING:
    import pandas as pd

    from chopper.runs.rundir import RecordedRun


@dataclass(frozen=True)
class ScalingCurve:
    """Predictions at several world sizes and what the run measured.

    Attributes:
        world_size: The run's ranks.
        measured_step_s: The run's median step time, s.
        points: ``(N, prediction)`` in increasing ``N``, refused sizes left out.
    """

    world_size: int
    measured_step_s: float
    points: tuple[tuple[int, Prediction], ...]


def run_curve(run: RecordedRun, steps: pd.DataFrame) -> ScalingCurve | None:
    """The curve of a run already read and attributed (module docstring), or None."""
    try:
        inputs = from_run(run, steps)
        worlds = sorted({1, *range(2, int(MAX_WORLD_FACTOR * inputs.world_size) + 1, max(1, inputs.world_size // 4))})
        points = tuple((n, p) for n, p, _ in scaling_curve([inputs], worlds) if p is not None)
    except PredictInputError:
        return None
    if not any(n > 1 for n, _ in points):
        return None
    return ScalingCurve(inputs.world_size, float(inputs.steps["step_time_s"].median()), points)
