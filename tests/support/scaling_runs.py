"""Real weak-scaling runs for validating ``chopper predict``: gloo DDP at 2 and 4 ranks over a rate-limited link.

Shared by ``tests/e2e/test_predict_validation.py`` and ``benchmarks/bench_predict_validation.py``.

Method (``run_world`` for one world size, ``run_all`` for several, serially; ``held_back`` then
predicts each configuration from the others):

1. Two network namespaces joined by a veth pair with a ``tc`` rate limit
   (``tests.support.netns.VethLink``) are two "nodes" of ``world_size / 2`` ranks each. Each node's
   ranks are started as users start them, by ``torchrun`` in that namespace (``--nnodes 2
   --node-rank K``, static rendezvous at node a's address); gloo talks over the veth end only
   (``GLOO_SOCKET_IFNAME``). Every rank marks through ``chopper.pytorch.instrument`` to one real
   agent over its unix socket (a socket path works across network namespaces); each node's ranks
   name their simulated GPUs through ``CUDA_VISIBLE_DEVICES`` as a scheduler binds them.
2. The ranks (``tests/support/scaling_train.py``) train the same model on the same number of rows
   at every world size (weak scaling), one intra-op thread each, two ranks per core at every world
   size (node a's k-th core is node b's k-th core), and time every step with ``perf_counter``.
3. One job per world size alternates between the link rates in blocks of steps, ABBA (``rate_of``),
   so that a machine whose load drifts during the job moves every rate alike: at the job's gate
   before each block the harness sets that block's rate, and each block begins with untimed
   settling steps. The agent's stream is recorded (``chopper.runs.record.record``) from the
   launch until every rank reported; a configuration is one (world size, rate), and its run
   directory (``split_run``) holds the recording's devices, samples and links and the markers of
   that rate's timed steps only: what ``chopper predict`` reads. One job for both rates also
   halves the start-ups (torchrun, torch, DDP's imports: ~25 s a job on two busy cores).
4. Truth per configuration, from the job's own clocks only: the median over every rank's timed
   steps (``Measured.step_s``), and tokens/s = ``world_size × rows per rank ÷ step_s``.
5. ``held_back``: each configuration is predicted with ``chopper predict``'s functions from the
   other configurations' runs, each given its link bandwidth, and compared with its truth.

Which link is the bottleneck, and what it carries. gloo's all-reduce is a ring (gloo
``allreduce.cc``: reduce-scatter then all-gather, each rank sending to rank − 1 and receiving from
rank + 1, ``2 (n − 1) / n`` of the buffer on each ring edge). Ranks ``0 .. n/2 − 1`` are node a,
the rest node b (torchrun's node rank), so the ring crosses the veth pair on exactly two edges,
one in each direction (``n/2 → n/2 − 1`` is b → a, ``0 → n − 1`` is a → b); the edges inside a node
go over its loopback at memory speed. Each direction of the limited link therefore carries one
ring edge: ``2 (n − 1) / n × grad_bytes`` per step, ``grad_bytes`` at 2 ranks and ``1.5 ×
grad_bytes`` at 4 (``bottleneck_bytes``), at the ``tc`` rate each way. That is the bus-bandwidth
model of a ring all-reduce with the link's rate as the bus bandwidth: ``t = α + 2 (n − 1) / n × S / B``.

Everything a run starts is removed whatever happens: the ranks (each torchrun worker is a session
of its own, so they are found by namespace, ``ip netns pids``, and killed), then the namespaces
(``VethLink.close``). A job has a deadline; past it, ``TimeoutError``.

Times are seconds, rates bit/s, sizes bytes.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.support.daemons import AgentProcess
from tests.support.netns import COMMAND_TIMEOUT_S, VethLink

if TYPE_CHECKING:
    from chopper.predict import RunInputs

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "tests" / "support" / "scaling_train.py"
MASTER_PORT = 29500
RANK_NICE = -10  # the ranks run ahead of other load on the machine (they are root's, as the namespaces are)
GOAL_REL_ERROR = 0.15  # predicted step time within 15 % of the measured one, on every held-back configuration
# After every rank reported (its markers were delivered before), the recording goes on this long, so
# the agent's samples after the last step reach it too (a subscriber gets a batch a second,
# agent.server.BATCH_INTERVAL_S).
RECORD_TAIL_S = 2.0
# The environment a scheduler would give a fresh job: nothing of the machine's launcher, scheduler or
# Chopper settings leaks in.
_KEPT_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV")


@dataclass(frozen=True)
class Workload:
    """What every rank trains, the same at every world size (``scaling_train.py`` options)."""

    width: int = 384
    layers: int = 6
    batch: int = 160
    warmup: int = 5
    blocks: int = 4  # per job; block k runs at rate_of(rates, k), ABBA
    settle: int = 1
    block_steps: int = 6

    def argv(self) -> list[str]:
        return ["--width", str(self.width), "--layers", str(self.layers), "--batch", str(self.batch),
                "--warmup", str(self.warmup), "--blocks", str(self.blocks), "--settle", str(self.settle),
                "--block-steps", str(self.block_steps)]


@dataclass(frozen=True)
class Config:
    """One configuration: ranks (even: half per node) and the link's rate each way."""

    world_size: int
    rate_bit_s: float

    def __post_init__(self) -> None:
        if self.world_size < 2 or self.world_size % 2:
            raise ValueError(f"world_size must be even and at least 2 (half per node), got {self.world_size}")

    @property
    def name(self) -> str:
        return f"{self.world_size}ranks-{self.rate_bit_s / 1e6:g}Mbit"

    @property
    def per_node(self) -> int:
        return self.world_size // 2


