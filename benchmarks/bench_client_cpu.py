"""CPU the marker client costs the training process per marker, its sender thread included.

Goal: at most ``GOAL_US_PER_MARKER`` µs of the training process's CPU per marker, all of its
threads counted: the caller's enqueue, the sender thread that packs batches, and gRPC's threads
that put them on the wire (``bench_marker_cost`` measures the caller's share alone).

Method. A real agent in its own process (``tests.support.daemons.AgentProcess``, simulated
backend), so none of its work is counted here. This process plays a training loop: ``STEPS_PER_S``
steps a second, each marked as the one-line DDP integration marks it (step, forward, backward
with ``BUCKETS`` gradient-bucket all-reduces, optimizer: ``MARKERS_PER_STEP`` markers), then
sleeping until its next step is due. Run twice in this process, interleaved ABAB:

* ``instrumented``: ``chopper.step``/``phase``/``collective`` of a client connected to the agent
  (a new client each window, warmed up for half a second before it, shut down after it, the
  shutdown's CPU counted with the window: it sends the markers the window left queued);
* ``baseline``: the same loop with ``contextlib.nullcontext()`` and the same sleeps, no client.

Each round's figure is ``(process CPU instrumented − process CPU baseline) / markers marked``
over its two windows (``time.process_time``: user + system of every thread of this process); the
result is the median over ``ROUNDS`` rounds, with the least and the most beside it: on a shared
machine one round's windows can differ by a third for the same loop (other load, steal), and the
median is what such a round does not move. Every marker must reach the agent (its
``chopper_rank_markers_received_total``).

Run: ``python -m benchmarks.bench_client_cpu``; ``run()`` returns the figures as a dict.
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from chopper.client import Client
from chopper.demo.run import metric_sum
from tests.support.daemons import AgentProcess

BUCKETS = 40
MARKERS_PER_STEP = 2 + 2 + 2 + 2 * BUCKETS + 2
STEPS_PER_S = 100  # 8,800 markers/s: one rank of the ordinary DDP load
GOAL_US_PER_MARKER = 1.0
ROUNDS = 7
WINDOW_S = 3.0


def _loop(step: Callable[[int], Any], phase: Callable[[str], Any], collective: Callable[[str, int], Any],
          first: int, seconds: float) -> tuple[float, int]:
    """Mark steps from ``first`` on for ``seconds`` at ``STEPS_PER_S``; return (process CPU s, steps)."""
    period = 1.0 / STEPS_PER_S
    cpu0, due = time.process_time(), time.monotonic()
    end = due + seconds
    i = first
    while due < end:
        with step(i):
            with phase("forward"):
                pass
            with phase("backward"):
                for _ in range(BUCKETS):
                    with collective("all_reduce", 25 << 20):
                        pass
            with phase("optimizer"):
                pass
        i += 1
        due += period
        time.sleep(max(0.0, due - time.monotonic()))
    return time.process_time() - cpu0, i - first


def run(seconds: float = WINDOW_S, rounds: int = ROUNDS) -> dict[str, Any]:
    """Interleave instrumented and baseline windows; return CPU per marker and the delivery check."""
    with tempfile.TemporaryDirectory(prefix="chopper-bench-client") as tmp:
        agent = AgentProcess(Path(tmp), "--sim-gpus", "1").start()
        try:
            null = contextlib.nullcontext()
            cpu = {"instrumented": 0.0, "baseline": 0.0}
            per_round: list[float] = []  # µs per marker
            steps = measured_steps = sent = dropped = 0
            for _ in range(rounds):
                # A client as chopper.init builds it, without its Control stream (no captures are
                # asked for); alive only through its window, so its idle wake-ups count as its cost.
                client = Client("bench-client", 0, 0, agent.target, control=False)
                steps += _loop(client.step, client.phase, client.collective, steps, 0.5)[1]  # connect, warm up
                spent, n = _loop(client.step, client.phase, client.collective, steps, seconds)
                cpu0 = time.process_time()
                client.shutdown(timeout=10.0)  # sends what the window left queued: counted with it
                spent += time.process_time() - cpu0
                steps += n
                measured_steps += n
                stats = client.stats()
                sent, dropped = sent + stats["sent"], dropped + stats["dropped"]
                base, base_steps = _loop(lambda _i: null, lambda _n: null, lambda _n, _b: null, 0, seconds)
                cpu["instrumented"] += spent
                cpu["baseline"] += base
                # The baseline per step, times the steps marked: the two windows' step counts differ a little.
                per_round.append(1e6 * (spent - base * n / base_steps) / (n * MARKERS_PER_STEP))
            received = metric_sum(agent.metrics(), "chopper_rank_markers_received_total")
        finally:
            agent.terminate()
    measured_markers = measured_steps * MARKERS_PER_STEP
    us = statistics.median(per_round)
    return {
        "markers_per_s": STEPS_PER_S * MARKERS_PER_STEP, "markers_measured": measured_markers,
        "cpu_instrumented_s": round(cpu["instrumented"], 3), "cpu_baseline_s": round(cpu["baseline"], 3),
        "us_per_marker": round(us, 3), "us_per_marker_rounds": [round(u, 3) for u in per_round],
        "us_per_marker_least": round(min(per_round), 3), "us_per_marker_most": round(max(per_round), 3),
        "core_ratio": round(us * STEPS_PER_S * MARKERS_PER_STEP / 1e6, 4),
        "sent": sent, "dropped": dropped, "received_by_agent": int(received),
        "all_delivered": int(received) == steps * MARKERS_PER_STEP,
        "goal_us_per_marker": GOAL_US_PER_MARKER, "meets_goal": us <= GOAL_US_PER_MARKER,
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
