"""Aggregator ingest rate, delivery latency and memory per rank, against the real aggregator process.

Goals: at least 20,000 step summaries/s ingested from 64 concurrent ``Deliver`` streams on this
machine; p99 latency from a step's end to its summary being visible on the aggregator's
``/metrics`` under 2 s; memory per rank of a 10,000-rank job stated.

Method.

1. **Ingest.** ``chopper-aggregator`` (``python -m aggregator.main``) runs as its own process on
   private ports. A simulated 10,000-rank job (``RANKS``) spread over 64 agents (about 157 ranks
   each) delivers ``STEPS`` steps: 64 streams, one per agent, each sending its ranks' summaries
   step by step in batches of up to 512 (the agent's default), each batch numbered as an agent
   numbers them. Summaries are built and serialized *before* timing (a real agent serializes on
   its own node), and the client writes the bytes through a raw stream-stream call, so the
   client's share of this 2-core machine is as small as it can be. Rate = summaries / wall time
   from the first batch sent to the last acknowledgement received; the acknowledgements say
   every summary was taken in (``acked_seq`` equals each stream's last number).
2. **Baseline, same run.** The same load against a process that only decodes and acknowledges
   through ``aggregator.ledger.Ledger`` (the transport and protobuf floor): ``ratio_to_transport``
   says what share of that ceiling the whole aggregator (job join, attribution, metrics) keeps.
   **Durable, same run.** The same load against a fresh aggregator with ``--store-dir``: every
   acknowledgement then waits for the write-ahead log's group commit (fsync) and rows go to
   Parquet; ``durable_summaries_per_s`` and ``durable_ratio`` (to the in-memory aggregator) say
   what durability costs.
3. **Memory.** The aggregator's resident set (``VmRSS``) after start-up and after the ingest
   holds the 10,000-rank job: the difference / ranks. It includes everything the ingest left
   behind: rank state, open steps, the recent steps kept per job for ``QuerySteps`` (16 steps ×
   10,000 ranks) and the allocator's high-water mark, so it grows with ``STEPS`` up to the
   recent-step depth.
4. **Latency.** The agent's real delivery code (``agent.delivery.Forwarder``, default 100 ms
   interval) over a ring buffer, into the aggregator: 64 ranks end a step every 100 ms with
   ``end_ns`` = now; ``/metrics`` is scraped every 20 ms and a step is visible when
   ``chopper_aggregator_summaries_received_total`` covers it. Latency = scrape time − ``end_ns``
   (so it includes the scrape period; both on this host's ``CLOCK_REALTIME``), p50/p99 over
   ``LATENCY_STEPS`` steps, with the aggregator otherwise idle.

Run: ``python benchmarks/bench_aggregator.py``; ``run()`` returns the figures as a dict.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import grpc
import numpy as np

from agent.buffers import RingBuffer
from agent.delivery import Forwarder
from chopper.demo.run import free_port, metric_sum
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import aggregator_pb2 as apb

STREAMS = 64
RANKS = 10_000
STEPS = 30
BATCH = 512
LATENCY_RANKS = 64
LATENCY_STEPS = 100
GOAL_SUMMARIES_PER_S = 20_000
GOAL_P99_S = 2.0
ROOT = Path(__file__).resolve().parents[1]
DELIVER = "/chopper.v1.Aggregator/Deliver"


def _summary(job: str, node: str, rank: int, gpu: int, step: int, end_ns: int) -> pb.StepSummary:
    t = 0.5 + 0.001 * (rank % 7)
    return pb.StepSummary(
        job=job, node=node, rank=rank, gpu=gpu, step=step, begin_ns=end_ns - int(t * 1e9), end_ns=end_ns,
        step_time_s=t, flops=1e14, tokens=4096, phases=3, collectives=1, mean_gfx_clock_mhz=2100.0,
        min_gfx_clock_mhz=2000.0, mean_power_w=650.0, energy_j=325.0, max_temp_c=70.0, busy_ratio=0.9,
        clock=pb.CLOCK_SOURCE_DEVICE, ideal_s=0.08, matrix_util_loss_s=0.2, compute_at_clock_s=0.28,
        dvfs_loss_s=0.02, dvfs_power_s=0.02, exposed_comm_s=0.15, idle_s=t - 0.45, mfu=0.16, matrix_ratio=0.5,
        tokens_per_s=8192.0, tokens_per_j=12.6,
    )


def build_load(streams: int = STREAMS, ranks: int = RANKS, steps: int = STEPS) -> tuple[list[list[bytes]], int]:
    """Serialized ``SummaryBatch``es per stream (one agent each) and the total summary count."""
    now = time.time_ns()
    out: list[list[bytes]] = []
    total = 0
    for a in range(streams):
        node = f"node{a:03d}"
        my_ranks = range(a * ranks // streams, (a + 1) * ranks // streams)
        seq = 0
        batches: list[bytes] = []
        pending: list[pb.StepSummary] = []
        for step in range(steps):
            pending += [_summary("bench", node, r, r % 8, step, now + step * 10**9) for r in my_ranks]
            while len(pending) >= BATCH or (step == steps - 1 and pending):
                chunk, pending = pending[:BATCH], pending[BATCH:]
                seqs = list(range(seq + 1, seq + 1 + len(chunk)))
                seq += len(chunk)
                batches.append(apb.SummaryBatch(agent=node, incarnation=f"inc{a}", seq=seqs,
                                                summaries=chunk).SerializeToString())
        total += seq
        out.append(batches)
    return out, total


def deliver_all(address: str, load: list[list[bytes]]) -> float:
    """Send every stream's batches concurrently over 4 plaintext channels; seconds until every last ack arrived."""
    channels = [grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)])
                for _ in range(4)]
    try:
        return deliver_on(channels, load)
    finally:
        for c in channels:
            c.close()


