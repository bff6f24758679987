"""Kernel classes by name: one ordered table, first match wins.

Two levels:

* ``kernel_class``: the three-way split Holistic Trace Analysis (HTA) 0.5 uses for its temporal
  breakdown, overlap and kernel-type views (COMMUNICATION, MEMORY, COMPUTATION). Its patterns are
  copied exactly from ``shared/data/kineto/REFERENCE.md`` so figures compare one to one.
* ``kernel_type``: a finer split of COMPUTATION (GEMM, ATTENTION, ELEMENTWISE, OTHER) for the
  kernel-type and top-kernel views; COMMUNICATION and MEMORY kernels keep their class.

GPU-timeline *sync* events (``cat`` ``cuda_sync``: "Stream Sync", "Context Sync", "Stream Wait
Event") are not kernels, but HTA counts them as GPU activity: names matching ``.*Sync`` fall in its
``OTHER`` class (busy, not compute) and the rest fall through to COMPUTATION. ``sync_class`` applies
that rule so the reference figures reproduce exactly.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

COMMUNICATION = "COMMUNICATION"
MEMORY = "MEMORY"
COMPUTATION = "COMPUTATION"
OTHER = "OTHER"

# (class, kernel_type, pattern): tested top to bottom, first match wins. The first two rows are
# HTA's exact rules (communication is tested before memory, so "hipMemcpy..." kernels are
# communication there too); every later row is a COMPUTATION kernel with a finer type.
KERNEL_TABLE: tuple[tuple[str, str, str], ...] = (
    (COMMUNICATION, COMMUNICATION, r"^nccl|^hip|^hccl|ncclKernel"),
    (MEMORY, MEMORY, r"^(hip)?Memcpy|^(hip)?Memset|^dma"),
    # Attention before GEMM: fused attention kernels often carry "gemm" in their template names.
    (COMPUTATION, "ATTENTION", r"(?i)flash|fmha|attention|sdpa|_attn|attn_"),
    # Convolutions run as implicit GEMMs on tensor / matrix cores, so they count as GEMM.
    # fbgemm is a library name (embedding kernels), not a matrix multiply.
    (COMPUTATION, "GEMM", r"(?i)(?<!fb)gemm|gemv|cutlass|cublas|Cijk_|matmul|wmma|mfma|xmma|nvjet|"
                          r"scudnn|cudnn.*conv|fprop|dgrad|wgrad|conv2d|convolution"),
    (COMPUTATION, "ELEMENTWISE", r"(?i)elementwise|vectorized|unrolled|reduce|softmax|layer_?norm|"
                                 r"rms_?norm|batch_?norm|dropout|copy|fill|multi_tensor|scan|sort|"
                                 r"index|scatter|gather|transpose|permute|cast|gelu|relu|silu|adam|"
                                 r"embedding|cat_array|nchwtonhwc|nhwctonchw"),
)
COMPUTATION_DEFAULT_TYPE = "OTHER"

# HTA's compute test excludes names matching this (with re.match), which is what makes sync events
# busy-but-not-compute time.
SYNC_OTHER_PATTERN = r".*Sync"

_COMPILED = tuple((cls, typ, re.compile(pat)) for cls, typ, pat in KERNEL_TABLE)
_SYNC_OTHER = re.compile(SYNC_OTHER_PATTERN)


def classify_name(name: str) -> tuple[str, str]:
    """Return ``(kernel_class, kernel_type)`` of one kernel name.

    Args:
        name: The kernel name as the trace writes it.

    Returns:
        The HTA class (COMMUNICATION, MEMORY or COMPUTATION) and the finer type.
    """
    for cls, typ, pat in _COMPILED:
        if pat.search(name):
            return cls, typ
    return COMPUTATION, COMPUTATION_DEFAULT_TYPE


def classify_names(names: pd.Series) -> tuple[pd.Series, pd.Series]:
    """Classify a column of kernel names.

    Algorithm:
        1. Classify each *distinct* name once (traces repeat a few hundred names millions of times).
        2. Map the results back onto the column.

    Args:
        names: Kernel names, one per row.

    Returns:
        ``(kernel_class, kernel_type)`` Series aligned with ``names``.
    """
    uniq = pd.unique(names.to_numpy(dtype=object))
    table = {n: classify_name(str(n)) for n in uniq}
    cls = names.map({n: c for n, (c, _) in table.items()})
    typ = names.map({n: t for n, (_, t) in table.items()})
    return cls.astype(object), typ.astype(object)


def sync_class(names: pd.Series) -> pd.Series:
    """HTA class of GPU sync events: the kernel table, then ``.*Sync`` → OTHER, else COMPUTATION.

    Args:
        names: Names of ``cuda_sync`` events.

    Returns:
        One class per row.
    """
    cls, _ = classify_names(names)
    is_sync = names.map(lambda n: _SYNC_OTHER.match(str(n)) is not None).to_numpy(dtype=bool)
    out = np.where((cls == COMPUTATION).to_numpy() & is_sync, OTHER, cls.to_numpy())
    return pd.Series(out, index=names.index, dtype=object)
