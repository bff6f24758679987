"""A real 2-rank CPU training job (gloo) that logs, per step, whether torch.profiler is on, its RSS and step time.

``python -m tests.e2e.capture_bound_job --agent TARGET --out DIR --duration S``: each rank appends one JSON
line per step to ``DIR/rank<R>.jsonl``: ``step``, ``wall_ns`` (CLOCK_REALTIME at the step's end),
``step_s`` (the step's own time, taken without the markers), ``rss`` (bytes) and ``profiling``
(torch.profiler on in this process during the step's body). Each step runs many small ops, so that a
running profiler records many events and its cost shows, and sleeps ``STEP_SLEEP_S``, so that
steps last long enough for a capture's timeout to pass inside its window.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import psutil
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import chopper

JOB = "bounded"
OPS_PER_STEP = 300
STEP_SLEEP_S = 0.08


def _rank(rank: int, world: int, port: int, agent: str, out: str, duration_s: float) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    chopper.init(job=JOB, rank=rank, agent=agent, gpu=rank)
    # The first torch.profiler start of a process loads Kineto: 9 s on a loaded 2-core machine, enough
    # to eat a capture's whole timeout. Paid here, the tests' timeouts measure the profiled window.
    with torch.profiler.profile():
        pass
    me = psutil.Process()
    x = torch.ones(64)
    grad = torch.zeros(4096)
    end = time.monotonic() + duration_s
    step = 0
    with open(Path(out) / f"rank{rank}.jsonl", "a", buffering=1) as log:
        while time.monotonic() < end:
            started = time.perf_counter()
            with chopper.step(step):
                with chopper.phase("forward"):
                    y = x
                    for _ in range(OPS_PER_STEP):
                        y = y * 1.0001 + 0.0001
                with chopper.collective("all_reduce", bytes=grad.numel() * 4):
                    dist.all_reduce(grad)
                profiling = bool(torch._C._autograd._profiler_enabled())
                time.sleep(STEP_SLEEP_S)
            log.write(json.dumps({"step": step, "wall_ns": time.time_ns(), "step_s": time.perf_counter() - started,
                                  "rss": me.memory_info().rss,
                                  "profiling": profiling}) + "\n")
            step += 1
    chopper.shutdown()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--agent", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    mp.spawn(_rank, args=(2, args.port, args.agent, args.out, args.duration), nprocs=2, join=True)


if __name__ == "__main__":
    main()
