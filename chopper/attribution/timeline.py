"""Integrals of one GPU's samples over many time windows at once (the DESIGN sample semantics).

A sample at ``ts`` describes the interval ``(previous ts, ts]``: its ratios and clocks are
averages over that interval, its cumulative counters are values at ``ts``. The first sample's
interval is taken to be the GPU's median sampling interval long, since its predecessor is unknown.

Algorithm (vectorised over windows ``[b_i, e_i]``):

1. Knots are the interval boundaries ``s_0 < ts_0 < ts_1 < ...``; a piecewise-constant quantity
   ``v`` has the cumulative integral ``C(t)``, linear between knots. Its integral over a window
   is ``C(e) − C(b)`` by linear interpolation, which is exactly the overlapping fraction of every
   interval the window cuts. Outside the knots ``C`` is flat, so uncovered time adds nothing.
2. NaN values add neither to the integral nor to the "valid time" integral of that quantity,
   so a mean over a window is ``∫v / ∫valid``, over the time the quantity was known.
3. A cumulative counter is linearly interpolated at ``b`` and ``e`` between its readings; the
   window's amount is the difference (clamped to the first/last reading outside them).
4. Extremes (minimum clock, maximum temperature) are taken over the samples whose interval
   overlaps the window, with ``fmin/fmax.reduceat`` over index ranges.

Times are nanoseconds relative to a base chosen by the caller, so that float64 interpolation is
exact to the nanosecond (absolute CLOCK_REALTIME nanoseconds exceed float64's 2**53).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class GpuTimeline:
    """One GPU's samples prepared for window integrals.

    Attributes:
        ts: Sample timestamps, ns relative to the caller's base, strictly increasing.
        knots: ``[s_0, ts_0, ..., ts_{n-1}]``.
        values: Per-interval quantities by name (NaN where unknown).
        counters: Cumulative counters by name, read at ``ts``.
    """

    ts: F64
    knots: F64
    values: dict[str, F64]
    counters: dict[str, F64]

    @classmethod
    def build(
        cls, ts: F64, values: dict[str, F64], counters: dict[str, F64], first_interval_ns: float | None = None
    ) -> GpuTimeline:
        """Prepare a timeline; ``first_interval_ns`` defaults to the median sampling interval."""
        if ts.size and first_interval_ns is None:
            first_interval_ns = float(np.median(np.diff(ts))) if ts.size > 1 else 1e8
        knots = np.concatenate(([ts[0] - (first_interval_ns or 0.0)], ts)) if ts.size else ts
        return cls(ts, knots, values, counters)

    def integrals(
        self, specs: Sequence[tuple[str | None, str | None]], b: F64, e: F64
    ) -> tuple[F64, F64]:
        """``(∫ v·w dt, ∫ w dt)`` for each ``(v, w)`` of ``specs`` over each window, in value·ns and ns.

        Only intervals where both ``v`` and ``w`` are known count. ``v=None`` integrates 1
        (coverage); ``w=None`` weighs by 1, so the second value is the time ``v`` was known; with
        ``w="busy_ratio"`` their ratio is the busy-weighted mean of ``v``. All specs share one
        cumulative sum and one search of the knots (rows of the results follow ``specs``).
        """
        k = len(specs)
        if self.ts.size == 0:
            return np.zeros((k, b.size)), np.zeros((k, b.size))
        ones = np.ones(self.ts.size)
        rows = []
        for value, weight in specs:
            v = ones if value is None else self.values[value]
            w = ones if weight is None else self.values[weight]
            known = ~np.isnan(v) & ~np.isnan(w)
            w_known = np.where(known, w, 0.0)
            rows += [np.where(known, v, 0.0) * w_known, w_known]
        widths = np.diff(self.knots)
        cumulative = np.zeros((2 * k, self.knots.size))
        np.cumsum(np.vstack(rows) * widths, axis=1, out=cumulative[:, 1:])
        at = self._interpolate(cumulative, e) - self._interpolate(cumulative, b)
        return at[0::2], at[1::2]

    def _interpolate(self, cumulative: npt.NDArray[np.float64], x: F64) -> npt.NDArray[np.float64]:
        """Rows of ``cumulative`` (values at the knots) linearly interpolated at ``x``, flat outside."""
        knots = self.knots
        xc = np.clip(x, knots[0], knots[-1])
        i = np.clip(np.searchsorted(knots, xc, side="right") - 1, 0, knots.size - 2)
        frac = (xc - knots[i]) / (knots[i + 1] - knots[i])
        return cumulative[:, i] + frac * (cumulative[:, i + 1] - cumulative[:, i])

    def counter_delta(self, name: str, b: F64, e: F64) -> F64:
        """Increase of a cumulative counter over each window; NaN when it was never read."""
        c = self.counters[name]
        ok = ~np.isnan(c)
        if not ok.any():
            return np.full_like(b, np.nan)
        t, v = self.ts[ok], c[ok]
        return np.interp(e, t, v) - np.interp(b, t, v)

    def extreme(self, name: str, b: F64, e: F64, *, largest: bool) -> F64:
        """Max (or min) of a quantity over the samples whose interval overlaps each window."""
        v = self.values[name]
        n = v.size
        out = np.full(b.shape, np.nan)
        if n == 0:
            return out
        lo = np.searchsorted(self.ts, b, side="right")  # first sample ending after b
        hi = np.minimum(np.searchsorted(self.ts, e, side="left"), n - 1)  # last sample starting before e
        ok = (lo < n) & (lo <= hi) & (e > self.knots[0])
        if not ok.any():
            return out
        # reduceat over [lo, hi] ranges: interleave starts and stops, keep every other result.
        idx = np.empty(2 * int(ok.sum()), dtype=np.int64)
        idx[0::2] = lo[ok]
        idx[1::2] = hi[ok] + 1
        padded = np.append(v, np.nan)
        reduce = np.fmax.reduceat if largest else np.fmin.reduceat
        out[ok] = reduce(padded, idx)[0::2]
        return out
