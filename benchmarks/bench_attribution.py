"""Attribution throughput: rank-steps per second of ``chopper.attribution.attribute``.

Method: build a synthetic recorded run of 1,000 ranks × 100 steps sampled at 10 Hz (the
ground-truth generator's ``big_run``: 1 M sample rows and 1 M marker rows), then time, in the same
process and interleaved, (a) the whole attribution (marker pairing, per-GPU window integrals, every
term, job-level straggler split, flags) and (b) a baseline: a plain pandas
``samples.groupby(["node", "gpu"])`` mean of the four sampled ratios and clocks, the least any
per-GPU analysis of those samples must do. The minimum of ``REPEATS`` runs of each is reported,
plus their ratio (how many baseline groupbys one attribution costs). Goal: ≥ 20,000 rank-steps/s
on one core (numpy and pandas here run single-threaded).

Run: ``python benchmarks/bench_attribution.py``; ``run()`` returns the figures as a dict.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from chopper.attribution import attribute
from tests.support.attribution_scenarios import big_run

RANKS, STEPS, SAMPLE_HZ = 1000, 100, 10.0
REPEATS = 3
GOAL_RANK_STEPS_PER_S = 20_000


def run() -> dict[str, Any]:
    scenario = big_run(RANKS, STEPS, SAMPLE_HZ)
    samples = scenario.samples
    attribution_s, baseline_s = [], []
    rank_steps = 0
    for _ in range(REPEATS):
        started = time.process_time()
        rank_steps = len(attribute(scenario.devices, samples, scenario.markers).steps)
        attribution_s.append(time.process_time() - started)
        started = time.process_time()
        samples.groupby(["node", "gpu"])[["busy_ratio", "matrix_ratio", "gfx_clock_mhz", "temp_c"]].mean()
        baseline_s.append(time.process_time() - started)
    best, base = min(attribution_s), min(baseline_s)
    throughput = rank_steps / best
    return {
        "ranks": RANKS, "steps": STEPS, "sample_hz": SAMPLE_HZ, "sample_rows": len(samples),
        "marker_rows": len(scenario.markers), "rank_steps": rank_steps, "attribution_cpu_s": round(best, 3),
        "baseline_groupby_cpu_s": round(base, 4), "ratio_to_groupby": round(best / base, 1),
        "rank_steps_per_s": round(throughput), "goal_rank_steps_per_s": GOAL_RANK_STEPS_PER_S,
        "meets_goal": throughput >= GOAL_RANK_STEPS_PER_S,
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
