"""Recorded runs whose tables disagree, through ``chopper attribute`` and ``chopper report`` as a user runs them.

Each case edits one table of a real four-rank run (the ``hot_straggler`` scenario) the way a
clumsy export or a hand edit would, then runs the installed ``chopper`` command in a child
process. The promise: exit status 2 and one message naming the file, the column, the row and the
fix; never a traceback, never figures computed from the bad values.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests.support.attribution_scenarios import ALL_SCENARIOS

CHOPPER = str(Path(sys.executable).parent / "chopper")


def _edit(table: str, change: Callable[[pd.DataFrame], pd.DataFrame]) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        path = run / f"{table}.parquet"
        change(pd.read_parquet(path)).to_parquet(path, index=False)
    return apply


def _set(frame: pd.DataFrame, row: int, column: str, value: Any) -> pd.DataFrame:
    frame.loc[row, column] = value
    return frame


def _swap(frame: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    frame[a], frame[b] = frame[b].to_numpy().copy(), frame[a].to_numpy().copy()
    return frame


# case: (edit, the file, what the message must name)
CASES: dict[str, tuple[Callable[[Path], None], str, tuple[str, ...]]] = {
    "a GPU listed twice in devices, with different clocks": (
        _edit("devices", lambda f: pd.concat([f, f.iloc[[0]].assign(max_gfx_clock_mhz=1000.0)], ignore_index=True)),
        "devices.parquet", ("gpu=0 is listed in rows 0, 4", "columns node, gpu", "remove the duplicate")),
    "busy_ratio=inf in one sample": (
        _edit("samples", lambda f: _set(f, 5, "busy_ratio", np.inf)),
        "samples.parquet", ("column busy_ratio must be a ratio from 0 to 1", "row 5 has inf", "Fix that row")),
    "busy_ratio and gfx_clock_mhz swapped": (
        _edit("samples", lambda f: _swap(f, "busy_ratio", "gfx_clock_mhz")),
        "samples.parquet", ("column busy_ratio", "row 0 has 840.0", "swapped")),
    "ts_ns and gpu swapped": (
        _edit("samples", lambda f: _swap(f, "ts_ns", "gpu")),
        "samples.parquet", ("column gpu must be a local GPU index", "row 0 has 17", "swapped")),
    "a negative peak_flops": (
        _edit("devices", lambda f: _set(f, 2, "peak_flops", -1.0)),
        "devices.parquet", ("column peak_flops must be finite and above 0", "row 2 has -1.0")),
    "negative FLOPs on a step_end": (
        _edit("markers", lambda f: _set(f, int(np.flatnonzero(f["kind"] == "step_end")[3]), "flops", -5e12)),
        "markers.parquet", ("column flops must be a finite amount, not negative", "has -5000000000000.0")),
}


@pytest.fixture(scope="module")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ALL_SCENARIOS["hot_straggler"]().write(tmp_path_factory.mktemp("good") / "run")


def _copy(good: Path, dest: Path) -> Path:
    dest.mkdir()
    for f in good.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    return dest


def _chopper(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHOPPER, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.hazard(item=14, input="recorded-run tables that disagree: a GPU listed twice, busy_ratio=inf, columns "
                    "swapped, negative peak or FLOPs; `chopper attribute RUN`",
                    promise="exit 2 with one message naming the file, column, row and fix; no traceback, no figures")
@pytest.mark.parametrize("case", list(CASES))
def test_attribute_names_the_table_column_row_and_fix(case: str, good_run: Path, tmp_path: Path,
                                                        hazard: Any) -> None:
    edit, file, named = CASES[case]
    run = _copy(good_run, tmp_path / "run")
    edit(run)
    done = _chopper("attribute", str(run))
    hazard.outcome = f"{case}: exit {done.returncode}, {len(done.stdout)} bytes of figures; {done.stderr.strip()[:200]}"
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"chopper attribute: {run / file}: "), done.stderr
    for words in named:
        assert words in done.stderr, (words, done.stderr)


@pytest.mark.hazard(item=14, input="a GPU listed twice in devices, and busy_ratio=inf, through `chopper report RUN -o`",
                    promise="exit 2 naming the file, column and row; no report written, no traceback")
@pytest.mark.parametrize("case", ["a GPU listed twice in devices, with different clocks",
                                  "busy_ratio=inf in one sample"])
def test_report_refuses_alike(case: str, good_run: Path, tmp_path: Path, hazard: Any) -> None:
    edit, file, named = CASES[case]
    run = _copy(good_run, tmp_path / "run")
    edit(run)
    out = tmp_path / "report.html"
    done = _chopper("report", str(run), "-o", str(out), "--quiet")
    hazard.outcome = f"{case}: exit {done.returncode}, report written: {out.exists()}; {done.stderr.strip()[:160]}"
    assert done.returncode == 2 and not out.exists(), done.stderr[-2000:]
    assert done.stderr.startswith(f"chopper report: {run / file}: ") and named[0] in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.hazard(item=14, input="a step_end 10 s before its step_begin (negative duration), `chopper attribute RUN`",
                    promise="that step skipped and named (job, rank, step), every other step attributed")
def test_a_step_that_ends_before_it_begins_is_named_and_skipped(good_run: Path, tmp_path: Path, hazard: Any) -> None:
    run = _copy(good_run, tmp_path / "run")

    def back(f: pd.DataFrame) -> pd.DataFrame:
        f.loc[(f["kind"] == "step_end") & (f["step"] == 2) & (f["rank"] == 0), "ts_ns"] -= 10 * 10**9
        return f

    _edit("markers", back)(run)
    done = _chopper("attribute", str(run), "--json")
    doc = json.loads(done.stdout)
    steps = {(s["rank"], s["step"]) for s in doc["steps"]}
    hazard.outcome = (f"exit {done.returncode}; {len(steps)} rank-steps attributed, (rank 0, step 2) "
                      f"{'kept' if (0, 2) in steps else 'skipped'}; problems: {doc['summary']['problems']}")
    assert done.returncode == 0 and (0, 2) not in steps and (1, 2) in steps
    assert any("rank 0: 1 steps that end before they begin (steps 2); skipped" in p for p in doc["summary"]["problems"])
