"""Runs recorded on real GPUs by ``make gpu-check`` and kept under tests/fixtures/gpu: each must stay valid.

No GPU is needed to check a recording, so this runs everywhere: the tables must read as a
recorded run, the provenance must be complete, Chopper's marker MFU must agree with the loop's own
timing, and the replay backend must play the samples back unchanged (``tests.gpu.runs``).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.gpu.check import FIXTURES
from tests.gpu.runs import check_run

RUNS = sorted(p for p in FIXTURES.glob("*/") if (p / "check.json").exists()) if FIXTURES.is_dir() else []


@pytest.mark.skipif(not RUNS, reason=f"no run recorded on a GPU under {FIXTURES} yet (make gpu-check on a GPU machine)")
@pytest.mark.parametrize("run_dir", RUNS, ids=[p.name for p in RUNS])
def test_recorded_gpu_run_is_complete_and_consistent(run_dir: Path) -> None:
    rec = check_run(run_dir, vendors=("nvidia", "amd"))
    assert rec["loop"]["timer"] == "device events"
    assert (run_dir / "agent.log").read_text().count(f"backend={rec['backend']}") >= 1
