"""Matrix-utilisation loss: compute time at the observed clock that the FLOPs do not explain.

Algorithm: ``U = K × f̄/f_max − T_ideal`` (compute time scaled to what it would take at the
maximum clock, minus the ideal time). ``U < 0`` means the FLOPs or the peak are wrong: ``U`` is
clamped to 0, ``T_ideal`` is capped at ``K × f̄/f_max`` so that the account still closes, and the
step is flagged ``ideal_exceeds_compute``. Where ``T_ideal`` is unknown, ``U`` is NaN. The
matrix-activity counter, where the backend has one, is reported beside ``U`` by the caller; it does
not enter the closure. Seconds in, seconds out.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from chopper.attribution.timeline import F64


def matrix_util_loss(compute_at_clock_s: F64, ideal_s: F64) -> tuple[F64, F64, npt.NDArray[np.bool_]]:
    """Returns ``(U, ideal capped, where the cap applied)`` from ``K × f̄/f_max`` and ``T_ideal``."""
    over = ideal_s > compute_at_clock_s  # False for NaN ideal
    capped_ideal = np.where(over, compute_at_clock_s, ideal_s)
    return compute_at_clock_s - capped_ideal, capped_ideal, over
