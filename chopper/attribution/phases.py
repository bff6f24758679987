"""Per-phase time: how long each named phase ran within each step.

A phase's time in a step is the measure of the union of that name's windows inside the step
(clipped to it), so a phase entered twice counts both windows and two overlapping windows of
the same name (re-entered from two threads) count once. Phases of different names may overlap
(``forward`` inside a user phase ``train``); each name is measured on its own, so the phase
times of a step need not add up to the step time. Collectives are not phases.

Algorithm (one sweep over all steps and names at once, as in ``exposed_comm``):

1. Every window becomes two events, ``+1`` at its begin and ``−1`` at its end, keyed by the
   pair (step, name) it belongs to.
2. Events are sorted by (key, time); a running sum gives how many windows of that key are
   open between consecutive events. Each key's events sum to zero, so one global cumulative
   sum resets itself at every key boundary.
3. A gap between consecutive events of the same key counts when at least one window is open;
   the gaps are summed per key (``bincount``).
4. A step keeps at most ``MAX_PHASES_PER_STEP`` names: the longest (ties by name); the time of
   the others is summed under ``OTHER`` (a sum of per-name unions), so a client that sends
   thousands of names bounds what every summary and row carries.

Nanoseconds in, seconds out; names in each step's result are sorted.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
MAX_PHASES_PER_STEP = 64
# Where the phases beyond the bound go. A phase a user names "other" shares it.
OTHER = "other"


def phase_seconds(
    n_steps: int, step_index: I64, names: Sequence[str], begin_ns: I64, end_ns: I64,
    max_names: int = MAX_PHASES_PER_STEP,
) -> list[dict[str, float]]:
    """Per step, phase name → seconds of the union of its windows (module docstring).

    Args:
        n_steps: Number of steps; ``step_index`` values are in ``0..n_steps-1``.
        step_index: The step each phase window belongs to.
        names: The phase name of each window.
        begin_ns, end_ns: Each window, clipped to its step, ns.
        max_names: Names kept per step; the rest are summed under ``OTHER``.

    Returns:
        One mapping per step; names whose windows have no length are left out.
    """
    out: list[dict[str, float]] = [{} for _ in range(n_steps)]
    if step_index.size == 0:
        return out
    vocab, code = np.unique(np.asarray(names, dtype=object).astype(str), return_inverse=True)
    # One dense code per (step, name) pair present, so memory follows the windows, not steps × names.
    pairs, pair = np.unique(step_index.astype(np.int64) * len(vocab) + code.astype(np.int64), return_inverse=True)
    group = np.concatenate((pair, pair))
    time = np.concatenate((begin_ns, end_ns))
    delta = np.concatenate((np.ones(pair.size, np.int64), -np.ones(pair.size, np.int64)))
    order = np.lexsort((time, group))
    group, time, delta = group[order], time[order], delta[order]
    open_count = np.cumsum(delta)
    gap = np.diff(time).astype(np.float64)
    inside = (group[1:] == group[:-1]) & (open_count[:-1] > 0)
    totals = np.bincount(group[:-1][inside], weights=gap[inside], minlength=pairs.size) / 1e9
    for p in np.flatnonzero(totals > 0):
        step, name = divmod(int(pairs[p]), len(vocab))
        out[step][str(vocab[name])] = float(totals[p])
    return [_bounded(step, max_names) for step in out]


def _bounded(times: dict[str, float], max_names: int) -> dict[str, float]:
    """The ``max_names`` longest phases (ties by name) and the rest summed under ``OTHER``, sorted by name."""
    if len(times) <= max_names:
        return dict(sorted(times.items()))
    ranked = sorted(times.items(), key=lambda item: (-item[1], item[0]))
    kept = dict(ranked[:max_names])
    rest = sum(seconds for _, seconds in ranked[max_names:])
    kept[OTHER] = kept.get(OTHER, 0.0) + rest
    return dict(sorted(kept.items()))
