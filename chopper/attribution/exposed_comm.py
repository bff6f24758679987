"""Exposed communication: time inside collective windows that no compute phase covers.

Algorithm (one sweep over all steps at once):

1. Every clipped interval becomes two events, ``+1`` at its begin and ``−1`` at its end, counted
   separately for collectives and for phases, keyed by the step it belongs to.
2. Events are sorted by (step, time). A running sum per kind gives, between consecutive events,
   how many collectives and phases are open. Because each step's events sum to zero, one global
   cumulative sum resets itself at every step boundary.
3. Each gap between consecutive events of the same step counts as exposed when at least one
   collective and no phase is open, and as collective time (``collective_seconds``, hidden or
   not) when at least one collective is open; the lengths are summed per step (``bincount``).
4. ``cap_exposed``: exposed time is capped so that ``idle + exposed ≤ T`` (a collective that
   kept the GPU idle must not be counted twice).

Nanoseconds in, seconds out.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from chopper.attribution.timeline import F64

I64 = npt.NDArray[np.int64]


def exposed_seconds(n_steps: int, step_index: I64, is_collective: npt.NDArray[np.bool_], begin_ns: I64,
                    end_ns: I64) -> F64:
    """Measure of (∪ collectives) \\ (∪ phases) per step, in seconds; steps without intervals get 0."""
    return collective_seconds(n_steps, step_index, is_collective, begin_ns, end_ns)[0]


def collective_seconds(n_steps: int, step_index: I64, is_collective: npt.NDArray[np.bool_], begin_ns: I64,
                       end_ns: I64) -> tuple[F64, F64]:
    """Per step, in seconds: (∪ collectives) \\ (∪ phases) and ∪ collectives, from one sweep.

    The sweep sorts every interval edge by (step, time) and keeps running counts of open collectives
    and open phases; a gap between consecutive edges of one step belongs to the collective union
    when a collective is open, and is exposed when, besides, no phase is. The difference of the two
    is the communication hidden behind compute.
    """
    if step_index.size == 0:
        return np.zeros(n_steps), np.zeros(n_steps)
    group = np.concatenate((step_index, step_index))
    time = np.concatenate((begin_ns, end_ns))
    delta = np.concatenate((np.ones(step_index.size, np.int64), -np.ones(step_index.size, np.int64)))
    coll = np.concatenate((is_collective, is_collective))
    order = np.lexsort((time, group))
    group, time, delta, coll = group[order], time[order], delta[order], coll[order]
    open_coll = np.cumsum(np.where(coll, delta, 0))
    open_phase = np.cumsum(np.where(coll, 0, delta))
    gap = np.diff(time).astype(np.float64)
    same_step = group[1:] == group[:-1]
    in_collective = same_step & (open_coll[:-1] > 0)
    exposed = in_collective & (open_phase[:-1] == 0)
    return (np.bincount(group[:-1][exposed], weights=gap[exposed], minlength=n_steps) / 1e9,
            np.bincount(group[:-1][in_collective], weights=gap[in_collective], minlength=n_steps) / 1e9)


def cap_exposed(exposed_s: F64, idle_s: F64, step_s: F64) -> tuple[F64, npt.NDArray[np.bool_]]:
    """Cap exposed time at ``T − idle``; returns the capped values and where the cap applied."""
    room = np.maximum(step_s - idle_s, 0.0)
    capped = exposed_s > room
    return np.minimum(exposed_s, room), capped
