"""A real, small PyTorch training job instrumented with the Chopper client (used by the demo).

Each rank trains a two-layer decoder-only transformer language model on random tokens on the
CPU, with torch.distributed over gloo. Gradients are averaged with an explicit ``all_reduce`` so
that the collective is visible (the framework integrations make this automatic later). Every
step is marked: ``step`` (with FLOPs = 6 × parameters × tokens and the token count), phases
``forward``, ``backward``, ``optimizer`` and the collective ``all_reduce`` with its bytes.

Run as ``python -m chopper.demo.train --agent unix:///path.sock --duration 60 --ranks 2``, or with
``--agents A,B`` to spread the ranks over several agents (several simulated nodes on one machine):
rank ``r`` of ``R`` reports to ``agents[r * len(agents) // R]`` and drives the local GPU numbered
from 0 on that agent. ``--slow-rank R --slow-ms M`` makes rank R's forward phase M ms longer, which
is what a thermally throttled GPU does to a real job (CPU ranks have no clock to throttle).

``--gpu-time`` makes each step stand in for a step of a real model on the rank's GPU
(``chopper.demo.gputime``): the steps declare that model's FLOPs, tokens and gradient bytes, the
real CPU work shrinks to ``GPU_TIME_BATCH`` × ``GPU_TIME_SEQ`` tokens, and each phase lasts as
long as it would on that GPU at the clock the agent samples, so a throttled GPU slows its rank.
The last stdout line also carries each rank's own wall-clock seconds of its steps, timed without
the markers.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import chopper
from chopper.demo.gputime import ClockWatch, GpuTime, StandIn
from chopper.runs import consumer

VOCAB, DIM, HEADS, LAYERS, SEQ, BATCH = 1024, 256, 4, 2, 128, 8
# The CPU work of a --gpu-time step: small enough to fit inside the GPU time of every phase even
# on a busy CPU, so that the GPU model, not the host, sets the pace.
GPU_TIME_BATCH, GPU_TIME_SEQ = 2, 64


class TinyDecoder(nn.Module):
    """Embedding, ``LAYERS`` causal transformer blocks, and a vocabulary head, for ``seq`` tokens."""

    def __init__(self, seq: int = SEQ) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        block = nn.TransformerEncoderLayer(DIM, HEADS, 4 * DIM, dropout=0.0, batch_first=True, norm_first=True)
        # Nested tensors do not apply with norm_first; asking for them only earns a warning.
        self.blocks = nn.TransformerEncoder(block, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(DIM, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens), mask=self.mask, is_causal=True))


class DemoTrainer:
    """One rank's model, optimizer and data, stepping with markers on every phase.

    Args:
        world: Number of ranks; gradients are averaged over them with ``all_reduce``.
        gpu_time: Hold every phase for its time on the rank's GPU and declare the stand-in model's
            FLOPs, tokens and gradient bytes (``--gpu-time``); None: the CPU model's own.
    """

    def __init__(self, world: int, gpu_time: GpuTime | None = None) -> None:
        self.world, self.gpu_time = world, gpu_time
        self.batch, self.seq = (BATCH, SEQ) if gpu_time is None else (GPU_TIME_BATCH, GPU_TIME_SEQ)
        self.model = TinyDecoder(self.seq)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        n_params = sum(p.numel() for p in self.params)
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-3)
        self.loss_fn = nn.CrossEntropyLoss()
        if gpu_time is None:
            self.tokens_per_step = self.batch * self.seq
            self.flops_per_step = 6.0 * n_params * self.tokens_per_step
            self.grad_bytes = n_params * 4
        else:
            self.tokens_per_step = gpu_time.model.tokens
            self.flops_per_step = gpu_time.model.flops
            self.grad_bytes = gpu_time.model.grad_bytes

    slow_s = 0.0

    def _hold(self, began: float, phase: str) -> None:
        """With ``gpu_time``: wait until ``phase``, begun at ``began``, has lasted its GPU time."""
        if self.gpu_time is not None:
            rest = self.gpu_time.seconds(phase) - (time.perf_counter() - began)
            if rest > 0:
                time.sleep(rest)

    def step(self, i: int, marks: Any = chopper) -> None:
        """Train one step, marked through ``marks`` (``chopper``, or anything with its API)."""
        batch = torch.randint(0, VOCAB, (self.batch, self.seq + 1))
        with marks.step(i, flops=self.flops_per_step, tokens=self.tokens_per_step):
            with marks.phase("forward"):
                began = time.perf_counter()
                logits = self.model(batch[:, :-1])
                loss = self.loss_fn(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
                if self.slow_s:
                    time.sleep(self.slow_s)
                self._hold(began, "forward")
            with marks.phase("backward"):
                began = time.perf_counter()
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self._hold(began, "backward")
            with marks.collective("all_reduce", bytes=self.grad_bytes):
                grads = [p.grad for p in self.params if p.grad is not None]
                flat = torch.cat([g.reshape(-1) for g in grads])
                dist.all_reduce(flat)
                # Every rank has arrived here: the ring transfer of the stand-in's gradients follows.
                began = time.perf_counter()
                flat /= self.world
                offset = 0
                for grad in grads:
                    grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
                    offset += grad.numel()
                self._hold(began, "all_reduce")
            with marks.phase("optimizer"):
                began = time.perf_counter()
                self.optimizer.step()
                self._hold(began, "optimizer")


def placement(rank: int, world: int, agents: Sequence[str]) -> tuple[str, int]:
    """The agent rank ``rank`` of ``world`` reports to, and its GPU index on that agent's node."""
    k = rank * len(agents) // world
    first = next(r for r in range(world) if r * len(agents) // world == k)
    return agents[k], rank - first


def _gpu_time(agent: str, gpu: int, world: int) -> tuple[GpuTime, ClockWatch]:
    """The stand-in model timed on GPU ``gpu`` of ``agent``'s node, and the watch of its clock."""
    info = consumer.wait_for_info(agent, timeout_s=30.0)
    device = next((d for d in info.devices if d.gpu == gpu), None)
    if device is None:
        raise ValueError(f"--gpu-time: the agent at {agent} has no GPU {gpu} (it has {len(info.devices)}); "
                         "run fewer ranks or give the agent more GPUs")
    watch = ClockWatch(agent, gpu, device.max_gfx_clock_mhz)
    return GpuTime(StandIn(), device.peak_flops, device.max_gfx_clock_mhz, world, watch), watch


def train(rank: int, world: int, agent: str, job: str, duration_s: float, max_steps: int, port: int,
          gpu: int | None = None, slow_s: float = 0.0, gpu_time: bool = False) -> dict:
    """Train until ``duration_s`` or ``max_steps``; returns this rank's counts of what it marked,
    ``step_s``, the seconds its steps took by its own clock (``time.perf_counter``, no markers), and
    ``median_step_s``, the median of those steps' seconds (a truth that a few steps slowed by a busy
    machine do not move)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    gpu = rank if gpu is None else gpu
    chopper.init(job=job, rank=rank, agent=agent, gpu=gpu)
    timing, watch = _gpu_time(agent, gpu, world) if gpu_time else (None, None)
    trainer = DemoTrainer(world, timing)
    trainer.slow_s = slow_s
    counts: dict[str, Any] = {"steps": 0, "phases": 0, "collectives": 0}
    step_seconds: list[float] = []
    deadline = time.monotonic() + duration_s
    step = 0
    while step < max_steps:
        # Every rank must run the same number of steps (the all_reduce pairs them up), so rank 0
        # decides when to stop and tells the others with a tiny broadcast.
        flag = torch.tensor([1 if time.monotonic() < deadline else 0])
        dist.broadcast(flag, src=0)
        if not flag.item():
            break
        began = time.perf_counter()
        trainer.step(step)
        step_seconds.append(time.perf_counter() - began)
        counts["steps"] += 1
        counts["phases"] += 3
        counts["collectives"] += 1
        step += 1
    counts["step_s"] = sum(step_seconds)
    counts["median_step_s"] = statistics.median(step_seconds) if step_seconds else 0.0
    if watch is not None:
        watch.stop()
    chopper.shutdown(timeout=5.0)
    counts["client"] = chopper.stats()
    dist.destroy_process_group()
    return counts


def _worker(rank: int, args: argparse.Namespace, results: dict) -> None:
    if args.agents:
        agent, gpu = placement(rank, args.ranks, args.agents.split(","))
    else:
        agent, gpu = args.agent, rank
    slow_s = args.slow_ms / 1000 if rank == args.slow_rank else 0.0
    results[rank] = train(rank, args.ranks, agent, args.job, args.duration, args.max_steps, args.port, gpu, slow_s,
                          args.gpu_time)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--agent", help="agent gRPC target of every rank, e.g. unix:///run/chopper/agent.sock")
    target.add_argument("--agents", help="comma-separated agent targets; rank r goes to agents[r * len // ranks]")
    parser.add_argument("--job", default="demo", help="job name")
    parser.add_argument("--ranks", type=int, default=2, help="number of CPU ranks (gloo)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of training")
    parser.add_argument("--max-steps", type=int, default=10**9, help="stop after this many steps")
    parser.add_argument("--port", type=int, default=29533, help="torch.distributed rendezvous port")
    parser.add_argument("--slow-rank", type=int, default=-1, help="rank whose forward phase is slowed (-1: none)")
    parser.add_argument("--slow-ms", type=float, default=0.0, help="extra forward time of --slow-rank per step, ms")
    parser.add_argument("--gpu-time", action="store_true",
                        help="each step stands in for a 1.3 B-parameter model's step on the rank's GPU, paced by "
                             "the clock the agent samples (chopper.demo.gputime)")
    args = parser.parse_args(argv)
    if args.agents is not None and not all(a.strip() for a in args.agents.split(",")):
        parser.error("--agents needs comma-separated targets")
    if args.ranks < 1 or args.duration <= 0 or args.max_steps < 1:
        parser.error("--ranks, --duration and --max-steps must be positive")
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_worker, args=(args, results), nprocs=args.ranks, join=True)
        print(json.dumps({str(k): v for k, v in sorted(results.items())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
