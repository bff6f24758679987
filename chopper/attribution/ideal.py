"""Ideal time and MFU: how long the step's FLOPs take at the device's peak.

Algorithm: ``T_ideal = flops / peak_flops`` (dense BF16 at max clock), ``MFU = T_ideal / T``.
A step without FLOPs (0 or missing) or a device without a known peak has NaN for both; the
caller flags it ``no_flops``. FLOPs and FLOP/s in, seconds out.
"""
from __future__ import annotations

import numpy as np

from chopper.attribution.timeline import F64


def ideal_seconds(flops: F64, peak_flops: F64) -> F64:
    """``flops / peak``; NaN where either is missing or not positive."""
    known = (flops > 0) & (peak_flops > 0)
    return np.where(known, flops / np.where(known, peak_flops, 1.0), np.nan)


def mfu(ideal_s: F64, step_s: F64) -> F64:
    """Model FLOPs utilisation ``T_ideal / T``; NaN for zero-length steps."""
    return np.where(step_s > 0, ideal_s / np.where(step_s > 0, step_s, 1.0), np.nan)
