"""What a clumsy trainer does to its markers, against the real agent: every marker arrives or is counted.

Each test runs ``python -m agent`` (``AgentProcess``) and a real client, and counts what the agent
received from its ``/metrics`` (``chopper_rank_markers_received_total``), against what the client
says it queued, sent and dropped:

* identity that is not text (a job name with bytes that are not UTF-8, or control characters),
  from the environment through ``chopper.init()``;
* SIGTERM to a trainer that installed no handler, with markers still queued;
* one marker with a 5 MB phase name, and a step_end with NaN FLOPs, among good markers.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chopper.client import Client
from chopper.demo.run import metric_sum
from tests.support.daemons import AgentProcess
from tests.support.hazards import HazardOutcome
from tests.support.polling import wait_until

REPO = Path(__file__).resolve().parents[2]
# Variables of the test's own environment that would otherwise name the trainer's job, rank or GPU.
_IDENTITY_VARS = re.compile(r"CHOPPER_.*|RANK|LOCAL_RANK|WORLD_SIZE|SLURM_.*|OMPI_.*|PMIX?_.*|TORCHELASTIC_.*|"
                            r"KUBERNETES_SERVICE_HOST|.*_VISIBLE_DEVICES")


def _label(value: str) -> str:
    """``value`` as the text exposition format writes a label value."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def received(agent: AgentProcess, job: str) -> int:
    return int(metric_sum(agent.metrics(), "chopper_rank_markers_received_total", training_job=_label(job)))


