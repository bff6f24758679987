"""Exposed communication against an independent measurement: a 2-rank job over a rate-limited link.

Shared by ``tests/e2e/test_exposed_truth.py`` and ``benchmarks/bench_exposed_truth.py``.

Method (``run_job``, then ``figures``):

1. The two ranks of ``tests/e2e/exposed_truth_train.py`` run in their own network namespaces,
   joined by a veth pair with a ``tc`` rate limit (``tests.support.netns.VethLink``); gloo talks over that
   link only (``GLOO_SOCKET_IFNAME``). Their markers go to a real agent over its unix socket (a
   socket path works across network namespaces).
2. The job runs blocks of interleaved steps with and without gradient synchronisation (and, with
   ``slow_ms``, steps where one rank sleeps in its forward). Before each block the link's rate is
   set to that block's rate, in ABBA order over the rates, so both rates see the same machine.
3. After the job, the agent's buffers are recorded (``chopper.runs.record.record``) and attributed
   (``chopper.attribution.attribute_run``, what ``chopper attribute`` runs). Every step the job
   timed must have its attributed row, or the run fails.
4. ``figures``, per rate and rank, from medians over steps:

   * truth: ``comm_wait = median over paired steps of the training thread's off-CPU time (sync −
     no sync)``: the step's ``perf_counter`` time minus what the kernel counted the thread running
     and runnable (``/proc/thread-self/schedstat``), i.e. the time it slept in waits. With one
     intra-op thread the step's compute is all on that thread, so what synchronisation adds to its
     sleep is the time it waited for communication, which nothing computed through;
   * bound: ``sync_cost = median step time (sync) − median step time (no sync)``, timed by the job
     with ``time.perf_counter`` and nothing of Chopper's. It is the exposed communication plus
     the computation synchronisation adds and slows (DDP's bucket copies, FSDP2's copy-in and
     copy-out, gloo's threads taking the rank's core while backward runs), which the kernel's
     account shows as added running and run-queue time (``sync_added_run_ms``,
     ``sync_added_runqueue_ms``) and ours as the phases' growth (``ours_phase_growth_ms``,
     forward + backward, sync − no sync);
   * ours: ``median X (sync) − median X (no sync)`` with ``X = exposed_comm_s + straggler_wait_s``,
     the rank's own exposed communication before the job-level split (for DDP no-sync steps have no
     collective; FSDP2 still all-gathers in them, and the difference keeps what synchronisation
     adds, which is what the truth measures);
   * compute that must not move with the rate: median no-sync step time (truth side) and the
     median forward and backward phase times of synchronised steps (ours);
   * straggler (slow steps), on the job's own stamps on the machine's monotonic clock, which both
     namespaces share: ``arrival`` (the hook on the last gradient: ready to synchronise) and
     ``synced`` (``backward()`` returned: the gradients are synchronised). ``lead`` is the other
     rank's arrival minus this one's, clamped at 0: how late the other rank came. The truth is
     how much longer this rank was between ready and synchronised than the rank that was so least
     (``(synced − arrival) − min over ranks``, clamped at 0), the wait straggler_wait_s claims to
     be; ours = its median ``straggler_wait_s``; the slowed rank's should be ~0. The truth is the
     lead less the ``end_skew`` (how much later the other rank was synchronised): on a slow link
     the early rank sends part of its data while it waits, so the late rank still has that much
     more to send after it arrives and finishes later; both are reported. What the waiting rank's
     step time grew by is reported too (``step_growth_slow_ms``) but is no measure of the wait:
     the data sent early is not sent later, so its step grows by less than it waited;
   * the wire time of the gradients: ``grad_bytes × 8 / rate`` (a 2-rank ring all-reduce sends the
     whole buffer each way once: half in reduce-scatter, half in all-gather).

   Goal per rank: ``|ours − comm_wait| ≤ max(5 ms, 20 % of comm_wait)`` (``within_goal``), and
   ours no more than that tolerance above ``sync_cost`` (``within_bound``).

Times in the figures are milliseconds; rates bit/s.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tests.support.daemons import AgentProcess
from tests.support.netns import VethLink

REPO = Path(__file__).resolve().parents[2]
ABS_TOLERANCE_S = 0.005
REL_TOLERANCE = 0.20
# Each rank has a core of its own and runs ahead of other load on the machine (it is root's, as the
# namespaces are): what is timed is then the job's own work and waits, not two ranks contending for
# one core, where the rank that sleeps or waits would lend the other its core and speed it up.
RANK_NICE = -10
RECORD_S = 3.0  # the buffered run is replayed at once; this only bounds the stream's tail


@dataclass(frozen=True)
class Job:
    """One training job: framework, model size, schedule, and the link rate of each block.

    ``rates_bit_s`` is cycled in ABBA order over the blocks (``rate_of``).
    """

    framework: str
    rates_bit_s: tuple[float, ...]
    blocks: int = 2
    cycles: int = 4
    warmup: int = 3
    slow_ms: float = 0.0
    slow_rank: int = 1
    width: int = 384
    layers: int = 6
    batch: int = 160
    bucket_mb: float = 0.0
    bucket_view: bool = False

    @property
    def modes(self) -> tuple[str, ...]:
        return ("sync", "nosync", "slow") if self.slow_ms > 0 else ("sync", "nosync")

    def rate_of(self, block: int) -> float:
        """ABBA over two rates (A B B A A B ...); more rates cycle forwards then back."""
        n = len(self.rates_bit_s)
        lap, pos = divmod(block, n)
        return self.rates_bit_s[pos if lap % 2 == 0 else n - 1 - pos]

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "tests.e2e.exposed_truth_train", "--framework", self.framework,
                "--width", str(self.width), "--layers", str(self.layers), "--batch", str(self.batch),
                "--bucket-mb", str(self.bucket_mb), *(["--bucket-view"] if self.bucket_view else []),
                "--warmup", str(self.warmup), "--blocks", str(self.blocks), "--cycles", str(self.cycles),
                "--slow-ms", str(self.slow_ms), "--slow-rank", str(self.slow_rank)]


@dataclass
class Measured:
    """What one job produced: per-step rows of both sides, and the job's own report per rank."""

    job: Job
    rows: list[dict[str, Any]]  # rank, step, block, rate_bit_s, mode, seconds, evidence, x_s, ...
    reports: dict[int, dict[str, Any]]  # the JSON line of each rank
    problems: list[str]

    @property
    def grad_bytes(self) -> int:
        return int(self.reports[0]["grad_bytes"])


