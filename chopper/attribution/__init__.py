"""Step-time attribution: where every step of every rank went (DESIGN "The attribution model").

``attribute(devices, samples, markers)`` returns one row per (job, rank, step) with the terms of
``columns.STEP_COLUMNS``; ``attribute_run(path)`` does the same for a recorded run directory.
Each term lives in its own module with its algorithm in the docstring: ``idle``,
``exposed_comm``, ``dvfs``, ``ideal``, ``matrix_util``, ``straggler``; ``timeline`` holds the
window integrals over samples and ``markers`` the pairing of markers into windows.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chopper.attribution.model import Attribution, AttributionError, attribute

__all__ = ["Attribution", "AttributionError", "attribute", "attribute_run"]


def __getattr__(name: str) -> Any:
    # The offline model needs pandas; the live agent imports the numpy-only term modules of this
    # package (``terms``, ``phases``, ...) and must not load pandas and pyarrow with them.
    if name in ("Attribution", "AttributionError", "attribute"):
        from chopper.attribution import model

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def attribute_run(path: str | Path, job: str | None = None) -> Attribution:
    """Attribute a recorded run directory (Parquet or CSV tables, see ``chopper.runs.rundir``)."""
    from chopper.attribution.model import attribute
    from chopper.runs.rundir import read_run

    run = read_run(path)
    return attribute(run.devices, run.samples, run.markers, job=job, collectives=run.collectives, errors=run.errors)
