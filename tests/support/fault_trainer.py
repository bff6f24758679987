"""A training stand-in for the fault scenarios: fixed-length steps, marked like the demo, timed per step.

Each step is ``--compute-iters`` iterations of pure-Python arithmetic (it holds the GIL, so a
client thread that hogged the interpreter would lengthen it) followed by ``--sleep-ms`` of sleep
(the host thread of a GPU-bound step mostly waits). Markers per step, as the demo's: step,
phases forward/backward/optimizer and one all_reduce collective, 10 in all, through a real
``chopper.client.Client`` to the agent. The step's wall time is measured with
``time.monotonic()`` (the clock the test process reads too, so the test can tell which steps ran
during a fault).

``python -m tests.support.fault_trainer --agent unix:///x.sock --duration 8`` trains for 8 s, or until
SIGTERM (a test ends it when its fault is over), and prints one JSON line at the end: ``times``
([start_s, seconds] per step), ``steps``, ``marked`` (markers made) and ``client``
(``Client.stats()`` after shutdown).
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Sequence

from chopper.client import Client
from chopper.daemon.stopsignals import StopSignals

MARKERS_PER_STEP = 10


def _compute(iters: int) -> int:
    total = 0
    for i in range(iters):
        total += i * i
    return total


def run(
    client: Client, duration_s: float, sleep_s: float, compute_iters: int, stop: threading.Event,
) -> list[tuple[float, float]]:
    """Step until ``duration_s`` has passed or ``stop`` is set; returns (start, seconds) of every step."""
    times = []
    deadline = time.monotonic() + duration_s
    step = 0
    while (start := time.monotonic()) < deadline and not stop.is_set():
        with client.step(step, flops=1e12, tokens=1024):
            with client.phase("forward"):
                _compute(compute_iters)
            with client.phase("backward"):
                time.sleep(sleep_s * 0.6)
            with client.collective("all_reduce", bytes=1 << 20):
                time.sleep(sleep_s * 0.3)
            with client.phase("optimizer"):
                time.sleep(sleep_s * 0.1)
        times.append((start, time.monotonic() - start))
        step += 1
    return times


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", required=True, help="agent gRPC target")
    parser.add_argument("--duration", type=float, required=True, help="seconds of training (at most, with SIGTERM)")
    parser.add_argument("--job", default="faults", help="job name")
    parser.add_argument("--rank", type=int, default=0, help="rank")
    parser.add_argument("--gpu", type=int, default=0, help="local GPU index")
    parser.add_argument("--sleep-ms", type=float, default=40.0, help="sleep per step, ms")
    parser.add_argument("--compute-iters", type=int, default=20_000, help="pure-Python loop iterations per step")
    parser.add_argument("--queue-size", type=int, default=65536, help="client queue size, markers")
    args = parser.parse_args(argv)
    client = Client(job=args.job, rank=args.rank, gpu=args.gpu, agent=args.agent, queue_size=args.queue_size)
    with StopSignals() as stop:
        times = run(client, args.duration, args.sleep_ms / 1000, args.compute_iters, stop.event)
    client.shutdown(timeout=5.0)
    print(json.dumps({"times": times, "steps": len(times), "marked": MARKERS_PER_STEP * len(times),
                      "client": client.stats()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