def deliver_on(channels: list[grpc.Channel], load: list[list[bytes]],
               requests: Callable[[int, list[bytes]], Iterator[bytes]] | None = None) -> float:
    """Send stream ``i``'s batches on ``channels[i % len(channels)]``, all at once; seconds to the last ack.

    ``requests(i, batches)`` is what stream ``i`` writes, e.g. the batches paced on a schedule
    (``benchmarks/bench_fleet.py``); default: every batch as fast as the stream takes it. Each
    stream must be acknowledged up to the last number its batches carry.

    Raises:
        RuntimeError: A stream failed or was not acknowledged to its last summary.
    """
    errors: list[str] = []
    barrier = threading.Barrier(len(load) + 1)

    def one(i: int, batches: list[bytes]) -> None:
        call = channels[i % len(channels)].stream_stream(
            DELIVER, request_serializer=lambda b: b, response_deserializer=apb.DeliveryAck.FromString)
        # The last batch that carries numbers (a paced stream may end on one with positions only).
        expected = next((b.seq[-1] for b in map(apb.SummaryBatch.FromString, reversed(batches)) if b.seq), 0)
        barrier.wait()
        try:
            last = 0
            for ack in call(iter(batches) if requests is None else requests(i, batches), timeout=600):
                last = ack.acked_seq
            if last != expected:
                errors.append(f"stream {i}: acked {last} of {expected}")
        except grpc.RpcError as exc:
            errors.append(f"stream {i}: {exc}")

    threads = [threading.Thread(target=one, args=(i, b)) for i, b in enumerate(load)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError("; ".join(errors[:3]))
    return elapsed


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _scrape(addr: str) -> str:
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as response:
        return str(response.read().decode())


def _wait_up(proc: subprocess.Popen[bytes], probe: Any, what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            probe()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not start")


def _start_aggregator(workdir: str, *extra: str) -> tuple[subprocess.Popen[bytes], str, str]:
    address, maddr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "aggregator.main", "--listen", address, "--metrics-listen", maddr,
         "--step-timeout-s", "60", "--rank-series-top-k", "20", "--log-level", "warning", *extra],
        cwd=ROOT, stderr=open(os.path.join(workdir, f"aggregator{len(extra)}.log"), "wb"),  # noqa: SIM115
    )
    _wait_up(proc, lambda: _scrape(maddr), "chopper-aggregator")
    return proc, address, maddr


