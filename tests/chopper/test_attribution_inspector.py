"""Offline attribution of recorded runs that hold Inspector collectives (the ``collectives`` table).

Job ``a`` marks steps and phases only: its exposed communication comes from the Inspector's
intervals. Job ``b`` also marks its all-reduce: its account comes from the markers and the
Inspector's view is kept beside it, with their disagreement. Every expected figure is computed by
hand from the windows written below (milliseconds after T0). The GPUs run busy at their maximum
clock throughout, so idle and DVFS are 0 and exposed communication is never capped.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from chopper.attribution import attribute_run
from chopper.runs.rundir import write_run
from chopper.schema import DeviceInfo, Sample
from tests.support.hazards import HazardOutcome

T0 = 1_765_000_000_000_000_000
MS = 1_000_000
TERMS = ("ideal_s", "matrix_util_loss_s", "dvfs_loss_s", "exposed_comm_s", "straggler_wait_s", "idle_s")


def _marker(job: str, gpu: int, kind: str, step: int, at_ms: int, name: str = "", nbytes: float = np.nan) -> dict:
    return dict(ts_ns=T0 + at_ms * MS, job=job, node="n1", rank=0, gpu=gpu, kind=kind, step=step, name=name,
                flops=1e12 if kind == "step_end" else np.nan, tokens=np.nan, bytes=nbytes)


def _markers() -> list[dict]:
    rows = []
    for job, gpu in (("a", 0), ("b", 1)):
        for step, base in ((1, 0), (2, 100)):
            rows += [_marker(job, gpu, "step_begin", step, base), _marker(job, gpu, "step_end", step, base + 100),
                     _marker(job, gpu, "phase_begin", step, base + 10, "backward"),
                     _marker(job, gpu, "phase_end", step, base + 60, "backward")]
    # Job b marks its all-reduce, 60-90 ms into each step, 4 KiB.
    for step, base in ((1, 0), (2, 100)):
        rows += [_marker("b", 1, "collective_begin", step, base + 60, "all_reduce", 4096.0),
                 _marker("b", 1, "collective_end", step, base + 90, "all_reduce", 4096.0)]
    return rows


def _record(job: str, rank: int, gpu: int, lo_ms: int, hi_ms: int, nbytes: int, seq: int, placed: bool = True) -> dict:
    return dict(job=job, node="n1", rank=rank, gpu=gpu, collective="AllReduce", begin_ns=T0 + lo_ms * MS,
                end_ns=T0 + hi_ms * MS, placed=placed, exec_s=(hi_ms - lo_ms) / 1e3, timing_source="kernel_gpu",
                bytes=nbytes, algo_bandwidth_gbs=1.0, bus_bandwidth_gbs=1.75, comm_id="0x1", comm_rank=0,
                comm_ranks=8, comm_nodes=1, seq=seq, pid=100 + gpu, format_version="v4.0")


def _collectives() -> list[dict]:
    return [
        # Job a. Step 1: [50, 80] (backward hides 50-60) and the first 5 ms of [95, 105], which
        # crosses into step 2 and counts there. Step 2: the rest of it, [150, 170] and [165, 190].
        _record("a", 0, 0, 50, 80, 1000, 1), _record("a", 0, 0, 95, 105, 500, 2),
        _record("a", 0, 0, 150, 170, 2000, 3), _record("a", 0, 0, 165, 190, 3000, 4),
        # Job b. Step 1: [65, 90], and [92, 94] from a process the agent could not name (rank -1,
        # no job) on b's GPU, from a dump without event timestamps. Step 2: nothing, although the
        # Inspector covers the rank.
        _record("b", 0, 1, 65, 90, 4096, 1), _record("", -1, 1, 92, 94, 8, 2, placed=False),
        # A GPU without steps in the run: reported, not used.
        _record("", -1, 3, 10, 20, 8, 1),
    ]


def _run(path: Path, collectives: list[dict] | None) -> Path:
    devices = [DeviceInfo("n1", g, "simulated", "sim", f"SIM-{g}", 2000.0, 1e15, 1 << 30, 500.0) for g in range(4)]
    samples = [Sample(T0 + t * 10 * MS, "n1", g, gfx_clock_mhz=2000.0, busy_ratio=1.0, energy_j=float(t),
                      throttle_power_s=0.0, throttle_thermal_s=0.0, throttle_current_s=0.0, throttle_other_s=0.0)
               for t in range(0, 22) for g in (0, 1)]
    return write_run(path, devices, samples, _markers(), collectives)


def _rows(result: Any) -> dict[tuple[str, int], dict]:
    return {(r["job"], int(r["step"])): r for r in result.steps.to_dict("records")}


def test_a_job_that_marks_no_collective_gets_exposed_communication_from_the_inspector(tmp_path: Path) -> None:
    result = attribute_run(_run(tmp_path / "run", _collectives()))
    rows = _rows(result)
    s1, s2 = rows[("a", 1)], rows[("a", 2)]
    assert s1["collective_source"] == s2["collective_source"] == "inspector"
    # Step 1: [60, 80] + [95, 100] outside backward [10, 60]; union [50, 80] + [95, 100].
    assert s1["exposed_comm_s"] == pytest.approx(0.025) and s1["collective_s"] == pytest.approx(0.035)
    # Step 2: [100, 105] + [160, 190] outside backward [110, 160]; union [100, 105] + [150, 190].
    assert s2["exposed_comm_s"] == pytest.approx(0.035) and s2["collective_s"] == pytest.approx(0.045)
    assert (s1["collective_bytes"], s2["collective_bytes"]) == (1000.0, 5500.0)
    assert (s1["inspector_collectives"], s2["inspector_collectives"]) == (1, 3)
    assert s1["inspector_collective_s"] == pytest.approx(0.035) and s2["inspector_bytes"] == 5500.0
    assert np.isnan(s1["collective_disagreement_s"]) and np.isnan(s2["collective_disagreement_s"])
    # The account closes with the Inspector's exposed time in it.
    for row in rows.values():
        assert sum(row[t] for t in TERMS) == pytest.approx(row["step_time_s"], abs=1e-12)
        assert row["idle_s"] == pytest.approx(0.0, abs=1e-12)


def test_a_job_that_marks_collectives_keeps_them_and_the_disagreement_is_computed(tmp_path: Path) -> None:
    result = attribute_run(_run(tmp_path / "run", _collectives()))
    rows = _rows(result)
    s1, s2 = rows[("b", 1)], rows[("b", 2)]
    assert s1["collective_source"] == s2["collective_source"] == "markers"
    # The marked [60, 90] lies wholly after backward: 30 ms exposed, 4 KiB, in both steps.
    assert s1["exposed_comm_s"] == pytest.approx(0.030) and s2["exposed_comm_s"] == pytest.approx(0.030)
    assert (s1["collective_bytes"], s2["collective_bytes"]) == (4096.0, 4096.0)
    # The Inspector: [65, 90] and the lent [92, 94] in step 1 (27 ms, 2 records), nothing in step 2.
    assert s1["inspector_collective_s"] == pytest.approx(0.027) and s1["inspector_collectives"] == 2
    assert s1["inspector_bytes"] == 4104.0
    assert (s2["inspector_collective_s"], s2["inspector_bytes"], s2["inspector_collectives"]) == (0.0, 0.0, 0)
    assert s1["collective_disagreement_s"] == pytest.approx(0.003)
    assert s2["collective_disagreement_s"] == pytest.approx(0.030)
    flagged = sorted(key for key, row in rows.items() if "inspector_unplaced" in row["flags"])
    assert flagged == [("b", 1)]
    [problem] = [p for p in result.problems if "Inspector" in p]
    assert problem.startswith("1 Inspector collective records of node 'n1' gpu 3 name job '' rank -1, which has no "
                              "steps in this run")


def test_without_a_collectives_table_the_account_is_the_markers(tmp_path: Path) -> None:
    with_table = _rows(attribute_run(_run(tmp_path / "with", _collectives())))
    without = _rows(attribute_run(_run(tmp_path / "without", None)))
    assert without[("a", 1)]["collective_source"] == "none" and without[("a", 1)]["exposed_comm_s"] == 0.0
    assert np.isnan(without[("a", 1)]["inspector_collective_s"]) and np.isnan(without[("b", 1)]["inspector_bytes"])
    # Job b's account does not change with the Inspector beside it.
    for step in (1, 2):
        assert without[("b", step)]["exposed_comm_s"] == with_table[("b", step)]["exposed_comm_s"]


def test_attribute_cli_json_carries_the_collective_columns(tmp_path: Path) -> None:
    run = _run(tmp_path / "run", _collectives())
    out = subprocess.run([sys.executable, "-m", "chopper.cli", "attribute", str(run), "--json"],
                         capture_output=True, text=True, check=True).stdout
    steps = pd.DataFrame(json.loads(out)["steps"]).set_index(["job", "step"])
    assert steps.loc[("a", 2), "collectives"] == {
        "source": "inspector", "collective_s": pytest.approx(0.045), "bytes": 5500.0,
        "inspector_s": pytest.approx(0.045), "inspector_bytes": 5500.0, "inspector_count": 3, "disagreement_s": None,
    }
    table = subprocess.run([sys.executable, "-m", "chopper.cli", "attribute", str(run)],
                           capture_output=True, text=True, check=True).stdout
    assert "collectives: 2 rank-steps from the Inspector" in table


@pytest.mark.hazard(item=1, input="Inspector records of a GPU no rank with steps drove, and of a rank whose step "
                    "windows overlap (step numbers reused), in a recorded run",
                    promise="those records are listed as not used with the reason; every step is still attributed")
def test_records_that_cannot_be_placed_are_reported(tmp_path: Path, hazard: HazardOutcome) -> None:
    markers = _markers()
    # Job a's step 2 begins inside step 1: its windows overlap.
    for row in markers:
        if row["job"] == "a" and row["kind"] == "step_begin" and row["step"] == 2:
            row["ts_ns"] = T0 + 50 * MS
    devices = [DeviceInfo("n1", g, "simulated", "sim", f"SIM-{g}", 2000.0, 1e15, 1 << 30, 500.0) for g in range(4)]
    run = write_run(tmp_path / "run", devices, [], markers, _collectives())
    result = attribute_run(run)
    assert len(result.steps) == 4
    problems = [p for p in result.problems if "Inspector" in p]
    assert problems == [
        "1 Inspector collective records of node 'n1' gpu 3 name job '' rank -1, which has no steps in this run, and "
        "no single rank with steps drove that GPU: not used. Record the job's markers on that node, or check the "
        "agent's mapping of processes to ranks (docs/INSPECTOR.md)",
        "job 'a' rank 0: step windows overlap (step numbers reused?), so its 4 Inspector collective records cannot "
        "be placed on steps: not used",
    ]
    assert set(result.steps[result.steps["job"] == "a"]["collective_source"]) == {"none"}
    hazard.outcome = (f"{len(problems)} groups of records reported as not used, naming the GPU or the rank and why; "
                      f"all {len(result.steps)} steps attributed")
