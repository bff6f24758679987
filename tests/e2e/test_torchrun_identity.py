"""A job launched by ``torchrun`` itself is recorded under its Slurm job, its ranks and its physical GPUs.

torchrun with a static rendezvous leaves ``TORCHELASTIC_RUN_ID`` at ``none``; the job runs with
``SLURM_JOB_ID=4242`` and ``CUDA_VISIBLE_DEVICES=4,5`` on a simulated 8-GPU node, as Slurm's
``--gpus`` binding starts it. The truth is the launch itself: rank r drives the r-th listed GPU.
Then bad input against the same real agent: a device UUID the node does not have.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chopper import cli
from chopper.demo.run import free_port, metric_sum
from chopper.runs.record import record
from tests.support.daemons import AgentProcess
from tests.support.polling import wait_until
from tests.support.recording import observe_recorder_streams

REPO = Path(__file__).resolve().parents[2]
STEPS = 8
# The launcher's and the scheduler's variables of the machine running the tests must not leak in.
_LAUNCH_VARS = ("SLURM_", "TORCHELASTIC", "CUDA_", "NVIDIA_", "ROCR_", "HIP_", "GPU_DEVICE", "CHOPPER_", "RANK",
                "LOCAL_RANK", "WORLD_SIZE", "OMPI_", "PMI", "KUBERNETES_", "JOBSET_", "PET_", "MASTER_")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCH_VARS)}
    return {**env, "PYTHONPATH": str(REPO), **extra}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[AgentProcess]:
    agent = AgentProcess(tmp_path, "--sim-gpus", "8").start()
    yield agent
    if agent.proc is not None and agent.proc.poll() is None:
        agent.terminate()


@pytest.mark.slow
def test_torchrun_job_is_attributed_to_its_slurm_job_ranks_and_physical_gpus(
        node: AgentProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    stop = threading.Event()
    observed = observe_recorder_streams(monkeypatch)
    recorder = threading.Thread(target=record, args=(node.target, run, None, time.time_ns(), stop))
    recorder.start()
    started = time.monotonic()
    launch = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--node-rank", "0", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(REPO / "tests/e2e/torchrun_worker.py"),
         "--agent", node.target, "--steps", str(STEPS)],
        env=clean_env(SLURM_JOB_ID="4242", CUDA_VISIBLE_DEVICES="4,5"), capture_output=True, text=True, timeout=120)
    assert launch.returncode == 0, launch.stderr[-3000:]
    trained = time.monotonic() - started
    ranks = sorted((json.loads(line) for line in launch.stdout.splitlines() if line.startswith("{")),
                   key=lambda r: r["rank"])
    assert [(r["job"], r["rank"], r["gpu"], r["device_uuid"]) for r in ranks] == [("4242", 0, 4, ""),
                                                                                  ("4242", 1, 5, "")]
    assert all(r["stats"]["dropped"] == 0 for r in ranks)
    markers = 2 * STEPS * 2 * (1 + 3 + 2)  # per rank and step: the step, three phases, two all_reduce
    assert wait_until(lambda: metric_sum(node.metrics(), "chopper_agent_step_summaries_total") >= 2 * STEPS,
                      timeout_s=30)
    summarised_ns = time.time_ns()
    assert wait_until(lambda: bool(observed) and observed[0].markers >= markers
                      and observed[0].last_sample_ns > summarised_ns, timeout_s=30)
    stop.set()
    recorder.join(30)
    capsys.readouterr()
    assert cli.main(["attribute", "--json", str(run)]) == 0  # the command, in this process: no second start-up
    steps = json.loads(capsys.readouterr().out)["steps"]
    seen = {(s["job"], s["rank"], s["gpu"]) for s in steps}
    assert seen == {("4242", 0, 4), ("4242", 1, 5)}, seen
    assert len(steps) == 2 * STEPS and not any("unknown_device" in s["flags"] for s in steps)
    # Live, the agent's per-rank series carry the same identity, and the simulated GPUs 4 and 5 ran them.
    text = node.metrics()
    for rank, gpu in ((0, "4"), (1, "5")):
        assert metric_sum(text, "chopper_rank_steps_total", training_job="4242", rank=str(rank), gpu=gpu) == STEPS
    assert "job=\"none\"" not in text and "job=\"default\"" not in text
    print(f"torchrun job trained in {trained:.1f} s")


def test_a_device_uuid_the_node_does_not_have_is_flagged_and_training_goes_on(node: AgentProcess) -> None:
    foreign = "GPU-deadbeef-0000-4000-8000-000000000000"
    code = ("import chopper\n"
            f"c = chopper.init(agent={node.target!r})\n"
            "for i in range(5):\n"
            "    with chopper.step(i, flops=1e9):\n"
            "        with chopper.phase('forward'):\n"
            "            sum(range(10000))\n"
            "chopper.shutdown(30.0)\n"
            "print(chopper.stats()['sent'], c.gpu, c.device_uuid)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=clean_env(CHOPPER_JOB="foreign-gpu", CUDA_VISIBLE_DEVICES=foreign))
    assert out.returncode == 0, out.stderr  # training unaffected
    assert out.stdout.split() == ["20", "-1", foreign]  # every marker delivered
    (warning,) = [line for line in out.stderr.splitlines() if "event=unknown_device" in line]
    assert f"device UUID {foreign} is not a GPU of node 'e2e-node'" in warning
    assert f"CUDA_VISIBLE_DEVICES='{foreign}'" in warning and "set CHOPPER_GPU" in warning
    assert wait_until(lambda: metric_sum(node.metrics(), "chopper_rank_flagged_steps_total", training_job="foreign-gpu",
                                         flag="unknown_device") == 5, timeout_s=30)
    agent_log = [line for line in node.log().splitlines() if "event=unknown_device" in line]
    assert len(agent_log) == 1 and "job 'foreign-gpu' rank 0 drives device" in agent_log[0]
    assert "is not a GPU of node 'e2e-node' (8 GPUs" in agent_log[0]
