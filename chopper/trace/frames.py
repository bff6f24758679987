"""Column contract of a parsed Kineto / PyTorch-profiler trace (one rank).

Times are int64 CLOCK_REALTIME nanoseconds, the clock of Chopper's markers and samples: Kineto's
microsecond ``ts`` × 1000, rounded, plus the trace's ``baseTimeNanoseconds`` where it has one
(``reader.clock_offset_ns``); durations int64 nanoseconds. Every analysis in ``chopper.trace`` takes these frames.

``kernels``: one row per GPU activity (``cat`` kernel, gpu_memcpy, gpu_memset).
``runtime``: one row per CUDA/HIP runtime call (launches, synchronize, memcpy calls).
``cpu_ops``: one row per CPU-side range: ``cpu_op``, ``user_annotation`` (``ProfilerStep#N``,
``record_function`` ranges, FSDP ranges), ``python_function``.
``gpu_annotations``: ``gpu_user_annotation`` ranges on the GPU timeline.
``flows``: forward↔backward flow events (``fwdbwd``) and other flows, one row per endpoint.

The reader holds each frame as :class:`Columns` (plain numpy arrays, text interned as int32
codes into a shared vocabulary), so loading a trace and running the analyses that Holistic Trace
Analysis also runs never imports pandas (~100 MB and ~0.3 s with pyarrow); pandas DataFrames are
built from the columns on first use.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

KERNEL_COLUMNS: tuple[str, ...] = (
    "name", "cat", "ts_ns", "dur_ns", "end_ns", "device", "stream", "correlation",
)
RUNTIME_COLUMNS: tuple[str, ...] = ("name", "ts_ns", "dur_ns", "end_ns", "pid", "tid", "correlation")
CPU_OP_COLUMNS: tuple[str, ...] = ("name", "cat", "ts_ns", "dur_ns", "end_ns", "pid", "tid", "external_id")
GPU_ANNOTATION_COLUMNS: tuple[str, ...] = ("name", "ts_ns", "dur_ns", "end_ns", "device", "stream")
FLOW_COLUMNS: tuple[str, ...] = ("id", "cat", "phase", "ts_ns", "pid", "tid")

# Kernel classes (one table, tested in order; first match wins). The first three are the
# definitions Holistic Trace Analysis uses for its temporal breakdown (REFERENCE.md);
# the finer classes split "computation" for the kernel-type and top-kernel views.
KERNEL_CLASSES: tuple[str, ...] = ("COMMUNICATION", "MEMORY", "COMPUTATION")


@dataclass(frozen=True)
class Columns:
    """One frame as plain numpy columns: int64 values, text as int32 codes into a shared vocabulary.

    Attributes:
        columns: Column names in frame order (one of the ``*_COLUMNS`` tuples above).
        data: Column name → array, all of one length; a text column holds its int32 codes.
        vocab: Text column name → object array of the strings its codes index (shared by every
            frame of a trace, so equal codes are equal strings across frames).
    """

    columns: tuple[str, ...]
    data: dict[str, np.ndarray]
    vocab: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.data[self.columns[0]])

    def __getitem__(self, column: str) -> np.ndarray:
        """The column's values; text decoded to an object array of (shared) str objects."""
        values = self.data[column]
        vocab = self.vocab.get(column)
        return values if vocab is None else vocab[values]

    def factorize(self, column: str) -> tuple[np.ndarray, np.ndarray]:
        """Distinct strings of a text column and, per row, the index of its string among them.

        Algorithm:
            1. Mark the vocabulary codes that occur (one pass over the rows; the vocabulary is small).
            2. Number the occurring codes 0..k-1 in code order and map each row's code to its number.

        Per-name work (regex classification, prefix tests) then runs once per distinct string and is
        mapped back with ``result[inverse]``, without sorting or decoding the rows.

        Returns:
            ``(uniques, inverse)``: an object array of the k distinct strings and an intp array with
            ``uniques[inverse]`` equal to the decoded column.
        """
        codes, vocab = self.data[column], self.vocab[column]
        present = np.zeros(len(vocab), dtype=bool)
        present[codes] = True
        used = np.flatnonzero(present)
        number = np.zeros(len(vocab), dtype=np.intp)
        number[used] = np.arange(len(used))
        return vocab[used], number[codes]

    def with_values(self, **arrays: np.ndarray) -> Columns:
        """A copy with some non-text columns replaced (same length)."""
        return Columns(self.columns, {**self.data, **arrays}, self.vocab)

    def to_pandas(self) -> pd.DataFrame:
        """The frame as a pandas DataFrame (text decoded), columns in :attr:`columns` order."""
        import pandas as pd  # deferred: the HTA-path analyses never need it

        return pd.DataFrame({c: self[c] for c in self.columns}, columns=list(self.columns))
