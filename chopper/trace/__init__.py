"""Kernel-level analysis of Kineto / PyTorch-profiler traces (CUDA and ROCm).

Facade: :func:`load_trace`, :func:`load_traces`, :class:`Trace`, :class:`TraceError`. Which
files are traces is :mod:`chopper.trace.discover`; the hierarchy lives in
:mod:`chopper.trace.hierarchy`, analyses in :mod:`chopper.trace.analyses`.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from chopper.trace.discover import trace_files
from chopper.trace.reader import Trace, TraceError, read_trace

__all__ = ["Trace", "TraceError", "check_one_job", "load_trace", "load_traces"]


def load_trace(path: str | Path, require_gpu: bool = True) -> Trace:
    """Read one rank's trace (``.json`` or ``.json.gz``); ``require_gpu`` as in :func:`read_trace`.

    Raises:
        TraceError: the file is missing, truncated, not a trace, or has no GPU kernels while
            ``require_gpu``.
    """
    return read_trace(path, require_gpu)


def check_one_job(traces: Sequence[Trace]) -> None:
    """Refuse a set that mixes jobs: two files of one rank, or different world sizes.

    Raises:
        TraceError: naming both files.
    """
    by_rank: dict[int, Trace] = {}
    for t in traces:
        if t.rank in by_rank:
            raise TraceError(
                f"{by_rank[t.rank].path} and {t.path} both hold rank {t.rank}: two runs of the same job "
                "mixed in one set. Keep one trace per rank")
        by_rank[t.rank] = t
    worlds = [t for t in traces if t.world_size is not None]
    for t in worlds[1:]:
        if t.world_size != worlds[0].world_size:
            raise TraceError(
                f"{worlds[0].path} (world size {worlds[0].world_size}) and {t.path} (world size {t.world_size}) "
                "come from different jobs. Analyze the traces of one job together")


def load_traces(paths: Iterable[str | Path] | str | Path, require_gpu: bool = True) -> list[Trace]:
    """Read the traces of one job, one per rank, sorted by rank.

    Args:
        paths: Trace files and/or directories; a directory stands for the traces
            :func:`chopper.trace.discover.trace_files` finds in it (``*.json``/``*.json.gz`` at any
            depth). A file is read whatever its name.
        require_gpu: As in :func:`chopper.trace.reader.read_trace`.

    Returns:
        The traces sorted by rank.

    Raises:
        TraceError: a directory holds no trace, any trace is bad, two files claim the same rank,
            or the files disagree on the world size (two jobs mixed); the message names the
            directory or both files.
    """
    files: list[Path] = []
    for p in map(Path, [paths] if isinstance(paths, str | Path) else paths):
        if not p.is_dir():
            files.append(p)
            continue
        found = trace_files(p)
        if not found:
            raise TraceError(f"{p}: no .json or .json.gz traces in this directory or below it. Point at the "
                             "trace files")
        files += found
    traces = sorted((read_trace(f, require_gpu) for f in files), key=lambda t: t.rank)
    check_one_job(traces)
    return traces