def _own_core(rank: int) -> None:
    """In the rank's process before it execs: its own CPU (when there are two), at nice ``RANK_NICE``.

    Where the kernel groups processes by session (``/proc/self/autogroup``), a nice value only
    ranks processes within a group, so the rank (a session of its own) sets its group's nice.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    os.nice(RANK_NICE)
    with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as group:
        group.write(str(RANK_NICE))


def _lines(stream: IO[str], out: queue.Queue[str | None]) -> None:
    for line in stream:
        out.put(line)
    out.put(None)


def _message(line: str) -> dict[str, Any]:
    """A JSON object the job printed, or {} for its other output (libraries print too)."""
    try:
        message = json.loads(line)
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def run_job(agent: AgentProcess, workdir: Path, job: Job, name: str, timeout_s: float) -> Measured:
    """Run ``job`` as Chopper job ``name`` over a fresh link; record and attribute it (module docstring).

    Raises:
        TimeoutError: The job did not finish within ``timeout_s`` (everything it started is removed).
        RuntimeError: A rank failed, or a timed step has no attributed row.
    """
    from chopper.attribution import attribute_run
    from chopper.runs.record import record

    deadline = time.monotonic() + timeout_s
    since_ns = time.time_ns()
    logs = [workdir / f"{name}-rank{r}.log" for r in range(2)]
    rank1_out = workdir / f"{name}-rank1.out"
    with VethLink(job.rate_of(0)) as link:
        procs = []
        for rank in range(2):
            env = {**os.environ, "MASTER_ADDR": link.addresses[0], "MASTER_PORT": "29500", "RANK": str(rank),
                   "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "GLOO_SOCKET_IFNAME": link.interfaces[rank],
                   "CHOPPER_AGENT": agent.target, "CHOPPER_JOB": name, "OMP_NUM_THREADS": "1",
                   "PYTHONUNBUFFERED": "1"}
            with open(logs[rank], "wb") as err, open(rank1_out, "w") as out1:
                procs.append(link.popen(rank, job.argv(), cwd=REPO, env=env, stderr=err, text=True,
                                        start_new_session=True, preexec_fn=functools.partial(_own_core, rank),
                                        stdin=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                                        stdout=subprocess.PIPE if rank == 0 else out1))
        lines: queue.Queue[str | None] = queue.Queue()
        assert procs[0].stdout is not None and procs[0].stdin is not None
        threading.Thread(target=_lines, args=(procs[0].stdout, lines), daemon=True).start()
        reports: dict[int, dict[str, Any]] = {}
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"{job.framework} job {name} ran past {timeout_s:g} s; rank 0 log ends:\n"
                                   f"{_tail(logs[0])}\nrank 1 log ends:\n{_tail(logs[1])}") from None
            if line is None:
                break
            message = _message(line)
            if "block" in message:
                link.set_rate(job.rate_of(int(message["block"])))
                procs[0].stdin.write("go\n")
                procs[0].stdin.flush()
            elif "steps" in message:
                reports[0] = message
        for rank, proc in enumerate(procs):
            code = proc.wait(max(1.0, deadline - time.monotonic()))
            if code != 0:
                raise RuntimeError(f"rank {rank} of {name} exited {code}; its log ends:\n{_tail(logs[rank])}")
    for line in rank1_out.read_text().splitlines():
        if "steps" in _message(line):
            reports[1] = _message(line)
    if len(reports) != 2:
        raise RuntimeError(f"{name}: rank(s) {sorted({0, 1} - set(reports))} printed no report; logs in {workdir}")
    rundir = workdir / f"{name}-run"
    record(agent.target, rundir, RECORD_S, since_ns)
    attribution = attribute_run(rundir, job=name)
    return Measured(job, _join(job, reports, attribution.steps), reports, list(attribution.problems))


def _join(job: Job, reports: dict[int, dict[str, Any]], steps: Any) -> list[dict[str, Any]]:
    """The job's timed steps with their attributed terms; every timed step must have its row."""
    attributed = {(int(r["rank"]), int(r["step"])): r for r in steps.to_dict("records")}
    rows = []
    for rank, report in reports.items():
        for step, block, mode, seconds, evidence, arrival, run_s, runqueue_s, synced in report["steps"]:
            row = attributed.get((rank, step))
            if row is None:
                raise RuntimeError(f"rank {rank} step {step} was timed by the job but has no attributed row "
                                   f"({len(attributed)} rows recorded); the markers did not reach the recording")
            phases = row.get("phase_s") or {}
            rows.append({
                "rank": rank, "step": step, "cycle": (step - job.warmup) // len(job.modes), "block": block,
                "rate_bit_s": job.rate_of(block), "mode": mode,
                "seconds": seconds, "evidence": evidence, "arrival": arrival, "synced": synced,
                "run_s": run_s, "runqueue_s": runqueue_s, "blocked_s": seconds - run_s - runqueue_s,
                "x_s": row["exposed_comm_s"] + row["straggler_wait_s"], "exposed_s": row["exposed_comm_s"],
                "straggler_s": row["straggler_wait_s"], "step_time_s": row["step_time_s"],
                "forward_s": phases.get("forward"), "backward_s": phases.get("backward"),
                "phases_s": phases.get("forward", 0.0) + phases.get("backward", 0.0),
                "flags": list(row["flags"]),
            })
    return rows


