"""Step time, tokens/s, MFU and exposed communication of a job at another world size and bandwidth.

``predict(inputs, world_size, bandwidth_gbs)`` pools the observations of every input (runs of the
same job at other sizes and bandwidths) and predicts one step at the target:

1. **Fits.** Every collective call of every input becomes one observation ``(L, V, seconds)`` at
   its own world size (``volumes``); one α–β fit per collective type, plus one pooled over all
   types (``"all"``), which serves a type that has no fit of its own: bus bytes are comparable
   across collectives (nccl-tests ``PERFORMANCE.md``: the bus bandwidth "should reflect the speed
   of the hardware bottleneck" whatever the operation). Bandwidths: when every input says the
   bandwidth its run had (``--run-bandwidth``), fits are in units of it and the target bandwidth
   scales the bandwidth term (``fit``); when none does, ``--bandwidth`` replaces the effective
   bandwidth ``1/β`` the runs reached. A mix is refused.
2. **Compute is kept as measured** (weak scaling: every rank keeps its batch, so per-rank work does
   not change with the world size): the median over steps of ``noncomm_s`` (``inputs``: the
   slowest rank's compute and idle). Taken from the inputs at the target world size when there
   are any (the same number of processes also shares the host as the target would), else from all.
3. **The step's collectives** at the target: the calls per step of each (collective, ``S``) the
   inputs ran (mean over inputs); with ``parallelism``, instead the collectives of that strategy
   (``volumes.step_plan``) for the step's gradient bytes (``volumes.gradient_bytes`` of what
   ran). Each call's seconds come from its fit at ``(S, N, B)``; ``comm_s`` is their sum.
4. **Overlap is kept**: ``exposed_comm_s = e · comm_s`` with ``e`` the median over steps of the
   measured exposed share ``exposed_comm_s / collective_s`` (inputs chosen as in 2), capped to
   [0, 1].
5. ``step_time_s = noncomm_s + exposed_comm_s``; ``tokens_per_s = tokens per rank · N /
   step_time_s`` (the job's throughput); ``mfu = ideal_s / step_time_s`` (``ideal_s`` = FLOPs /
   peak FLOP/s of a rank, from the attribution). Uncertainty (one standard deviation):
   ``sqrt((e · Σ calls · t̂ · rms_rel)² + sd(noncomm_s)²)``, the fits' relative RMS residual taken as
   fully correlated across calls, plus the step-to-step spread of the measured compute.
6. **Refusals** (``PredictionRefused``): a call whose fit was refused and no pooled fit exists, a
   target outside what the fits observed (``fit.support``), inputs without collectives.

One rank (``N = 1``) communicates nothing: its step is ``noncomm_s``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from chopper.predict import volumes
from chopper.predict.fit import Fit, FitRefused, fit_collective, support
from chopper.predict.inputs import PredictInputError, RunInputs

if TYPE_CHECKING:
    import pandas as pd

POOLED = "all"


class PredictionRefused(ValueError):
    """The inputs cannot support the prediction asked; the message says why and what would."""


@dataclass(frozen=True)
class PlannedCall:
    """One collective of the predicted step."""

    collective: str
    size: float
    calls_per_step: float
    seconds: float
    fit: str


@dataclass(frozen=True)
class Prediction:
    """One predicted step (module docstring); seconds unless named otherwise."""

    world_size: int
    bandwidth_gbs: float | None
    parallelism: str | None
    algorithm: str
    step_time_s: float
    uncertainty_s: float
    noncomm_s: float
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    exposed_share: float
    tokens_per_s: float
    mfu: float
    plan: tuple[PlannedCall, ...]
    fits: dict[str, Fit]
    refused_fits: dict[str, str]
    inputs: tuple[dict[str, Any], ...]
    notes: tuple[str, ...] = field(default_factory=tuple)


def observations(inputs: Sequence[RunInputs], algorithm: str = "ring") -> pd.DataFrame:
    """Every collective call of every input with its ``latency_steps`` (L), ``bus_bytes`` (V) and run bandwidth."""
    import numpy as np
    import pandas as pd

    frames = [i.collectives.assign(run=i.label, bandwidth_gbs=np.nan if i.bandwidth_gbs is None else i.bandwidth_gbs)
              for i in inputs if not i.collectives.empty]
    if not frames:
        return pd.DataFrame(columns=["run", "collective", "size", "world", "seconds", "bandwidth_gbs",
                                     "latency_steps", "bus_bytes"])
    obs = pd.concat(frames, ignore_index=True)
    obs["latency_steps"] = [volumes.latency_steps(c, int(n), algorithm) for c, n in zip(obs["collective"], obs["world"],
                                                                                      strict=True)]
    obs["bus_bytes"] = [volumes.bus_bytes(c, s, int(n), algorithm)
                        for c, s, n in zip(obs["collective"], obs["size"], obs["world"], strict=True)]
    return obs


def fit_all(inputs: Sequence[RunInputs], algorithm: str = "ring",
            alpha_s: float | None = None) -> tuple[dict[str, Fit], dict[str, str]]:
    """One fit per collective type and the pooled one (module docstring, 1); refusals by type."""
    _check_bandwidths(inputs)
    obs = observations(inputs, algorithm)
    fits: dict[str, Fit] = {}
    refused: dict[str, str] = {}
    groups = [(c, g) for c, g in obs.groupby("collective", sort=True)]
    if len(groups) > 1:
        groups.append((POOLED, obs))
    for name, rows in groups:
        bandwidths = None if rows["bandwidth_gbs"].isna().all() else rows["bandwidth_gbs"]
        try:
            fits[str(name)] = fit_collective(str(name), algorithm, rows["latency_steps"], rows["bus_bytes"],
                                             rows["seconds"], rows["size"], rows["world"], bandwidths, alpha_s)
        except FitRefused as exc:
            refused[str(name)] = str(exc)
    return fits, refused


def _check_bandwidths(inputs: Sequence[RunInputs]) -> None:
    known = {i.bandwidth_gbs is not None for i in inputs if not i.collectives.empty}
    if len(known) > 1:
        raise PredictInputError("some inputs have a run bandwidth and some do not; give --run-bandwidth for every "
                                "input or for none")


def _target_bandwidth(fits: dict[str, Fit], bandwidth_gbs: float | None) -> float | None:
    """The bandwidth to predict at: the one asked, or the runs' own when they all had one."""
    scaled = [f for f in fits.values() if f.scaled]
    if bandwidth_gbs is not None or not scaled:
        return bandwidth_gbs
    lo, hi = scaled[0].bandwidths or (math.nan, math.nan)
    if lo != hi:
        raise PredictionRefused(f"the inputs ran at {lo:g}–{hi:g} GB/s; say which bandwidth to predict at "
                                "(--bandwidth)")
    return lo


