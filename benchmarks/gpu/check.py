"""``make gpu-check`` / ``python -m benchmarks.gpu``: the agent and a real training loop on a real GPU.

One run, a few minutes, nothing changed on the device (``provenance.NOT_CHANGED``):

1. Pre-flight, in this process: open and close the vendor backend once (``auto`` tries ``amd``
   then ``nvidia``, as the agent's detection does). No GPU, or no vendor library, ends the check
   with exit status 2 and the backend's own message, which names what is missing; so does a torch
   that cannot see a GPU of that vendor.
2. Start the agent daemon (``python -m agent``) with that backend on a private socket and wait
   until it answers ``GetInfo``.
3. Build the job (``workload``) on the device, count its FLOPs per step with ``FlopCounterMode``,
   then ``chopper.init`` (after CUDA/HIP is initialised, so that markers carry device-event
   timestamps, ``chopper._device_clock``) and ``chopper.pytorch.instrument`` with those FLOPs. Warm
   up for ``--warmup`` seconds.
4. Start recording the agent (``chopper.runs.record.record`` from now on) and following its live step
   summaries, train for ``--duration`` seconds timed by the loop's own device events, flush the
   markers, wait until a live summary of every trained step is in (``LIVE_WAIT_S`` at most: the
   agent summarises a step once a sample at or after its end arrived, which takes as long as the
   backend's samples lag the clock), then a few sample periods more for the recording's stream to
   carry that sample, and stop both.
5. Attribute the recorded run (``chopper.attribution``), compute the figures (``figures``), check
   that the rank's GPU is the one torch trained on (by UUID), write ``PROVENANCE.md`` and
   ``check.json`` into the run directory and print the figures.

``--backend simulated`` is the dry run for machines without a GPU: the same steps against the
agent's simulated backend (one H200, driven by the markers) with the job on the CPU, where
markers carry CPU timestamps. Exit status: 0 when the run was recorded and attributed, 1 when the
check failed on the way (the message says where), 2 when it cannot run on this machine.
"""
from __future__ import annotations

import argparse
import datetime
import logging
import re
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from agent.backends.base import BackendError, BackendUnavailable
from agent.backends.select import create_backend
from agent.config import AgentSettings
from benchmarks.gpu import provenance
from chopper.schema import DeviceInfo

log = logging.getLogger("gpu_check")

JOB = "gpu-check"
FIXTURES = provenance.ROOT / "tests" / "fixtures" / "gpu"
SIM_MODEL = "H200"  # the dry run simulates the GPU this check is first meant for
AGENT_START_S = 60.0
# Sample periods waited after the last live summary, so that the sample after the last step's end
# that the summary waited for reaches the recording too.
SETTLE_PERIODS = 3
# Longest wait for the last steps' live summaries, s: the agent summarises every 0.5 s and batches
# Subscribe 0.25 s apart (agent/daemon.py, agent/server.py), with room for a loaded machine.
LIVE_WAIT_S = 10.0


class CheckFailed(Exception):
    """The check stopped on the way; the message says where and what to look at (exit 1)."""


