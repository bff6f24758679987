"""The last seconds of each GPU's samples, column-wise, for the step summaries to integrate over.

A step is summarised from its GPU's samples over the step's window (``agent.steps``), so the agent
keeps ``STEP_HISTORY_S`` of them. Kept as ``Sample`` objects that is about 560 B a sample: 54 MB
for 8 GPUs at 100 Hz over 120 s, most of the agent's heap. Here each GPU has a fixed ring of rows
instead: an int64 timestamp column and one float64 column per quantity the model integrates
(``chopper.attribution.terms.RATIOS`` and ``COUNTERS``), 8 B a value, about 9 MB for the same
8 GPUs. The rings are filled with NaN when a GPU first reports, so their pages are resident from
then on and the agent's memory does not creep up while they fill.

A window is the samples from the last one before the window's start to the newest, copied out in
time order (``SampleWindow``), so a summary never sees the ring change under it.
"""
from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from chopper.attribution.terms import COUNTERS, RATIOS
from chopper.schema import Sample

# What a summary integrates, in the order of the ring's value columns.
HISTORY_COLUMNS = (*RATIOS, *COUNTERS)
_values = operator.attrgetter(*HISTORY_COLUMNS)


@dataclass(frozen=True)
class SampleWindow:
    """Samples of one GPU in time order, column-wise.

    Attributes:
        ts_ns: Sample timestamps, CLOCK_REALTIME ns (int64).
        columns: Per ``HISTORY_COLUMNS`` name, the samples' values (float64, NaN where unknown).
    """

    ts_ns: npt.NDArray[np.int64]
    columns: dict[str, npt.NDArray[np.float64]]

    def __len__(self) -> int:
        return int(self.ts_ns.size)

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> SampleWindow:
        """The window of ``samples`` (time-sorted ``Sample`` objects), e.g. from a recorded run."""
        ts = np.array([s.ts_ns for s in samples], dtype=np.int64)
        values = np.array([_values(s) for s in samples], dtype=np.float64).reshape(len(samples), -1).T
        return cls(ts, dict(zip(HISTORY_COLUMNS, values, strict=True)))


class _Ring:
    """One GPU's ring: ``rows`` slots; the sample appended ``i``-th (from 0) lives in slot ``i % rows``."""

    def __init__(self, rows: int) -> None:
        self.ts = np.full(rows, np.iinfo(np.int64).min, dtype=np.int64)
        # One row per column, so that a window's column is contiguous.
        self.values = np.full((len(HISTORY_COLUMNS), rows), np.nan)
        self.written = 0

    def append(self, sample: Sample) -> None:
        slot = self.written % self.ts.size
        self.ts[slot] = sample.ts_ns
        self.values[:, slot] = _values(sample)
        self.written += 1

    def window(self, begin_ns: int) -> SampleWindow:
        rows, ts = self.ts.size, self.ts
        oldest = max(0, self.written - rows)
        # Binary search, in append order, for the first sample at or after begin_ns.
        lo, hi = oldest, self.written
        while lo < hi:
            mid = (lo + hi) // 2
            if ts[mid % rows] < begin_ns:
                lo = mid + 1
            else:
                hi = mid
        # The last sample before begin_ns opens the window: it closes the interval begin_ns falls in.
        slots = np.arange(max(oldest, lo - 1), self.written) % rows
        values = self.values[:, slots]
        return SampleWindow(ts[slots], dict(zip(HISTORY_COLUMNS, values, strict=True)))


class SampleHistory:
    """Fixed rings of the last ``rows`` samples per GPU (module docstring).

    Not thread-safe: the agent appends and reads under its state lock.
    """

    def __init__(self, rows: int) -> None:
        if rows < 2:
            raise ValueError(f"a sample history needs at least 2 rows, got {rows}")
        self.rows = rows
        self._rings: dict[int, _Ring] = {}

    def extend(self, samples: Iterable[Sample]) -> None:
        """Append samples, each to its GPU's ring (in time order per GPU)."""
        rings = self._rings
        for s in samples:
            ring = rings.get(s.gpu)
            if ring is None:
                ring = rings[s.gpu] = _Ring(self.rows)
            ring.append(s)

    def window(self, gpu: int, begin_ns: int) -> SampleWindow | None:
        """The samples of ``gpu`` from the last one before ``begin_ns`` on; None if it has none."""
        ring = self._rings.get(gpu)
        return ring.window(begin_ns) if ring is not None and ring.written else None

    @property
    def nbytes(self) -> int:
        """Memory the rings hold, bytes."""
        return sum(r.ts.nbytes + r.values.nbytes for r in self._rings.values())
