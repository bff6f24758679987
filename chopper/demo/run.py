"""Orchestrates ``chopper demo``: agent, recording, training job, live step table, verdict, report.

1. Start ``chopper-agent`` with ``--backend auto`` (real GPUs when present, else a simulated
   MI300X node, which the agent logs plainly) on a private unix socket and a free metrics port.
   The simulated node has a power cap on every GPU (``power_cap_w``, by default ``CAP_OF_TDP`` of
   the model's TDP, an administrator's limit) and one GPU with failed cooling (``hot_gpu``): the
   scenario that the rest of the demo uncovers from telemetry alone.
2. Wait until it answers ``GetInfo``; print its devices, the scenario and the ``/metrics`` address.
3. Record the agent's devices, samples and markers (``chopper.runs.record``, as ``chopper record``).
4. Run ``chopper.demo.train`` (CPU ranks, gloo) against it, printing every ``TABLE_EVERY``-th step
   summary the agent streams back as a table row. On the simulated node the job runs with
   ``--gpu-time``: each step stands in for a 1.3 B-parameter model's step on its (simulated) GPU,
   so the GPUs' clocks set its pace (``chopper.demo.gputime``).
5. Print what the trainers sent next to what the agent's ``/metrics`` counted, then stop the
   recording and the agent.
6. Attribute the recorded run offline and print the verdict (``chopper.demo.verdict``): where the
   time went, each rank's clock and DVFS loss by cause, the slowest rank and why; write the HTML
   report of the run (``chopper.report``, as ``chopper report``) and print its path.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import grpc

from agent.backends.specs import SPECS
from chopper.demo.gputime import StandIn
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.runs import consumer, steptable
from chopper.runs.record import RecordError, RecordStats, record
from chopper.runs.rundir import RunDirError

JOB = "demo"
# One table row per rank every this many steps: about one a second per rank, readable live; every
# step is in the recorded run and the report.
TABLE_EVERY = 2
# The simulated node's default power cap, as a share of the model's TDP: low enough that a healthy
# GPU loses a visible share of its clock for power, high enough that the GPU with failed cooling
# reaches its thermal limit within seconds (its thermal budget then binds below the cap).
CAP_OF_TDP = 0.75
# The table header again after this many rows, so that the columns stay named as it scrolls.
HEADER_EVERY = 40


@dataclass
class DemoOptions:
    """What ``chopper demo`` runs. Durations in seconds, power in watts.

    ``power_cap_w`` (every GPU; None: ``CAP_OF_TDP`` of the model's TDP) and ``hot_gpu`` (failed
    cooling) set the simulated node's scenario; a real backend ignores them.
    """

    duration_s: float = 60.0
    ranks: int = 2
    model: str = "MI300X"
    gpus: int = 8
    sample_hz: float = 10.0
    backend: str = "auto"
    power_cap_w: float | None = None
    hot_gpu: int = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def metric_sum(exposition: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (text exposition format)."""
    total = 0.0
    for line in exposition.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        series, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in series for k, v in labels.items()):
            total += float(value)
    return total


def _print_rows(target: str, out: TextIO, stop: threading.Event) -> None:
    channel, stream = consumer.subscribe(target, pb.SubscribeRequest(step_summaries=True))
    stop_watch = threading.Thread(target=lambda: (stop.wait(), channel.close()), daemon=True)
    stop_watch.start()
    rows = 0
    try:
        for batch in stream:
            for summary in batch.step_summaries:
                if summary.step % TABLE_EVERY:
                    continue
                if rows % HEADER_EVERY == 0:
                    print(steptable.header(), file=out, flush=True)
                print(steptable.row(summary), file=out, flush=True)
                rows += 1
    except grpc.RpcError:
        pass  # the channel was closed at the end of the demo, or the agent went away


