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
3. One job per world size runs one phase per link rate: at the job's gate before a phase the
   harness sets that phase's rate; at the gate after its warm-up steps it notes the time, which
   is where that configuration's recorded run begins. A configuration is one (world size, rate)
   phase. Its markers and samples are recorded (``chopper.runs.record.record``) into a run
   directory of its own while the job waits at the next phase's gate (the last: once every rank
   reported), so each run directory holds exactly the steps the job timed at that rate. One job
   for both rates halves the start-ups (torchrun, torch, DDP's imports: ~25 s a job on two busy
   cores) and measures both rates on the same processes.
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

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
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
RECORD_S = 2.0  # the buffered run is replayed at once; this only bounds the stream's tail
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
    steps: int = 30

    def argv(self) -> list[str]:
        return ["--width", str(self.width), "--layers", str(self.layers), "--batch", str(self.batch),
                "--warmup", str(self.warmup), "--steps", str(self.steps)]


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


def ring_edge_fraction(world_size: int) -> float:
    """Share of the buffer a ring all-reduce sends over each ring edge: ``2 (n − 1) / n``."""
    return 2 * (world_size - 1) / world_size


@dataclass
class Measured:
    """One configuration's recorded run and the truth its job timed (module docstring)."""

    config: Config
    job: str
    run_dir: Path
    reports: list[dict[str, Any]]  # each rank's scaling_train.py report, by rank, ``step_s`` of this phase only
    wall_s: float  # the job's launch to exit (all its phases)
    step_s: float = field(init=False)
    tokens_per_s: float = field(init=False)

    def __post_init__(self) -> None:
        steps = [s for r in self.reports for s in r["step_s"]]
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
        return {int(r["rank"]): statistics.median(r["step_s"]) for r in self.reports}

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


def kill_namespace_processes(link: VethLink) -> int:
    """SIGKILL every process inside the link's namespaces (torchrun and its workers); returns how many."""
    killed = 0
    for ns in link.namespaces:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            listed = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                                    timeout=COMMAND_TIMEOUT_S, check=False).stdout.split()
            for pid in listed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
                    killed += 1
    return killed


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


class _Gates:
    """The harness's side of the job's gates (``scaling_train.py``): rates, run windows, recordings."""

    def __init__(self, link: VethLink, agent: AgentProcess, out: Path, rates: Sequence[float], world_size: int) -> None:
        self.link, self.agent, self.out, self.rates, self.world_size = link, agent, out, rates, world_size
        self.since_ns: list[int] = []  # where each phase's timed steps begin, CLOCK_REALTIME ns
        self.recorded: list[Path] = []

    def poll(self) -> None:
        """Answer the gate the job waits at, if any; record a phase when the next one asks for its rate.

        The last phase is recorded as soon as every rank wrote its report (its markers were
        delivered before), while the processes exit.
        """
        phase = len(self.since_ns)
        if phase == len(self.rates):
            if len(self.recorded) < phase and self.reported():
                self.record(phase - 1)
        elif (self.out / f"phase{phase}.ready").exists() and not (self.out / f"phase{phase}.go").exists():
            if phase:
                self.record(phase - 1)  # the job waits here, so the recording holds only phase - 1
            self.link.set_rate(self.rates[phase])
            (self.out / f"phase{phase}.go").touch()
        elif (self.out / f"measure{phase}.ready").exists():
            self.since_ns.append(time.time_ns())
            (self.out / f"measure{phase}.go").touch()

    def reported(self) -> bool:
        return all((self.out / f"rank{r}.json").exists() for r in range(self.world_size))

    def record(self, phase: int) -> None:
        from chopper.runs.record import record

        run_dir = self.out.parent / f"{self.out.name}-{self.rates[phase] / 1e6:g}Mbit-run"
        record(self.agent.target, run_dir, RECORD_S, self.since_ns[phase])
        self.recorded.append(run_dir)


