"""What mutual TLS costs the aggregator's ``Deliver`` ingest, on 1 and on 8 concurrent streams.

Goal: with mutual TLS the aggregator ingests at least ``GOAL_RATIO`` of the step summaries per
second it ingests in plaintext, on one stream and on eight, measured in the same run.

Method.

1. Two real ``chopper-aggregator`` processes (``python -m aggregator.main``) on private loopback
   ports: one plaintext, one with ``--tls-cert``, ``--tls-key`` and ``--tls-client-ca`` (mutual
   TLS, EC P-256 certificates of a CA made for the run by ``tests/support/pki.py``). Both run
   the same code path otherwise (access checks, job join, attribution, metrics).
2. Loads are built and serialized before timing: ``SUMMARIES`` step summaries of a
   ``RANKS``-rank job per run, split over the run's streams (one agent each), in batches of up
   to 512 (the agent's default). Every run has its own job name and incarnations, so no run
   re-delivers what the aggregator already holds.
3. Per run, every stream is a raw stream-stream ``Deliver`` call on its own channel, started
   together; rate = summaries / wall time from the first batch sent to the last acknowledgement,
   and the acknowledgements must cover every batch (``acked_seq`` equals the last number sent).
4. ``REPEATS`` rounds; each round measures 1 and 8 streams, plaintext and TLS in alternating
   order (ABBA), so drift on a shared machine hits both alike. Figures are medians; the ratio is
   median TLS rate / median plaintext rate at the same stream count.

Run: ``python -m benchmarks.bench_tls``; ``run()`` returns the figures as a dict.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import grpc

from benchmarks.bench_aggregator import BATCH, _scrape, _summary, _wait_up, deliver_on
from chopper.daemon.tls import ClientTLS
from chopper.demo.run import free_port
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from tests.support.pki import Authority

STREAM_COUNTS = (1, 8)
SUMMARIES = 24_000
RANKS = 1_200
REPEATS = 5
GOAL_RATIO = 0.8
ROOT = Path(__file__).resolve().parents[1]


def build_load(run: int, streams: int) -> list[list[bytes]]:
    """Serialized ``SummaryBatch``es per stream for one run: ``SUMMARIES`` summaries of job ``tls<run>``."""
    now = time.time_ns()
    steps = SUMMARIES // RANKS
    out: list[list[bytes]] = []
    for a in range(streams):
        node = f"r{run}n{a}"
        ranks = range(a * RANKS // streams, (a + 1) * RANKS // streams)
        summaries = [_summary(f"tls{run}", node, r, r % 8, step, now + step * 10**9)
                     for step in range(steps) for r in ranks]
        batches = []
        for first in range(0, len(summaries), BATCH):
            chunk = summaries[first:first + BATCH]
            batches.append(apb.SummaryBatch(agent=node, incarnation=f"inc{run}", seq=range(first + 1,
                                            first + 1 + len(chunk)), summaries=chunk).SerializeToString())
        out.append(batches)
    return out


def deliver(address: str, load: list[list[bytes]], tls: ClientTLS | None) -> float:
    """Send every stream's batches at once, each on its own channel; seconds to the last acknowledgement."""
    options = [("grpc.max_send_message_length", 64 << 20)]
    channels = [grpc.secure_channel(address, tls.credentials(), options=options) if tls is not None
                else grpc.insecure_channel(address, options=options) for _ in load]
    try:
        for channel in channels:  # connect (and handshake) before the clock starts
            grpc.channel_ready_future(channel).result(timeout=30)
        return deliver_on(channels, load)
    finally:
        for channel in channels:
            channel.close()


def _aggregator(workdir: str, name: str, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    address, maddr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "aggregator.main", "--listen", address, "--metrics-listen", maddr,
         "--step-timeout-s", "60", "--rank-series-top-k", "20", "--log-level", "warning",
         "--rate-limit-messages-per-s", "0", "--rate-limit-calls-per-s", "0", *extra],
        cwd=ROOT, stderr=open(os.path.join(workdir, f"{name}.log"), "wb"),  # noqa: SIM115
    )
    _wait_up(proc, lambda: _scrape(maddr), f"chopper-aggregator ({name})")
    return proc, address


def run() -> dict[str, Any]:
    """Run the rounds of the module docstring and return the figures."""
    rates: dict[tuple[str, int], list[float]] = {(mode, n): [] for mode in ("plaintext", "tls") for n in STREAM_COUNTS}
    with tempfile.TemporaryDirectory() as workdir:
        ca = Authority(Path(workdir), "bench-ca")
        server, client = ca.issue("chopper-aggregator", server=True), ca.issue("bench-agent")
        tls = ClientTLS(ca.ca, client.cert, client.key)
        order = [(mode, n) for n in STREAM_COUNTS for mode in ("plaintext", "tls")]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            plain_proc, plain = _aggregator(workdir, "plaintext")
            procs.append(plain_proc)
            tls_proc, secure = _aggregator(workdir, "tls", "--tls-cert", server.cert, "--tls-key", server.key,
                                           "--tls-client-ca", ca.ca)
            procs.append(tls_proc)
            for repeat in range(REPEATS):
                for i, (mode, n) in enumerate(order if repeat % 2 == 0 else order[::-1]):
                    load = build_load(repeat * len(order) + i, n)
                    seconds = deliver(secure if mode == "tls" else plain, load, tls if mode == "tls" else None)
                    rates[(mode, n)].append(SUMMARIES / seconds)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(30)
    figures: dict[str, Any] = {"summaries_per_run": SUMMARIES, "repeats": REPEATS}
    for n in STREAM_COUNTS:
        plain_rate = statistics.median(rates[("plaintext", n)])
        tls_rate = statistics.median(rates[("tls", n)])
        figures[f"streams_{n}"] = {"plaintext_summaries_per_s": round(plain_rate),
                                   "tls_summaries_per_s": round(tls_rate),
                                   "ratio_tls_to_plaintext": round(tls_rate / plain_rate, 3)}
    figures["meets_goal"] = all(figures[f"streams_{n}"]["ratio_tls_to_plaintext"] >= GOAL_RATIO
                                for n in STREAM_COUNTS)
    return figures


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
