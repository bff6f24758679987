"""Idle time: the part of a step the GPU was not busy (launch gaps, host and data-loader stalls).

Algorithm: ``I = T × (1 − busy)``, with ``busy`` the time-weighted mean of the samples'
``busy_ratio`` over the step window (``GpuTimeline.integral``). Where no sample tells the busy
ratio, idle is 0 and the step is flagged ``no_samples`` by the caller. Seconds in, seconds out.
"""
from __future__ import annotations

import numpy as np

from chopper.attribution.timeline import F64


def idle_seconds(step_s: F64, busy_ratio: F64) -> F64:
    """``T × (1 − busy)``; 0 where ``busy`` is unknown; busy is clipped to [0, 1] first."""
    busy = np.clip(np.nan_to_num(busy_ratio, nan=1.0), 0.0, 1.0)
    return step_s * (1.0 - busy)
