"""DVFS / frequency loss: compute time lost to running below the maximum clock, split by cause.

Algorithm:

1. ``D = K × (1 − f̄/f_max)`` with ``K`` the compute time of the step, ``f̄`` the busy-weighted
   mean graphics clock over the window and ``f_max`` the device's maximum clock. ``f̄`` above
   ``f_max`` (boost readings) counts as no loss.
2. ``D`` is split between power, thermal, current and other in proportion to the throttle
   residency (seconds, from the cumulative ``throttle_*_s`` counters) each cause accrued in the
   window. When none accrued (or none is known), all of ``D`` is ``unattributed``.

Seconds and MHz in, seconds out.
"""
from __future__ import annotations

import numpy as np

from chopper.attribution.timeline import F64
from chopper.schema import THROTTLE_CAUSES


def clock_ratio(mean_clock_mhz: F64, max_clock_mhz: F64) -> F64:
    """``f̄ / f_max`` in [0, 1]; 1 (no loss) where either clock is unknown."""
    ratio = np.where(max_clock_mhz > 0, mean_clock_mhz / np.where(max_clock_mhz > 0, max_clock_mhz, 1.0), np.nan)
    return np.clip(np.nan_to_num(ratio, nan=1.0), 0.0, 1.0)


def dvfs_loss(compute_s: F64, ratio: F64) -> F64:
    """``K × (1 − f̄/f_max)``."""
    return compute_s * (1.0 - ratio)


def split_by_cause(loss_s: F64, residency_s: dict[str, F64]) -> dict[str, F64]:
    """Split ``loss_s`` by each cause's share of the accrued residency; the rest is ``unattributed``."""
    shares = {c: np.clip(np.nan_to_num(residency_s[c], nan=0.0), 0.0, None) for c in THROTTLE_CAUSES}
    total = sum(shares.values())
    any_residency = total > 0
    safe_total = np.where(any_residency, total, 1.0)
    out = {c: np.where(any_residency, loss_s * shares[c] / safe_total, 0.0) for c in THROTTLE_CAUSES}
    out["unattributed"] = np.where(any_residency, 0.0, loss_s)
    return out
