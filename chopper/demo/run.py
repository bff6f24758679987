"""Orchestrates ``chopper demo``: agent process, training job, live step table, final tallies.

1. Start ``chopper-agent`` with ``--backend auto`` (real GPUs when present, else a simulated
   MI300X node, which the agent logs plainly) on a private unix socket and a free metrics port.
2. Wait until it answers ``GetInfo``; print its devices and the ``/metrics`` address.
3. Run ``chopper.demo.train`` (2 CPU ranks, gloo) against it, printing each step summary the
   agent streams back as a table row.
4. Print what the trainers sent next to what the agent's ``/metrics`` counted, then stop the
   agent with SIGTERM.
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

from chopper import consumer, steptable
from chopper.proto.chopper.v1 import agent_pb2 as pb


@dataclass
class DemoOptions:
    """What ``chopper demo`` runs. Durations in seconds."""

    duration_s: float = 60.0
    ranks: int = 2
    model: str = "MI300X"
    gpus: int = 8
    sample_hz: float = 10.0
    backend: str = "auto"


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
    print(steptable.header(), file=out, flush=True)
    try:
        for batch in stream:
            for summary in batch.step_summaries:
                print(steptable.row(summary), file=out, flush=True)
    except grpc.RpcError:
        pass  # the channel was closed at the end of the demo, or the agent went away


def run_demo(options: DemoOptions, out: TextIO = sys.stdout) -> int:
    """Run the demo end to end; returns 0 when the agent counted every step that was sent."""
    workdir = Path(tempfile.mkdtemp(prefix="chopper-demo-"))
    sock = workdir / "agent.sock"
    target = f"unix://{sock}"
    metrics_addr = f"127.0.0.1:{free_port()}"
    agent_cmd = [
        sys.executable, "-m", "agent", "--backend", options.backend, "--socket-path", str(sock),
        "--metrics-listen", metrics_addr, "--sim-model", options.model, "--sim-gpus", str(options.gpus),
        "--sample-hz", str(options.sample_hz), "--node", socket.gethostname(),
    ]
    agent = subprocess.Popen(agent_cmd, stderr=open(workdir / "agent.log", "w"))  # noqa: SIM115
    try:
        info = consumer.wait_for_info(target, timeout_s=30.0)
        print(f"agent: backend={info.backend} node={info.node} gpus={len(info.devices)} "
              f"model={info.devices[0].model if info.devices else '-'} sample_hz={info.sample_hz:g}", file=out)
        print(f"agent log: {workdir / 'agent.log'}", file=out)
        print(f"metrics:   http://{metrics_addr}/metrics", file=out)
        print(f"training:  {options.ranks} CPU ranks (gloo) for {options.duration_s:g} s\n", file=out, flush=True)
        stop = threading.Event()
        printer = threading.Thread(target=_print_rows, args=(target, out, stop), daemon=True)
        printer.start()
        train = subprocess.run(
            [sys.executable, "-m", "chopper.demo.train", "--agent", target, "--ranks", str(options.ranks),
             "--duration", str(options.duration_s), "--port", str(free_port())],
            capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}, check=False,
        )
        time.sleep(2.5 / options.sample_hz + 0.5)  # let the last summaries be covered by samples
        stop.set()
        printer.join(5)
        if train.returncode != 0:
            print(f"\ntraining failed (exit {train.returncode}):\n{train.stderr[-4000:]}", file=out)
            return 1
        sent = json.loads(train.stdout.strip().splitlines()[-1])
        metrics = scrape(f"http://{metrics_addr}/metrics")
        return _report(sent, metrics, metrics_addr, out)
    except consumer.AgentUnreachable as exc:
        print(f"demo: {exc}\nagent log:\n{(workdir / 'agent.log').read_text()[-4000:]}", file=out)
        return 1
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            agent.kill()


def _report(sent: dict[str, dict], metrics: str, metrics_addr: str, out: TextIO) -> int:
    print("\nrank  steps sent/seen  phases sent/seen  collectives sent/seen  client drops", file=out)
    ok = True
    for rank, counts in sorted(sent.items(), key=lambda kv: int(kv[0])):
        seen = {
            kind: int(metric_sum(metrics, "chopper_rank_markers_received_total", rank=rank, job="demo", kind=kind))
            for kind in ("step_end", "phase_end", "collective_end")
        }
        ok &= (seen["step_end"], seen["phase_end"], seen["collective_end"]) == (
            counts["steps"], counts["phases"], counts["collectives"])
        print(f"{rank:>4}  {counts['steps']:>5}/{seen['step_end']:<9} {counts['phases']:>6}/{seen['phase_end']:<9} "
              f"{counts['collectives']:>11}/{seen['collective_end']:<9} {counts['client']['dropped']:>12}", file=out)
    print(f"\nall markers accounted for: {'yes' if ok else 'NO'}; metrics were at http://{metrics_addr}/metrics",
          file=out)
    return 0 if ok else 1