def start_trainer(agent: AgentProcess, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """``tests.e2e.init_trainer`` with ``env`` over a clean identity; values may hold surrogate escapes (raw bytes)."""
    base = {k: v for k, v in os.environ.items() if not _IDENTITY_VARS.fullmatch(k)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.init_trainer", *args], cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**base, "CHOPPER_AGENT": agent.target, "RANK": "0", "CHOPPER_GPU": "0", **env},
    )


@pytest.mark.slow
@pytest.mark.hazard(item=6, input="CHOPPER_JOB=$'caf\\xff' (not UTF-8); TORCHELASTIC_RUN_ID=$'run\\xfe\\tx'",
                    promise="identity that is not text is replaced at init and said so; queued == sent + dropped; "
                            "no client thread dies")
def test_a_job_name_that_is_not_text_is_replaced_and_every_marker_arrives(tmp_path: Path,
                                                                          hazard: HazardOutcome) -> None:
    agent = AgentProcess(tmp_path).start()
    try:
        # The environment holds bytes: subprocess encodes each surrogate escape back to its byte.
        cases = {"caf\\xff": {"CHOPPER_JOB": "caf\udcff"}, "run\\xfe\\tx": {"TORCHELASTIC_RUN_ID": "run\udcfe\tx"}}
        procs = {job: start_trainer(agent, env, "--duration", "2") for job, env in cases.items()}
        outcomes = []
        for job, proc in procs.items():
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err[-3000:]
            stats = json.loads(out.strip().splitlines()[-1])["client"]
            assert "Traceback" not in err, err[-3000:]
            assert "event=identity_replaced field=job" in err and f"used={job!r}" in err, err[-3000:]
            assert stats["queued"] == stats["sent"] + stats["dropped"] and stats["dropped"] == 0, stats
            assert stats["queued"] > 0
            assert wait_until(lambda job=job, stats=stats: received(agent, job) == stats["sent"], timeout_s=15), (
                received(agent, job), stats)
            outcomes.append(f"job {job!r}: queued {stats['queued']}, sent {stats['sent']}, dropped "
                            f"{stats['dropped']}, agent received {received(agent, job)}")
        hazard.outcome = "; ".join(outcomes) + "; the replacement said at init; no traceback"
    finally:
        agent.terminate()


@pytest.mark.slow
@pytest.mark.hazard(item=10, input="SIGTERM to a trainer with no handler of its own, markers still queued",
                    promise="the queued markers are flushed (bounded, 2 s) and counted, then the process ends as "
                            "SIGTERM ends it (-15)")
def test_sigterm_flushes_the_queue_then_terminates(tmp_path: Path, hazard: HazardOutcome) -> None:
    agent = AgentProcess(tmp_path).start()
    proc = start_trainer(agent, {"CHOPPER_JOB": "sigterm"}, "--duration", "60", "--burst-after", "1.0")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        _, err = proc.communicate(timeout=60)
        ended_s = time.monotonic() - signalled
        assert line.startswith("marked "), err[-3000:]
        marked = int(line.split()[1])
        assert proc.returncode == -signal.SIGTERM, (proc.returncode, err[-3000:])
        flushed = re.search(r"event=flushed_on_signal signal=SIGTERM pending=(\d+) queued=(\d+) sent=(\d+) "
                            r"dropped=(\d+) seconds=([\d.]+)", err)
        assert flushed is not None, err[-3000:]
        pending, queued, sent, dropped = (int(flushed[i]) for i in range(1, 5))
        assert queued >= marked and dropped == 0 and sent == queued, flushed[0]
        assert wait_until(lambda: received(agent, "sigterm") == sent, timeout_s=15), (received(agent, "sigterm"), sent)
        assert ended_s < 10.0  # the flush is bounded by 2 s; the rest is the loaded machine
        hazard.outcome = (f"{pending} of {queued} markers queued at SIGTERM; flushed in {float(flushed[5]):.3f} s; "
                          f"agent received {received(agent, 'sigterm')} of {queued}, dropped {dropped}; exit "
                          f"{proc.returncode} (SIGTERM's), {ended_s:.2f} s after the signal")
    finally:
        if proc.poll() is None:
            proc.kill()
        agent.terminate()


@pytest.mark.slow
@pytest.mark.hazard(item=11, input="a 5 MB phase name among 19 good markers; a step_end with NaN FLOPs",
                    promise="the bad marker alone is refused, named and counted, the batch kept; bad FLOPs are "
                            "dropped from the step, which is kept and flagged")
def test_an_oversized_marker_costs_only_itself_and_bad_flops_only_the_field(tmp_path: Path,
                                                                            hazard: HazardOutcome) -> None:
    agent = AgentProcess(tmp_path).start()
    client = Client(job="clumsy", rank=0, gpu=0, agent=agent.target, flush_interval_s=3600.0, control=False)
    try:
        huge = "p" * (5 << 20)
        # One batch (shutdown flushes the whole queue at once): 22 markers, 2 of them with the huge name.
        with client.step(0, flops=1e12, tokens=64):
            with client.phase("forward"):
                pass
            with client.phase(huge):
                pass
            for _ in range(3):
                with client.phase("backward"), client.collective("all_reduce", bytes=1 << 20):
                    pass
            with client.phase("optimizer"):
                pass
        with client.step(1, flops=float("nan"), tokens=64):
            pass
        client.shutdown(timeout=30.0)
        s = client.stats()
        assert s["queued"] == 22 and s["sent"] == 20 and s["dropped"] == 2, s
        assert s["dropped_invalid_by_reason"] == {"bad_name": 2} and s["batches_sent"] == 1, s
        assert s["last_error"] == "", s  # the stream never broke
        assert wait_until(lambda: received(agent, "clumsy") == 20, timeout_s=15), received(agent, "clumsy")
        assert wait_until(lambda: metric_sum(agent.metrics(), "chopper_rank_steps_total", training_job="clumsy") == 2)
        flagged = metric_sum(agent.metrics(), "chopper_rank_flagged_steps_total", training_job="clumsy",
                             flag="bad_flops")
        assert wait_until(lambda: metric_sum(agent.metrics(), "chopper_rank_flagged_steps_total", training_job="clumsy",
                                             flag="bad_flops") == 1, timeout_s=15), flagged
        rejected = metric_sum(agent.metrics(), "chopper_agent_markers_rejected_total")
        assert metric_sum(agent.metrics(), "chopper_agent_marker_fields_dropped_total", field="flops") == 1
        assert "event=marker_fields_dropped" in agent.log()
        assert "agent_unreachable" not in agent.log()
        hazard.outcome = (f"client queued {s['queued']}, sent {s['sent']} in {s['batches_sent']} batch, refused 2 "
                          f"(bad_name: the 5 MB name's begin and end), stream unbroken; agent received "
                          f"{received(agent, 'clumsy')}, completed 2 steps, rejected {rejected:.0f}; the NaN-FLOPs "
                          "step kept and flagged bad_flops (1)")
    finally:
        client.shutdown(0.1)
        agent.terminate()
