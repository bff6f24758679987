"""Two-rank gloo jobs that alternate steps with and without gradient synchronisation.

Each rank is instrumented the way a user does it (``chopper.pytorch.instrument``, or
``chopper.hf.ChopperCallback`` for the Trainer) and sends its markers over real gRPC to an
in-process servicer, and it times its own steps with ``time.perf_counter_ns``. The independent
truth for exposed communication is then the median step time with synchronisation minus the median
step time without it, on the same rank, in the same job; Chopper's figure is the exposed time of
the markers (``chopper.attribution.exposed_comm``), per step, with synchronisation minus without.

Model: ``layers`` ``nn.Linear(dim, dim)`` layers with ReLU between them, mean-squared error, SGD,
one CPU thread per rank (``torch.set_num_threads(1)``: the gloo threads of both ranks still share
the machine with the compute). Steps alternate ``sync`` (even) and ``nosync`` (odd) after
``warmup`` synchronised steps, so a shared machine's drift falls on both alike. Kinds:

* ``ddp``: ``DistributedDataParallel`` (``bucket_cap_mb=bucket_mb``, gradients as bucket views); no
  sync = ``model.no_sync()``.
* ``fsdp2``: ``fully_shard`` per layer and the root; no sync = ``set_requires_gradient_sync(False)``
  (the reduce-scatters go, the all-gathers stay).
* ``hf``: a ``transformers.Trainer`` wrapping a GPT-2 (4 layers, width 512, ~13 M parameters) in
  DDP itself (``ddp_bucket_cap_mb=bucket_mb``); no sync = ``training_step`` under the DDP wrapper's
  ``no_sync()``; timed from ``on_step_begin`` to ``on_step_end``.

On two shared cores, an all-reduce that overlaps backward takes CPU from it, and synchronisation
adds computation of its own (DDP's averaging and bucket copies, FSDP's reduce-scatter copy-in and
copy-out): both lengthen the step with synchronisation without being communication that no
computation covers, so the truth is an upper bound of the exposed time here, approached when one
bucket is all-reduced after the backward (``bucket_mb`` above the gradient size).

A step is timed from before its forward to after ``optimizer.step()``; ``zero_grad(set_to_none=False)``
keeps gradients allocated so the optimizer does the same work in both modes.

Run: ``python -m tests.support.sync_truth_jobs ddp fsdp2 hf --steps 24`` prints, per job and
rank, Chopper's exposed communication against the truth (milliseconds).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import chopper
from agent.markers import batch_markers
from chopper.attribution.exposed_comm import exposed_seconds
from chopper.attribution.markers import paired_intervals
from chopper.demo.run import free_port
from chopper.proto.chopper.v1 import agent_pb2, agent_pb2_grpc
from chopper.schema import MarkerKind

KINDS = ("ddp", "fsdp2", "hf")


class Recorder(agent_pb2_grpc.AgentServicer):
    """A minimal agent keeping every (rank, marker) it receives."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: list[tuple[int, agent_pb2.Marker]] = []

    def PushMarkers(self, request_iterator: Iterator[agent_pb2.MarkerBatch], context: grpc.ServicerContext):
        n = 0
        for batch in request_iterator:
            markers = batch_markers(batch)
            with self.lock:
                self.rows += [(batch.rank, m) for m in markers]
            n += len(markers)
        return agent_pb2.PushMarkersResponse(accepted=n)


def received(job: str, train: Callable[[str, str], None]) -> pd.DataFrame:
    """Run ``train(agent_target, workdir)`` against an in-test agent; the markers it got, one row each."""
    with tempfile.TemporaryDirectory(prefix="chp", dir="/tmp") as d:  # short: sun_path holds 108 bytes
        sock = Path(d) / "agent.sock"
        rec = Recorder()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        agent_pb2_grpc.add_AgentServicer_to_server(rec, server)
        assert server.add_insecure_port(f"unix://{sock}") != 0
        server.start()
        try:
            train(f"unix://{sock}", d)
        finally:
            server.stop(1.0)
    return pd.DataFrame([{"job": job, "rank": r, "kind": MarkerKind(m.kind).name.lower(), "name": m.name,
                          "step": m.step, "ts_ns": m.ts_ns, "flops": m.flops, "tokens": m.tokens, "bytes": m.bytes}
                         for r, m in rec.rows])


@dataclass(frozen=True)
class Job:
    """One job's shape: ``layers`` square linear layers of width ``dim`` on ``batch`` rows."""

    kind: str
    steps: int = 24
    warmup: int = 2
    dim: int = 1536
    layers: int = 6
    batch: int = 32
    bucket_mb: float = 25.0


def is_sync(job: Job, step: int) -> bool:
    """Whether step ``step`` synchronises gradients: the warm-up steps, then every even step."""
    return step < job.warmup or step % 2 == 0


def _mlp(job: Job) -> nn.Sequential:
    mods: list[nn.Module] = []
    for i in range(job.layers):
        mods.append(nn.Linear(job.dim, job.dim))
        if i < job.layers - 1:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def _worker(rank: int, job: Job, agent: str, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    chopper.init(job=job.kind, rank=rank, agent=agent, gpu=rank)
    times = _train_hf(rank, job, out) if job.kind == "hf" else _train_torch(rank, job)
    chopper.shutdown(timeout=10.0)
    Path(out, f"{rank}.json").write_text(json.dumps({"times": times, "stats": chopper.stats()}))
    dist.destroy_process_group()


def _train_torch(rank: int, job: Job) -> list[tuple[int, bool, float]]:
    import chopper.pytorch as ctorch

    model: Any = _mlp(job)
    if job.kind == "ddp":
        model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=job.bucket_mb, gradient_as_bucket_view=True)
    elif job.kind == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    inst = ctorch.instrument(model, opt)
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(job.batch, job.dim, generator=gen), torch.randn(job.batch, job.dim, generator=gen)
    times = []
    for step in range(job.steps):
        sync = is_sync(job, step)
        if job.kind == "fsdp2":
            model.set_requires_gradient_sync(sync)
        ctx = model.no_sync() if not sync and job.kind == "ddp" else contextlib.nullcontext()
        t0 = time.perf_counter_ns()
        with ctx:
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
        opt.step()
        t1 = time.perf_counter_ns()
        opt.zero_grad(set_to_none=False)
        times.append((step, sync, (t1 - t0) / 1e9))
    inst.remove()
    assert not inst.errors, dict(inst.errors)
    return times


