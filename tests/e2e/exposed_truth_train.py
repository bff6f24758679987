"""One rank of a gloo training job that times its own steps with and without gradient synchronisation.

The independent side of the exposed-communication checks (``tests/e2e/test_exposed_truth.py``,
``benchmarks/bench_exposed_truth.py``): the cost of gradient synchronisation is measured here,
with ``time.perf_counter``, as the step time with synchronisation minus the step time of the same
job without it, and never from Chopper's markers. The job is instrumented the way a user does it
(``chopper.pytorch.instrument``, or ``chopper.hf.ChopperCallback`` for the Trainer), so the markers
the agent receives describe exactly the steps timed here.

Model: ``--layers`` ``nn.Linear(width, width)`` layers with ReLU between them, mean-squared error
against fixed random targets, each rank on its own fixed random batch (so unsynchronised gradients
differ between ranks), SGD, one CPU thread per rank. Frameworks (``--framework``):

* ``ddp``: ``DistributedDataParallel``; no sync = ``with model.no_sync():`` around forward and
  backward.
* ``fsdp2``: ``fully_shard`` on every layer and the root; no sync =
  ``model.set_requires_gradient_sync(False)`` (the reduce-scatters are skipped, the all-gathers
  still run).
* ``hf``: ``transformers.Trainer`` (which wraps the model in DDP through accelerate); no sync = a
  Trainer whose ``training_step`` runs under the DDP wrapper's ``no_sync()``.

Schedule, by optimizer step: ``--warmup`` synchronised steps, then ``--blocks`` blocks of
``--cycles`` cycles; a cycle runs each mode once: ``sync``, ``nosync`` and, with ``--slow-ms``,
``slow`` (synchronised, and rank ``--slow-rank`` sleeps that long at the start of its forward),
in reverse order every other cycle so drifts of a shared machine fall on every mode alike. Before
each block, rank 0 prints ``{"block": k}`` and waits for ``go`` on stdin (the harness sets that
block's link rate meanwhile), then the ranks meet at a barrier that is not marked.

A step is timed from before its forward to after ``zero_grad`` (HF: from ``on_step_begin`` to
``on_step_end``). ``zero_grad(set_to_none=False)`` keeps gradients allocated, so the optimizer
does the same work in both modes. Evidence that a no-sync step really skipped the collective:
``ddp``/``hf`` report the sum of the first layer's weight gradient before the optimizer step (equal
on both ranks only after an all-reduce), ``fsdp2`` the number of ``reduce_scatter_single`` calls
of the step, counted by a wrapper of its own.

The kernel's account of the training thread over each step (``/proc/thread-self/schedstat``: the
nanoseconds it ran on a CPU and waited runnable in a run queue) splits the step's time into
running, runnable-but-displaced and off CPU (blocked: sleeping in a wait); the backward pass of
CPU tensors runs on the thread that calls it, and with one intra-op thread all of the step's
compute is on that thread, so what synchronisation adds to its off-CPU time is the time it waited
for communication, measured by the scheduler rather than by markers.

Output: the last stdout line is JSON: ``rank``, ``framework``, ``params``, ``grad_bytes``,
``steps`` (``[step, block, mode, seconds, evidence, arrival, run_s, runqueue_s, synced]`` per step
after warm-up; ``step`` is the number Chopper's markers carry; ``arrival``, ``ddp``/``fsdp2`` only, is
``time.perf_counter`` (CLOCK_MONOTONIC, one clock for every process of the machine) when the step's
last gradient was accumulated, i.e. when this rank was ready to synchronise, and ``synced`` when
its ``backward()`` returned, which DDP and FSDP2 hold until the gradient collectives are done;
``run_s`` and ``runqueue_s`` are the training thread's scheduler times over the step),
``hook_errors`` and the client's ``stats``.

Run by the harness inside a network namespace, with ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``GLOO_SOCKET_IFNAME``, ``CHOPPER_AGENT`` and ``CHOPPER_JOB`` set:
``python -m tests.e2e.exposed_truth_train --framework ddp --blocks 2 --cycles 4``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import chopper

# Taken before any instrumentation wraps torch.distributed: the block gate is the harness's, not the job's.
_unmarked_barrier = dist.barrier
FRAMEWORKS = ("ddp", "fsdp2", "hf")


class Net(nn.Module):
    """``layers`` square linear layers; ``sleep_s`` is slept at the start of every forward."""

    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.sleep_s = 0.0

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else torch.relu(layer(x))
        return {"loss": nn.functional.mse_loss(x, labels)}


class Schedule:
    """Which mode each optimizer step runs and which block it is in (module docstring)."""

    def __init__(self, warmup: int, blocks: int, cycles: int, slow: bool) -> None:
        self.warmup = warmup
        self.modes = ("sync", "nosync", "slow") if slow else ("sync", "nosync")
        self.block_steps = cycles * len(self.modes)
        self.total = warmup + blocks * self.block_steps

    def block(self, step: int) -> int:
        """The block of ``step``; -1 during warm-up."""
        return -1 if step < self.warmup else (step - self.warmup) // self.block_steps

    def mode(self, step: int) -> str:
        if step < self.warmup:
            return "sync"
        cycle, pos = divmod(step - self.warmup, len(self.modes))
        return (self.modes if cycle % 2 == 0 else self.modes[::-1])[pos]

    def starts_block(self, step: int) -> bool:
        return step >= self.warmup and (step - self.warmup) % self.block_steps == 0


def thread_sched_s() -> tuple[float, float]:
    """The calling thread's (time on a CPU, time runnable in a run queue) since it started, seconds."""
    with open("/proc/thread-self/schedstat") as f:
        run_ns, runqueue_ns, _slices = f.read().split()
    return int(run_ns) / 1e9, int(runqueue_ns) / 1e9


