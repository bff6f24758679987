"""Agent CPU per marker ingested, with step summaries computed, from DDP-shaped marker streams.

Goals (issue: a lean agent): the agent ingests at least ``GOAL_MARKERS_PER_CORE_S`` markers per
second of its CPU (≤ 10 µs of CPU per marker) in large batches and in the small batches a
training loop's client sends, and ``PACED_RATE`` markers/s cost it at most ``GOAL_PACED_CORE``
of a core.

Method. The agent in this process, built as ``agent.main`` builds it
(``bench_agent_cpu.in_process_agent``: simulated backend with ``GPUS`` GPUs at the default 10 Hz,
the real gRPC server on a private unix socket and the marker socket beside it, ``/metrics``,
default buffers). ``RANKS`` ranks mark steps the way the
one-line DDP integration does: step, forward, backward holding ``BUCKETS`` gradient-bucket
all-reduces, optimizer (``MARKERS_PER_STEP`` markers a step). A load process (``--load`` mode of
this module, on the other core) pushes them over the agent's marker socket as ``chopper.Client``
does (``agent.marker_socket``: one connection per rank, one datagram per batch of ``batch``
markers); each step's timestamps are the load's wall clock, so steps close,
wait for their covering samples and are summarised as in production. Batches are encoded in the
load process, in the column form ``chopper.Client`` sends (``MarkerColumns``); the agent decodes,
validates, stores and summarises them.

Modes: ``flood`` (as fast as the agent takes them: throughput), ``paced`` (``PACED_RATE``
markers/s in all: the cost of an ordinary rate). The agent's CPU time (``time.process_time``:
user + system of all its threads) over the window, less the CPU time spent inside the simulated
backend (``TimedBackend``: its sampling and the markers it simulates, which a vendor backend does
not do), divided by the markers it accepted (``chopper_rank_markers_received_total``) is the CPU
per marker; its step summaries over the
window (``chopper_agent_step_summaries_total``) show that summaries kept up. CPU time, unlike wall
time, barely moves with other load on a shared machine.

Run: ``python -m benchmarks.bench_marker_ingest``; ``run()`` returns the figures as a dict.
``--profile OUT.txt`` runs py-spy on the agent during the flood (``pip install py-spy``).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_agent_cpu import in_process_agent
from chopper.demo.run import metric_sum
from chopper.schema import marker_socket_path
from tests.support.markers import marker_columns

GPUS = 8
RANKS = 8
BUCKETS = 40
MARKERS_PER_STEP = 2 + 2 + 2 + 2 * BUCKETS + 2
LARGE_BATCH = 2048
SMALL_BATCH = 16  # what chopper.client sends a busy loop per flush: a few markers, often
PACED_RATE = 10_000
GOAL_MARKERS_PER_CORE_S = 100_000
GOAL_PACED_CORE = 0.10


def _counts(url: str) -> tuple[float, float, float]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return (metric_sum(text, "chopper_rank_markers_received_total"),
            metric_sum(text, "chopper_agent_markers_rejected_total"),
            metric_sum(text, "chopper_agent_step_summaries_total"))


def run_mode(mode: str, batch: int, measure_s: float = 10.0, warmup_s: float = 3.0,
             profile: str | None = None) -> dict[str, Any]:
    """The agent and one load process in ``mode`` (``flood`` or ``paced``) with batches of ``batch``."""
    with in_process_agent(["--sim-gpus", str(GPUS)]) as running:
        running.agent.start()
        backend = running.backend
        load = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bench_marker_ingest", "--load", running.socket, mode, str(batch),
             str(warmup_s + measure_s + 2.0)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
        spy = None
        try:
            assert load.stdout is not None
            if load.stdout.readline().strip() != "ready":  # its batches are encoded: the load starts now
                raise RuntimeError(f"load process failed before it started:\n{load.communicate()[1][-2000:]}")
            time.sleep(warmup_s)

            def snapshot() -> tuple[float, float, float, float, float, float]:
                backend_s = (backend.sample_cpu_ns + backend.marker_cpu_ns) / 1e9
                return (time.monotonic(), time.process_time(), backend_s, *_counts(running.metrics_url))

            w0, p0, b0, r0, j0, s0 = snapshot()
            if profile:
                spy = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "py-spy"), "record", "--pid",
                                        str(os.getpid()), "--duration", str(int(measure_s)), "--format", "raw",
                                        "--output", profile, "--nonblocking"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(measure_s)
            w1, p1, b1, r1, j1, s1 = snapshot()
            out, err = load.communicate(timeout=60)
            if spy is not None:
                spy.wait(60)
        finally:
            if load.poll() is None:
                load.kill()
                load.wait()
    if load.returncode != 0:
        raise RuntimeError(f"load process failed:\n{err[-2000:]}")
    markers, wall_s = r1 - r0, w1 - w0
    agent_s, backend_s = (p1 - p0) - (b1 - b0), b1 - b0
    us = 1e6 * agent_s / markers if markers else float("nan")
    return {
        "mode": mode, "batch": batch, "markers_per_s": round(markers / wall_s),
        "agent_core_ratio": round(agent_s / wall_s, 4), "backend_core_ratio": round(backend_s / wall_s, 4),
        "us_per_marker": round(us, 2), "markers_per_core_s": round(1e6 / us) if markers else 0,
        "summaries_per_s": round((s1 - s0) / wall_s, 1),
        "expected_summaries_per_s": round(markers / wall_s / MARKERS_PER_STEP, 1),
        "rejected": int(j1 - j0), "load": json.loads(out.strip().splitlines()[-1]),
    }


def run(measure_s: float = 10.0) -> dict[str, Any]:
    """Flood in large and small batches, and the paced rate; the goals judged on each."""
    large = run_mode("flood", LARGE_BATCH, measure_s)
    small = run_mode("flood", SMALL_BATCH, measure_s)
    paced = run_mode("paced", SMALL_BATCH, measure_s)
    worst_us = max(large["us_per_marker"], small["us_per_marker"])
    return {
        "ranks": RANKS, "gpus": GPUS, "markers_per_step": MARKERS_PER_STEP,
        "large": large, "small": small, "paced": paced,
        "worst_us_per_marker": worst_us, "paced_core_ratio": paced["agent_core_ratio"],
        "goal_markers_per_core_s": GOAL_MARKERS_PER_CORE_S, "goal_paced_core": GOAL_PACED_CORE,
        "meets_goal": 1e6 / worst_us >= GOAL_MARKERS_PER_CORE_S and paced["agent_core_ratio"] <= GOAL_PACED_CORE,
    }


# ------------------------------------------------------------------------------ load process


def _step_markers(pb: Any, step: int, t0_ns: int, step_ns: int) -> list[Any]:
    """One DDP-shaped step's markers, timestamps spread over ``step_ns`` from ``t0_ns``."""
    names = [(pb.MARKER_KIND_STEP_BEGIN, ""), (pb.MARKER_KIND_PHASE_BEGIN, "forward"),
             (pb.MARKER_KIND_PHASE_END, "forward"), (pb.MARKER_KIND_PHASE_BEGIN, "backward")]
    for _ in range(BUCKETS):
        names += [(pb.MARKER_KIND_COLLECTIVE_BEGIN, "all_reduce"), (pb.MARKER_KIND_COLLECTIVE_END, "all_reduce")]
    names += [(pb.MARKER_KIND_PHASE_END, "backward"), (pb.MARKER_KIND_PHASE_BEGIN, "optimizer"),
              (pb.MARKER_KIND_PHASE_END, "optimizer"), (pb.MARKER_KIND_STEP_END, "")]
    gap = step_ns // len(names)
    out = []
    for i, (kind, name) in enumerate(names):
        m = pb.Marker(ts_ns=t0_ns + i * gap, kind=kind, step=step, name=name, clock=pb.CLOCK_SOURCE_CPU)
        if kind == pb.MARKER_KIND_STEP_END:
            m.flops, m.tokens = 1e12, 4096
        elif name == "all_reduce":
            m.bytes = 25 << 20
        out.append(m)
    return out


