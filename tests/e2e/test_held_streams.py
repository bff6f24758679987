"""One local process holds hundreds of streams open on a real agent: other trainers and GetInfo are still served.

The holder is its own process: it opens ``HELD`` ``PushMarkers`` streams on the agent's unix
socket, states its process id (``chopper-pid``) as the job-side client's streams do, and sends
nothing, so each admitted stream holds one of the agent's worker threads. A real ``chopper.Client``
in the test's process then marks steps, and ``GetInfo`` is called with a short deadline.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

import chopper
from chopper.demo.run import metric_sum
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import agent_pb2_grpc
from chopper.schema import PID_METADATA, marker_socket_path
from tests.support.daemons import AgentProcess
from tests.support.hazards import HazardOutcome
from tests.support.polling import wait_until

HELD = 300
STEPS = 20
ROOT = Path(__file__).resolve().parents[2]


def hold(target: str, streams: int) -> None:
    """Open ``streams`` empty PushMarkers streams, print how they stand once settled, hold them until stdin closes.

    The streams state this process's id (``chopper-pid``) as the job-side client's do.
    """
    release = threading.Event()

    def requests() -> Iterator[pb.MarkerBatch]:
        release.wait()
        yield from ()

    channels = [grpc.insecure_channel(target) for _ in range(4)]
    metadata = ((PID_METADATA, str(os.getpid())),)
    calls = [agent_pb2_grpc.AgentStub(channels[i % 4]).PushMarkers.future(requests(), metadata=metadata)
             for i in range(streams)]
    time.sleep(3.0)  # the agent admits or refuses each at once; held ones stay pending
    codes: dict[str, int] = {}
    for call in calls:
        name = call.code().name if call.done() else "HELD"
        codes[name] = codes.get(name, 0) + 1
    print(json.dumps(codes), flush=True)
    sys.stdin.read()
    release.set()


def start_holder(target: str) -> subprocess.Popen[str]:
    """A process of its own that runs ``hold(target, HELD)``: its first stdout line is its codes."""
    return subprocess.Popen(
        [sys.executable, "-c", f"from tests.e2e.test_held_streams import hold; hold({target!r}, {HELD})"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.hazard(item=7, input="one local process opens 300 PushMarkers streams and holds them, sending nothing",
                    promise="streams are bounded per client and in all, the pool keeps threads for the others: a "
                    "second trainer delivers every marker, GetInfo answers, each refused stream is counted")
def test_one_process_holding_300_streams_starves_neither_trainers_nor_getinfo(tmp_path: Path,
                                                                              hazard: HazardOutcome) -> None:
    agent = AgentProcess(tmp_path).start()
    holder = start_holder(agent.target)
    try:
        assert holder.stdout is not None
        codes = json.loads(holder.stdout.readline())
        held = codes.get("HELD", 0)
        refused = codes.get("RESOURCE_EXHAUSTED", 0)
        assert held + refused == HELD and 0 < held < HELD, codes
        text = agent.metrics()
        counted = metric_sum(text, "chopper_agent_rpc_refused_total", rpc="PushMarkers")
        over_share = metric_sum(text, "chopper_agent_rpc_refused_total", rpc="PushMarkers", reason="streams_per_client")
        assert counted == refused and over_share > 0, text  # the rest came faster than the call rate limit

        with grpc.insecure_channel(agent.target) as channel:
            started = time.monotonic()
            info = agent_pb2_grpc.AgentStub(channel).GetInfo(pb.GetInfoRequest(), timeout=5.0)
            getinfo_s = time.monotonic() - started
        assert info.node == "e2e-node"

        client = chopper.Client("victim", 0, 0, agent.target)
        for i in range(STEPS):
            with client.step(i, flops=1e12, tokens=64):
                time.sleep(0.01)
        client.shutdown(timeout=10.0)
        stats = client.stats()
        assert stats["sent"] == 2 * STEPS and stats["dropped"] == 0, stats
        assert wait_until(lambda: metric_sum(agent.metrics(), "chopper_rank_markers_received_total",
                                             training_job="victim") == 2 * STEPS, timeout_s=20), (
            "the agent lost markers")
        hazard.outcome = (f"{held} of {HELD} streams held, {refused} refused RESOURCE_EXHAUSTED and counted "
                          f"({over_share:g} streams_per_client, the rest rate_limited); GetInfo answered in "
                          f"{getinfo_s * 1000:.0f} ms; the second trainer's {2 * STEPS} of {2 * STEPS} markers "
                          "reached the agent, 0 dropped")
    finally:
        holder.kill()
        holder.wait()
        agent.terminate()


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.hazard(item=7, input="two local processes hold every stream slot of the agent, then a trainer connects",
                    promise="a refused stream is counted on both sides: the agent by reason, the client as "
                    "dropped, never as sent; GetInfo still answers")
def test_a_refused_trainer_counts_its_markers_dropped_and_the_agent_counts_the_refusal(
        tmp_path: Path, hazard: HazardOutcome) -> None:
    # Unlimited call rate: the holders open their streams in a burst, and only the slots may refuse them.
    agent = AgentProcess(tmp_path, "--rate-limit-calls-per-s", "0").start()
    # Each holder may take three quarters of the slots: two of them take them all.
    holders = [start_holder(agent.target) for _ in range(2)]
    try:
        codes: dict[str, int] = {}
        for holder in holders:
            assert holder.stdout is not None
            for name, n in json.loads(holder.stdout.readline()).items():
                codes[name] = codes.get(name, 0) + n
        # On a loaded machine the holders' streams may still be connecting when they report: wait
        # until the agent has held or refused every one of them.
        def settled() -> bool:
            text = agent.metrics()
            return (metric_sum(text, "chopper_agent_marker_streams")
                    + metric_sum(text, "chopper_agent_rpc_refused_total", rpc="PushMarkers")) >= 2 * HELD
        assert wait_until(settled, timeout_s=60), agent.metrics()
        # The marker socket does not share gRPC's worker threads, so its trainers are still served.
        served = chopper.Client("served", 0, 0, agent.target)
        for i in range(STEPS):
            with served.step(i):
                pass
        served.shutdown(timeout=5.0)
        assert served.stats()["sent"] == 2 * STEPS and served.stats()["dropped"] == 0, served.stats()
        assert wait_until(lambda: metric_sum(agent.metrics(), "chopper_rank_markers_received_total",
                                             training_job="served") == 2 * STEPS, timeout_s=10)
        # A trainer that finds no marker socket (an agent of an earlier version) streams over gRPC.
        os.unlink(marker_socket_path(str(agent.socket)))
        before = metric_sum(agent.metrics(), "chopper_agent_rpc_refused_total", rpc="PushMarkers",
                            reason="too_many_streams")
        client = chopper.Client("refused", 0, 0, agent.target)
        for i in range(STEPS):
            with client.step(i):
                time.sleep(0.02)
        client.shutdown(timeout=5.0)
        stats = client.stats()
        text = agent.metrics()
        received = metric_sum(text, "chopper_rank_markers_received_total", training_job="refused")
        refusals = metric_sum(text, "chopper_agent_rpc_refused_total", rpc="PushMarkers",
                              reason="too_many_streams") - before
        assert received == 0 and stats["sent"] == 0, (received, stats, refusals)
        assert stats["queued"] == stats["dropped"] == 2 * STEPS and "RESOURCE_EXHAUSTED" in stats["last_error"], stats
        assert refusals >= 1, text  # each of the trainer's attempts is one
        with grpc.insecure_channel(agent.target) as channel:
            assert agent_pb2_grpc.AgentStub(channel).GetInfo(pb.GetInfoRequest(), timeout=5.0).node == "e2e-node"
        hazard.outcome = (f"holders: {codes.get('HELD', 0)} held, {codes.get('RESOURCE_EXHAUSTED', 0)} refused; the "
                          f"trainer's {stats['queued']} markers: {stats['sent']} counted sent, {stats['dropped']} "
                          f"dropped, {received:g} reached the agent; the agent counted its {refusals:g} attempts as "
                          "PushMarkers too_many_streams refusals; GetInfo answered; a trainer on the marker socket "
                          f"meanwhile delivered {served.stats()['sent']} of {served.stats()['queued']} markers")
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
        agent.terminate()