class _Recording:
    """``chopper.runs.record.record`` of the agent into ``out`` on a thread, from now until ``stop()``."""

    def __init__(self, target: str, out: Path) -> None:
        self._stop = threading.Event()
        self._result: list[RecordStats | Exception] = []
        since_ns = time.time_ns()

        def run() -> None:
            try:
                self._result.append(record(target, out, None, since_ns, self._stop))
            except Exception as exc:  # handed to stop()'s caller, which reports it
                self._result.append(exc)

        self._thread = threading.Thread(target=run, name="chopper-demo-record", daemon=True)
        self._thread.start()

    def stop(self) -> RecordStats:
        self._stop.set()
        self._thread.join(60)
        result = self._result[0] if self._result else TimeoutError("the recording did not finish writing in 60 s")
        if isinstance(result, Exception):
            raise result
        return result


def _setup_lines(info: pb.AgentInfo, options: DemoOptions, cap_w: float, simulated: bool) -> list[str]:
    models = ", ".join(sorted({d.model for d in info.devices})) or "no GPU"
    vendors = ",".join(sorted({d.vendor for d in info.devices})) or "-"
    gpus = f"{len(info.devices)} × {models}, vendor={vendors}, sampled at {info.sample_hz:g} Hz"
    if not simulated:
        return [f"agent: backend={info.backend} node={info.node}: {gpus}",
                f"job: {options.ranks} CPU ranks (gloo); the GPUs are real, and this CPU job does not use them"]
    ranks = f"{options.ranks} CPU rank{'s' if options.ranks != 1 else ''}"
    lines = [
        f"SIMULATED node {info.node} (no GPU is measured): {gpus}",
        f"scenario: every GPU power-capped at {cap_w:g} W; gpu {options.hot_gpu} has failed cooling; "
        "rank r runs on gpu r",
    ]
    if options.hot_gpu >= options.ranks:
        lines.append(f"  (no rank runs on gpu {options.hot_gpu}: --ranks {options.hot_gpu + 1} puts one there)")
    return [
        *lines,
        f"job: {ranks} (gloo) train a small transformer; each step stands in for a step of",
        f"  {StandIn().describe()} on its GPU, at the clock that GPU",
        "  runs: a throttled GPU slows its rank. The verdict at the end is what the telemetry found.",
    ]


def run_demo(options: DemoOptions, out: TextIO = sys.stdout) -> int:
    """Run the demo end to end; returns 0 when the agent counted every step that was sent and the
    recorded run was attributed and reported."""
    spec = SPECS.get(options.model) or SPECS.get(options.model.upper())
    if spec is None:
        print(f"demo: unknown --model {options.model!r}; known models: {', '.join(SPECS)}", file=out)
        return 2
    cap_w = options.power_cap_w if options.power_cap_w is not None else round(CAP_OF_TDP * spec.tdp_w)
    workdir = Path(tempfile.mkdtemp(prefix="chopper-demo-"))
    sock = workdir / "agent.sock"
    target = f"unix://{sock}"
    metrics_addr = f"127.0.0.1:{free_port()}"
    agent_cmd = [
        sys.executable, "-m", "agent", "--backend", options.backend, "--socket-path", str(sock),
        "--metrics-listen", metrics_addr, "--sim-model", options.model, "--sim-gpus", str(options.gpus),
        "--sim-power-cap-w", str(cap_w), "--sim-hot-gpus", str(options.hot_gpu),
        "--sample-hz", str(options.sample_hz), "--node", socket.gethostname(),
    ]
    agent = subprocess.Popen(agent_cmd, stderr=open(workdir / "agent.log", "w"))  # noqa: SIM115
    try:
        info = consumer.wait_for_info(target, timeout_s=30.0)
        simulated = info.backend == "simulated"
        if simulated and options.ranks > len(info.devices):
            print(f"demo: --ranks {options.ranks} needs as many GPUs; the simulated node has {len(info.devices)}",
                  file=out)
            return 2
        for line in _setup_lines(info, options, cap_w, simulated):
            print(line, file=out)
        print(f"agent log: {workdir / 'agent.log'}\nmetrics:   http://{metrics_addr}/metrics\n"
              f"training for {options.duration_s:g} s; one step in {TABLE_EVERY} shown, times in ms\n",
              file=out, flush=True)
        # The report is titled after the run directory: it says plainly that the GPUs were simulated.
        recording = _Recording(target, workdir / ("simulated-run" if simulated else "run"))
        stop = threading.Event()
        printer = threading.Thread(target=_print_rows, args=(target, out, stop), daemon=True)
        printer.start()
        train = subprocess.run(
            [sys.executable, "-m", "chopper.demo.train", "--agent", target, "--ranks", str(options.ranks),
             "--duration", str(options.duration_s), "--port", str(free_port()), "--job", JOB,
             *(["--gpu-time"] if simulated else [])],
            capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}, check=False,
        )
        time.sleep(2.5 / options.sample_hz + 0.5)  # let the last summaries be covered by samples
        stop.set()
        printer.join(5)
        stats = recording.stop()
        if train.returncode != 0:
            print(f"\ntraining failed (exit {train.returncode}):\n{train.stderr[-4000:]}", file=out)
            return 1
        sent = json.loads(train.stdout.strip().splitlines()[-1])
        metrics = scrape(f"http://{metrics_addr}/metrics")
        counted = _report(sent, metrics, out)
        reported = _verdict(stats.out, workdir / "report.html", sent, info if simulated else None, out)
        return 0 if counted and reported else 1
    except consumer.AgentUnreachable as exc:
        print(f"demo: {exc}\nagent log:\n{(workdir / 'agent.log').read_text()[-4000:]}", file=out)
        return 1
    except (RecordError, RunDirError, TimeoutError) as exc:
        print(f"demo: recording the run into {workdir} failed: {exc}", file=out)
        return 1
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            agent.kill()