def _rank_batches(pb: Any, rank: int, batch: int, rate: float, duration_s: float, start_ns: int) -> list[bytes]:
    """One rank's batches for ``duration_s`` at ``rate`` markers/s per rank, encoded before the run.

    Encoding them up front keeps the load process's own cost out of the way of the agent's: the
    flood then goes as fast as the agent takes it. Timestamps follow the planned rate from
    ``start_ns``, so steps close, wait for samples that cover them and are summarised.
    """
    step_ns = int(MARKERS_PER_STEP / rate * 1e9)
    markers: list[Any] = []
    for step in range(int(duration_s * rate / MARKERS_PER_STEP) + 1):
        markers += _step_markers(pb, step, start_ns + step * step_ns, step_ns)
    return [pb.MarkerBatch(job="bench-ingest", rank=rank, gpu=rank % GPUS, seq=1 + i // batch,
                           columns=marker_columns(markers[i:i + batch]), pid=os.getpid()).SerializeToString()
            for i in range(0, len(markers), batch)]


def _load(target: str, mode: str, batch: int, duration_s: float) -> dict[str, Any]:
    from chopper.proto.chopper.v1 import agent_pb2 as pb

    # Flood: timestamps planned at twice the goal rate, so steps are never stamped in the future of
    # an agent that keeps up; paced: at the paced rate, one batch of each rank per period.
    rate = (PACED_RATE if mode == "paced" else 2 * GOAL_MARKERS_PER_CORE_S) / RANKS
    start_ns = time.time_ns()  # stamps planned from now fall behind the clock, never ahead of it
    plans = [_rank_batches(pb, r, batch, rate, duration_s, start_ns) for r in range(RANKS)]
    pace_s = batch / rate if mode == "paced" else 0.0
    print("ready", flush=True)
    until = time.monotonic() + duration_s
    sent = [0] * RANKS

    def stream(rank: int) -> None:
        """One rank's stream, as ``chopper.Client`` sends it: a datagram a batch, then the agent's answer."""
        next_at = time.monotonic()
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.connect(marker_socket_path(target.removeprefix("unix://")))
            for i, encoded in enumerate(plans[rank]):
                if time.monotonic() >= until:
                    break
                sock.send(encoded)
                sent[rank] = i + 1
                if pace_s:
                    next_at += pace_s
                    time.sleep(max(0.0, next_at - time.monotonic()))
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(30)
            results.append(pb.PushMarkersResponse.FromString(sock.recv(65536)))

    results: list[Any] = []
    threads = [threading.Thread(target=stream, args=(r,), daemon=True) for r in range(RANKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(duration_s + 30)
    return {"batches_sent": sum(sent), "accepted": sum(r.accepted for r in results),
            "rejected": sum(r.rejected for r in results), "errors": [e for r in results for e in r.errors][:3]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", nargs=4, metavar=("TARGET", "MODE", "BATCH", "SECONDS"), help=argparse.SUPPRESS)
    parser.add_argument("--measure", type=float, default=10.0, help="measurement window per mode, s")
    parser.add_argument("--profile", metavar="OUT", help="py-spy raw profile of the agent in a large-batch flood")
    args = parser.parse_args(argv)
    if args.load:
        target, mode, batch, seconds = args.load
        print(json.dumps(_load(target, mode, int(batch), float(seconds))))
    elif args.profile:
        print(json.dumps(run_mode("flood", LARGE_BATCH, args.measure, profile=args.profile), indent=1))
    else:
        print(json.dumps(run(args.measure), indent=1))


if __name__ == "__main__":
    main()
