"""How long the demo job's phases would take on its GPU: the stand-in model behind ``--gpu-time``.

The demo trains a small transformer on the CPU. With ``--gpu-time`` each of its steps stands in
for one step of ``StandIn`` (by default a 1.3 B-parameter decoder, 16 × 2048 tokens per rank and
step, bf16 gradients, AdamW) on the rank's GPU, as the agent describes it (peak FLOP/s, maximum
clock) and samples it (clock). So a throttled GPU makes its rank slower, as it would on real
hardware, and the FLOPs the steps declare are those of that model. Algorithm, per step:

1. FLOPs ``F = 6·N·T`` (``N`` parameters, ``T`` tokens): forward ``2·N·T``, backward ``4·N·T``.
2. A compute phase of ``F_p`` FLOPs lasts ``F_p / (peak · η) · f_max / f``: ``η`` is the share of
   the peak the model's kernels reach at the maximum clock (their matrix efficiency), ``f`` the
   GPU's clock while it computes: the mean of the clocks the agent sampled over the last second,
   weighted by each sample's matrix activity (``ClockWatch``), ``f_max`` before any sample.
3. The optimizer step is memory-bound: ``optimizer_s`` whatever the clock.
4. The gradient all-reduce is a ring over ``R`` ranks: ``2·(R − 1)/R · 2·N`` bytes at
   ``bus_bytes_per_s``, after every rank has arrived (a late rank's lateness is the others' wait).
5. The rank does the real CPU work of a phase first and then waits out the rest of the phase's
   GPU time; where the CPU work takes longer, the phase takes that long.

Times in seconds, clocks in MHz.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import grpc

from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.runs import consumer

# Samples older than this (before the newest one) no longer set the clock estimate.
CLOCK_WINDOW_NS = 1_000_000_000
# Shares of a step's FLOPs: the backward pass computes the gradients of activations and weights.
COMPUTE_SHARES = {"forward": 1 / 3, "backward": 2 / 3}


@dataclass(frozen=True)
class StandIn:
    """The model a demo step stands in for.

    Attributes:
        params: Parameters ``N``.
        tokens: Tokens per rank and step ``T``.
        efficiency: ``η``, share of the peak FLOP/s its kernels reach at the maximum clock.
        optimizer_s: Optimizer step, s: AdamW streams ~28 bytes per parameter (fp32 weights,
            gradients and two moments read, three written back), 36 GB for 1.3 B parameters, about
            10 ms at the 3–5 TB/s of HBM3; memory-bound, so not scaled by the engine clock.
        bus_bytes_per_s: Per-GPU ring bandwidth of the all-reduce, B/s (the order of a node's
            xGMI / NVLink links under load).
    """

    params: float = 1.3e9
    tokens: int = 16 * 2048
    efficiency: float = 0.6
    optimizer_s: float = 0.012
    bus_bytes_per_s: float = 100e9

    @property
    def flops(self) -> float:
        """FLOPs of one step, ``6·N·T``."""
        return 6.0 * self.params * self.tokens

    @property
    def grad_bytes(self) -> int:
        """Bytes of one rank's bf16 gradients."""
        return int(2 * self.params)

    def describe(self) -> str:
        """``a 1.3 B-parameter decoder on 32768 tokens (256 TFLOP)``."""
        return f"a {self.params / 1e9:.1f} B-parameter decoder on {self.tokens} tokens ({self.flops / 1e12:.0f} TFLOP)"


class ClockWatch:
    """The clock one GPU computes at, from the agent's sample stream (algorithm step 2).

    A daemon thread reads ``Subscribe(samples=True)`` and keeps the samples of ``gpu`` from the
    last ``CLOCK_WINDOW_NS``. The stream ending (the agent went away) leaves the last estimate in
    place: the job keeps training.

    Args:
        agent: Agent gRPC target.
        gpu: GPU index on that agent's node.
        max_clock_mhz: Returned until a sample with matrix activity has arrived.
    """

    def __init__(self, agent: str, gpu: int, max_clock_mhz: float) -> None:
        self.gpu, self.max_clock_mhz = gpu, max_clock_mhz
        self._recent: deque[tuple[int, float, float]] = deque()  # (ts_ns, matrix_ratio, gfx_clock_mhz)
        self._lock = threading.Lock()
        self._channel, stream = consumer.subscribe(agent, pb.SubscribeRequest(samples=True))
        self._thread = threading.Thread(target=self._read, args=(stream,), name="chopper-demo-clock", daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        try:
            for batch in stream:
                mine = [(s.ts_ns, s.matrix_ratio, s.gfx_clock_mhz) for s in batch.samples if s.gpu == self.gpu]
                if not mine:
                    continue
                with self._lock:
                    self._recent.extend(mine)
                    while self._recent and self._recent[0][0] < self._recent[-1][0] - CLOCK_WINDOW_NS:
                        self._recent.popleft()
        except grpc.RpcError:
            pass  # closed by stop(), or the agent went away: keep the last estimate

    def clock_mhz(self) -> float:
        """Matrix-activity-weighted mean clock of the last second's samples, MHz."""
        with self._lock:
            weight = sum(m for _, m, f in self._recent if m > 0 and f > 0)
            weighted = sum(m * f for _, m, f in self._recent if m > 0 and f > 0)
        return weighted / weight if weight > 0 else self.max_clock_mhz

    def stop(self) -> None:
        self._channel.close()
        self._thread.join(2.0)


class GpuTime:
    """Seconds each phase of a demo step takes on one GPU (module algorithm, steps 2–4).

    Args:
        model: The stand-in model.
        peak_flops: The GPU's peak dense FLOP/s at ``max_clock_mhz``.
        max_clock_mhz: The GPU's maximum engine clock.
        world: Ranks in the all-reduce.
        clock: Where the current clock comes from (a ``ClockWatch``, or anything with ``clock_mhz()``).

    Raises:
        ValueError: The GPU's peak or maximum clock is unknown (not positive).
    """

    def __init__(self, model: StandIn, peak_flops: float, max_clock_mhz: float, world: int, clock: Any) -> None:
        if not (peak_flops > 0 and max_clock_mhz > 0):
            raise ValueError(f"--gpu-time needs the GPU's peak FLOP/s and maximum clock; the agent reports "
                             f"{peak_flops} FLOP/s and {max_clock_mhz} MHz (set the agent's peak_flops)")
        self.model, self.peak_flops, self.max_clock_mhz, self.world = model, peak_flops, max_clock_mhz, world
        self.clock = clock

    def seconds(self, phase: str) -> float:
        """GPU time of ``phase`` (``forward``, ``backward``, ``all_reduce`` or ``optimizer``) at the clock now."""
        if phase == "optimizer":
            return self.model.optimizer_s
        if phase == "all_reduce":
            return 2 * (self.world - 1) / self.world * self.model.grad_bytes / self.model.bus_bytes_per_s
        share = COMPUTE_SHARES[phase]
        slowdown = self.max_clock_mhz / min(self.clock.clock_mhz(), self.max_clock_mhz)
        return share * self.model.flops / (self.peak_flops * self.model.efficiency) * slowdown
