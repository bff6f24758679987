"""A real gloo job that hangs inside a collective: one rank never leaves backward, the others wait in all_reduce.

``python -m tests.e2e.hang_train --agent TARGET --rank R --world W --port P --hang-step S --hang-rank H``
is one rank of a W-rank job ``hang`` on torch.distributed over gloo (CPU). Every step is marked:
``step``, phase ``forward`` (a small matmul), phase ``backward``, then the collective ``all_reduce``
of a 1 MiB tensor. At step S, rank H sleeps inside ``backward`` until it is killed, so the other
ranks block inside ``all_reduce`` of step S: a real hang, as a rank stuck in a data-dependent
branch or a dead NCCL peer makes one. The process group's timeout (600 s) outlasts the test,
which kills every rank. Each rank prints ``rank R at step S`` (stdout, one write) when it reaches
the hang step, so a test knows the hang began.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

import chopper


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--hang-step", type=int, default=3)
    parser.add_argument("--hang-rank", type=int, default=1)
    args = parser.parse_args(argv)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world, timeout=datetime.timedelta(seconds=600))
    torch.set_num_threads(1)
    chopper.init(job="hang", rank=args.rank, agent=args.agent, gpu=args.rank)
    weights = torch.randn(256, 256)
    grads = torch.zeros(256 * 1024)
    for step in range(10**6):
        with chopper.step(step, flops=2 * 256**3, tokens=256):
            with chopper.phase("forward"):
                out = weights @ torch.randn(256, 256)
            with chopper.phase("backward"):
                grads.copy_(out.flatten().repeat(4)[: grads.numel()])
                if step == args.hang_step:
                    sys.stdout.write(f"rank {args.rank} at step {step}\n")
                    sys.stdout.flush()
                    if args.rank == args.hang_rank:
                        while True:  # until the test kills it
                            time.sleep(3600)
            with chopper.collective("all_reduce", bytes=grads.numel() * 4):
                dist.all_reduce(grads)
        time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