def _median_ms(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r[key] is not None]
    return round(1e3 * statistics.median(values), 2) if values else None


def _paired_ms(rows: Sequence[dict[str, Any]], key: str, mode: str, baseline: str) -> float | None:
    """Median over cycles of ``key`` in the cycle's ``mode`` step minus its ``baseline`` step, ms.

    The two steps of a pair ran next to each other, so a machine that slows down for a while
    slows both, which a difference of two medians over the whole run would not cancel.
    """
    cycles: dict[tuple[int, int], dict[str, Any]] = {}
    for r in rows:
        cycles.setdefault((r["block"], r["cycle"]), {})[r["mode"]] = r[key]
    diffs = [c[mode] - c[baseline] for c in cycles.values()
             if c.get(mode) is not None and c.get(baseline) is not None]
    return round(1e3 * statistics.median(diffs), 2) if diffs else None


def _straggler_truth_ms(rows: Sequence[dict[str, Any]], rank: int, rate: float) -> dict[str, float] | None:
    """Medians over slow steps of ``rank``'s wait, lead and end skew on the job's stamps, ms (module docstring).

    Returns ``{"wait", "lead", "end_skew"}``, or ``None`` where no slow step has both ranks' stamps.
    """
    stamps: dict[int, dict[int, tuple[float, float]]] = {}
    for r in rows:
        if r["mode"] == "slow" and r["rate_bit_s"] == rate and r["arrival"] is not None and r["synced"] is not None:
            stamps.setdefault(r["step"], {})[r["rank"]] = (r["arrival"], r["synced"])
    paired = [by for by in stamps.values() if len(by) == 2]
    if not paired:
        return None
    other = 1 - rank

    def median_ms(values: list[float]) -> float:
        return round(1e3 * statistics.median(values), 2)

    inside = [{k: synced - arrival for k, (arrival, synced) in by.items()} for by in paired]
    return {"wait": median_ms([max(0.0, ins[rank] - min(ins.values())) for ins in inside]),
            "lead": median_ms([max(0.0, by[other][0] - by[rank][0]) for by in paired]),
            "end_skew": median_ms([by[other][1] - by[rank][1] for by in paired])}