def _chosen(inputs: Sequence[RunInputs], world_size: int) -> list[RunInputs]:
    same = [i for i in inputs if i.world_size == world_size]
    return same or list(inputs)


def _step_plan(inputs: Sequence[RunInputs], parallelism: str | None) -> list[tuple[str, float, float]]:
    """``(collective, S, calls per step)`` of the step to predict (module docstring, 3)."""
    import pandas as pd

    rates = []
    for i in inputs:
        calls = i.collectives[i.collectives["step"] >= 0]
        if calls.empty:
            continue
        steps = calls["step"].nunique()
        rates.append(calls.groupby(["collective", "size"]).size() / steps)
    if not rates:
        raise PredictionRefused("no input has a collective inside a step; record a run whose job marks its "
                                "collectives (chopper.pytorch.instrument) or runs NCCL's Inspector")
    mean = pd.concat(rates, axis=1).fillna(0.0).mean(axis=1)
    ran = [(str(c), float(s), float(k)) for (c, s), k in mean.items()]
    if parallelism is None:
        return ran
    grad = volumes.gradient_bytes([(c, s * k) for c, s, k in ran])
    if grad <= 0:
        raise PredictionRefused(f"--parallelism {parallelism}: the runs show no gradient collective (all_reduce or "
                                "reduce_scatter) to size that strategy's collectives from")
    planned: dict[tuple[str, float], float] = {}
    for c, s in volumes.step_plan(parallelism, grad):
        planned[(c, s)] = planned.get((c, s), 0.0) + 1.0
    return [(c, s, k) for (c, s), k in planned.items()]


