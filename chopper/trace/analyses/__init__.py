"""Per-rank trace analyses, one module each, with Holistic Trace Analysis's definitions.

* :func:`temporal.breakdown`: idle / compute / non-compute time over the kernel span.
* :func:`overlap.comm_comp_overlap_pct`: share of communication time overlapped by computation.
* :func:`kernel_types.breakdown`: time of each exclusive combination of kernel classes.
"""
from __future__ import annotations

from chopper.trace.analyses import kernel_types, overlap, temporal

__all__ = ["kernel_types", "overlap", "temporal"]