def within(ours_ms: float, truth_ms: float) -> bool:
    """The goal: ``|ours − truth| ≤ max(5 ms, 20 % of truth)``."""
    return abs(ours_ms - truth_ms) <= max(1e3 * ABS_TOLERANCE_S, REL_TOLERANCE * abs(truth_ms))


def figures(measured: Measured) -> dict[str, Any]:
    """Per rate and rank: ours vs the truth, compute terms, straggler wait (module docstring step 4).

    Returns:
        ``{"rates": {"<Mbit/s>": {"wire_ms", "ranks": {"<rank>": {...}}}}, "straggler": {...},
        "skipped_collective_ok", "capped_steps", "grad_bytes"}``.
    """
    job = measured.job
    out: dict[str, Any] = {"grad_bytes": measured.grad_bytes, "rates": {}}
    for rate in job.rates_bit_s:
        per_rank: dict[str, Any] = {}
        for rank in range(2):
            at = [r for r in measured.rows if r["rank"] == rank and r["rate_bit_s"] == rate]
            by = {m: [r for r in at if r["mode"] == m] for m in job.modes}
            sync_cost = _paired_ms(at, "seconds", "sync", "nosync")
            ours = _paired_ms(at, "x_s", "sync", "nosync")
            assert sync_cost is not None and ours is not None
            waited = _paired_ms(at, "blocked_s", "sync", "nosync")
            assert waited is not None
            fig: dict[str, Any] = {
                "truth_comm_wait_ms": waited, "ours_exposed_ms": ours, "within_goal": within(ours, waited),
                "truth_sync_cost_ms": sync_cost,
                "within_bound": ours <= sync_cost or within(ours, sync_cost),
                "sync_added_run_ms": _paired_ms(at, "run_s", "sync", "nosync"),
                "sync_added_runqueue_ms": _paired_ms(at, "runqueue_s", "sync", "nosync"),
                "ours_phase_growth_ms": _paired_ms(at, "phases_s", "sync", "nosync"),
                "step_sync_ms": _median_ms(by["sync"], "seconds"),
                "step_nosync_ms": _median_ms(by["nosync"], "seconds"),
                "ours_x_sync_ms": _median_ms(by["sync"], "x_s"), "ours_x_nosync_ms": _median_ms(by["nosync"], "x_s"),
                "ours_forward_ms": _median_ms(by["sync"], "forward_s"),
                "ours_backward_ms": _median_ms(by["sync"], "backward_s"),
                "pairs": len(by["sync"]),
            }
            if "slow" in by:
                fig["step_growth_slow_ms"] = _paired_ms(at, "seconds", "slow", "sync")
                fig["ours_straggler_ms"] = _median_ms(by["slow"], "straggler_s")
                truth = _straggler_truth_ms(measured.rows, rank, rate)
                if truth is not None:
                    fig.update(truth_wait_ms=truth["wait"], lead_ms=truth["lead"], end_skew_ms=truth["end_skew"],
                               straggler_within_goal=within(fig["ours_straggler_ms"] or 0.0, truth["wait"]))
            per_rank[str(rank)] = fig
        out["rates"][f"{rate / 1e6:g}"] = {"wire_ms": round(1e3 * measured.grad_bytes * 8 / rate, 2),
                                           "ranks": per_rank}
    out["skipped_collective_ok"] = skipped_collective_ok(measured)
    out["capped_steps"] = sum("comm_capped" in r["flags"] for r in measured.rows)
    out["problems"] = measured.problems
    return out


def skipped_collective_ok(measured: Measured) -> bool:
    """Whether no-sync steps skipped the gradient collective and the others ran it (the job's evidence).

    DDP and HF: the first layer's gradient sum is equal on both ranks after an all-reduce and differs
    without one (each rank has its own batch). FSDP2: reduce-scatter calls counted per step.
    """
    rows = {(r["rank"], r["step"]): r for r in measured.rows}
    for (rank, step), row in rows.items():
        if rank != 0:
            continue
        synced = row["mode"] != "nosync"
        if measured.job.framework == "fsdp2":
            if (row["evidence"] > 0) != synced:
                return False
            continue
        other = rows[(1, step)]["evidence"]
        equal = abs(row["evidence"] - other) <= 1e-6 * max(abs(row["evidence"]), abs(other), 1e-12)
        if equal != synced:
            return False
    return True
