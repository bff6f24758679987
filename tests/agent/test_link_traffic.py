"""A step's NVLink / XGMI traffic, live: the bytes a job's collective moved on the simulated links come back
as the step's link bytes, per rank on /metrics, and link by link beside the summed counters."""
from __future__ import annotations

import os
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.backends.simulated import SimulatedBackend
from agent.config import load_settings
from agent.daemon import SUMMARY_INTERVAL_NS, Agent
from agent.metrics import AgentCollector
from chopper.daemon.text_format import Registry
from chopper.proto.chopper.v1 import agent_pb2 as pb

MS = 1_000_000
MOVED = 5e8  # bytes the all-reduce declares; the simulator moves them at 100 GB/s, in 5 ms


def _scrape(agent: Agent) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = Registry()
    registry.register(AgentCollector(agent.view))
    text = registry.render().decode()
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k in ("gpu", "link", "direction", "rank")))):
            s.value for f in text_string_to_metric_families(text) for s in f.samples}


def _agent_after_one_step(model: str) -> tuple[Agent, pb.StepSummary]:
    """Four simulated GPUs; rank 0 on GPU 1 runs one step [t0, t0 + 200 ms] with one all-reduce inside."""
    settings = load_settings(["--node", "n1", "--backend", "simulated", "--sim-gpus", "4", "--sample-hz", "10"], env={})
    agent = Agent(settings, SimulatedBackend("n1", model=model, gpus=4), host=None)
    agent.open_backend()
    t0 = time.time_ns() - 10**9
    agent.tick(t0)
    markers = [
        pb.Marker(kind=pb.MARKER_KIND_STEP_BEGIN, step=0, ts_ns=t0),
        pb.Marker(kind=pb.MARKER_KIND_COLLECTIVE_BEGIN, step=0, ts_ns=t0 + 10 * MS, name="all_reduce",
                  bytes=int(MOVED)),
        pb.Marker(kind=pb.MARKER_KIND_COLLECTIVE_END, step=0, ts_ns=t0 + 90 * MS, name="all_reduce", bytes=int(MOVED)),
        pb.Marker(kind=pb.MARKER_KIND_STEP_END, step=0, ts_ns=t0 + 200 * MS, flops=1e12, tokens=8),
    ]
    result = agent.push_markers(pb.MarkerBatch(job="j", rank=0, gpu=1, seq=1, pid=os.getpid(), markers=markers))
    assert not result.rejected, result
    # Ticks at 10 Hz until the summaries' next turn (agent.daemon.SUMMARY_INTERVAL_NS after the first tick).
    for i in range(1, SUMMARY_INTERVAL_NS // (100 * MS) + 2):
        agent.tick(t0 + i * 100 * MS)
    [summary], _, _ = agent.summaries.read(0, 10)
    return agent, summary


def test_a_steps_link_bytes_are_what_its_collective_moved() -> None:
    agent, summary = _agent_after_one_step("MI300X")
    # The step covers whole sample intervals, so no share of an interval is interpolated.
    assert summary.link_tx_bytes == MOVED and summary.link_rx_bytes == MOVED
    exported = _scrape(agent)
    for direction in ("tx", "rx"):
        key = ("chopper_rank_link_bytes_total", (("direction", direction), ("gpu", "1"), ("rank", "0")))
        assert exported[key] == MOVED


def test_each_link_has_a_series_and_they_add_up_to_the_summed_counter() -> None:
    agent, _ = _agent_after_one_step("H100")
    exported = _scrape(agent)
    per_link = {labels: v for (name, labels), v in exported.items() if name == "chopper_gpu_link_bytes_total"}
    gpu1_tx = {dict(labels)["link"]: v for labels, v in per_link.items()
               if dict(labels)["gpu"] == "1" and dict(labels)["direction"] == "tx"}
    assert sorted(gpu1_tx, key=int) == [str(k) for k in range(18)]  # an H100 SXM5's NVLinks
    assert exported[("chopper_gpu_link_tx_bytes_total", (("gpu", "1"),))] == MOVED
    assert sum(gpu1_tx.values()) == pytest.approx(MOVED, rel=1e-12)  # 18 equal shares, rounded once each
    assert len(per_link) == 4 * 18 * 2  # bounded: GPUs x links x directions
