"""Kernel classes by name: one ordered table, first match wins.

Two levels:

* ``kernel_class``: the split Holistic Trace Analysis (HTA) 0.5.0 uses for its temporal breakdown,
  overlap and kernel-type views, as its ``get_kernel_type`` (``hta/utils/utils.py``) decides it,
  tested in this order with ``re.match``: COMMUNICATION when the name is ``nccl…Kernel…``; MEMORY
  when it starts with ``Memcpy``, ``Memset`` or ``dma``; OTHER (busy, but neither compute nor
  communication) when it contains ``Memcpy`` or ``Sync`` anywhere; COMPUTATION otherwise.
* ``kernel_type``: a finer split of COMPUTATION (GEMM, ATTENTION, ELEMENTWISE, OTHER) for the
  kernel-type and top-kernel views; COMMUNICATION, MEMORY and OTHER kernels keep their class.

The same rule classes GPU-timeline *sync* events (``cat`` ``cuda_sync``), which HTA counts as GPU
activity: "Stream Sync" and "Context Sync" are OTHER, "Stream Wait Event" COMPUTATION.

The per-name function works on arrays of *distinct* names (``classify_unique``) and needs only
numpy; callers map the results back to rows with the names' inverse indices. The pandas wrapper
``classify_names`` serves the DataFrame analyses.
"""
from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

COMMUNICATION = "COMMUNICATION"
MEMORY = "MEMORY"
COMPUTATION = "COMPUTATION"
OTHER = "OTHER"

# (class, kernel_type, pattern): tested top to bottom with re.search, first match wins. The first
# three rows are HTA 0.5.0's rules (its NCCL_KERNEL_RE, MEMORY_KERNEL_RE and the not-compute half of
# NCCL_COMPUTE_KERNEL_RE, whose ".*Memcpy" and ".*Sync" match anywhere in the name); every later row
# is a COMPUTATION kernel with a finer type. Every pattern runs in time linear in the name: no
# ".*" that a search could retry from each of many starting points.
KERNEL_TABLE: tuple[tuple[str, str, str], ...] = (
    (COMMUNICATION, COMMUNICATION, r"^nccl.*Kernel"),
    (MEMORY, MEMORY, r"^(Memcpy|Memset|dma)"),
    (OTHER, OTHER, r"Memcpy|Sync"),
    # Attention before GEMM: fused attention kernels often carry "gemm" in their template names.
    (COMPUTATION, "ATTENTION", r"(?i)flash|fmha|attention|sdpa|_attn|attn_"),
    # Convolutions run as implicit GEMMs on tensor / matrix cores, so they count as GEMM.
    # fbgemm is a library name (embedding kernels), not a matrix multiply. "cudnn, later conv" is
    # anchored and atomic: the first cudnn is found once, so "cudnn" repeated cannot make it quadratic
    # (and, unlike a plain ".*", it looks past a newline in a name).
    (COMPUTATION, "GEMM", r"(?i)(?<!fb)gemm|gemv|cutlass|cublas|Cijk_|matmul|wmma|mfma|xmma|nvjet|"
                          r"scudnn|^(?s:(?>.*?cudnn).*conv)|fprop|dgrad|wgrad|conv2d|convolution"),
    (COMPUTATION, "ELEMENTWISE", r"(?i)elementwise|vectorized|unrolled|reduce|softmax|layer_?norm|"
                                 r"rms_?norm|batch_?norm|dropout|copy|fill|multi_tensor|scan|sort|"
                                 r"index|scatter|gather|transpose|permute|cast|gelu|relu|silu|adam|"
                                 r"embedding|cat_array|nchwtonhwc|nhwctonchw"),
)
COMPUTATION_DEFAULT_TYPE = "OTHER"
_FOLD = "(?i)"


def _compile(pattern: str) -> tuple[bool, re.Pattern[str]]:
    """A row's regex, and whether it runs on the lower-cased name.

    Case-insensitive alternations cost Python's ``re`` about 5x a case-sensitive one per character,
    so a ``(?i)`` row is lower-cased and matched against the lower-cased name (the same matches:
    its patterns hold no escapes that lower-casing would change).
    """
    if pattern.startswith(_FOLD):
        return True, re.compile(pattern[len(_FOLD):].lower())
    return False, re.compile(pattern)


_COMPILED = tuple((cls, typ, *_compile(pat)) for cls, typ, pat in KERNEL_TABLE)
# Names classified once each, whichever analysis asks first (the hierarchy, the temporal breakdown
# of each analysis and top kernels all class the same names). Bounded by names and by characters
# held, so a process that analyses many traces keeps at most ~16 MiB of names alive.
CACHE_NAMES = 1 << 14
CACHE_CHARS = 1 << 24


class _NameCache:
    """Least-recently-used ``name -> (class, type)``, within ``CACHE_NAMES`` and ``CACHE_CHARS``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._chars = 0

    def get(self, name: str) -> tuple[str, str] | None:
        with self._lock:
            found = self._items.get(name)
            if found is not None:
                self._items.move_to_end(name)
            return found

    def put(self, name: str, value: tuple[str, str]) -> None:
        if len(name) > CACHE_CHARS:
            return
        with self._lock:
            if name not in self._items:
                self._chars += len(name)
            self._items[name] = value
            while len(self._items) > CACHE_NAMES or self._chars > CACHE_CHARS:
                old, _ = self._items.popitem(last=False)
                self._chars -= len(old)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._chars = 0


_CACHE = _NameCache()


def _classify(name: str) -> tuple[str, str]:
    folded = name.lower()
    for cls, typ, fold, pat in _COMPILED:
        if pat.search(folded if fold else name):
            return cls, typ
    return COMPUTATION, COMPUTATION_DEFAULT_TYPE


def classify_name(name: str) -> tuple[str, str]:
    """Return ``(kernel_class, kernel_type)`` of one kernel name, in time linear in its length.

    Args:
        name: The kernel name as the trace writes it.

    Returns:
        The HTA class (COMMUNICATION, MEMORY, OTHER or COMPUTATION) and the finer type.
    """
    found = _CACHE.get(name)
    if found is None:
        found = _classify(name)
        _CACHE.put(name, found)
    return found


def classify_unique(names: Sequence[str] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Classify distinct kernel names (one regex pass each), as object arrays aligned with ``names``.

    Args:
        names: Distinct kernel names (e.g. from ``Columns.factorize`` or ``Series.factorize``).

    Returns:
        ``(kernel_class, kernel_type)``, one entry per name.
    """
    pairs = [classify_name(str(n)) for n in names]
    cls = np.array([c for c, _ in pairs], dtype=object)
    typ = np.array([t for _, t in pairs], dtype=object)
    return cls, typ


def classify_names(names: pd.Series) -> tuple[pd.Series, pd.Series]:
    """Classify a column of kernel names.

    Algorithm:
        1. Factorize the column: its distinct names and each row's index among them.
        2. Classify each *distinct* name once (traces repeat a few hundred names millions of times).
        3. Map the results back onto the rows through the indices.

    Args:
        names: Kernel names, one per row.

    Returns:
        ``(kernel_class, kernel_type)`` Series aligned with ``names``.
    """
    import pandas as pd  # deferred: callers of the numpy functions above never load pandas

    codes, uniq = names.factorize(use_na_sentinel=False)
    cls, typ = classify_unique(np.asarray(uniq, dtype=object))
    return (pd.Series(cls[codes], index=names.index, dtype=object),
            pd.Series(typ[codes], index=names.index, dtype=object))