def _train_hf(rank: int, job: Job, out: str) -> list[tuple[int, bool, float]]:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      HF_HUB_OFFLINE="1")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    import chopper.hf

    seq = 32
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 1024, (job.steps * job.batch, seq))]
    times: list[tuple[int, bool, float]] = []

    class Timer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.t0 = time.perf_counter_ns()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            step = state.global_step - 1
            times.append((step, is_sync(job, step), (time.perf_counter_ns() - self.t0) / 1e9))

    class Alternating(Trainer):  # type: ignore[misc]
        def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            if is_sync(job, self.state.global_step):
                return super().training_step(model, inputs, *args, **kwargs)
            with model.no_sync():
                return super().training_step(model, inputs, *args, **kwargs)

    # ~13 M parameters, like the linear jobs: gradient all-reduce of ~50 MB per step.
    model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=512, n_head=8, vocab_size=1024, n_positions=seq))
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=job.batch // 8, max_steps=job.steps,
                             use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
                             dataloader_num_workers=0, disable_tqdm=True, ddp_backend="gloo", max_grad_norm=0.0,
                             ddp_bucket_cap_mb=int(job.bucket_mb))
    # Timer first: its on_step_begin runs before the callback's, its on_step_end after.
    Alternating(model=model, args=args, train_dataset=data, callbacks=[Timer(), chopper.hf.ChopperCallback()]).train()
    return times


def run(job: Job) -> tuple[pd.DataFrame, dict[int, dict[str, Any]]]:
    """Train ``job`` on 2 gloo ranks; the markers received and each rank's step times and client stats."""
    reports: dict[int, dict[str, Any]] = {}

    def train(target: str, workdir: str) -> None:
        mp.spawn(_worker, args=(job, target, free_port(), workdir), nprocs=2, join=True)
        reports.update({r: json.loads(Path(workdir, f"{r}.json").read_text()) for r in range(2)})

    return received(job.kind, train), reports


def exposed_per_step(markers: pd.DataFrame, rank: int) -> dict[int, float]:
    """Exposed communication seconds per step of ``rank``, from its markers (the attribution's sweep)."""
    intervals, problems = paired_intervals(markers[markers["rank"] == rank])
    assert problems == [], problems
    step = intervals["step"].to_numpy(np.int64)
    n = int(step.max()) + 1
    exp = exposed_seconds(n, step, intervals["is_collective"].to_numpy(bool),
                          intervals["begin_ns"].to_numpy(np.int64), intervals["end_ns"].to_numpy(np.int64))
    return {int(s): float(exp[s]) for s in np.unique(step)}


def compare(job: Job, markers: pd.DataFrame, reports: dict[int, dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Per rank, in seconds: Chopper's exposed time with and without sync and the timed truth.

    ``ours`` = median exposed over sync steps − median over no-sync steps; ``truth`` = median step
    time with sync − median without; warm-up steps are left out of both.
    """
    result = {}
    for rank, rep in reports.items():
        exposed = exposed_per_step(markers, rank)
        rows = [(s, sync, t) for s, sync, t in rep["times"] if s >= job.warmup]
        t_sync = np.median([t for _, sync, t in rows if sync])
        t_nosync = np.median([t for _, sync, t in rows if not sync])
        e_sync = float(np.median([exposed.get(s, 0.0) for s, sync, _ in rows if sync]))
        e_nosync = float(np.median([exposed.get(s, 0.0) for s, sync, _ in rows if not sync]))
        result[rank] = {"step_sync": float(t_sync), "step_nosync": float(t_nosync), "truth": float(t_sync - t_nosync),
                        "exposed_sync": e_sync, "exposed_nosync": e_nosync, "ours": e_sync - e_nosync}
    return result


def within(ours: float, truth: float) -> bool:
    """The goal: ``|ours − truth| ≤ max(5 ms, 20 % of truth)``."""
    return abs(ours - truth) <= max(0.005, 0.2 * abs(truth))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kinds", nargs="+", choices=KINDS)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--dim", type=int, default=Job.dim, help="width of the linear layers (ddp, fsdp2)")
    p.add_argument("--bucket-mb", type=float, default=Job.bucket_mb, help="DDP bucket_cap_mb")
    a = p.parse_args(argv)
    print("job    rank  step_sync  step_nosync  truth  exposed_sync  exposed_nosync  ours  within (ms)")
    for kind in a.kinds:
        job = Job(kind, steps=a.steps, dim=a.dim, bucket_mb=a.bucket_mb)
        markers, reports = run(job)
        for rank, r in sorted(compare(job, markers, reports).items()):
            ms = {k: 1e3 * v for k, v in r.items()}
            print(f"{kind:6s} {rank:4d} {ms['step_sync']:10.1f} {ms['step_nosync']:12.1f} {ms['truth']:6.1f} "
                  f"{ms['exposed_sync']:13.1f} {ms['exposed_nosync']:15.1f} {ms['ours']:5.1f}  "
                  f"{within(r['ours'], r['truth'])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
