"""Steps/s of a small model with and without ``chopper.pytorch.instrument``, in the same run.

Goal: at steady state on the CPU, the instrumented training loop is less than 1 % slower than the
same loop without instrumentation (``median instrumented step / median plain step < 1.01``).

Method. One real agent process (``python -m agent``, simulated backend with one GPU, private unix
socket and metrics port) receives the markers. The training runs in this process, single rank, no
torch.distributed (so no CPU contention between ranks), ``torch.set_num_threads(1)``: the demo's
``TinyDecoder`` (``chopper.demo.train``: 2 causal transformer blocks, dim 256, vocabulary 1024,
batch 8 × 128 tokens) with AdamW, a plain loop (forward, cross-entropy, ``backward``,
``optimizer.step``, ``zero_grad``) that knows nothing of the telemetry. ``chopper.init`` is called
once; the loop then alternates ``CYCLES`` times between a segment of ``SEGMENT_STEPS`` steps
instrumented (``chopper.pytorch.instrument(model, optimizer, ...)`` before it, ``.remove()`` after
it) and a segment of as many steps not instrumented, flipping which of the two comes first in each
cycle (ABBA order), so slow drifts of a shared machine fall on both alike. The first
``SKIP_STEPS`` steps of each segment are left out (hook (un)installation transients). A warm-up
instrumented segment, not timed, comes first: it counts the step's FLOPs once with
``FlopCounterMode`` (``flops_source``), and the timed instrumentations are given that figure, so
no timed step pays for the counting.

Each step is timed with ``time.perf_counter`` around the whole loop body. Figures: median step
time of each mode, their ratio (the goal's figure), steps/s, the per-cycle ratios (their spread is
the noise floor), markers per instrumented step (growth of the client's ``queued`` counter over the
instrumented segments / their steps: step begin/end plus begin/end of forward, backward and
optimizer phases), markers dropped, and the steps the agent counted
(``chopper_rank_steps_total``), which shows the markers really reached it.

Run: ``python benchmarks/bench_instrument_overhead.py``; ``run()`` returns the figures as a dict.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from chopper.demo.run import metric_sum
from tests.support.daemons import AgentProcess

GOAL_RATIO = 1.01
CYCLES = 18
SEGMENT_STEPS = 10
SKIP_STEPS = 1
WARMUP_STEPS = 10
JOB = "bench-instrument"


def _train(target: str) -> dict[str, Any]:
    """Train in this process, alternating instrumented and plain segments; raw figures."""
    import torch
    from torch import nn

    import chopper
    import chopper.pytorch as ctorch
    from chopper.demo.train import BATCH, SEQ, VOCAB, TinyDecoder

    warnings.filterwarnings("ignore", message="enable_nested_tensor")  # the demo model's, harmless
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = TinyDecoder()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss_fn = nn.CrossEntropyLoss()
        tokens = BATCH * SEQ

        def steps(n: int) -> list[float]:
            out = []
            for _ in range(n):
                t0 = time.perf_counter()
                batch = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
                logits = model(batch[:, :-1])
                loss = loss_fn(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                out.append(time.perf_counter() - t0)
            return out

        chopper.init(job=JOB, rank=0, agent=target, gpu=0)
        step_index = 0
        warm = ctorch.instrument(model, optimizer, tokens_per_step=tokens)
        steps(WARMUP_STEPS)
        warm.remove()
        step_index += warm.steps
        flops_source, flops = warm.flops_source, warm.flops_per_step
        steps(WARMUP_STEPS)  # and the plain loop warmed up too

        on: list[float] = []
        off: list[float] = []
        cycle_ratios: list[float] = []
        queued = 0
        on_steps = 0
        errors: dict[str, int] = {}
        for cycle in range(CYCLES):
            seg: dict[bool, list[float]] = {}
            for instrumented in ((True, False) if cycle % 2 == 0 else (False, True)):
                if instrumented:
                    before = chopper.stats()["queued"]
                    inst = ctorch.instrument(model, optimizer, flops_per_step=flops, tokens_per_step=tokens,
                                             start_step=step_index)
                    seg[True] = steps(SEGMENT_STEPS)
                    inst.remove()
                    step_index += inst.steps
                    queued += chopper.stats()["queued"] - before
                    on_steps += SEGMENT_STEPS
                    for k, v in inst.errors.items():
                        errors[k] = errors.get(k, 0) + v
                else:
                    seg[False] = steps(SEGMENT_STEPS)
            on += seg[True][SKIP_STEPS:]
            off += seg[False][SKIP_STEPS:]
            cycle_ratios.append(round(statistics.median(seg[True][SKIP_STEPS:])
                                      / statistics.median(seg[False][SKIP_STEPS:]), 4))
        chopper.shutdown(timeout=5.0)
        client = chopper.stats()
    finally:
        torch.set_num_threads(threads)
    return {"on": on, "off": off, "cycle_ratios": cycle_ratios, "queued": queued, "on_steps": on_steps,
            "steps_marked": step_index, "flops_source": flops_source, "flops_per_step": flops,
            "client": client, "hook_errors": errors}


def run() -> dict[str, Any]:
    """Alternate instrumented and plain segments of one training loop; return medians and ratio.

    Returns:
        ``median_step_ms`` and ``steps_per_s`` per mode (``instrumented``, ``plain``),
        ``ratio_instrumented_vs_plain`` (the goal's figure), ``cycle_ratios``, ``markers_per_step``,
        ``flops_source``, ``flops_per_step``, ``steps_timed`` per mode, ``agent_steps_total``,
        ``client`` stats, ``hook_errors``, ``goal_ratio`` and ``meets_goal``.
    """
    with tempfile.TemporaryDirectory(prefix="chopper-bench-inst") as tmpdir:
        agent = AgentProcess(Path(tmpdir), "--node", "bench", "--sim-gpus", "1", "--sample-hz", "10")
        try:
            agent.start()
            raw = _train(agent.target)
            agent_steps = metric_sum(agent.metrics(), "chopper_rank_steps_total", job=JOB)
        finally:
            if agent.proc is not None and agent.proc.poll() is None:
                try:
                    agent.terminate()
                except subprocess.TimeoutExpired:
                    agent.kill()
    med_on = statistics.median(raw["on"])
    med_off = statistics.median(raw["off"])
    ratio = med_on / med_off
    return {
        "cycles": CYCLES,
        "segment_steps": SEGMENT_STEPS,
        "steps_timed": {"instrumented": len(raw["on"]), "plain": len(raw["off"])},
        "median_step_ms": {"instrumented": round(1e3 * med_on, 3), "plain": round(1e3 * med_off, 3)},
        "steps_per_s": {"instrumented": round(1 / med_on, 2), "plain": round(1 / med_off, 2)},
        "ratio_instrumented_vs_plain": round(ratio, 4),
        "cycle_ratios": raw["cycle_ratios"],
        "markers_per_step": round(raw["queued"] / raw["on_steps"], 2),
        "flops_source": raw["flops_source"],
        "flops_per_step": raw["flops_per_step"],
        "steps_marked": raw["steps_marked"],
        "agent_steps_total": agent_steps,
        "client": raw["client"],
        "hook_errors": raw["hook_errors"],
        "goal_ratio": GOAL_RATIO,
        "meets_goal": ratio < GOAL_RATIO and agent_steps > 0 and not raw["hook_errors"],
    }


def main() -> int:
    result = run()
    print(
        f"instrument overhead: median step {result['median_step_ms']['instrumented']:.2f} ms instrumented vs "
        f"{result['median_step_ms']['plain']:.2f} ms plain (ratio {result['ratio_instrumented_vs_plain']:.4f}, "
        f"per cycle {result['cycle_ratios']}); {result['markers_per_step']:g} markers/step; "
        f"flops_source {result['flops_source']}; agent counted {result['agent_steps_total']:.0f} steps; "
        f"goal ratio < {GOAL_RATIO:g}: {'met' if result['meets_goal'] else 'MISSED'}"
    )
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
