"""The check's training job: an MLP whose FLOPs are known exactly, timed without our markers.

The model is ``layers`` square ``Linear(width, width, bias=False)`` layers with ReLU between
them, trained with plain SGD on one fixed batch of ``batch`` rows, so the device time is almost
all matrix multiplication and the FLOPs of a step follow from the shapes:

- forward: ``2 · batch · width²`` per layer;
- backward: the weight gradient (``2 · batch · width²``) of every layer and the input gradient
  (the same again) of every layer but the first, whose input needs no gradient.

So a step is ``2 · batch · width² · (3 · layers − 1)`` FLOPs. ``count_flops`` measures the same
with ``torch.utils.flop_counter.FlopCounterMode`` over one real step; the two must agree, and
the measured count is what the markers carry and what MFU is computed from.

``timed_loop`` trains for a wall-clock duration and times the loop on its own: on a GPU with a
pair of timing events around the whole loop on the training stream (``torch.cuda.Event``, which
is HIP's on ROCm) and one synchronize at the end; on the CPU, where every kernel finishes before
the call returns, with ``time.perf_counter``. Neither uses Chopper's markers, so the FLOP-derived
MFU built on it is an independent measurement.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class Shape:
    """The MLP: ``layers`` × ``Linear(width, width)`` trained on ``batch`` rows of ``dtype``."""

    width: int
    layers: int
    batch: int
    dtype: str

    def flops_per_step(self) -> float:
        """Matrix-multiply FLOPs of one forward + backward step (module docstring)."""
        return 2.0 * self.batch * self.width**2 * (3 * self.layers - 1)


# On a GPU: ~25 TFLOP per step in BF16 (tens of ms on a current data-centre GPU), 1 GiB of
# weights, so the step is compute-bound and the tensor cores are what limits it.
GPU_SHAPE = Shape(width=8192, layers=8, batch=8192, dtype="bfloat16")
# On a CPU (the dry run): a few ms per step in FP32, which CPUs multiply fastest.
CPU_SHAPE = Shape(width=256, layers=4, batch=128, dtype="float32")


@dataclass(frozen=True)
class Job:
    """A model, its optimizer and the batch it trains on, all on ``device``."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    batch: torch.Tensor
    device: torch.device
    shape: Shape


@dataclass(frozen=True)
class LoopTime:
    """Steps trained and how long they took, measured by ``timer``.

    Attributes:
        steps: Steps completed inside the timed window.
        seconds: Device (GPU) or wall (CPU) seconds from before the first step to after the last.
        timer: ``"device events"`` or ``"perf_counter"``.
    """

    steps: int
    seconds: float
    timer: str


def build(shape: Shape, device: torch.device, seed: int = 0) -> Job:
    """The model, an SGD optimizer (no momentum: no state to update) and a fixed batch on ``device``."""
    torch.manual_seed(seed)
    dtype = getattr(torch, shape.dtype)
    layers: list[nn.Module] = []
    for i in range(shape.layers):
        if i:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(shape.width, shape.width, bias=False))
    model = nn.Sequential(*layers).to(device=device, dtype=dtype)
    # A tiny rate keeps the weights, and so the arithmetic, unchanged in practice over minutes.
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    batch = torch.randn(shape.batch, shape.width, device=device, dtype=dtype)
    return Job(model, optimizer, batch, device, shape)


def train_step(job: Job) -> None:
    """One step as a user writes it: forward, loss, backward, optimizer step, zero_grad."""
    out = job.model(job.batch)
    loss = out.float().pow(2).mean()
    loss.backward()
    job.optimizer.step()
    job.optimizer.zero_grad(set_to_none=True)


def count_flops(job: Job) -> float:
    """FLOPs of one real step as torch's ``FlopCounterMode`` counts them (matrix multiplies)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        train_step(job)
    return float(counter.get_total_flops())


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_for(job: Job, seconds: float) -> int:
    """Train for ``seconds`` of wall time (warm-up: kernels chosen, clocks up); returns the steps."""
    steps = _loop(job, seconds)
    _synchronize(job.device)
    return steps


def timed_loop(job: Job, seconds: float) -> LoopTime:
    """Train for ``seconds`` of wall time and time the whole loop independently of any marker."""
    if job.device.type == "cuda":
        _synchronize(job.device)
        begin: Any = torch.cuda.Event(enable_timing=True)
        end: Any = torch.cuda.Event(enable_timing=True)
        begin.record()
        steps = _loop(job, seconds)
        end.record()
        end.synchronize()
        return LoopTime(steps, begin.elapsed_time(end) / 1e3, "device events")
    t0 = time.perf_counter()
    steps = _loop(job, seconds)
    return LoopTime(steps, time.perf_counter() - t0, "perf_counter")


def _loop(job: Job, seconds: float) -> int:
    steps = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        train_step(job)
        steps += 1
    return steps
