"""Step time of a real training job while its node agent is killed (-9) and restarted.

Goal: with the agent killed, training goes on and its median step time is within 2 % of the
median while the agent is alive (``|absent / alive − 1| < 0.02``); the client counts what it
dropped; once the agent is restarted, markers reach it again.

Method. One real agent process (``python -m agent``, simulated backend with one GPU per rank at
the default 10 Hz, private unix socket and metrics port) and one real 2-rank training job on the
CPU: the demo's ``TinyDecoder`` (``chopper.demo.train``) with torch.distributed over gloo, one
intra-op thread per rank, gradients averaged by an explicit ``all_reduce``, each step marked
with ``chopper.step`` / ``phase`` / ``collective`` as the demo marks it. The loop is written here
rather than reused because the demo prints only counts and per-step wall times are needed: each
rank records ``time.monotonic()`` (one system-wide clock, shared with this process) at the start
and end of every step body, excluding the tiny control broadcast that tells ranks when to stop.

While the job runs, this process cycles the node through three modes, ``CYCLES`` times, then
ends on a last ``alive`` segment (each segment ``segment_s`` seconds):

1. ``alive``: agent running, markers on;
2. ``absent``: agent killed with SIGKILL, markers still on (the client queues, then drops);
3. ``off``: agent still dead and markers switched off (rank 0 broadcasts the switch, so both
   ranks change at the same step): the cost of telemetry as a whole, in the same job;
4. restart the agent, wait until it answers ``GetInfo``, back to 1.

Interleaving the modes spreads slow drifts of a shared, noisy machine over all of them. A step
counts for a segment only if it starts ``SETTLE_S`` after the segment began and ends before it
ended, so kill and restart transients (an agent starting up competes for the 2 cores) are left
out. Figures are medians of rank 0's step times (ranks wait for each other in the all_reduce, so
rank 1's are the same). Besides the pooled ratio, each cycle's ``absent / alive`` ratio is
reported; their spread shows the noise floor.

The client's queue is set to ``QUEUE_SIZE`` markers (the default is 65536) so that a few seconds
without an agent overflow it and the drop path is exercised and reported too. A second, short
job that never calls ``chopper.init`` (and with no agent running) gives a separate baseline of
the telemetry's total cost; it runs after the first job, so slow drift is not cancelled there.

Run: ``python benchmarks/bench_agent_kill.py``; ``run()`` returns the figures as a dict.
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from chopper.demo.run import free_port, metric_sum
from tests.support.daemons import AgentProcess

GOAL_REL_CHANGE = 0.02
CYCLES = 4
SETTLE_S = 0.5
QUEUE_SIZE = 256
WORLD = 2
JOB = "bench-kill"


# ------------------------------------------------------------------------------ training side


class _Off:
    """Stands in for the ``chopper`` module when markers are switched off."""

    @staticmethod
    def step(i: int, flops: float | None = None, tokens: int | None = None) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    @staticmethod
    def phase(name: str) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    @staticmethod
    def collective(name: str, bytes: int | None = None) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()


def _rank_main(rank: int, port: int, target: str, telemetry: bool, ctrl: dict[str, Any], out: str) -> None:
    """One rank: train until told to stop; write step times and client stats to ``out``.

    ``ctrl`` holds shared ints: ``stop`` and ``markers`` (read by rank 0 and broadcast),
    ``steps`` (written by rank 0, so the orchestrator knows training has started).
    """
    import warnings

    import torch
    import torch.distributed as dist

    import chopper
    from chopper.demo.train import DemoTrainer

    warnings.filterwarnings("ignore", message="enable_nested_tensor")  # the demo model's, harmless
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    if telemetry:
        chopper.init(job=JOB, rank=rank, agent=target, gpu=rank, queue_size=QUEUE_SIZE)
    trainer = DemoTrainer(WORLD)
    times: list[tuple[float, float, bool]] = []
    step = 0
    while True:
        flag = torch.tensor([1 - ctrl["stop"].value, ctrl["markers"].value] if rank == 0 else [0, 0])
        dist.broadcast(flag, src=0)
        if not flag[0].item():
            break
        on = telemetry and bool(flag[1].item())
        mark: Any = chopper if on else _Off
        t0 = time.monotonic()
        trainer.step(step, mark)
        times.append((t0, time.monotonic(), on))
        step += 1
        if rank == 0:
            ctrl["steps"].value = step
    client: dict[str, Any] = {}
    if telemetry:
        chopper.shutdown(timeout=5.0)
        client = chopper.stats()
    # Written before teardown: gloo sometimes aborts a rank whose peer tore down first, which
    # must not lose the measurements (the exit codes are reported).
    Path(out).write_text(json.dumps({"times": times, "client": client}))
    dist.barrier()
    dist.destroy_process_group()


def _start_job(tmp: Path, name: str, target: str, telemetry: bool) -> tuple[list[Any], dict[str, Any], list[Path]]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    ctrl = {"stop": ctx.Value("i", 0), "markers": ctx.Value("i", 1), "steps": ctx.Value("i", 0)}
    port = free_port()
    outs = [tmp / f"{name}-rank{r}.json" for r in range(WORLD)]
    procs = [ctx.Process(target=_rank_main, args=(r, port, target, telemetry, ctrl, str(outs[r])), daemon=True)
             for r in range(WORLD)]
    for p in procs:
        p.start()
    return procs, ctrl, outs


def _wait_started(procs: list[Any], ctrl: dict[str, Any], timeout_s: float = 120.0) -> None:
    # A few steps in, first-step costs (allocator, autograd graph build) are behind us.
    deadline = time.monotonic() + timeout_s
    while ctrl["steps"].value < 5:
        if time.monotonic() > deadline or any(not p.is_alive() for p in procs):
            raise RuntimeError("training did not start")
        time.sleep(0.1)


def _finish_job(procs: list[Any], ctrl: dict[str, Any], outs: list[Path]) -> list[dict[str, Any]]:
    ctrl["stop"].value = 1
    for p in procs:
        p.join(60)
    missing = [str(o) for o in outs if not o.exists()]
    if missing:
        raise RuntimeError(f"training ranks exited with {[p.exitcode for p in procs]} before writing {missing}")
    return [{**json.loads(o.read_text()), "exitcode": p.exitcode} for o, p in zip(outs, procs, strict=True)]


# --------------------------------------------------------------------------------- agent side


# --------------------------------------------------------------------------------- analysis


def _median_ms(values: list[float]) -> float:
    return round(1e3 * statistics.median(values), 2) if values else float("nan")


def _in_segment(times: list[list[Any]], begin: float, end: float, markers_on: bool) -> list[float]:
    return [t1 - t0 for t0, t1, on in times if t0 >= begin + SETTLE_S and t1 <= end and bool(on) == markers_on]


def run(segment_s: float = 6.0, no_init_s: float = 15.0) -> dict[str, Any]:
    """Kill and restart the agent under a running job; return step-time medians and ratios.

    Args:
        segment_s: Length of each alive / absent / off segment, wall seconds.
        no_init_s: Length of the separate job that never calls ``chopper.init``, wall seconds.

    Returns:
        ``median_step_ms`` per mode, ``ratio_absent_vs_alive`` (the goal's figure),
        ``cycle_ratios_absent_vs_alive``, ``ratio_alive_vs_off`` and ``ratio_alive_vs_no_init``
        (cost of telemetry), steps per mode, ``client`` stats per rank, ``agent_restarts``,
        ``steps_at_restarted_agent``, ``markers_flow_after_restart``, ``goal_rel_change`` and
        ``meets_goal``.
    """
    with tempfile.TemporaryDirectory(prefix="chopper-bench-kill") as tmpdir:
        tmp = Path(tmpdir)
        # The agent at its default 10 Hz on a simulated GPU per rank, as a node would run it.
        agent = AgentProcess(tmp, "--node", "bench", "--sim-gpus", str(WORLD), "--sample-hz", "10")
        procs: list[Any] = []
        try:
            agent.start()
            procs, ctrl, outs = _start_job(tmp, "job", agent.target, telemetry=True)
            _wait_started(procs, ctrl)
            segments: list[tuple[str, int, float, float]] = []

            def segment(mode: str, cycle: int) -> None:
                begin = time.monotonic()
                time.sleep(segment_s)
                segments.append((mode, cycle, begin, time.monotonic()))

            for cycle in range(CYCLES):
                segment("alive", cycle)
                agent.kill()
                segment("absent", cycle)
                ctrl["markers"].value = 0
                segment("off", cycle)
                ctrl["markers"].value = 1
                agent.start()
            segment("alive", CYCLES)
            results = _finish_job(procs, ctrl, outs)
            steps_restarted = metric_sum(agent.metrics(), "chopper_rank_steps_total", job=JOB)
            agent.kill()
            procs, ctrl, outs = _start_job(tmp, "noinit", agent.target, telemetry=False)
            _wait_started(procs, ctrl)
            no_init_begin = time.monotonic()
            time.sleep(no_init_s)
            no_init_end = time.monotonic()
            no_init = _finish_job(procs, ctrl, outs)
        finally:
            if agent.proc is not None:
                agent.kill()
            for p in procs:
                if p.is_alive():
                    p.kill()
    times = results[0]["times"]
    by_mode: dict[str, list[float]] = {"alive": [], "absent": [], "off": []}
    per_cycle: dict[tuple[str, int], list[float]] = {}
    for mode, cycle, begin, end in segments:
        picked = _in_segment(times, begin, end, markers_on=mode != "off")
        by_mode[mode] += picked
        per_cycle[(mode, cycle)] = picked
    no_init_steps = _in_segment(no_init[0]["times"], no_init_begin, no_init_end, markers_on=False)
    med = {mode: _median_ms(v) for mode, v in by_mode.items()}
    med["no_init"] = _median_ms(no_init_steps)
    cycle_ratios = []
    for c in range(CYCLES):
        # An absent segment sits between two alive ones: compare with both, so drift cancels.
        alive = per_cycle[("alive", c)] + per_cycle[("alive", c + 1)]
        absent = per_cycle[("absent", c)]
        if alive and absent:
            cycle_ratios.append(round(statistics.median(absent) / statistics.median(alive), 4))
    ratio = med["absent"] / med["alive"]
    return {
        "segment_s": segment_s,
        "cycles": CYCLES,
        "median_step_ms": med,
        "steps": {**{m: len(v) for m, v in by_mode.items()}, "no_init": len(no_init_steps)},
        "ratio_absent_vs_alive": round(ratio, 4),
        "cycle_ratios_absent_vs_alive": cycle_ratios,
        "ratio_alive_vs_off": round(med["alive"] / med["off"], 4),
        "ratio_absent_vs_off": round(med["absent"] / med["off"], 4),
        "ratio_alive_vs_no_init": round(med["alive"] / med["no_init"], 4),
        "client": {str(r): res["client"] for r, res in enumerate(results)},
        "queue_size": QUEUE_SIZE,
        "agent_restarts": agent.starts - 1,
        "steps_at_restarted_agent": steps_restarted,
        "markers_flow_after_restart": steps_restarted > 0,
        "rank_exit_codes": [res["exitcode"] for res in results],
        "goal_rel_change": GOAL_REL_CHANGE,
        "meets_goal": abs(ratio - 1.0) < GOAL_REL_CHANGE and steps_restarted > 0,
    }


def main() -> int:
    result = run()
    dropped = sum(c.get("dropped", 0) for c in result["client"].values())
    print(
        f"agent kill: median step {result['median_step_ms']['absent']:.1f} ms with the agent killed vs "
        f"{result['median_step_ms']['alive']:.1f} ms alive (ratio {result['ratio_absent_vs_alive']:.3f}, "
        f"per cycle {result['cycle_ratios_absent_vs_alive']}); client dropped {dropped} markers; "
        f"restarted agent counted {result['steps_at_restarted_agent']:.0f} steps; "
        f"goal |ratio-1| < {GOAL_REL_CHANGE:.0%}: {'met' if result['meets_goal'] else 'MISSED'}"
    )
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
