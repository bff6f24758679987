"""``chopper capture`` against a real agent process and the real demo training job (docs/CAPTURE.md)."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from chopper.demo.run import metric_sum
from tests.support.daemons import AgentProcess
from tests.support.polling import wait_until
from tests.support.profiler_traces import step_events
from tests.support.training import start_training, stop_training

# Training outlives every CLI start-up and captured step however loaded the machine is; each test
# kills it once its checks are done, so it never runs this long.
TRAINING_S = 120.0


def capture(target: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "chopper.cli", "capture", "--agent", target, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def profiler_steps(trace_dir: Path) -> dict[int, int]:
    """``ProfilerStep#`` annotations per rank (rank from the file name)."""
    return {int(p.name.split(".")[0].removeprefix("rank")): len(step_events(p))
            for p in sorted(trace_dir.glob("rank*.json.gz"))}


def wait_for_steps(agent: AgentProcess, steps: int = 2) -> None:
    assert wait_until(lambda: metric_sum(agent.metrics(), "chopper_rank_steps_total", training_job="e2e",
                                         rank="1") >= steps, timeout_s=60), "training never started stepping"


@pytest.mark.slow
def test_capture_profiles_n_steps_and_records_the_window_at_a_raised_rate(agent_process: AgentProcess,
                                                                           tmp_path: Path) -> None:
    training = start_training(agent_process.target, ranks=2, duration_s=TRAINING_S)
    try:
        wait_for_steps(agent_process)
        out = tmp_path / "cap"
        proc = capture(agent_process.target, "--job", "e2e", "--steps", "3", "--ranks", "0,1", "--out", str(out))
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        assert "captured 3 step(s) of job e2e" in stdout
        assert training.poll() is None, f"training ended during the capture:\n{training.communicate()[1][-3000:]}"
    finally:
        stop_training(training)

    assert profiler_steps(out / "traces") == {0: 3, 1: 3}
    header, *ranks = (json.loads(line) for line in (out / "capture.jsonl").read_text().splitlines())
    assert header["sample_hz"] == 100.0 and header["missing_ranks"] == []
    assert [r["steps"] for r in ranks] == [3, 3] and all(r["error"] == "" for r in ranks)

    # The agent sampled at 100 Hz during the profiled steps (20 Hz otherwise): intervals of 10 ms,
    # 20 or 30 where a starved sampler skipped a tick or two, never the 50 ms of the normal rate.
    samples = pd.read_parquet(out / "samples.parquet")
    begin, end = min(r["begin_ns"] for r in ranks), max(r["end_ns"] for r in ranks)
    window = samples[(samples.gpu == 0) & (samples.ts_ns >= begin) & (samples.ts_ns <= end)].ts_ns.sort_values()
    assert len(window) >= 5
    assert window.diff().dropna().median() < 30e6

    # `chopper attribute` joins each profiled step's counters with its trace on one clock: Kineto's
    # ts plus baseTimeNanoseconds is CLOCK_REALTIME, the markers' axis (docs/CAPTURE.md).
    attributed = subprocess.run([sys.executable, "-m", "chopper.cli", "attribute", str(out), "--json"],
                                capture_output=True, text=True, timeout=120)
    assert attributed.returncode == 0, attributed.stderr
    joined = json.loads(attributed.stdout)["capture"]
    assert Counter(r["rank"] for r in joined) == {0: 3, 1: 3}  # every profiled step found in the run
    # A step's marker is stamped on entry, its ProfilerStep# range opened just after; the first
    # profiled step starts torch.profiler in between, which takes up to hundreds of ms on a loaded
    # machine. Misaligned axes would be off by far more than either bound.
    first_step = {rank: min(r["step"] for r in joined if r["rank"] == rank) for rank in (0, 1)}
    offsets = [(r["begin_offset_us"], r["step"] == first_step[r["rank"]]) for r in joined]
    assert all(abs(us) < (1_000_000 if first else 50_000) for us, first in offsets), offsets
    assert all(r["cpu_only_trace"] and r["kernel_busy_s"] is None for r in joined)  # no GPU here


@pytest.mark.slow
def test_capture_refusals_and_agent_killed_mid_capture(agent_process: AgentProcess, tmp_path: Path) -> None:
    missing = capture(agent_process.target, "--job", "nope", "--steps", "2", "--out", str(tmp_path / "none"))
    _, err = missing.communicate(timeout=60)
    assert missing.returncode == 2
    assert "no training process of job 'nope'" in err
    assert not (tmp_path / "none").exists()

    training = start_training(agent_process.target, ranks=2, duration_s=TRAINING_S)
    try:
        wait_for_steps(agent_process)
        long = capture(agent_process.target, "--job", "e2e", "--steps", "100", "--out", str(tmp_path / "long"))
        # The agent raises its sample rate once the capture runs: only then is a second one sure to collide.
        assert wait_until(lambda: metric_sum(agent_process.metrics(), "chopper_agent_sample_rate_hertz") >= 100,
                          timeout_s=60), "the long capture never started"
        second = capture(agent_process.target, "--job", "e2e", "--steps", "2", "--out", str(tmp_path / "second"))
        _, err = second.communicate(timeout=60)
        assert second.returncode == 2, err
        assert "capture already running for job e2e since" in err

        # Both ranks start profiling at their next step after the command: let every rank take a few
        # steps under the capture before the kill, however slow a loaded machine makes them.
        text = agent_process.metrics()
        done = {r: metric_sum(text, "chopper_rank_steps_total", training_job="e2e", rank=r) for r in ("0", "1")}
        assert wait_until(lambda: all(
            metric_sum(agent_process.metrics(), "chopper_rank_steps_total", training_job="e2e", rank=r) >= done[r] + 3
            for r in done), timeout_s=60), "training stopped stepping during the capture"
        agent_process.kill()
        _, err = long.communicate(timeout=60)
        assert long.returncode == 1
        assert "agent went away" in err

        # Each rank notices at its next step and writes its partial trace; training is far from its
        # end, so the traces come from that path, not from the shutdown. A trace being written does
        # not read yet.
        partial: dict[int, int] = {}

        def partial_traces() -> bool:
            try:
                partial.update(profiler_steps(tmp_path / "long" / "traces"))
            except (OSError, EOFError, ValueError):
                return False
            return set(partial) == {0, 1}

        assert wait_until(partial_traces, timeout_s=60), f"partial traces of ranks {sorted(partial)} only"
        assert all(0 < n < 100000 for n in partial.values()), partial
        assert training.poll() is None, f"training ended without its agent:\n{training.communicate()[1][-3000:]}"
    finally:
        stop_training(training)