def _wait(procs: Sequence[subprocess.Popen[Any]], gates: _Gates, logs: Sequence[Path], job: str, deadline: float,
          timeout_s: float) -> None:
    """Serve the gates until both nodes' torchrun exited 0; the first failure or the deadline raises.

    Both nodes are watched at once: when one fails, the other would wait for it until its own
    rendezvous timeout, minutes later.
    """
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
        gates.poll()
        time.sleep(0.01)


def run_world(agent: AgentProcess, workdir: Path, world_size: int, rates_bit_s: Sequence[float], workload: Workload,
              timeout_s: float, prefix: str = "scaling") -> list[Measured]:
    """One job of ``world_size`` ranks over a fresh link, one phase per rate, one recorded run per phase.

    The job is Chopper job ``<prefix>-<world_size>ranks``; each phase is a configuration of its own
    (``Measured``), recorded from its first timed step to the gate that ends it (module docstring).

    Raises:
        TimeoutError: The job did not finish within ``timeout_s`` (everything it started is removed).
        RuntimeError: A node's torchrun failed or a rank wrote no report.
    """
    configs = [Config(world_size, rate) for rate in rates_bit_s]
    job = f"{prefix}-{world_size}ranks"
    out = workdir / job
    out.mkdir(parents=True)
    logs = [out / f"node{side}.log" for side in range(2)]
    cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    argv = [*workload.argv(), "--phases", str(len(configs))]
    started = time.monotonic()
    with VethLink(rates_bit_s[0]) as link:
        gates = _Gates(link, agent, out, rates_bit_s, world_size)
        try:
            procs = []
            for side in range(2):
                with open(logs[side], "wb") as log:
                    procs.append(link.popen(side, _torchrun(link, side, configs[0], argv, out, cores), cwd=REPO,
                                            env=_env(link, side, configs[0], agent, job), stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            _wait(procs, gates, logs, job, started + timeout_s, timeout_s)
        finally:
            kill_namespace_processes(link)
    wall_s = time.monotonic() - started
    missing = [r for r in range(world_size) if not (out / f"rank{r}.json").exists()]
    if missing or len(gates.since_ns) != len(configs):
        raise RuntimeError(f"{job}: rank(s) {missing} wrote no report, {len(gates.since_ns)} of {len(configs)} "
                           f"phases timed; logs in {out}")
    if len(gates.recorded) < len(configs):
        gates.record(len(configs) - 1)
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world_size)]
    return [Measured(config, job, run_dir, [{**r, "step_s": r["step_s"][k]} for r in reports], wall_s)
            for k, (config, run_dir) in enumerate(zip(configs, gates.recorded, strict=True))]


def run_all(agent: AgentProcess, workdir: Path, world_sizes: Sequence[int], rates_bit_s: Sequence[float],
            workload: Workload, timeout_s: float, prefix: str = "scaling") -> list[Measured]:
    """``run_world`` for each world size in turn (one namespace-heavy job at a time).

    Every other world size runs the rates in reverse order (A B, then B A), so a machine that
    drifts during the experiment moves both rates alike.
    """
    measured: list[Measured] = []
    for i, world_size in enumerate(world_sizes):
        rates = list(rates_bit_s) if i % 2 == 0 else list(rates_bit_s)[::-1]
        measured += run_world(agent, workdir, world_size, rates, workload, timeout_s, prefix)
    return measured


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
        predict's split (``noncomm_ms``, ``comm_ms``, ``exposed_ms``), the inputs' configurations
        and the fits' relative RMS residuals; or, where predict refused, ``refused`` with its
        message and ``within_goal`` False.
    """
    from chopper.predict import FitRefused, PredictInputError, PredictionRefused, load_inputs

    inputs = {m.config: load_inputs(m.run_dir, job=m.job, bandwidth_gbs=bandwidth_gbs(m.config.rate_bit_s))
              for m in measured}
    rows = []
    for target in measured:
        others = [m for m in measured if m is not target]
        row = {**target.summary(), "from": [m.config.name for m in others]}
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