def rate_of(rates: Sequence[float], block: int) -> float:
    """The rate of ``block``: ABBA over two rates (A B B A A B ...); more rates cycle forwards then back."""
    lap, pos = divmod(block, len(rates))
    return rates[pos if lap % 2 == 0 else len(rates) - 1 - pos]


def ring_edge_fraction(world_size: int) -> float:
    """Share of the buffer a ring all-reduce sends over each ring edge: ``2 (n − 1) / n``."""
    return 2 * (world_size - 1) / world_size


@dataclass
class Measured:
    """One configuration's recorded run and the truth its job timed (module docstring)."""

    config: Config
    job: str
    run_dir: Path
    reports: list[dict[str, Any]]  # each rank's scaling_train.py report, by rank, ``steps`` of this rate only
    wall_s: float  # the job's launch to exit (both rates)
    step_s: float = field(init=False)
    tokens_per_s: float = field(init=False)

    def __post_init__(self) -> None:
        steps = [seconds for r in self.reports for _, _, seconds in r["steps"]]
        self.step_s = statistics.median(steps)
        tokens = sum(int(r["tokens_per_step"]) for r in self.reports)
        self.tokens_per_s = tokens / self.step_s

    @property
    def grad_bytes(self) -> int:
        return int(self.reports[0]["grad_bytes"])

    @property
    def bottleneck_bytes(self) -> float:
        """Bytes per step each direction of the limited link carries (module docstring)."""
        return ring_edge_fraction(self.config.world_size) * self.grad_bytes

    @property
    def rank_step_s(self) -> dict[int, float]:
        """Each rank's median step time after warm-up."""
        return {int(r["rank"]): statistics.median(seconds for _, _, seconds in r["steps"]) for r in self.reports}

    def summary(self) -> dict[str, Any]:
        """The figures of this configuration, for tables and JSON (milliseconds, MB, tokens/s)."""
        wire = self.bottleneck_bytes * 8 / self.config.rate_bit_s
        return {"config": self.config.name, "world_size": self.config.world_size,
                "rate_mbit_s": self.config.rate_bit_s / 1e6, "measured_step_ms": round(1e3 * self.step_s, 2),
                "tokens_per_s": round(self.tokens_per_s, 1), "grad_mb": round(self.grad_bytes / 1e6, 3),
                "bottleneck_mb": round(self.bottleneck_bytes / 1e6, 3), "wire_ms": round(1e3 * wire, 2),
                "wire_share": round(wire / self.step_s, 3),
                "rank_step_ms": {str(k): round(1e3 * v, 2) for k, v in sorted(self.rank_step_s.items())},
                "wall_s": round(self.wall_s, 1)}


def _env(link: VethLink, side: int, config: Config, agent: AgentProcess, job: str) -> dict[str, str]:
    first_gpu = side * config.per_node
    return {**{k: os.environ[k] for k in _KEPT_ENV if k in os.environ},
            "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": link.interfaces[side], "CHOPPER_AGENT": agent.target, "CHOPPER_JOB": job,
            "CUDA_VISIBLE_DEVICES": ",".join(str(first_gpu + g) for g in range(config.per_node))}


