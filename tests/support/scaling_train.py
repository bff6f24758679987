"""One rank of a weak-scaling gloo DDP job, launched by ``torchrun``: it times its own steps.

The measured side of the scaling validation (``tests/support/scaling_runs.py``): every rank does
the same work at every world size (same model, same rows per rank), so what changes between
configurations is only the gradient all-reduce, and the step time is timed here with
``time.perf_counter``, never from Chopper's markers. The job is instrumented as a user does it
(``chopper.pytorch.instrument``), so the recorded markers describe exactly the steps timed here.

Model: ``--layers`` ``nn.Linear(width, width)`` layers with ReLU between them, mean-squared error
against fixed random targets, ``--batch`` rows per rank (each rank its own rows), SGD, one CPU
thread per rank. DDP with one gradient bucket (``--bucket-mb`` above the gradients' size) that is
the gradients' own storage (``gradient_as_bucket_view``): the all-reduce starts when backward
ends and holds all the gradients, so each step is compute, then one all-reduce of ``grad_bytes``.

CPU share: a rank pins itself to core ``cores[LOCAL_RANK % len(cores)]`` (``--cores``) and runs at
nice ``--nice``. The harness runs both "nodes" (network namespaces) on one machine, so node a's
k-th core is node b's k-th core: every core holds one rank of each node, two ranks per core at
every world size, which keeps the per-rank compute the same from 2 ranks to 4.

Schedule: ``--warmup`` untimed steps, then ``--blocks`` blocks, each ``--settle`` untimed steps
after the harness set the block's link rate, then ``--block-steps`` timed steps. Before each
block, rank 0 writes the gate file ``block<k>.ready`` and waits for ``block<k>.go`` (the harness
sets the rate meanwhile); then every rank meets at a barrier that is not marked (``gate``). A step
is timed from before its forward to after ``zero_grad(set_to_none=False)``.

Output: ``--out``/``rank<RANK>.json``, written once at the end (to a temporary name, then
renamed): ``rank``, ``world_size``, ``local_rank``, ``core``, ``params``, ``grad_bytes``,
``tokens_per_step`` (rows of this rank per step), ``steps`` (``[step, block, seconds]`` of each
timed step; ``step`` is the number Chopper's markers carry, counted from 0 over every step),
``hook_errors`` and the client's ``stats``.

``torchrun --nnodes 2 --node-rank K --nproc-per-node N ... tests/support/scaling_train.py --out DIR``,
with ``CHOPPER_AGENT``, ``CHOPPER_JOB`` and ``GLOO_SOCKET_IFNAME`` set.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import chopper
import chopper.pytorch

# Taken before the instrumentation wraps torch.distributed: the gate is the harness's, not the job's.
_unmarked_barrier = dist.barrier
GATE_TIMEOUT_S = 120.0


def pin(cores: Sequence[int], local_rank: int, nice: int) -> int:
    """Run this process on its core at nice ``nice`` (module docstring); returns the core.

    Each torchrun worker is a session of its own: where the kernel groups processes by session
    (``/proc/self/autogroup``), a nice value only ranks processes within a group, so the group's
    nice is set too.
    """
    core = cores[local_rank % len(cores)]
    os.sched_setaffinity(0, {core})
    if nice:
        os.nice(nice)
        with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as group:
            group.write(str(nice))
    return core


def gate(directory: Path, name: str) -> None:
    """Rank 0 writes ``<name>.ready`` and waits for ``<name>.go``; then every rank meets (module docstring)."""
    if dist.get_rank() == 0:
        (directory / f"{name}.ready").touch()
        go = directory / f"{name}.go"
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while not go.exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"no {go} within {GATE_TIMEOUT_S:g} s: the harness went away")
            time.sleep(0.005)
    _unmarked_barrier()


def model(width: int, layers: int) -> nn.Module:
    blocks: list[nn.Module] = []
    for i in range(layers):
        blocks.append(nn.Linear(width, width))
        if i < layers - 1:
            blocks.append(nn.ReLU())
    return nn.Sequential(*blocks)


def train_step(ddp: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    """One training step; returns its seconds."""
    t0 = time.perf_counter()
    nn.functional.mse_loss(ddp(x), y).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)
    return time.perf_counter() - t0


def train(args: argparse.Namespace) -> dict[str, object]:
    """Train the schedule (module docstring); returns this rank's report."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    net = model(args.width, args.layers)
    ddp = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=args.bucket_mb, gradient_as_bucket_view=True)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1 + rank)
    x, y = torch.randn(args.batch, args.width, generator=gen), torch.randn(args.batch, args.width, generator=gen)
    chopper.init()
    inst = chopper.pytorch.instrument(ddp, optimizer, tokens_per_step=args.batch)
    timed: list[tuple[int, int, float]] = []
    step = 0
    for _ in range(args.warmup):
        train_step(ddp, optimizer, x, y)
        step += 1
    for block in range(args.blocks):
        gate(args.out, f"block{block}")
        for i in range(args.settle + args.block_steps):
            seconds = train_step(ddp, optimizer, x, y)
            if i >= args.settle:
                timed.append((step, block, seconds))
            step += 1
    inst.remove()
    params = sum(p.numel() for p in net.parameters())
    return {"rank": rank, "world_size": dist.get_world_size(), "params": params,
            "grad_bytes": 4 * params, "tokens_per_step": args.batch, "steps": timed,
            "hook_errors": dict(inst.errors)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for rank<RANK>.json")
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--batch", type=int, default=160, help="rows per rank per step")
    parser.add_argument("--bucket-mb", type=float, default=64.0, help="DDP bucket_cap_mb: above the gradients' size")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before the first block")
    parser.add_argument("--blocks", type=int, default=4, help="blocks, each at the rate the harness sets")
    parser.add_argument("--settle", type=int, default=1, help="untimed steps at the start of each block")
    parser.add_argument("--block-steps", type=int, default=6, help="timed steps per block")
    parser.add_argument("--cores", default="", help="comma-separated CPU ids (default: this process's)")
    parser.add_argument("--nice", type=int, default=0)
    args = parser.parse_args(argv)
    cores = [int(c) for c in args.cores.split(",")] if args.cores else sorted(os.sched_getaffinity(0))
    local_rank = int(os.environ["LOCAL_RANK"])
    core = pin(cores, local_rank, args.nice)
    torch.set_num_threads(1)
    report = train(args)
    chopper.shutdown(timeout=10.0)
    report.update(local_rank=local_rank, core=core, stats=chopper.stats())
    path = args.out / f"rank{report['rank']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report))
    tmp.rename(path)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
