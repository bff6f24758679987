"""``chopper.pytorch.instrument`` after ``accelerator.prepare``: a real 2-process ``accelerate launch`` on gloo."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import chopper.pytorch as ctorch
from chopper.demo.run import free_port
from tests.support.sync_truth_jobs import exposed_per_step, received

pytest.importorskip("accelerate")

ROOT = Path(__file__).resolve().parents[2]
STEPS, ACCUMULATE = 4, 2


@pytest.mark.slow
@pytest.mark.parametrize("dynamo", ["no", "eager"])
def test_accelerate_launch_two_cpu_ranks(tmp_path: Path, dynamo: str) -> None:
    accelerate = Path(sys.executable).with_name("accelerate")

    def train(agent: str, _: str) -> None:
        env = {**os.environ, "CHOPPER_AGENT": agent, "CHOPPER_JOB": "acc", "PYTHONPATH": str(ROOT),
               "OMP_NUM_THREADS": "1"}
        # --multi_gpu on a machine without GPUs: torchrun starts both ranks, Accelerator(cpu=True) uses gloo.
        cmd = [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", dynamo, "--main_process_port", str(free_port()),
               "-m", "tests.chopper.accelerate_job", "--out", str(tmp_path), "--steps", str(STEPS),
               "--accumulate", str(ACCUMULATE)]
        subprocess.run(cmd, check=True, env=env, cwd=ROOT, timeout=540)

    markers = received("acc", train)
    for rank in range(2):
        rep = json.loads((tmp_path / f"{rank}.json").read_text())
        assert rep["distributed"] == "DistributedType.MULTI_CPU"
        assert rep["optimizer"] == "AcceleratedOptimizer" and rep["hooked"] == "AdamW"
        want_chain = ["DistributedDataParallel", "Sequential"]
        assert rep["chain"] == (want_chain if dynamo == "no" else ["OptimizedModule", *want_chain])
        assert rep["errors"] == {} and rep["steps"] == STEPS
        assert rep["stats"]["dropped"] == 0
        mine = markers[markers["rank"] == rank]
        for k in ("step_begin", "step_end"):  # optimizer steps, not micro-batches
            assert sorted(mine.loc[mine["kind"] == k, "step"]) == list(range(STEPS))
        ends = mine[mine["kind"] == "phase_end"]
        got = Counter(zip(ends["step"], ends["name"], strict=True))
        assert got == Counter({(s, p): 1 if p == "optimizer" else ACCUMULATE
                               for s in range(STEPS) for p in ("forward", "backward", "optimizer")}), got
        # accelerate skips the all-reduce of the micro-batches it runs under no_sync: one gradient
        # sync per optimizer step, every bucket marked with its bytes (6 layers of 1024² fp32 weights).
        coll = mine[(mine["kind"] == "collective_begin") & (mine["name"] == "all_reduce")]
        assert rep["issued"]["all_reduce"] == rep["marked"]["all_reduce"] == len(coll)
        assert sorted(set(coll["step"])) == list(range(STEPS))
        assert (coll["bytes"] > 0).all()
        assert coll.groupby("step")["bytes"].sum().min() >= 6 * 1024 * 1024 * 4
        # The all-reduce tail after the backward computation is exposed on every step.
        exposed = exposed_per_step(mine, rank)
        assert all(exposed[s] > 0 for s in range(STEPS)), exposed


@pytest.fixture
def accelerator() -> Iterator[Any]:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    yield Accelerator(cpu=True)
    AcceleratorState._reset_state(True)  # accelerate's state is process-wide


def test_wrappers_are_seen_through(accelerator: Any) -> None:
    from accelerate.optimizer import AcceleratedOptimizer

    model = nn.Linear(4, 4)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapped = accelerator.prepare_optimizer(inner)
    assert isinstance(wrapped, AcceleratedOptimizer)
    assert ctorch.unwrap_optimizer(wrapped) is inner
    assert ctorch.unwrap_optimizer(inner) is inner
    compiled = torch.compile(model, backend="eager")
    assert ctorch.wrapper_chain(compiled) == [compiled, model]
    inst = ctorch.instrument(compiled, wrapped)  # raised AttributeError on _optimizer_step_pre_hooks before
    try:
        assert inst.optimizer is inner
        for _ in range(2):
            compiled(torch.ones(2, 4)).sum().backward()
            wrapped.step()
            wrapped.zero_grad()
        assert inst.steps == 2 and inst.errors == {}
        with pytest.raises(ValueError, match="already instrumented"):  # the same torch optimizer, another wrapper
            ctorch.instrument(nn.Linear(4, 4), AcceleratedOptimizer(inner))
    finally:
        inst.remove()