class CannotRun(Exception):
    """This machine cannot run the check: no GPU, no vendor library, no GPU build of torch (exit 2)."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("auto", "nvidia", "amd", "simulated"), default="auto",
                   help="vendor backend (default auto: the one that finds a GPU); simulated: dry run on the CPU")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of training recorded (default 60)")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds of training before recording (default 5)")
    p.add_argument("--out", type=Path, default=None,
                   help="run directory to write (default tests/fixtures/gpu/<vendor>-<model>-<UTC time>)")
    p.add_argument("--peak-flops", type=float, default=0.0,
                   help="dense BF16 FLOP/s of the GPU when agent.backends.specs does not know the model "
                        "(passed to the agent)")
    args = p.parse_args(argv)
    if args.duration <= 0 or args.warmup < 0:
        p.error("--duration must be > 0 and --warmup >= 0")
    return args


def _settings(backend: str) -> AgentSettings:
    return AgentSettings(backend=backend, sim_model=SIM_MODEL, sim_gpus=1)


def preflight(choice: str) -> tuple[str, list[DeviceInfo]]:
    """Open and close the chosen backend once; the first that answers, with its devices.

    Raises:
        CannotRun: No backend found a GPU; the message carries each backend's reason.
    """
    reasons = []
    for name in ("amd", "nvidia") if choice == "auto" else (choice,):
        backend = create_backend(name, _settings(name))
        try:
            return name, backend.open()
        except (BackendUnavailable, BackendError) as exc:
            reasons.append(f"{name}: {exc}")
        finally:
            backend.close()
    raise CannotRun("no GPU answered through its vendor library (" + "; ".join(reasons) + ")")


def torch_device(backend: str, torch: Any) -> Any:
    """The torch device the job trains on: the current GPU, or the CPU for the dry run.

    Raises:
        CannotRun: torch sees no GPU, or is built for the other vendor.
    """
    if backend == "simulated":
        return torch.device("cpu")
    build = {"nvidia": ("cuda", "CUDA"), "amd": ("hip", "ROCm")}[backend]
    if getattr(torch.version, build[0], None) is None:
        raise CannotRun(f"torch {torch.__version__} is not built for {build[1]} (torch.version.cuda="
                        f"{torch.version.cuda}, hip={getattr(torch.version, 'hip', None)}); install a {build[1]} "
                        "build of torch for this python")
    if not torch.cuda.is_available():
        raise CannotRun(f"torch {torch.__version__} ({build[1]} build) sees no GPU: check the driver and "
                        "CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES")
    return torch.device("cuda", torch.cuda.current_device())


def default_out(device: DeviceInfo, now: datetime.datetime) -> Path:
    """``tests/fixtures/gpu/<vendor>-<model>-<YYYYMMDD-HHMM>`` (UTC), e.g. ``nvidia-h200-20250601-0930``."""
    words = re.sub(r"[^a-z0-9]+", " ", device.model.lower()).split()
    model = "-".join(w for w in words if w not in ("nvidia", "amd", "instinct", "simulated")) or "gpu"
    return FIXTURES / f"{device.vendor}-{model}-{now:%Y%m%d-%H%M}"


class _Thread:
    """Runs ``target`` in a daemon thread and hands back its result or its exception."""

    def __init__(self, name: str, target: Any, *args: Any) -> None:
        self._result: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(target, *args), name=name, daemon=True)
        self._thread.start()

    def _run(self, target: Any, *args: Any) -> None:
        try:
            self._result = target(*args)
        except BaseException as exc:  # handed to the caller of join()
            self._error = exc

    def join(self, timeout_s: float) -> Any:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise CheckFailed(f"{self._thread.name} did not finish within {timeout_s:g} s")
        if self._error is not None:
            raise CheckFailed(f"{self._thread.name} failed: {self._error}") from self._error
        return self._result


class LiveSummaries:
    """Follows the agent's step summaries of the check's job's steps that begin after ``since_ns``."""

    def __init__(self, target: str, since_ns: int) -> None:
        from chopper.proto.chopper.v1 import agent_pb2 as pb
        from chopper.runs import consumer

        self._pb = pb
        self._since_ns = since_ns
        self.summaries: list[Any] = []
        self._channel, stream = consumer.subscribe(
            target, pb.SubscribeRequest(step_summaries=True, since_ns=since_ns))
        self._thread = _Thread("step-summary subscriber", self._follow, stream)

    def _follow(self, stream: Any) -> None:
        import grpc

        try:
            for batch in stream:
                # The agent's buffers also replay warm-up steps that ended after since_ns.
                self.summaries += [s for s in batch.step_summaries if s.job == JOB and s.begin_ns >= self._since_ns]
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:  # cancelled is how stop() ends it
                raise

    def wait_for(self, count: int, timeout_s: float) -> bool:
        """Whether ``count`` summaries arrived within ``timeout_s`` (the stream keeps running)."""
        deadline = time.monotonic() + timeout_s
        while len(self.summaries) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(self.summaries) >= count

    def stop(self) -> dict[str, Any]:
        """End the stream; the summaries' count, timestamp sources and MFU (Σ ideal / Σ step time)."""
        self._channel.close()
        self._thread.join(10.0)
        clocks = Counter(self._pb.ClockSource.Name(s.clock).removeprefix("CLOCK_SOURCE_").lower()
                         for s in self.summaries)
        known = [s for s in self.summaries if s.ideal_s == s.ideal_s]  # NaN ideal: no FLOPs or no peak
        step_s = sum(s.step_time_s for s in known)
        return {"summaries": len(self.summaries), "clocks": dict(clocks) or "none",
                "mfu": sum(s.ideal_s for s in known) / step_s if step_s > 0 else float("nan")}


def _agent_argv(backend: str, workdir: Path, metrics: str, peak_flops: float) -> list[str]:
    s = _settings(backend)
    argv = [sys.executable, "-m", "agent", "--backend", backend, "--node", socket.gethostname(),
            "--socket-path", str(workdir / "agent.sock"), "--metrics-listen", metrics]
    if backend == "simulated":
        argv += ["--sim-model", s.sim_model, "--sim-gpus", str(s.sim_gpus)]
    if peak_flops > 0:
        argv += ["--peak-flops", repr(peak_flops)]
    return argv


