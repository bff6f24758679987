"""A latency–bandwidth (α–β) model per collective, fitted to observed (bytes, seconds) pairs.

Model: one collective on ``n`` ranks of an ``S``-byte array takes ``t = α·L + β·V`` with
``L = volumes.latency_steps`` and ``V = volumes.bus_bytes`` (Thakur, Rabenseifner & Gropp 2005).
When every observation's link bandwidth ``B`` is known (GB/s), the bandwidth term is written
``β·V/B``, β then being dimensionless (1 when the link runs at ``B``): one fit covers runs at
different bandwidths and predicts at a new one. When none is known, β is seconds per byte and
``1/β`` the effective bus bandwidth the collectives achieved.

Algorithm of ``fit_collective``:

1. Observations: one per call (``L``, ``V``, seconds). Fewer than ``MIN_PAIRS`` (3: two
   parameters and one degree of freedom) are refused; with α fixed, 2.
2. Identifiability: with α free, the pairs must not all have the same ``V/L`` (one message size
   at one world size): then α and β trade off exactly and β is not identifiable. Refused when
   the largest ``V/L`` is below ``MIN_SPREAD`` × the smallest.
3. Least squares on relative residuals (each pair weighted by ``1/t``), because timings span
   orders of magnitude and their noise grows with them: minimise ``Σ ((t − α·L − β·V)/t)²``.
4. A negative α (noise on latency-free data) is fixed at 0 and β refitted; a β ≤ 0 is refused:
   the time does not grow with the bytes, so no bandwidth can be read from these pairs.
5. Residuals: RMS seconds, RMS and largest relative residual ``(t − t̂)/t̂``; the range of ``S``,
   ``n`` and ``B`` observed, which ``support`` uses to refuse extrapolation.

Extrapolation rule (``support``): a prediction is refused when the target world size is above
``MAX_WORLD_FACTOR`` × the largest observed, the array size outside ``[min/MAX_SIZE_FACTOR,
max·MAX_SIZE_FACTOR]`` of the observed, or the target bandwidth outside the same factor of the
observed bandwidths (of ``1/β`` when the runs' bandwidths are unknown).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy.typing as npt

MIN_PAIRS = 3
MIN_SPREAD = 1.25
MAX_WORLD_FACTOR = 4.0
MAX_SIZE_FACTOR = 4.0
GB = 1e9  # bytes per GB (bandwidths are GB/s, as nccl-tests prints them)


class FitRefused(ValueError):
    """The observations cannot support the fit or the extrapolation asked; the message says why."""


@dataclass(frozen=True)
class Fit:
    """An α–β fit of one collective (module docstring).

    Attributes:
        collective: The collective (``volumes.COLLECTIVES``), or ``"all"`` for the pooled fit.
        algorithm: ``"ring"`` or ``"tree"`` (``volumes``).
        alpha_s: Seconds per latency step.
        beta: Seconds per byte of ``V``; with ``scaled``, dimensionless (multiplies ``V/B``).
        scaled: True when the fit used the runs' bandwidths.
        pairs: Observations fitted.
        rms_s: RMS residual, seconds.
        rms_rel: RMS relative residual.
        max_rel: Largest absolute relative residual.
        sizes: Smallest and largest ``S`` observed, bytes.
        worlds: Smallest and largest world size observed.
        bandwidths: Smallest and largest run bandwidth observed, GB/s (None when not scaled).
        alpha_fixed: True when α was given, or fixed at 0 because the fit made it negative.
        notes: Why α was fixed, and other remarks.
    """

    collective: str
    algorithm: str
    alpha_s: float
    beta: float
    scaled: bool
    pairs: int
    rms_s: float
    rms_rel: float
    max_rel: float
    sizes: tuple[float, float]
    worlds: tuple[int, int]
    bandwidths: tuple[float, float] | None
    alpha_fixed: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    def seconds(self, latency_steps: float, bus_bytes: float, bandwidth_gbs: float | None = None) -> float:
        """Predicted seconds of one call; ``bandwidth_gbs`` is required when ``scaled``, and otherwise,
        when given, replaces the effective bandwidth ``1/β``."""
        if self.scaled:
            if bandwidth_gbs is None:
                raise FitRefused("this fit is in units of the runs' bandwidths: give the target bandwidth")
            return self.alpha_s * latency_steps + self.beta * bus_bytes / (bandwidth_gbs * GB)
        beta = self.beta if bandwidth_gbs is None else 1.0 / (bandwidth_gbs * GB)
        return self.alpha_s * latency_steps + beta * bus_bytes

    @property
    def effective_bandwidth_gbs(self) -> float:
        """``1/β`` in GB/s (unscaled fits), or the share of the nominal bandwidth reached, ``1/β`` (scaled)."""
        return 1.0 / (self.beta * GB) if not self.scaled else 1.0 / self.beta


def fit_collective(
    collective: str, algorithm: str, latency_steps: npt.ArrayLike, bus_bytes: npt.ArrayLike,
    seconds: npt.ArrayLike, sizes: npt.ArrayLike, worlds: npt.ArrayLike,
    bandwidths_gbs: npt.ArrayLike | None = None, alpha_s: float | None = None,
) -> Fit:
    """Fit ``t = α·L + β·V`` (or ``β·V/B``) to one collective's observations (module docstring).

    Args:
        collective: Name carried into the result.
        algorithm: ``"ring"`` or ``"tree"``, the one ``L`` and ``V`` were computed for.
        latency_steps: ``L`` per observation.
        bus_bytes: ``V`` per observation, bytes.
        seconds: Measured seconds per observation.
        sizes: ``S`` per observation, bytes (for the observed range).
        worlds: World size per observation.
        bandwidths_gbs: The run bandwidth per observation, GB/s, or None when unknown for all.
        alpha_s: Fix α at this many seconds instead of fitting it.

    Raises:
        FitRefused: Too few pairs, β not identifiable, or a β that is not positive.
    """
    import numpy as np

    L = np.asarray(latency_steps, dtype=np.float64)
    V = np.asarray(bus_bytes, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    S = np.asarray(sizes, dtype=np.float64)
    W = np.asarray(worlds, dtype=np.int64)
    keep = np.isfinite(t) & (t > 0) & (V > 0)
    L, V, t, S, W = L[keep], V[keep], t[keep], S[keep], W[keep]
    B = None if bandwidths_gbs is None else np.asarray(bandwidths_gbs, dtype=np.float64)[keep]
    need = MIN_PAIRS if alpha_s is None else MIN_PAIRS - 1
    if len(t) < need:
        raise FitRefused(f"{collective}: {len(t)} timed call(s) with bytes, {need} needed to fit α and β; record "
                         "more steps")
    X = V if B is None else V / (B * GB)
    notes: list[str] = []
    fixed = alpha_s is not None
    if alpha_s is None:
        ratio = X / np.maximum(L, 1e-300)
        if ratio.max() < MIN_SPREAD * ratio.min():
            raise FitRefused(
                f"{collective}: every call moved the same bytes per latency step (one message size at one world "
                f"size, S={_fmt_bytes(S.min())}, n={W.min()}), so latency and bandwidth cannot be told apart: "
                "β is not identifiable. Record collectives of several sizes (e.g. DDP's bucket_cap_mb) or runs at "
                "another world size, or fix α (--latency-us)")
        w = 1.0 / t
        design = np.column_stack([L * w, X * w])
        (alpha, beta), *_ = np.linalg.lstsq(design, t * w, rcond=None)
        if alpha < 0:
            notes.append(f"the fitted latency was negative ({alpha * 1e6:.1f} µs): fixed at 0")
            alpha, fixed = 0.0, True
            beta = _beta_given_alpha(0.0, L, X, t)
    else:
        alpha = float(alpha_s)
        beta = _beta_given_alpha(alpha, L, X, t)
    if not beta > 0:
        raise FitRefused(f"{collective}: the time does not grow with the bytes (β = {beta:.3g}); the timings are "
                         "latency or noise, and no bandwidth can be read from them")
    predicted = alpha * L + beta * X
    rel = (t - predicted) / predicted
    return Fit(
        collective=collective, algorithm=algorithm, alpha_s=float(alpha), beta=float(beta), scaled=B is not None,
        pairs=len(t), rms_s=float(np.sqrt(np.mean((t - predicted) ** 2))),
        rms_rel=float(np.sqrt(np.mean(rel**2))), max_rel=float(np.abs(rel).max()),
        sizes=(float(S.min()), float(S.max())), worlds=(int(W.min()), int(W.max())),
        bandwidths=None if B is None else (float(B.min()), float(B.max())), alpha_fixed=fixed, notes=tuple(notes),
    )


def _beta_given_alpha(alpha: float, L: npt.NDArray, X: npt.NDArray, t: npt.NDArray) -> float:
    """β minimising the relative squared residuals with α fixed."""
    import numpy as np

    w2 = 1.0 / t**2
    return float(np.sum(w2 * X * (t - alpha * L)) / np.sum(w2 * X * X))


def support(fit: Fit, size: float, world: int, bandwidth_gbs: float | None) -> str | None:
    """Why ``fit`` cannot predict a call of ``size`` bytes on ``world`` ranks at ``bandwidth_gbs``, or None."""
    if world > MAX_WORLD_FACTOR * fit.worlds[1]:
        return (f"world size {world} is more than {MAX_WORLD_FACTOR:g}× the largest observed ({fit.worlds[1]}); "
                "record a run nearer that size")
    lo, hi = fit.sizes
    if not lo / MAX_SIZE_FACTOR <= size <= hi * MAX_SIZE_FACTOR:
        return (f"{_fmt_bytes(size)} is outside {MAX_SIZE_FACTOR:g}× the observed {_fmt_bytes(lo)}–{_fmt_bytes(hi)}")
    if bandwidth_gbs is not None:
        if fit.bandwidths is not None:
            blo, bhi = fit.bandwidths
            what = f"the observed {blo:g}–{bhi:g} GB/s"
        else:
            blo = bhi = fit.effective_bandwidth_gbs
            what = f"the effective {blo:.3g} GB/s the runs reached"
        if not blo / MAX_SIZE_FACTOR <= bandwidth_gbs <= bhi * MAX_SIZE_FACTOR:
            return f"{bandwidth_gbs:g} GB/s is more than {MAX_SIZE_FACTOR:g}× away from {what}"
    return None


def _fmt_bytes(n: float) -> str:
    if not math.isfinite(n):
        return str(n)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"
