"""Per-rank trace analyses, one module each (pure functions, algorithm in each docstring).

Holistic Trace Analysis's definitions, reproduced exactly on the reference traces:

* :func:`temporal.breakdown`: idle / compute / non-compute time over the kernel span.
* :func:`overlap.comm_comp_overlap_pct`: share of communication time overlapped by computation.
* :func:`kernel_types.breakdown`: time of each exclusive combination of kernel classes.

Beyond it, as in the Chopper paper and the Nsight Systems walkthrough:

* :mod:`top_kernels`: kernels by total GPU time and share.
* :mod:`launch`: launch overhead per kernel, split into CPU-late and launch-to-start.
* :mod:`idle`: GPU idle time split into host-wait and kernel-wait.
* :mod:`straggler`: cross-rank lead per operation, from each rank's own iteration start.
* :mod:`tables`: per-iteration and per-phase tables.
* :mod:`host`: per-thread CPU-op time, time blocked in synchronize calls, memory-transfer share.

The three HTA analyses (and the reader) need only numpy; the others use pandas. Submodules are
therefore imported on first access (PEP 562), so ``from chopper.trace.analyses import temporal``
does not load pandas through its siblings.
"""
from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["host", "idle", "kernel_types", "launch", "overlap", "straggler", "tables", "temporal", "top_kernels"]


def __getattr__(name: str) -> ModuleType:
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
