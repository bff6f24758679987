"""Which files under a path are Kineto traces: the one rule of every command that reads traces.

``chopper trace``, ``chopper report``, ``chopper attribute`` (the capture join) and the layout
``chopper capture`` writes all go through :func:`trace_files`, so a directory holds the same
traces for each of them. The rule:

1. A trace file is one whose name ends in ``.json`` or ``.json.gz`` (``TRACE_SUFFIXES``), as
   torch.profiler writes them (``export_chrome_trace``, ``tensorboard_trace_handler``:
   ``*.pt.trace.json[.gz]``). A capture's ``capture.jsonl`` and a run's ``.parquet``/``.csv``
   tables do not match.
2. A path that is a file is itself when its name matches, else nothing.
3. A directory: every matching file at any depth under it, sorted by path. That covers a folder
   of traces, per-rank folders, traces beside a run's tables, and a ``chopper capture`` directory,
   whose ranks write ``traces/rank<R>.pt.trace.json.gz`` (``TRACES_DIR``) beside the run.

Kept free of numpy and pandas, though the package facade imports the reader.
"""
from __future__ import annotations

from pathlib import Path

TRACE_SUFFIXES = (".json", ".json.gz")
# The folder of a ``chopper capture`` directory the ranks write their traces into.
TRACES_DIR = "traces"


def is_trace_name(path: str | Path) -> bool:
    """True when ``path``'s name ends in a trace suffix (rule 1)."""
    return Path(path).name.endswith(TRACE_SUFFIXES)


def trace_files(path: str | Path) -> list[Path]:
    """The trace files at ``path`` (module docstring): itself when it is one, else those under it, sorted.

    A path that does not exist holds none.
    """
    base = Path(path)
    if base.is_file():
        return [base] if is_trace_name(base) else []
    return sorted(p for p in base.rglob("*") if p.is_file() and is_trace_name(p))
