"""Communication–computation overlap of one rank (HTA's ``get_comm_comp_overlap``)."""
from __future__ import annotations

from chopper.trace.analyses.temporal import gpu_activity, union_ns
from chopper.trace.classify import COMMUNICATION, COMPUTATION
from chopper.trace.reader import Trace


def comm_comp_overlap_pct(trace: Trace, **options: bool) -> float | None:
    """Share of communication time during which computation also runs, in %.

    Algorithm:
        1. Select GPU activity with :func:`~chopper.trace.analyses.temporal.gpu_activity`.
        2. ``A`` = union of COMPUTATION intervals, ``C`` = union of COMMUNICATION intervals.
        3. Overlap = |A| + |C| − |A ∪ C| (inclusion–exclusion on the unions).
        4. Result = 100 × overlap / |C|.

    Args:
        trace: One rank's trace.
        **options: Passed to ``gpu_activity``.

    Returns:
        The overlap in % of communication time, or None when the rank ran no communication kernel.
    """
    act = gpu_activity(trace, **options)
    start, end = act["start_ns"].to_numpy(), act["end_ns"].to_numpy()
    comp = act["kernel_class"].eq(COMPUTATION).to_numpy()
    comm = act["kernel_class"].eq(COMMUNICATION).to_numpy()
    comm_ns = union_ns(start[comm], end[comm])
    if comm_ns == 0:
        return None
    either = comp | comm
    overlap = union_ns(start[comp], end[comp]) + comm_ns - union_ns(start[either], end[either])
    return 100.0 * overlap / comm_ns
