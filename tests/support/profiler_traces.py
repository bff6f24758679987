"""The ``ProfilerStep#`` ranges of the traces a capture writes, read as plain JSON."""
from __future__ import annotations

import gzip
import json
from pathlib import Path


def step_events(path: str | Path) -> list[dict]:
    """The ``ProfilerStep#`` annotations of one Kineto trace (``.json.gz``).

    Read as JSON rather than with ``chopper.trace.load_traces``: on a CPU-only machine the traces
    hold no GPU kernels, which the kernel-level reader refuses by design.
    """
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