def gate(block: int) -> None:
    """Rank 0 asks the harness for block ``block`` and waits for ``go``; then every rank meets."""
    if dist.get_rank() == 0:
        print(json.dumps({"block": block}), flush=True)
        answer = sys.stdin.readline().strip()
        if answer != "go":
            raise SystemExit(f"expected 'go' on stdin before block {block}, got {answer!r}: the harness went away")
    _unmarked_barrier()


class Recorder:
    """Per-step records of one rank: ``[step, block, mode, seconds, evidence, arrival, run_s, runqueue_s, synced]``.

    Only steps after warm-up are kept; ``begin`` and ``end`` run on the training thread.
    """

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.rows: list[list[Any]] = []
        self._t0 = 0.0
        self.evidence: float | int | None = None
        self.arrival: float | None = None
        self.synced: float | None = None
        self._sched0 = (0.0, 0.0)

    def begin(self, step: int, net: Net, slowed: float) -> str:
        """Gate a new block, set the step's sleep and start its clock; returns its mode."""
        if self.schedule.starts_block(step):
            gate(self.schedule.block(step))
        mode = self.schedule.mode(step)
        net.sleep_s = slowed if mode == "slow" else 0.0
        self.evidence = self.arrival = self.synced = None
        self._sched0 = thread_sched_s()
        self._t0 = time.perf_counter()
        return mode

    def end(self, step: int) -> None:
        seconds = time.perf_counter() - self._t0
        run_s, runqueue_s = (b - a for a, b in zip(self._sched0, thread_sched_s(), strict=True))
        if step >= self.schedule.warmup:
            self.rows.append([step, self.schedule.block(step), self.schedule.mode(step), seconds, self.evidence,
                              self.arrival, run_s, runqueue_s, self.synced])


def grad_sum(net: Net) -> float:
    first = net.layers[0]
    assert isinstance(first, nn.Linear)
    grad = first.weight.grad
    return float(grad.sum()) if grad is not None else float("nan")


@contextlib.contextmanager
def counting(counts: list[int], name: str) -> Iterator[None]:
    """Count calls of ``torch.distributed.<name>`` into ``counts[0]`` while active."""
    orig = getattr(dist, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        counts[0] += 1
        return orig(*args, **kwargs)

    setattr(dist, name, wrapper)
    try:
        yield
    finally:
        setattr(dist, name, orig)


def train_loop(args: argparse.Namespace, schedule: Schedule, rec: Recorder) -> dict[str, Any]:
    """DDP or FSDP2 in a plain loop instrumented with ``chopper.pytorch.instrument``."""
    import chopper.pytorch as ctorch

    dist.init_process_group("gloo")
    net = Net(args.width, args.layers)
    model: nn.Module
    counts = [0]
    if args.framework == "ddp":
        model = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=args.bucket_mb or None,
                                                    gradient_as_bucket_view=args.bucket_view)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in net.layers:
            fully_shard(layer, mesh=mesh)
        fsdp = fully_shard(net, mesh=mesh)
        model = net  # the same object: fully_shard changes the module's class in place
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    x, y = batch(args, dist.get_rank())
    chopper.init()
    inst = ctorch.instrument(model, optimizer, tokens_per_step=args.batch)
    slowed = args.slow_ms / 1e3 if dist.get_rank() == args.slow_rank else 0.0
    # The first layer's weight gradient is the last one backward computes: when this rank is ready
    # to synchronise, on the machine-wide monotonic clock both ranks share.
    first = net.layers[0]
    assert isinstance(first, nn.Linear)
    first.weight.register_post_accumulate_grad_hook(lambda _: setattr(rec, "arrival", time.perf_counter()))
    with counting(counts, "reduce_scatter_single"):
        for step in range(schedule.total):
            mode = rec.begin(step, net, slowed)
            before = counts[0]
            if args.framework == "ddp":
                assert isinstance(model, nn.parallel.DistributedDataParallel)
                with model.no_sync() if mode == "nosync" else contextlib.nullcontext():
                    model(x, y)["loss"].backward()
                rec.synced = time.perf_counter()
                rec.evidence = grad_sum(net)
            else:
                fsdp.set_requires_gradient_sync(mode != "nosync")
                model(x, y)["loss"].backward()
                rec.synced = time.perf_counter()
                rec.evidence = counts[0] - before
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
            rec.end(step)
    inst.remove()
    return {"hook_errors": dict(inst.errors), "params": sum(p.numel() for p in net.parameters())}


