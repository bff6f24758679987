"""One rank of a Hugging Face ``accelerate`` training job instrumented with ``chopper.pytorch.instrument``.

Launched by ``accelerate launch --multi_gpu --num_processes 2`` on a machine without GPUs, which
starts the ranks through torchrun; ``Accelerator(cpu=True)`` then joins them with gloo
(``DistributedType.MULTI_CPU``). The loop is accelerate's own idiom, instrumented with one line
after ``accelerator.prepare`` (the model comes back wrapped in DDP, and compiled when the launch
asks for a dynamo backend; the optimizer as an ``AcceleratedOptimizer``):

    model, opt = accelerator.prepare(model, opt)
    inst = chopper.pytorch.instrument(model, opt)
    with accelerator.accumulate(model):
        accelerator.backward(loss_fn(model(x), y)); opt.step(); opt.zero_grad()

The job name, agent and rank come from the environment (``CHOPPER_JOB``, ``CHOPPER_AGENT`` and
torchrun's ``RANK``). Each rank writes ``<out>/<rank>.json``: the types the wrappers had, the
steps and hook errors of the instrumentation, the collectives it saw and the client's counters.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn

import chopper
import chopper.pytorch as ctorch


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--steps", type=int, default=4, help="optimizer steps")
    p.add_argument("--accumulate", type=int, default=2, help="micro-batches per optimizer step")
    p.add_argument("--dim", type=int, default=1024)
    a = p.parse_args(argv)
    torch.set_num_threads(1)  # two ranks and their gloo threads share the machine
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=a.accumulate)
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(6):
        layers += [nn.Linear(a.dim, a.dim), nn.ReLU()]
    model: nn.Module = nn.Sequential(*layers[:-1])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = accelerator.prepare(model, opt)
    chopper.init()
    inst = ctorch.instrument(model, opt)  # the line under test
    gen = torch.Generator().manual_seed(accelerator.process_index)
    for _ in range(a.steps * a.accumulate):
        x, y = torch.randn(16, a.dim, generator=gen), torch.randn(16, a.dim, generator=gen)
        with accelerator.accumulate(model):
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()
    inst.remove()
    chopper.shutdown(timeout=10.0)
    a.out.joinpath(f"{accelerator.process_index}.json").write_text(json.dumps({
        "model": type(model).__name__, "optimizer": type(opt).__name__, "hooked": type(inst.optimizer).__name__,
        "chain": [type(m).__name__ for m in inst.chain], "distributed": str(accelerator.state.distributed_type),
        "steps": inst.steps, "errors": dict(inst.errors), "issued": dict(inst.collectives_issued),
        "marked": dict(inst.collectives_marked), "stats": chopper.stats(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
