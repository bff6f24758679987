"""A real 2-rank gloo training loop for ``torchrun`` to launch: identity comes from the launcher's environment.

``torchrun ... tests/e2e/torchrun_worker.py --agent unix:///... --steps N``. Each rank prints one
JSON line: the identity ``chopper.init()`` resolved and the steps it trained.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.distributed as dist

import chopper


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agent", required=True)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    dist.init_process_group("gloo")  # env:// from torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    client = chopper.init(agent=args.agent)  # job, rank and GPU from the environment only
    torch.manual_seed(dist.get_rank())
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256)
    for i in range(args.steps):
        with chopper.step(i, flops=6.0 * 64 * 256 * 256, tokens=64):
            with chopper.phase("forward"):
                loss = model(x).square().mean()
            with chopper.phase("backward"):
                loss.backward()
            for p in model.parameters():
                assert p.grad is not None
                with chopper.collective("all_reduce", bytes=p.grad.numel() * 4):
                    dist.all_reduce(p.grad)
            with chopper.phase("optimizer"):
                opt.step()
                opt.zero_grad()
    chopper.shutdown(30.0)
    # One write of the whole line: print() writes the text and the newline apart under
    # PYTHONUNBUFFERED, and the two ranks' lines then interleave on torchrun's shared stdout.
    line = json.dumps({"job": client.job, "rank": client.rank, "gpu": client.gpu, "device_uuid": client.device_uuid,
                       "steps": args.steps, "stats": chopper.stats()})
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
