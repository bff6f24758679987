"""A recorded run of a job that marks no collective: the Inspector's records → ``collectives`` → ``chopper attribute``.

A real agent process (simulated GPUs) reads ``--inspector-dir``; a real trainer process
(``tests/e2e/inspector_trainer.py``) marks steps and phases only and appends, per collective, the
line NCCL's Inspector plugin writes in verbose mode. ``chopper record --since-buffer`` (the real
CLI) then writes the run, and ``chopper attribute --json`` on it must find, per step, the
collective window the trainer measured itself, from the Inspector alone, as the live summaries do.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chopper.runs.rundir import read_run
from tests.support.daemons import AgentProcess

REPO = Path(__file__).resolve().parents[2]
STEPS = 12
pytestmark = pytest.mark.slow


def test_a_recorded_run_attributes_exposed_comm_from_the_inspector(tmp_path: Path) -> None:
    dump = tmp_path / "inspector"
    dump.mkdir()
    agent = AgentProcess(tmp_path, "--inspector-dir", str(dump), "--inspector-poll-s", "0.1").start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHOPPER_")}
        trainer = subprocess.run(
            [sys.executable, "-m", "tests.e2e.inspector_trainer", "--steps", str(STEPS)], cwd=REPO, text=True,
            capture_output=True, timeout=60,
            env={**env, "CHOPPER_AGENT": agent.target, "CHOPPER_JOB": "zero-code", "RANK": "0", "CHOPPER_GPU": "0",
                 "NCCL_INSPECTOR_DUMP_DIR": str(dump)},
        )
        assert trainer.returncode == 0, trainer.stderr
        truth = json.loads(trainer.stdout.splitlines()[-1])
        run = tmp_path / "run"
        recorded = subprocess.run(
            [sys.executable, "-m", "chopper.cli", "record", "--agent", agent.target, "--out", str(run),
             "--duration", "3", "--since-buffer"], cwd=REPO, text=True, capture_output=True, timeout=60)
        assert recorded.returncode == 0, recorded.stderr
    finally:
        agent.terminate()

    table = read_run(run).collectives
    mine = table[table["job"] == "zero-code"]
    assert len(mine) == STEPS and set(mine["rank"]) == {0} and mine["placed"].all()
    assert set(mine["collective"]) == {"AllReduce"} and set(mine["bytes"]) == {64 << 20}
    assert set(mine["timing_source"]) == {"kernel_gpu"} and set(mine["format_version"]) == {"v4.0"}

    out = subprocess.run([sys.executable, "-m", "chopper.cli", "attribute", str(run), "--json", "--job", "zero-code"],
                         cwd=REPO, text=True, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    steps = sorted(json.loads(out.stdout)["steps"], key=lambda s: s["step"])
    assert [s["step"] for s in steps] == list(range(STEPS))
    uncapped = 0
    for s, (begin, end) in zip(steps, truth["windows"], strict=True):
        c = s["collectives"]
        assert (c["source"], c["bytes"], c["inspector_count"], c["disagreement_s"]) == (
            "inspector", 64 << 20, 1, None)
        # The plugin's timestamps are whole microseconds: the trainer's own window to within 2 us.
        assert c["collective_s"] == pytest.approx((end - begin) / 1e9, abs=2e-6), s["step"]
        assert c["inspector_s"] == pytest.approx(c["collective_s"])
        # Between forward and backward no phase covers it: all exposed, unless the account capped it
        # where the simulated GPU read idle.
        if "comm_capped" not in s["flags"]:
            uncapped += 1
            assert s["exposed_comm_s"] == pytest.approx(c["collective_s"], abs=1e-9)
    assert uncapped >= STEPS // 2
