"""Inspector dumps → a real agent's /metrics and step account, live and recorded, for a job that marks no collective.

A real agent process (simulated GPUs) reads ``--inspector-dir``; a real trainer process
(``tests/e2e/inspector_trainer.py``) marks steps and phases only and appends, per collective, the
line NCCL's Inspector plugin writes in verbose mode (``tests/support/inspector_dumps.py``, laid out
as the plugin's source writes it), late as the plugin's dump thread writes it, with
``NCCL_INSPECTOR_ENABLE=1`` set as the recipes set it. The collective windows the trainer measured
are the truth: the agent must find the records by the trainer's pid, put them on its steps (the
first one too, which ends before any record of the rank arrives) and make them its exposed
communication, without a single collective marker. A second "process" that never talks to the
agent dumps into ``inspector_dir/<job>/`` and is named by that directory. Then ``chopper record
--since-buffer`` (the real CLI) writes the run, and ``chopper attribute --json`` on it must find the
same windows from the run's ``collectives`` table, as the live summaries do.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chopper.demo.run import metric_sum
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.runs import consumer
from chopper.runs.rundir import read_run
from tests.support.daemons import AgentProcess
from tests.support.inspector_dumps import Collective, Comm, coll_line
from tests.support.polling import wait_until

REPO = Path(__file__).resolve().parents[2]
STEPS = 12
pytestmark = pytest.mark.slow


def _summaries(agent: AgentProcess, job: str, want: int, timeout_s: float = 20.0) -> list[pb.StepSummary]:
    channel, stream = consumer.subscribe(agent.target, pb.SubscribeRequest(step_summaries=True, since_ns=1))
    got: list[pb.StepSummary] = []
    deadline = time.monotonic() + timeout_s
    try:
        for batch in stream:
            got += [s for s in batch.step_summaries if s.job == job]
            if len(got) >= want or time.monotonic() > deadline:
                break
    finally:
        channel.close()
    return got


def test_inspector_collectives_drive_exposed_comm_of_a_job_that_marks_none(tmp_path: Path) -> None:
    dump = tmp_path / "inspector"
    dump.mkdir()
    agent = AgentProcess(tmp_path, "--inspector-dir", str(dump), "--inspector-poll-s", "0.1").start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHOPPER_")}
        trainer = subprocess.run(
            [sys.executable, "-m", "tests.e2e.inspector_trainer", "--steps", str(STEPS)], cwd=REPO, text=True,
            capture_output=True, timeout=60,
            env={**env, "CHOPPER_AGENT": agent.target, "CHOPPER_JOB": "zero-code", "RANK": "0", "CHOPPER_GPU": "0",
                 "NCCL_INSPECTOR_ENABLE": "1", "NCCL_INSPECTOR_DUMP_DIR": str(dump)},
        )
        assert trainer.returncode == 0, trainer.stderr
        truth = json.loads(trainer.stdout.splitlines()[-1])
        summaries = sorted(_summaries(agent, "zero-code", STEPS), key=lambda s: s.step)
        assert [s.step for s in summaries] == list(range(STEPS))
        for s, (begin, end) in zip(summaries, truth["windows"], strict=True):
            assert s.collectives == 0  # the job marked none
            assert s.collective_source == pb.COLLECTIVE_SOURCE_INSPECTOR
            # The plugin's timestamps are whole microseconds: the window to within 2 us.
            assert s.collective_s == pytest.approx((end - begin) / 1e9, abs=2e-6), s.step
            assert s.inspector_collective_s == pytest.approx(s.collective_s)
            assert s.collective_bytes == s.inspector_bytes == 64 << 20 and s.inspector_collectives == 1
            assert "inspector_unplaced" not in s.flags
            # No phase covers it: all of it is exposed, unless the simulated GPU read idle then (its first
            # steps, before the agent saw the rank's phases) and the account capped it.
            if "comm_capped" not in s.flags:
                assert s.exposed_comm_s == pytest.approx(s.collective_s, abs=1e-9)
        assert sum("comm_capped" not in s.flags for s in summaries) >= STEPS // 2

        # A process that never spoke to the agent, dumping into inspector_dir/<job>/ (non-verbose).
        (dump / "bert").mkdir()
        now_us = time.time_ns() // 1000
        comm = Comm("0xbe27", 3, 8, 2, "node-b", 777)
        (dump / "bert" / "node-b-pid777.log").write_text(
            "".join(coll_line(comm, Collective("AllGather", n, 1 << 20, 250, now_us + n)) for n in range(1, 6)))

        def exported() -> str:
            return agent.metrics()

        assert wait_until(lambda: metric_sum(exported(), "chopper_inspector_collectives_total",
                                             training_job="bert") == 5)
        text = exported()
        assert metric_sum(text, "chopper_inspector_collectives_total", training_job="zero-code", collective="AllReduce",
                          size="16-256MiB") == STEPS
        assert metric_sum(text, "chopper_inspector_collective_seconds_total",
                          training_job="bert") == pytest.approx(5 * 250e-6)
        assert metric_sum(text, "chopper_inspector_records_mapped_total", via="registration") == STEPS
        assert metric_sum(text, "chopper_inspector_records_mapped_total", via="directory") == 5
        assert metric_sum(text, "chopper_inspector_records_unplaced_total") == 5
        assert metric_sum(text, "chopper_rank_collective_source_steps_total", training_job="zero-code",
                          source="inspector") == STEPS
        collective = metric_sum(text, "chopper_rank_inspector_collective_seconds_total", training_job="zero-code")
        assert collective == pytest.approx(sum((e - b) / 1e9 for b, e in truth["windows"]), abs=STEPS * 2e-6)
        assert metric_sum(text, "chopper_rank_collective_bytes_total", training_job="zero-code") == STEPS * (64 << 20)
        assert metric_sum(text, "chopper_inspector_dir_present") == 1
        assert metric_sum(text, "chopper_inspector_ranks_silent") == 0

        run = tmp_path / "run"
        recorded = subprocess.run(
            [sys.executable, "-m", "chopper.cli", "record", "--agent", agent.target, "--out", str(run),
             "--duration", "3", "--since-buffer"], cwd=REPO, text=True, capture_output=True, timeout=60)
        assert recorded.returncode == 0, recorded.stderr
        assert f"recorded {STEPS + 5} Inspector collectives" in recorded.stdout
    finally:
        agent.terminate()
    _check_recorded(run, truth["windows"])


def _check_recorded(run: Path, windows: list[tuple[int, int]]) -> None:
    """The recorded run's collectives table, and ``chopper attribute --json`` on it, against the trainer's windows."""
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
    for s, (begin, end) in zip(steps, windows, strict=True):
        c = s["collectives"]
        assert (c["source"], c["bytes"], c["inspector_count"], c["disagreement_s"]) == (
            "inspector", 64 << 20, 1, None)
        assert c["collective_s"] == pytest.approx((end - begin) / 1e9, abs=2e-6), s["step"]
        assert c["inspector_s"] == pytest.approx(c["collective_s"])
        if "comm_capped" not in s["flags"]:
            uncapped += 1
            assert s["exposed_comm_s"] == pytest.approx(c["collective_s"], abs=1e-9)
    assert uncapped >= STEPS // 2
