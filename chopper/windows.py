"""Time-window statistics over one GPU's samples, with the DESIGN sample semantics.

A sample at ``ts`` describes the interval ``(previous ts, ts]`` of the same GPU: its ratios and
clocks are averages over that interval and its cumulative counters are values at ``ts``. For a
window ``[begin, end]``:

1. Each sample's interval is intersected with the window; the overlap in seconds is its weight
   (a window that cuts an interval takes the overlapping fraction). The first sample's interval
   is taken to be ``period_ns`` long, since its predecessor is unknown.
2. An average (clock, busy, power) is the overlap-weighted mean of the samples, ignoring NaN.
3. A cumulative counter (energy, link bytes, throttle seconds) is linearly interpolated at
   ``begin`` and ``end``, and the window's amount is the difference.

All inputs are numpy arrays sorted by time; timestamps are integer nanoseconds.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def overlap_seconds(ts_ns: IntArray, begin_ns: int, end_ns: int, period_ns: int) -> FloatArray:
    """Seconds of each sample interval ``(prev_ts, ts]`` that fall inside ``[begin_ns, end_ns]``."""
    if ts_ns.size == 0:
        return np.zeros(0)
    starts = np.empty_like(ts_ns)
    starts[0] = ts_ns[0] - period_ns
    starts[1:] = ts_ns[:-1]
    lo = np.maximum(starts, begin_ns)
    hi = np.minimum(ts_ns, end_ns)
    return np.clip(hi - lo, 0, None).astype(np.float64) / 1e9


def weighted_mean(values: FloatArray, weights: FloatArray) -> float:
    """Weighted mean ignoring NaN values; NaN when no weight remains."""
    ok = ~np.isnan(values) & (weights > 0)
    total = float(weights[ok].sum())
    if total <= 0:
        return float("nan")
    return float((values[ok] * weights[ok]).sum() / total)


def counter_delta(ts_ns: IntArray, counter: FloatArray, begin_ns: int, end_ns: int) -> float:
    """Increase of a cumulative counter over ``[begin_ns, end_ns]`` by linear interpolation.

    NaN when fewer than two valid readings exist or the window is not covered by them.
    """
    ok = ~np.isnan(counter)
    t, c = ts_ns[ok], counter[ok]
    if t.size < 2 or begin_ns < t[0] or end_ns > t[-1]:
        return float("nan")
    at = np.interp(np.array([begin_ns, end_ns], dtype=np.float64), t.astype(np.float64), c)
    return float(at[1] - at[0])


def window_extreme(values: FloatArray, weights: FloatArray, *, largest: bool) -> float:
    """Largest (or smallest) non-NaN value among samples that overlap the window."""
    ok = ~np.isnan(values) & (weights > 0)
    if not ok.any():
        return float("nan")
    return float(values[ok].max() if largest else values[ok].min())
