"""Communication–computation overlap of one rank (HTA's ``get_comm_comp_overlap``)."""
from __future__ import annotations

from chopper.trace.analyses.temporal import activity
from chopper.trace.classify import COMMUNICATION, COMPUTATION
from chopper.trace.reader import Trace


def comm_comp_overlap_pct(trace: Trace, **options: bool) -> float | None:
    """Share of communication time during which computation also runs, in %.

    Algorithm:
        1. Select GPU activity with :func:`~chopper.trace.analyses.temporal.activity`.
        2. ``A`` = union of COMPUTATION intervals, ``C`` = union of COMMUNICATION intervals.
        3. Overlap = |A| + |C| − |A ∪ C| (inclusion–exclusion on the unions).
        4. Result = 100 × overlap / |C|.

    Args:
        trace: One rank's trace.
        **options: Passed to ``activity``.

    Returns:
        The overlap in % of communication time, or None when the rank ran no communication kernel.
    """
    act = activity(trace, **options)
    comm_ns = act.union_ns(COMMUNICATION)
    if comm_ns == 0:
        return None
    overlap = act.union_ns(COMPUTATION) + comm_ns - act.union_ns(COMPUTATION, COMMUNICATION)
    return 100.0 * overlap / comm_ns