def _report(sent: dict[str, dict], metrics: str, out: TextIO) -> bool:
    print("\nrank  steps sent/seen  phases sent/seen  collectives sent/seen  client drops", file=out)
    ok = True
    for rank, counts in sorted(sent.items(), key=lambda kv: int(kv[0])):
        seen = {
            kind: int(metric_sum(metrics, "chopper_rank_markers_received_total", rank=rank, job=JOB, kind=kind))
            for kind in ("step_end", "phase_end", "collective_end")
        }
        ok &= (seen["step_end"], seen["phase_end"], seen["collective_end"]) == (
            counts["steps"], counts["phases"], counts["collectives"])
        print(f"{rank:>4}  {counts['steps']:>5}/{seen['step_end']:<9} {counts['phases']:>6}/{seen['phase_end']:<9} "
              f"{counts['collectives']:>11}/{seen['collective_end']:<9} {counts['client']['dropped']:>12}", file=out)
    print(f"all markers accounted for: {'yes' if ok else 'NO'}", file=out)
    return ok


def _trainer_mfu(sent: dict[str, dict], info: pb.AgentInfo | None) -> float | None:
    """MFU by the trainers' own step clocks: the stand-in's FLOPs over peak × their seconds."""
    if info is None:
        return None
    peak = {d.gpu: d.peak_flops for d in info.devices}
    flops = sum(StandIn().flops * c["steps"] for c in sent.values())
    busy = sum(peak.get(int(r), 0.0) * c["step_s"] for r, c in sent.items())
    return flops / busy if busy > 0 else None


def _verdict(run_dir: Path, report: Path, sent: dict[str, dict], info: pb.AgentInfo | None, out: TextIO) -> bool:
    """Attribute the recorded run, print the verdict, write the HTML report; False when either failed."""
    from chopper.attribution import AttributionError, attribute_run
    from chopper.demo.verdict import verdict_lines
    from chopper.report import ReportError, build_report

    try:
        result = attribute_run(run_dir, job=JOB)
        print(f"\nrecorded run: {run_dir}\nverdict (chopper attribute of the recorded run; nothing here comes from "
              "the scenario):", file=out)
        for line in verdict_lines(result, JOB, _trainer_mfu(sent, info)):
            print("  " + line, file=out)
        build_report(run_dir, report, job=JOB)
    except (AttributionError, ReportError, RunDirError, OSError) as exc:
        print(f"\ndemo: the recorded run {run_dir} could not be attributed or reported: {exc}", file=out)
        return False
    print(f"report: {report}\n  (chopper report RUN -o FILE writes it again; open it in a browser)", file=out)
    return True
