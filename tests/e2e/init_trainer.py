"""A trainer that names itself as training code does, through ``chopper.init()``, and has no signal handler.

Job, rank, GPU and agent come from the environment (``CHOPPER_JOB``, ``CHOPPER_AGENT``...), so a
test can hand it the bytes a clumsy launcher would. It runs the steps of ``tests.support.fault_trainer``
(10 markers each, ~41 ms) for ``--duration`` s. With ``--burst-after S`` it makes, after S s,
``--burst-steps`` empty steps of 4 markers each (fewer markers than a batch holds, so they wait
for the sender's flush interval, 0.25 s), then prints ``marked N`` (flushed) and goes on
stepping: a test sends SIGTERM on that line, while those markers are still queued.

``python -m tests.e2e.init_trainer --duration 3`` prints one JSON line at the end: ``marked``
(markers made) and ``client`` (``chopper.stats()`` after ``chopper.shutdown()``). Logs go to
stderr at INFO, so a test reads the client's warnings and its ``event=flushed_on_signal`` line.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from collections.abc import Sequence

import chopper
from tests.support.fault_trainer import MARKERS_PER_STEP, run


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, required=True, help="seconds of training")
    parser.add_argument("--burst-after", type=float, default=-1.0, help="seconds before the burst; <0: none")
    parser.add_argument("--burst-steps", type=int, default=60, help="quick steps of the burst")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    client = chopper.init()
    never = threading.Event()
    marked = 0
    began = time.monotonic()
    if args.burst_after >= 0:
        marked += MARKERS_PER_STEP * len(run(client, args.burst_after, 0.04, 20_000, never))
        for i in range(args.burst_steps):
            with chopper.step(100_000 + i), chopper.phase("forward"):
                pass
        marked += 4 * args.burst_steps
        print(f"marked {marked}", flush=True)
    marked += MARKERS_PER_STEP * len(run(client, args.duration - (time.monotonic() - began), 0.04, 20_000, never))
    chopper.shutdown(timeout=30.0)
    print(json.dumps({"marked": marked, "client": chopper.stats()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