def batch(args: argparse.Namespace, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1 + rank)
    return (torch.randn(args.batch, args.width, generator=gen), torch.randn(args.batch, args.width, generator=gen))


def train_hf(args: argparse.Namespace, schedule: Schedule, rec: Recorder) -> dict[str, Any]:
    """The same model under ``transformers.Trainer`` with ``chopper.hf.ChopperCallback``."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    import chopper.hf

    rank = int(os.environ["RANK"])
    net = Net(args.width, args.layers)
    slowed = args.slow_ms / 1e3 if rank == args.slow_rank else 0.0
    errors: dict[str, int] = {}

    class Rows(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
        """This rank's fixed batch, row by row; the sampler splits it, so each rank gets its own rows."""

        def __init__(self) -> None:
            self.x = torch.cat([batch(args, r)[0] for r in range(2)])
            self.y = torch.cat([batch(args, r)[1] for r in range(2)])

        def __len__(self) -> int:
            return self.x.shape[0] * schedule.total

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"x": self.x[i % self.x.shape[0]], "labels": self.y[i % self.x.shape[0]]}

    callback = chopper.hf.ChopperCallback(tokens_per_step=args.batch)

    class Timing(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            rec.begin(state.global_step, net, slowed)

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            rec.evidence = grad_sum(net)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            rec.end(state.global_step - 1)  # global_step counts the step that just ended

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if callback.instrumentation is not None:  # this callback runs first: the hooks are still there
                errors.update(callback.instrumentation.errors)

    class ScheduledTrainer(Trainer):  # type: ignore[misc]
        def training_step(self, model: nn.Module, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
            skip = schedule.mode(self.state.global_step) == "nosync"
            no_sync: Callable[[], Any] = getattr(model, "no_sync", contextlib.nullcontext)
            with no_sync() if skip else contextlib.nullcontext():
                return super().training_step(model, inputs, num_items_in_batch)  # type: ignore[no-any-return]

    with tempfile.TemporaryDirectory(prefix="exposed-truth-hf") as out:
        targs = TrainingArguments(
            output_dir=out, per_device_train_batch_size=args.batch, max_steps=schedule.total, use_cpu=True,
            ddp_backend="gloo", ddp_find_unused_parameters=False, ddp_bucket_cap_mb=args.bucket_mb or None,
            report_to=[], save_strategy="no",
            logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0, optim="sgd", learning_rate=1e-4,
            lr_scheduler_type="constant", data_seed=0, seed=0)
        trainer = ScheduledTrainer(model=net, args=targs, train_dataset=Rows(), callbacks=[Timing(), callback])
        trainer.train()
    return {"hook_errors": errors, "params": sum(p.numel() for p in net.parameters())}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=FRAMEWORKS, required=True)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--batch", type=int, default=160, help="rows per rank per step")
    parser.add_argument("--bucket-mb", type=float, default=0.0,
                        help="DDP bucket_cap_mb (0: DDP's default, a 1 MiB first bucket then 25 MB)")
    parser.add_argument("--bucket-view", action="store_true",
                        help="DDP gradient_as_bucket_view: no copies between gradients and buckets")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--cycles", type=int, default=4)
    parser.add_argument("--slow-ms", type=float, default=0.0, help="with it, a third mode: this rank sleeps")
    parser.add_argument("--slow-rank", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # one core per rank: the ranks share a small machine
    torch.manual_seed(0)
    schedule = Schedule(args.warmup, args.blocks, args.cycles, args.slow_ms > 0)
    rec = Recorder(schedule)
    run = train_hf if args.framework == "hf" else train_loop
    figures = run(args, schedule, rec)
    rank = dist.get_rank()
    chopper.shutdown(timeout=10.0)
    print(json.dumps({"rank": rank, "framework": args.framework, "grad_bytes": 4 * figures["params"],
                      "steps": rec.rows, "client": chopper.stats(), **figures}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
