"""Kernel-type breakdown: time in each exclusive combination of kernel classes (HTA)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from chopper.trace.analyses.temporal import activity, merge_intervals
from chopper.trace.classify import COMMUNICATION, COMPUTATION, MEMORY
from chopper.trace.reader import Trace

if TYPE_CHECKING:
    import pandas as pd

# Bit order fixes the combination names: "COMPUTATION overlapping COMMUNICATION", as HTA writes them.
CLASS_BITS: tuple[str, ...] = (COMPUTATION, COMMUNICATION, MEMORY)
COLUMNS: tuple[str, ...] = ("kernel_type", "time_us", "percentage")


def combination_name(mask: int) -> str:
    """Name of a bit mask over :data:`CLASS_BITS`, e.g. 3 → "COMPUTATION overlapping COMMUNICATION"."""
    return " overlapping ".join(c for i, c in enumerate(CLASS_BITS) if mask & (1 << i))


@dataclass(frozen=True)
class KernelTypes:
    """Result of :func:`breakdown`: one entry per combination that occurs, largest time first.

    Attributes:
        kernel_type: Combination names, e.g. "COMMUNICATION", "COMPUTATION overlapping COMMUNICATION".
        time_us: Time during which exactly that combination ran (µs, float64).
        percentage: Share of the total time of all combinations (%, float64).
    """

    kernel_type: tuple[str, ...]
    time_us: np.ndarray
    percentage: np.ndarray

    def __len__(self) -> int:
        return len(self.kernel_type)

    def times(self) -> dict[str, float]:
        """Combination name → µs."""
        return dict(zip(self.kernel_type, self.time_us.tolist(), strict=True))

    def percentages(self) -> dict[str, float]:
        """Combination name → % of the total."""
        return dict(zip(self.kernel_type, self.percentage.tolist(), strict=True))

    def to_frame(self) -> pd.DataFrame:
        """The result as a DataFrame with :data:`COLUMNS`, one row per combination."""
        import pandas as pd  # deferred: the breakdown itself needs only numpy

        return pd.DataFrame({"kernel_type": list(self.kernel_type), "time_us": self.time_us,
                             "percentage": self.percentage}, columns=list(COLUMNS))


def breakdown(trace: Trace, **options: bool) -> KernelTypes:
    """Time during which exactly each combination of kernel classes runs.

    Algorithm:
        1. Select GPU activity with :func:`~chopper.trace.analyses.temporal.activity`; keep the
           COMPUTATION, COMMUNICATION and MEMORY classes (sync events, HTA's "OTHER", are left out).
        2. Merge each class's intervals into a disjoint union; give each class one bit.
        3. Sweep: every merged start adds its bit, every end subtracts it; sorting these boundary
           events by time and taking the cumulative sum gives the set of classes running in each
           segment between consecutive boundaries.
        4. Sum segment lengths per non-empty set (int64 ns, exact); share = time ÷ total time of all sets.
        5. Order by time, largest first (ties by bit mask).

    Args:
        trace: One rank's trace.
        **options: Passed to ``activity``.

    Returns:
        The combinations that occur with their ``time_us`` (µs) and ``percentage`` (% of the total);
        ``.to_frame()`` gives them as a DataFrame.
    """
    act = activity(trace, **options)
    times, deltas = [], []
    for bit, cls in enumerate(CLASS_BITS):
        sel = act.of(cls)
        ms, me = merge_intervals(act.start_ns[sel], act.end_ns[sel])
        times += [ms, me]
        deltas += [np.full(len(ms), 1 << bit), np.full(len(me), -(1 << bit))]
    t = np.concatenate(times)
    d = np.concatenate(deltas)
    order = np.argsort(t, kind="stable")
    t, d = t[order], d[order]
    running = np.cumsum(d)
    seg = np.diff(t, append=t[-1] if len(t) else 0)
    masks = np.arange(1, 1 << len(CLASS_BITS))
    dur = np.array([int(seg[running == m].sum()) for m in masks], dtype=np.int64)
    masks, dur = masks[dur > 0], dur[dur > 0]
    order = np.argsort(-dur, kind="stable")
    masks, dur = masks[order], dur[order]
    total = int(dur.sum())
    return KernelTypes(
        kernel_type=tuple(combination_name(int(m)) for m in masks),
        time_us=dur / 1000.0,
        percentage=100.0 * dur / total if total else np.zeros(len(dur)),
    )