def predict(inputs: Sequence[RunInputs], world_size: int, bandwidth_gbs: float | None = None,
            parallelism: str | None = None, algorithm: str = "ring", alpha_s: float | None = None) -> Prediction:
    """Predict one step at ``world_size`` ranks and ``bandwidth_gbs`` (module docstring).

    Args:
        inputs: ``load_inputs`` of one or more runs of the job (pooled).
        world_size: Target ranks, ≥ 1.
        bandwidth_gbs: Target link bandwidth, GB/s; None: the runs' own.
        parallelism: Predict this strategy's collectives (``volumes.PARALLELISMS``) instead of those that ran.
        algorithm: ``"ring"`` or ``"tree"`` (``volumes``).
        alpha_s: Fix the latency per step instead of fitting it.

    Raises:
        PredictInputError: Bad arguments or inputs.
        PredictionRefused: The data cannot support the prediction (module docstring, 6).
    """
    import numpy as np
    import pandas as pd

    if not inputs:
        raise PredictInputError("no input: pass at least one recorded run or store")
    if world_size < 1:
        raise PredictInputError(f"--world-size must be at least 1, got {world_size}")
    if bandwidth_gbs is not None and not bandwidth_gbs > 0:
        raise PredictInputError(f"--bandwidth must be a positive number of GB/s, got {bandwidth_gbs}")
    if parallelism is not None and parallelism not in volumes.PARALLELISMS:
        raise PredictInputError(f"unknown parallelism {parallelism!r}; use one of {', '.join(volumes.PARALLELISMS)}")
    if algorithm not in volumes.ALGORITHMS:
        raise PredictInputError(f"unknown algorithm {algorithm!r}; use one of {', '.join(volumes.ALGORITHMS)}")
    empty = [i.label for i in inputs if i.steps.empty]
    if empty:
        raise PredictInputError(f"{empty[0]}: no step that every rank completed; record longer")
    if all(i.collectives.empty for i in inputs):
        why = "; ".join(n for i in inputs for n in i.notes) or "no collective markers or Inspector records"
        raise PredictionRefused(f"no input has timed collectives ({why}); record a run whose job marks collectives")
    fits, refused = fit_all(inputs, algorithm, alpha_s)
    target_bw = _target_bandwidth(fits, bandwidth_gbs)
    chosen = _chosen(inputs, world_size)
    steps = pd.concat([i.steps for i in chosen], ignore_index=True)
    noncomm = float(steps["noncomm_s"].median())
    spread = float(steps["noncomm_s"].std(ddof=1)) if len(steps) > 1 else 0.0
    timed = pd.concat([i.steps for i in (chosen if any(not i.collectives.empty for i in chosen) else inputs)],
                      ignore_index=True)
    timed = timed[timed["collective_s"] > 0]
    share = float(np.clip(timed["exposed_comm_s"] / timed["collective_s"], 0.0, 1.0).median()) if len(timed) else 1.0
    # A type without a fit of its own is timed by the fit of all types, by bus bytes (step 1).
    pooled = fits.get(POOLED) or (next(iter(fits.values())) if len(fits) == 1 else None)
    plan: list[PlannedCall] = []
    notes: list[str] = []
    comm = unc = 0.0
    for collective, size, calls in _step_plan(inputs, parallelism):
        if world_size == 1:
            plan.append(PlannedCall(collective, size, calls, 0.0, "none"))
            continue
        fit = fits.get(collective) or pooled
        if fit is None:
            reason = refused.get(collective) or refused.get(POOLED) or f"{collective}: never observed"
            raise PredictionRefused(f"cannot time {collective} of {size:.0f} bytes: {reason}")
        if fit.collective != collective:
            notes.append(f"{collective}: no fit of its own ({refused.get(collective, 'never observed')}); the "
                         f"{fit.collective} fit is used by bus bytes")
        unsupported = support(fit, size, world_size, target_bw)
        if unsupported is not None:
            raise PredictionRefused(f"{collective} at N={world_size}: {unsupported}")
        seconds = fit.seconds(volumes.latency_steps(collective, world_size, algorithm),
                              volumes.bus_bytes(collective, size, world_size, algorithm), target_bw)
        plan.append(PlannedCall(collective, size, calls, seconds, fit.collective))
        comm += calls * seconds
        unc += calls * seconds * fit.rms_rel
    exposed = share * comm
    step = noncomm + exposed
    tokens = float(steps["tokens"].median())
    ideal = float(steps["ideal_s"].median())
    notes += [f"{i.label}: {n}" for i in inputs for n in i.notes]
    return Prediction(
        world_size=world_size, bandwidth_gbs=target_bw, parallelism=parallelism, algorithm=algorithm,
        step_time_s=step, uncertainty_s=math.hypot(share * unc, spread), noncomm_s=noncomm,
        compute_s=float(steps["compute_s"].median()), comm_s=comm, exposed_comm_s=exposed, exposed_share=share,
        tokens_per_s=tokens * world_size / step if step > 0 else math.nan,
        mfu=ideal / step if step > 0 else math.nan, plan=tuple(plan), fits=fits, refused_fits=refused,
        inputs=tuple(_measured(i) for i in inputs), notes=tuple(dict.fromkeys(notes)),
    )


def _measured(i: RunInputs) -> dict[str, Any]:
    """What one input measured, for the output and the report's figure."""
    return {"path": i.label, "kind": i.kind, "job": i.job, "world_size": i.world_size,
            "bandwidth_gbs": i.bandwidth_gbs, "steps": len(i.steps), "collective_calls": len(i.collectives),
            "collective_source": i.collective_source,
            "step_time_s": float(i.steps["step_time_s"].median()) if len(i.steps) else math.nan,
            "noncomm_s": float(i.steps["noncomm_s"].median()) if len(i.steps) else math.nan}


def scaling_curve(inputs: Sequence[RunInputs], worlds: Sequence[int], bandwidth_gbs: float | None = None,
                  parallelism: str | None = None, algorithm: str = "ring",
                  alpha_s: float | None = None) -> list[tuple[int, Prediction | None, str | None]]:
    """``predict`` at each of ``worlds``: ``(N, prediction, None)``, or ``(N, None, reason)`` where refused."""
    out: list[tuple[int, Prediction | None, str | None]] = []
    for n in worlds:
        try:
            out.append((n, predict(inputs, n, bandwidth_gbs, parallelism, algorithm, alpha_s), None))
        except (PredictionRefused, FitRefused) as exc:
            out.append((n, None, str(exc)))
    return out