def _start_transport_floor(streams: int = STREAMS) -> tuple[subprocess.Popen[bytes], str]:
    """The ledger-only server (``ledger_only_server``) in a process of its own, for ``streams`` streams at once."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--ledger-only", str(port), str(streams)],
                            cwd=ROOT)
    address = f"127.0.0.1:{port}"

    def probe() -> None:
        with grpc.insecure_channel(address) as ch:
            try:
                grpc.channel_ready_future(ch).result(timeout=0.5)
            except grpc.FutureTimeoutError:
                raise OSError("not ready") from None

    _wait_up(proc, probe, "ledger-only server")
    return proc, address


def ledger_only_server(port: int, streams: int = STREAMS) -> None:
    """Decode, dedupe through the ``Ledger`` and acknowledge; nothing else (the baseline)."""
    from aggregator.ledger import Ledger

    ledger = Ledger()

    def deliver(requests: Iterator[apb.SummaryBatch], context: Any) -> Iterator[apb.DeliveryAck]:
        for batch in requests:
            _, acked = ledger.accept(batch.agent, batch.incarnation, list(batch.seq), batch.lost_total)
            yield apb.DeliveryAck(incarnation=batch.incarnation, acked_seq=acked)

    handler = grpc.method_handlers_generic_handler("chopper.v1.Aggregator", {
        "Deliver": grpc.stream_stream_rpc_method_handler(
            deliver, request_deserializer=apb.SummaryBatch.FromString,
            response_serializer=apb.DeliveryAck.SerializeToString),
    })
    server = grpc.server(futures.ThreadPoolExecutor(streams + 8),
                         options=[("grpc.max_receive_message_length", 64 << 20)])
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


def measure_latency(address: str, maddr: str) -> dict[str, float]:
    """Step end to visible on ``/metrics`` through the agent's real forwarder (method step 4)."""
    buffer: RingBuffer[pb.StepSummary] = RingBuffer(100_000)
    fwd = Forwarder(buffer, "latency-node", address)
    fwd.start()
    base = _scrape_count(maddr)
    ends: list[tuple[int, float]] = []  # (step end ns, cumulative summaries through this step)
    latencies: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        i = 0
        while not stop.is_set() or i < len(ends):
            count = _scrape_count(maddr) - base
            now = time.time_ns()
            while i < len(ends) and count >= ends[i][1]:
                latencies.append((now - ends[i][0]) / 1e9)
                i += 1
            if stop.is_set() and time.time_ns() - ends[-1][0] > 30e9:
                break
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for step in range(LATENCY_STEPS):
            end = time.time_ns()
            buffer.extend(_summary("latency", "latency-node", r, r % 8, step, end) for r in range(LATENCY_RANKS))
            ends.append((end, (step + 1) * LATENCY_RANKS))
            time.sleep(0.1)
    finally:
        stop.set()
        watcher.join()
        fwd.stop()
    arr = np.array(latencies)
    return {"steps": len(arr), "p50_s": round(float(np.percentile(arr, 50)), 3),
            "p99_s": round(float(np.percentile(arr, 99)), 3), "max_s": round(float(arr.max()), 3)}


def _scrape_count(maddr: str) -> float:
    return metric_sum(_scrape(maddr), "chopper_aggregator_summaries_received_total")


def run() -> dict[str, Any]:
    """Run the four measurements (module docstring) and return the figures."""
    load, total = build_load()
    with tempfile.TemporaryDirectory() as workdir:
        floor_proc, floor_addr = _start_transport_floor()
        try:
            floor_s = deliver_all(floor_addr, load)
        finally:
            floor_proc.kill()
            floor_proc.wait()
        proc, address, maddr = _start_aggregator(workdir)
        try:
            rss_before = _rss_bytes(proc.pid)
            ingest_s = deliver_all(address, load)
            received = _scrape_count(maddr)
            rss_after = _rss_bytes(proc.pid)
            latency = measure_latency(address, maddr)
        finally:
            proc.terminate()
            proc.wait(30)
        proc, address, maddr = _start_aggregator(workdir, "--store-dir", os.path.join(workdir, "store"))
        try:
            durable_s = deliver_all(address, load)
            durable_received = _scrape_count(maddr)
        finally:
            proc.terminate()
            proc.wait(60)
    if received != total or durable_received != total:
        raise RuntimeError(f"the aggregator counted {received} (durable: {durable_received}) of {total} summaries")
    rate = total / ingest_s
    floor_rate = total / floor_s
    return {
        "streams": STREAMS, "ranks": RANKS, "steps": STEPS, "summaries": total,
        "summaries_per_s": round(rate), "transport_floor_summaries_per_s": round(floor_rate),
        "ratio_to_transport": round(rate / floor_rate, 3),
        "durable_summaries_per_s": round(total / durable_s), "durable_ratio": round(ingest_s / durable_s, 3),
        "rss_before_mib": round(rss_before / 2**20, 1), "rss_after_mib": round(rss_after / 2**20, 1),
        "rss_per_rank_kib": round((rss_after - rss_before) / RANKS / 1024, 2),
        "latency": latency,
        "meets_goal": bool(rate >= GOAL_SUMMARIES_PER_S and latency["p99_s"] < GOAL_P99_S),
    }


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--ledger-only":
        ledger_only_server(int(sys.argv[2]), int(sys.argv[3]))
    else:
        print(json.dumps(run(), indent=1))
