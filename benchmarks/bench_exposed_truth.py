"""Exposed communication against an independent truth: DDP, FSDP2 and the HF Trainer at two link rates.

Goal: on every rank, at both rates, our exposed term per step is within max(5 ms, 20 %) of the
truth, and not above the bound by more than that. The truth is what gradient synchronisation adds
to the training thread's time off CPU (asleep in a wait): its step time, timed by the job with
``time.perf_counter``, minus the time the kernel's scheduler counted it running or runnable
(``/proc/thread-self/schedstat``). The bound is the job's step time with synchronisation minus
without it, which also holds the computation synchronisation adds or slows. Both are paired steps
of one run (medians) and use nothing of Chopper's.

Method (``tests/e2e/exposed_truth_harness.py`` in full): one real agent process (simulated
backend, two GPUs) receives the markers over its unix socket; each configuration is one 2-rank
gloo job (``tests/e2e/exposed_truth_train.py``: 6 ``Linear(384, 384)`` layers, 0.89 M parameters,
3.5 MB of fp32 gradients, 160 rows per rank per step, one CPU thread per rank, instrumented with
``chopper.pytorch.instrument`` or ``chopper.hf.ChopperCallback``) whose ranks run in their own
network namespaces joined by a veth pair with a ``tc`` rate limit (``tests/support/netns.py``). Blocks of
interleaved synchronised / unsynchronised steps (and, for DDP, steps where rank 1 sleeps
``SLOW_MS`` in its forward) alternate between 1 Gbit/s and 250 Mbit/s in ABBA order. After each
job the agent's buffers are recorded and attributed as ``chopper attribute`` does; our per-rank
figure is the median over paired steps of ``exposed_comm_s + straggler_wait_s`` (sync minus no
sync). Configurations:

* ``ddp_1bucket``: DDP with ``bucket_cap_mb=16`` (one bucket) and ``gradient_as_bucket_view``: the
  all-reduce starts when backward ends and no gradient copies are added, so truth and bound
  nearly agree (the configuration ``tests/e2e/test_exposed_truth.py`` asserts);
* ``ddp``: DDP's defaults (a 1 MiB first bucket whose all-reduce overlaps the rest of backward,
  gradients copied into and out of the buckets): the bound also holds that CPU work and the
  compute the overlapped all-reduce slowed down, which are not communication;
* ``fsdp2``: ``fully_shard`` per layer (no sync = ``set_requires_gradient_sync(False)``; its
  all-gathers run in both modes);
* ``hf``: ``transformers.Trainer`` (DDP through accelerate, default buckets) with a Trainer whose
  ``training_step`` runs under ``no_sync()`` for the unsynchronised steps.

Per configuration the figures also hold the compute that must not move with the rate (median
no-sync step time, our forward and backward phase medians), the wire time ``bytes × 8 / rate``,
and for DDP the straggler wait of the rank that waited against the job's own stamps of it: how
much longer it was between ready to synchronise and synchronised (``truth_wait_ms``), the lead
the ``SLOW_MS`` sleep gave it (``lead_ms``) and how much later the slowed rank finished (``end_skew_ms``).
Needs root, ``ip`` and ``tc`` (network namespaces); raises naming what is missing otherwise.

Run: ``python benchmarks/bench_exposed_truth.py``; ``run()`` returns the figures as a dict.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.e2e.exposed_truth_harness import Job, figures, run_job
from tests.support.daemons import AgentProcess
from tests.support.netns import unavailable

RATES = (1e9, 250e6)
SLOW_MS = 30.0
MODEL: dict[str, Any] = {"blocks": 4, "cycles": 6}
CONFIGS = {
    "ddp_1bucket": Job("ddp", RATES, bucket_mb=16.0, bucket_view=True, slow_ms=SLOW_MS, **MODEL),
    "ddp": Job("ddp", RATES, slow_ms=SLOW_MS, **MODEL),
    "fsdp2": Job("fsdp2", RATES, **MODEL),
    "hf": Job("hf", RATES, **MODEL),
}
JOB_TIMEOUT_S = 240.0


def _summary(fig: dict[str, Any]) -> dict[str, Any]:
    """Per rate and rank, ``ours / truth (bound)`` in ms and whether both goals hold."""
    return {rate: {rank: f"{f['ours_exposed_ms']:g} / {f['truth_comm_wait_ms']:g} ({f['truth_sync_cost_ms']:g})"
                   + ("" if f["within_goal"] and f["within_bound"] else " (off)") for rank, f in v["ranks"].items()}
            for rate, v in fig["rates"].items()}


def run() -> dict[str, Any]:
    """Run every configuration once; return its figures and how many rank-rates met the goal.

    Returns:
        Per configuration: ``summary`` (``ours / truth (bound)`` ms per rate in Mbit/s and rank) and the
        harness's ``figures``; ``within`` and ``cases`` (rank-rates within the goal, of all),
        ``within_by_config``, and ``meets_goal`` (every rank-rate of every configuration).
    """
    reason = unavailable()
    if reason is not None:
        raise RuntimeError(f"bench_exposed_truth needs rate-limited network namespaces: {reason}")
    out: dict[str, Any] = {"rates_mbit_s": [r / 1e6 for r in RATES], "slow_ms": SLOW_MS}
    within = cases = 0
    by_config: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="chopper-bench-exposed") as tmpdir:
        workdir = Path(tmpdir)
        agent = AgentProcess(workdir, "--node", "bench", "--sim-gpus", "2")
        try:
            agent.start()
            for name, job in CONFIGS.items():
                print(f"  exposed_truth: {name} ...", file=sys.stderr, flush=True)
                fig = figures(run_job(agent, workdir, job, f"bench-exposed-{name}", JOB_TIMEOUT_S))
                ok = [f["within_goal"] and f["within_bound"] for v in fig["rates"].values()
                      for f in v["ranks"].values()]
                within += sum(ok)
                cases += len(ok)
                by_config[name] = f"{sum(ok)}/{len(ok)}"
                out[name] = {"summary": _summary(fig), **fig}
        finally:
            if agent.proc is not None and agent.proc.poll() is None:
                agent.terminate()
    out.update(within=within, cases=cases, within_by_config=by_config, meets_goal=within == cases)
    return out


def main() -> int:
    result = run()
    for name in CONFIGS:
        print(f"{name}: ours / truth (bound) ms {result[name]['summary']}")
    print(f"{result['within']}/{result['cases']} rank-rates within max(5 ms, 20 %) of the truth")
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