def _uuid_key(uuid: str) -> str:
    """NVML names a GPU ``GPU-<uuid>``, torch ``<uuid>``: compare the hex digits only."""
    return re.sub(r"[^0-9a-f]", "", uuid.lower().removeprefix("gpu-"))


def identity(torch: Any, device: Any, devices: Sequence[Any], resolved_gpu: int) -> tuple[str, bool]:
    """Whether the rank's GPU (as ``chopper.init`` resolved it) is the one torch trains on, by UUID.

    Returns:
        A sentence for the record, and False only when the UUIDs prove a different GPU.
    """
    if device.type != "cuda":
        return f"the job runs on the CPU; gpu {resolved_gpu} is a simulated GPU the markers drive", True
    uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", ""))
    match = [d.gpu for d in devices if uuid and _uuid_key(d.uuid) == _uuid_key(uuid)]
    if not match:
        return f"torch's device uuid {uuid or '(none)'} matches no agent device; gpu {resolved_gpu} unverified", True
    same = match[0] == resolved_gpu
    return (f"chopper resolved gpu {resolved_gpu}; torch's device {uuid} is agent gpu {match[0]}"
            f"{'' if same else ': a DIFFERENT GPU'}"), same


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise CheckFailed(f"stopped by signal {signum} (the time limit of make gpu-check?)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check; 0 recorded and attributed, 1 failed on the way, 2 cannot run here."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    from chopper.daemon import logs

    logs.configure("info")
    # SIGTERM (from `timeout`) unwinds through the finally blocks, so the agent is stopped too.
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        return _check(args, argv)
    except CannotRun as exc:
        print(f"gpu-check: cannot run on this machine: {exc}", file=sys.stderr)
        return 2
    except CheckFailed as exc:
        print(f"gpu-check: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)


def _check(args: argparse.Namespace, argv: list[str]) -> int:
    # datetime.UTC is 3.11+: the GPU machine runs this on its own python, which may be 3.10.
    started = datetime.datetime.now(datetime.timezone.utc)  # noqa: UP017
    backend, devices = preflight(args.backend)
    log.info("event=backend_found backend=%s gpus=%d model=%r", backend, len(devices), devices[0].model)
    out = (args.out or default_out(devices[0], started)).resolve()
    from chopper.runs.record import RecordError, check_output

    try:
        check_output(out)
    except RecordError as exc:
        raise CheckFailed(str(exc)) from exc
    workdir = Path(tempfile.mkdtemp(prefix="chopper-gpu-check-"))
    from chopper.demo.run import free_port
    from deploy.stack.services import Service, StackError, wait_ready

    metrics = f"127.0.0.1:{free_port()}"
    agent = Service("agent", _agent_argv(backend, workdir, metrics, args.peak_flops), workdir / "agent.log",
                    ready_url=f"http://{metrics}/metrics")
    try:
        agent.start()  # it starts while torch is imported
        try:
            import torch
        except ImportError as exc:
            raise CannotRun(f"torch cannot be imported by {sys.executable} ({exc}); the check trains with it") from exc
        device = torch_device(backend, torch)
        try:
            wait_ready([agent], AGENT_START_S)
            log.info("event=agent_ready backend=%s", backend)
            record = _train_and_record(args, backend, device, torch, f"unix://{workdir / 'agent.sock'}", out, agent)
        except StackError as exc:
            raise CheckFailed(str(exc)) from exc
    finally:
        stopped = agent.stop()
        if out.is_dir():
            shutil.copyfile(agent.log, out / "agent.log")
        shutil.rmtree(workdir, ignore_errors=True)
    log.info("event=agent_stopped how=%r", stopped)
    record["date"] = started.isoformat(timespec="seconds")
    record["command"] = shlex.join([Path(sys.executable).name, "-m", "benchmarks.gpu", *argv])
    provenance.write(out, record)
    print(f"gpu-check: {record['device']['model']}, {backend} backend; {record['identity']}")
    print("\n".join(provenance.figure_lines(record)))
    print(f"gpu-check: wrote {out} (PROVENANCE.md, check.json, {record['recorded']})")
    if not record["identity_ok"]:
        raise CheckFailed(f"the markers name another GPU than the one torch trained on: {record['identity']}")
    return 0


def timed_steps(steps: Any, since_ns: int) -> Any:
    """The attributed steps of the timed loop: those that began at or after ``since_ns``.

    The recording subscribes from ``since_ns``, but the agent also streams every marker that arrives
    after the subscription began, and the client sends the last warm-up steps' markers up to a flush
    interval after they were stamped; those steps are the loop's warm-up, not its timed part.
    """
    return steps[steps["begin_ns"] >= since_ns]


def _train_and_record(args: argparse.Namespace, backend: str, device: Any, torch: Any, target: str, out: Path,
                      agent: Any) -> dict[str, Any]:
    """Steps 3–5 of the module docstring; returns the run's record."""
    import chopper
    import chopper.pytorch as chopper_torch
    from benchmarks.gpu import figures, workload
    from chopper.attribution import attribute
    from chopper.runs import consumer
    from chopper.runs.record import record
    from chopper.runs.rundir import read_run

    info = consumer.wait_for_info(target, timeout_s=AGENT_START_S)
    shape = workload.GPU_SHAPE if device.type == "cuda" else workload.CPU_SHAPE
    job = workload.build(shape, device)
    flops = workload.count_flops(job)
    log.info("event=job_built device=%s flops_per_step=%.6g analytic=%.6g", device, flops, shape.flops_per_step())
    # Only the dry run names its GPU: a CPU job has no device for chopper to resolve.
    client = chopper.init(job=JOB, rank=0, agent=target, gpu=0 if device.type == "cpu" else None)
    inst = chopper_torch.instrument(job.model, job.optimizer, flops_per_step=flops, tokens_per_step=shape.batch)
    try:
        workload.run_for(job, args.warmup)
        since_ns = time.time_ns()
        stop = threading.Event()
        recording = _Thread("recorder", record, target, out, None, since_ns, stop)
        live = LiveSummaries(target, since_ns)
        log.info("event=recording out=%s duration_s=%g", out, args.duration)
        loop = workload.timed_loop(job, args.duration)
    finally:
        inst.remove()
        chopper.shutdown(timeout=10.0)
    live.wait_for(loop.steps, LIVE_WAIT_S)
    time.sleep(SETTLE_PERIODS / info.sample_hz)
    stop.set()
    stats = recording.join(30.0)
    live_figures = live.stop()
    if agent.exit_code() is not None:
        raise CheckFailed(f"the agent exited with {agent.exit_code()} during the run; its log ends:\n"
                          f"{agent.log_tail()}")
    run = read_run(out)
    steps = timed_steps(attribute(run.devices, run.samples, run.markers, job=JOB).steps, since_ns)
    if steps.empty:
        raise CheckFailed(f"no complete step of job {JOB} in the recording {out} (markers {stats.markers}, "
                          f"client {chopper.stats()})")
    gpu = int(steps["gpu"].iloc[0])
    rows = run.devices[run.devices["gpu"] == gpu]
    if rows.empty:
        raise CheckFailed(f"the markers name gpu {gpu}, which the agent does not have (devices "
                          f"{run.devices['gpu'].tolist()})")
    dev = rows.iloc[0]
    said, same = identity(torch, device, info.devices, client.gpu)
    figs = figures.compute(steps, run.samples, dev, loop.steps, loop.seconds, flops)
    vendor = str(dev["vendor"])
    return {
        "job": JOB,
        "backend": backend,
        "device": {k: (v.item() if hasattr(v, "item") else v) for k, v in dev.items()},
        "devices": run.devices.to_dict("records"),
        "driver": provenance.driver(vendor, gpu),
        "environment": provenance.environment(torch, device),
        "agent": {"backend": info.backend, "sample_hz": info.sample_hz, "version": info.version},
        "identity": said,
        "identity_ok": same,
        "shape": {"width": shape.width, "layers": shape.layers, "batch": shape.batch, "dtype": shape.dtype},
        "warmup_s": args.warmup,
        "since_ns": since_ns,
        "loop": {"steps": loop.steps, "seconds": loop.seconds, "timer": loop.timer, "flops_per_step": flops,
                 "flops_analytic": shape.flops_per_step()},
        "peak_flops": float(dev["peak_flops"]),
        "counter_source": {"nvidia": "NVML GPM ANY_TENSOR_UTIL", "amd": "amdsmi (no matrix-activity counter)",
                           "simulated": "simulated matrix activity"}.get(vendor, vendor),
        "recorded": f"devices {stats.devices}, samples {stats.samples}, markers {stats.markers} over "
                    f"{stats.duration_s:.1f} s",
        "client": chopper.stats(),
        "live": live_figures,
        "figures": figs.as_dict(),
    }
