"""Load held: one agent process at 8 GPUs x 100 Hz with 64 trainers' marker streams, for minutes.

Goal: the agent keeps up and its memory is small and flat with its default settings: resident
set size at most ``GOAL_RSS_MIB`` MiB and growing less than ``GOAL_RSS_SLOPE_MIB_PER_MIN`` MiB
per minute once its ring buffers are full, no marker is dropped, rejected or lost on the way,
and fewer than ``GOAL_MISSED_TICK_RATIO`` of its sampling ticks are skipped. CPU (% of one core)
is reported.

Method. One real agent process (``tests.support.daemons.AgentProcess``: ``python -m agent``, the
simulated backend with 8 GPUs at 100 Hz, a private unix socket) at nice 10 as
``deploy/systemd/chopper-agent.service`` runs it, with the default buffers: bounded by memory
(``*_buffer_mib``), the largest of them (samples, 10 MiB) fills in about 70 s of this load, so RSS
is judged after ``MIN_WARMUP_S`` at least.

``LOAD_PROCESSES`` load processes (``--load`` mode of this module) run ``RANKS`` real
``chopper.client.Client`` instances between them, one thread per rank: rank ``r`` drives GPU
``r % 8`` and marks ``STEPS_PER_S`` steps per second of 10 markers each (step, forward,
backward, optimizer, one all_reduce), sleeping between markers as a training loop would. A
scraper reads ``/metrics`` every ``SCRAPE_S`` seconds, as Prometheus would.

Every ``SAMPLE_S`` seconds this process reads the agent's ``/proc/<pid>/stat`` CPU time and
``VmRSS``. After ``warmup_s``, RSS slope is the least-squares slope of RSS over time (MiB/min) and
CPU is (CPU seconds) / (wall seconds) over the measured window. At the end the load processes
report their clients' counters (``sent``, ``dropped``), and the agent's ``/metrics`` gives
markers received, rejected, batches lost (sequence gaps) and sampler ticks run and missed.

Run: ``python -m benchmarks.bench_load_held --duration 600`` (the figure in docs/PERFORMANCE.md is
from a 10-minute run; ``make bench`` runs the default ``DEFAULT_DURATION_S``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from chopper.demo.run import metric_sum
from tests.support.daemons import AgentProcess

GPUS = 8
SAMPLE_HZ = 100.0
RANKS = 64
STEPS_PER_S = 5.0
MARKERS_PER_STEP = 10
LOAD_PROCESSES = 4
SCRAPE_S = 5.0
SAMPLE_S = 5.0
MIN_WARMUP_S = 90.0
DEFAULT_DURATION_S = 180.0
GOAL_RSS_MIB = 100.0
GOAL_RSS_SLOPE_MIB_PER_MIN = 1.0
GOAL_MISSED_TICK_RATIO = 0.01
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) points, MiB per minute."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return 60 * sum((t - mt) * (v - mv) for t, v in points) / var if var else 0.0


def run(duration_s: float = DEFAULT_DURATION_S, warmup_s: float | None = None) -> dict[str, Any]:
    """Hold the load for ``duration_s`` seconds; returns CPU, RSS over time, drops and the goal verdict.

    Args:
        duration_s: Seconds the load runs (the recorded figure uses 600).
        warmup_s: Seconds before RSS and CPU are judged; default a quarter of the run, at least
            ``MIN_WARMUP_S`` (the buffers fill in about 70 s).
    """
    warmup = max(MIN_WARMUP_S, duration_s / 4) if warmup_s is None else warmup_s
    with tempfile.TemporaryDirectory(prefix="chopper-bench-load") as tmpdir:
        agent = AgentProcess(
            Path(tmpdir), "--node", "bench", "--sim-gpus", str(GPUS), "--sample-hz", str(SAMPLE_HZ),
            "--log-level", "warning", nice=10,
        ).start()
        assert agent.proc is not None
        pid = agent.proc.pid
        per = RANKS // LOAD_PROCESSES
        loads = [
            subprocess.Popen(
                [sys.executable, "-m", "benchmarks.bench_load_held", "--load", agent.target, str(i * per), str(per),
                 str(duration_s)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            )
            for i in range(LOAD_PROCESSES)
        ]
        stop = threading.Event()
        scrapes = {"answered": 0, "failed": 0}

        def scrape() -> None:
            while not stop.wait(SCRAPE_S):
                try:
                    agent.metrics()
                    scrapes["answered"] += 1
                except OSError:  # a starved agent that misses a scrape is a figure, not a crash
                    scrapes["failed"] += 1

        scraper = threading.Thread(target=scrape, daemon=True)
        scraper.start()
        started = time.monotonic()
        samples: list[tuple[float, float, float]] = []  # (seconds since start, cpu s, rss MiB)
        try:
            # Sampled only while every load process runs (they started before this loop).
            while time.monotonic() - started < duration_s - SAMPLE_S:
                samples.append((time.monotonic() - started, _cpu_s(pid), _rss_mib(pid)))
                time.sleep(SAMPLE_S)
            outs = [p.communicate(timeout=60) for p in loads]
            time.sleep(1.0)  # the last batches reach the agent
            text = agent.metrics()
        finally:
            stop.set()
            for p in loads:
                if p.poll() is None:
                    p.kill()
            agent.terminate()
    for p, (_, err) in zip(loads, outs, strict=True):
        if p.returncode != 0:
            raise RuntimeError(f"load process failed:\n{err[-2000:]}")
    clients = [c for out, _ in outs for c in json.loads(out.strip().splitlines()[-1])]
    measured = [s for s in samples if s[0] >= warmup]
    (t0, c0, r0), (t1, c1, r1) = measured[0], measured[-1]
    middle = measured[len(measured) // 2]
    slope = _slope_per_min([(t, r) for t, _, r in measured])
    marked = sum(c["marked"] for c in clients)
    dropped = sum(c["dropped"] for c in clients)
    received = metric_sum(text, "chopper_rank_markers_received_total")
    rejected = metric_sum(text, "chopper_agent_markers_rejected_total")
    batches_lost = metric_sum(text, "chopper_rank_batches_lost_total")
    ticks = metric_sum(text, "chopper_agent_sampler_ticks_total")
    missed = metric_sum(text, "chopper_agent_sampler_missed_ticks_total")
    missed_ratio = missed / (ticks + missed) if ticks + missed else 1.0
    return {
        "duration_s": round(duration_s),
        "warmup_s": round(warmup),
        "gpus": GPUS,
        "sample_hz": SAMPLE_HZ,
        "ranks": RANKS,
        "markers_per_s": RANKS * STEPS_PER_S * MARKERS_PER_STEP,
        "agent_core_pct": round(100 * (c1 - c0) / (t1 - t0), 1),
        "rss_mib": {"start": round(r0, 1), "middle": round(middle[2], 1), "end": round(r1, 1),
                    "peak": round(max(r for _, _, r in samples), 1)},
        "rss_slope_mib_per_min": round(slope, 3),
        "rss_every_minute_mib": [round(r) for t, _, r in samples if int(t) % 60 < SAMPLE_S],
        "markers": {"marked": marked, "received": int(received), "client_dropped": dropped,
                    "rejected": int(rejected), "batches_lost": int(batches_lost)},
        "sampler": {"ticks": int(ticks), "missed": int(missed), "missed_ratio": round(missed_ratio, 5)},
        "scrapes": scrapes,
        "goal_rss_mib": GOAL_RSS_MIB,
        "goal_rss_slope_mib_per_min": GOAL_RSS_SLOPE_MIB_PER_MIN,
        "meets_goal": (max(r for _, _, r in measured) <= GOAL_RSS_MIB
                       and abs(slope) < GOAL_RSS_SLOPE_MIB_PER_MIN and dropped == 0 and rejected == 0
                       and batches_lost == 0 and received == marked and missed_ratio < GOAL_MISSED_TICK_RATIO),
    }


# ------------------------------------------------------------------------------ load process


def _load(target: str, first_rank: int, ranks: int, duration_s: float) -> list[dict[str, Any]]:
    """``ranks`` clients marking ``STEPS_PER_S`` steps/s each for ``duration_s``; their counters."""
    from chopper.client import Client

    period = 1.0 / STEPS_PER_S
    gap = period / (MARKERS_PER_STEP / 2 + 1)
    deadline = time.monotonic() + duration_s
    results: list[dict[str, Any]] = []

    def rank(r: int) -> None:
        client = Client(job="bench-load", rank=r, gpu=r % GPUS, agent=target)
        step = 0
        next_step = time.monotonic() + (r % 10) * period / 10  # spread the ranks over the period
        while next_step < deadline:
            time.sleep(max(0.0, next_step - time.monotonic()))
            with client.step(step, flops=1e12, tokens=4096):
                for name in ("forward", "backward"):
                    with client.phase(name):
                        time.sleep(gap)
                with client.collective("all_reduce", bytes=1 << 24):
                    time.sleep(gap)
                with client.phase("optimizer"):
                    time.sleep(gap)
            step += 1
            next_step += period
        client.shutdown(timeout=5.0)
        results.append({"rank": r, "marked": step * MARKERS_PER_STEP, **client.stats()})

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(first_rank, first_rank + ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=DEFAULT_DURATION_S, help="seconds of load")
    parser.add_argument("--load", nargs=4, metavar=("TARGET", "FIRST_RANK", "RANKS", "DURATION_S"),
                        help="internal: run one load process against an agent")
    args = parser.parse_args(argv)
    if args.load:
        target, first, ranks, duration = args.load
        print(json.dumps(_load(target, int(first), int(ranks), float(duration))))
        return 0
    result = run(args.duration)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
