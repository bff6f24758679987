"""A rank that marks steps and phases but no collective, beside which the Inspector plugin reports its collectives.

It stands for a training loop launched with ``NCCL_PROFILER_PLUGIN`` and ``NCCL_INSPECTOR_ENABLE=1``
on a machine without NCCL: each step runs ``forward`` (``--compute-ms``), then a collective the job
does not mark (a sleep of ``--collective-ms``: the rank waits, as it would on its peers), then
``backward``. For each collective it appends the line the plugin's verbose dump writes
(``tests.support.inspector_dumps``: timing source ``kernel_gpu``, channel kernel start/stop on the
collective's measured window) to ``$NCCL_INSPECTOR_DUMP_DIR/<hostname>-pid<pid>.log``, flushed at once,
as the plugin's dump thread does after each dump. As that thread dumps on its interval, a step's
line is written halfway through the next step's ``forward`` (the last one's at the end), holding
every collective that completed before its dump time: a step's record arrives after the step
ended, the first step's before the agent has seen any record of the rank.

``python -m tests.e2e.inspector_trainer --steps 12`` prints one JSON line at the end: ``windows``, the
collective windows it measured (CLOCK_REALTIME ns, begin and end), by step.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path

import chopper
from tests.support.inspector_dumps import Collective, Comm, KernelChannel, coll_line

COMM_ID = "0x1c0ffee"
COLLECTIVE_BYTES = 64 << 20


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--compute-ms", type=float, default=40.0, help="forward and backward, each")
    parser.add_argument("--collective-ms", type=float, default=30.0)
    args = parser.parse_args(argv)
    comm = Comm(COMM_ID, 0, 2, 1, socket.gethostname(), os.getpid())
    dump = Path(os.environ["NCCL_INSPECTOR_DUMP_DIR"]) / f"{comm.hostname}-pid{comm.pid}.log"
    chopper.init()
    windows: list[tuple[int, int]] = []
    with dump.open("a") as out:

        def dump_step(i: int) -> None:
            begin, end = windows[i]
            us = (end - begin) // 1000
            channel = KernelChannel(begin // 1000, end // 1000, end // 1000)
            out.write(coll_line(comm, Collective("AllReduce", i + 1, COLLECTIVE_BYTES, us, time.time_ns() // 1000,
                                                 enqueue_us=begin // 1000, channels=(channel,)), verbose=True))
            out.flush()

        for i in range(args.steps):
            with chopper.step(i):
                with chopper.phase("forward"):
                    time.sleep(args.compute_ms / 2e3)
                    if i:
                        dump_step(i - 1)
                    time.sleep(args.compute_ms / 2e3)
                begin = time.time_ns()
                time.sleep(args.collective_ms / 1e3)
                end = time.time_ns()
                with chopper.phase("backward"):
                    time.sleep(args.compute_ms / 1e3)
            windows.append((begin, end))
        dump_step(args.steps - 1)
    chopper.shutdown()
    print(json.dumps({"windows": windows, "pid": comm.pid}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