def _torchrun(link: VethLink, side: int, config: Config, argv: Sequence[str], out: Path, cores: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(side),
            "--nproc-per-node", str(config.per_node), "--master-addr", link.addresses[0],
            "--master-port", str(MASTER_PORT), "--max-restarts", "0", str(TRAIN), "--out", str(out),
            "--cores", cores, "--nice", str(RANK_NICE), *argv]


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def _serve_gates(out: Path, link: VethLink, rates: Sequence[float], served: int) -> int:
    """Answer the block gate the job waits at, if any (``scaling_train.py``); returns the blocks served."""
    if (out / f"block{served}.ready").exists():
        link.set_rate(rate_of(rates, served))
        (out / f"block{served}.go").touch()
        return served + 1
    return served


def _wait(procs: Sequence[subprocess.Popen[Any]], out: Path, link: VethLink, rates: Sequence[float],
          logs: Sequence[Path], job: str, deadline: float, timeout_s: float) -> None:
    """Serve the gates until both nodes' torchrun exited 0; the first failure or the deadline raises.

    Both nodes are watched at once: when one fails, the other would wait for it until its own
    rendezvous timeout, minutes later.
    """
    served = 0
    while True:
        codes = [proc.poll() for proc in procs]
        for side, code in enumerate(codes):
            if code not in (None, 0):
                raise RuntimeError(f"{job}: node {'ab'[side]}'s torchrun exited {code}; its log ends:\n"
                                   f"{_tail(logs[side])}")
        if all(code == 0 for code in codes):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{job} ran past {timeout_s:g} s; node a's log ends:\n{_tail(logs[0])}\n"
                               f"node b's log ends:\n{_tail(logs[1])}")
        served = _serve_gates(out, link, rates, served)
        time.sleep(0.01)


def split_run(recording: Path, steps: dict[Config, set[int]], out: Path) -> dict[Config, Path]:
    """One run directory per configuration from the job's recording: its devices, samples and links,
    and the markers of that configuration's timed steps only.

    Raises:
        RuntimeError: A timed step has no ``step_end`` marker of every rank in the recording.
    """
    import pandas as pd

    from chopper.runs.rundir import read_run, write_run

    run = read_run(recording)
    ranks = run.markers["rank"].nunique()
    ended = run.markers[run.markers["kind"] == "step_end"].groupby("step")["rank"].nunique()
    dirs = {}
    for config, wanted in steps.items():
        missing = sorted(s for s in wanted if ended.get(s, 0) < ranks)
        if missing:
            raise RuntimeError(f"{recording}: timed step(s) {missing[:5]} of {config.name} lack a rank's step_end; "
                               "the markers did not reach the recording")
        markers = run.markers[run.markers["step"].isin(pd.Series(sorted(wanted)))]
        dirs[config] = write_run(out / f"{config.name}-run", run.devices, run.samples, markers, links=run.links)
    return dirs


def run_world(agent: AgentProcess, workdir: Path, world_size: int, rates_bit_s: Sequence[float], workload: Workload,
              timeout_s: float, prefix: str = "scaling") -> list[Measured]:
    """One job of ``world_size`` ranks over a fresh link, its blocks alternating between the rates (ABBA).

    The job is Chopper job ``<prefix>-<world_size>ranks``, recorded from its launch to its last
    report; each rate is a configuration of its own (``Measured``), with a run directory holding
    that rate's timed steps (``split_run``, module docstring).

    Raises:
        TimeoutError: The job did not finish within ``timeout_s`` (everything it started is removed).
        RuntimeError: A node's torchrun failed, a rank wrote no report, or the recording lacks a timed step.
    """
    from chopper.runs.record import record

    configs = {rate: Config(world_size, rate) for rate in rates_bit_s}
    job = f"{prefix}-{world_size}ranks"
    out = workdir / job
    out.mkdir(parents=True)
    logs = [out / f"node{side}.log" for side in range(2)]
    cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    first = configs[rate_of(rates_bit_s, 0)]
    stop = threading.Event()
    recorder = threading.Thread(target=record, args=(agent.target, out / "recording", None, time.time_ns(), stop),
                                name="scaling-recorder", daemon=True)
    recorder.start()
    started = time.monotonic()
    try:
        with VethLink(first.rate_bit_s) as link:
            try:
                procs = []
                for side in range(2):
                    with open(logs[side], "wb") as log:
                        procs.append(link.popen(side, _torchrun(link, side, first, workload.argv(), out, cores),
                                                cwd=REPO, env=_env(link, side, first, agent, job),
                                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True))
                _wait(procs, out, link, rates_bit_s, logs, job, started + timeout_s, timeout_s)
            finally:
                link.kill_inside()
        wall_s = time.monotonic() - started
        time.sleep(RECORD_TAIL_S)
    finally:
        stop.set()
        recorder.join(COMMAND_TIMEOUT_S)
    missing = [r for r in range(world_size) if not (out / f"rank{r}.json").exists()]
    if missing:
        raise RuntimeError(f"{job}: rank(s) {missing} wrote no report; logs in {out}")
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world_size)]
    by_config = {c: [{**r, "steps": [s for s in r["steps"] if rate_of(rates_bit_s, s[1]) == rate]} for r in reports]
                 for rate, c in configs.items()}
    dirs = split_run(out / "recording", {c: {s[0] for s in rs[0]["steps"]} for c, rs in by_config.items()}, workdir)
    return [Measured(c, job, dirs[c], by_config[c], wall_s) for c in configs.values()]


def run_all(agent: AgentProcess, workdir: Path, world_sizes: Sequence[int], rates_bit_s: Sequence[float],
            workload: Workload, timeout_s: float, prefix: str = "scaling") -> list[Measured]:
    """``run_world`` for each world size in turn (one namespace-heavy job at a time)."""
    return [m for world_size in world_sizes
            for m in run_world(agent, workdir, world_size, rates_bit_s, workload, timeout_s, prefix)]


def bandwidth_gbs(rate_bit_s: float) -> float:
    """A link rate in bit/s as ``chopper predict`` takes bandwidths: GB/s (10⁹ bytes/s)."""
    return rate_bit_s / 8 / 1e9


def predict_json(inputs: Sequence[RunInputs], world_size: int, rate_bit_s: float) -> dict[str, Any]:
    """What ``chopper predict RUN... --run-bandwidth B... --world-size N --bandwidth B --json`` prints.

    The command's own functions (``predict``, ``report.to_json``) on inputs read once per run
    (``load_inputs``), since every run is an input of three predictions.

    Raises:
        PredictionRefused, FitRefused, PredictInputError: As the command refuses.
    """
    from chopper.predict import predict
    from chopper.predict.report import to_json

    return to_json(predict(inputs, world_size, bandwidth_gbs(rate_bit_s)))


def held_back(measured: Sequence[Measured]) -> list[dict[str, Any]]:
    """Each configuration predicted from all the others and compared with what its job timed.

    Returns:
        One row per configuration: its ``summary()`` figures, ``predicted_step_ms`` and
        ``uncertainty_ms`` (one standard deviation, predict's own), ``error`` (predicted ÷ measured
        − 1), ``within_goal`` (``|error| ≤ GOAL_REL_ERROR``), the predicted and measured tokens/s,
        predict's split (``noncomm_ms``, ``comm_ms``, ``exposed_ms``), ``own_noncomm_ms`` (the
        median non-communication time of this configuration's own run, which the prediction did
        not see: beside ``noncomm_ms`` it shows how much of the error is compute that moved with
        the rate), the inputs' configurations
        and the fits' relative RMS residuals; or, where predict refused, ``refused`` with its
        message and ``within_goal`` False.
    """
    from chopper.predict import FitRefused, PredictInputError, PredictionRefused, load_inputs

    inputs = {m.config: load_inputs(m.run_dir, job=m.job, bandwidth_gbs=bandwidth_gbs(m.config.rate_bit_s))
              for m in measured}
    rows = []
    for target in measured:
        others = [m for m in measured if m is not target]
        own = 1e3 * float(inputs[target.config].steps["noncomm_s"].median())
        row = {**target.summary(), "from": [m.config.name for m in others], "own_noncomm_ms": round(own, 2)}
        try:
            result = predict_json([inputs[m.config] for m in others], target.config.world_size,
                                  target.config.rate_bit_s)
        except (PredictionRefused, FitRefused, PredictInputError) as exc:
            rows.append({**row, "refused": f"{type(exc).__name__}: {exc}", "within_goal": False})
            continue
        p = result["prediction"]
        error = p["step_time_s"] / target.step_s - 1
        rows.append({**row, "predicted_step_ms": round(1e3 * p["step_time_s"], 2),
                     "uncertainty_ms": round(1e3 * p["uncertainty_s"], 2), "error": round(error, 4),
                     "within_goal": abs(error) <= GOAL_REL_ERROR,
                     "predicted_tokens_per_s": round(p["tokens_per_s"], 1),
                     "noncomm_ms": round(1e3 * p["noncomm_s"], 2), "comm_ms": round(1e3 * p["comm_s"], 2),
                     "exposed_ms": round(1e3 * p["exposed_comm_s"], 2),
                     "fit_rms_rel": {f["collective"]: round(f["rms_rel"], 4) for f in result["fits"]}})
    return rows
