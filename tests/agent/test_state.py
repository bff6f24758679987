"""``AgentView`` gives what ``/metrics`` exports: the same numbers, read through named, documented fields."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent import catalog
from agent.backends.simulated import SimulatedBackend
from agent.config import load_settings
from agent.daemon import Agent
from agent.host import HostSampler
from agent.metrics import AgentCollector
from agent.state import AgentView, BufferFill
from chopper.daemon.text_format import Registry
from chopper.proto.chopper.v1 import agent_pb2 as pb
from tests.support import scrape as support


def scrape(agent: Agent) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = Registry()
    registry.register(AgentCollector(agent.view))
    text = registry.render().decode()
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "node"))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def busy_agent(host: HostSampler | None = None) -> Agent:
    """Two simulated GPUs sampled 3 times, one rank with one step summarised, one marker rejected."""
    settings = load_settings(["--node", "n1", "--backend", "simulated", "--sim-gpus", "2", "--sample-hz", "10"], env={})
    agent = Agent(settings, SimulatedBackend("n1", gpus=2), host=host)
    agent.open_backend()
    now = time.time_ns() - 1_000_000_000  # a second ago, so the ticks below cover the step
    steps = [pb.Marker(kind=pb.MARKER_KIND_STEP_BEGIN, step=0, ts_ns=now),
             pb.Marker(kind=pb.MARKER_KIND_STEP_END, step=0, ts_ns=now + 10_000_000, flops=1e12, tokens=8),
             pb.Marker(kind=pb.MARKER_KIND_STEP_END, step=5, ts_ns=now + 20_000_000)]  # rejected: never began
    agent.push_markers(pb.MarkerBatch(job="j", rank=0, gpu=0, seq=1, pid=os.getpid(), markers=steps))
    for _ in range(3):
        agent.ticker.run_due_tick(time.monotonic_ns())  # one tick of the sampler: Agent.tick, counted
    agent.count(agent.undecodable, "Subscribe")
    return agent


@pytest.fixture
def agent() -> Agent:
    return busy_agent()


def test_view_reads_what_the_scrape_exports(agent: Agent) -> None:
    view, exported = agent.view, scrape(agent)
    assert (view.node, view.backend) == ("n1", "simulated")
    assert [d.gpu for d in view.devices] == [0, 1] and sorted(view.latest_samples) == [0, 1]
    assert exported[("chopper_agent_backend_up", (("backend", "simulated"),))] == float(view.backend_up) == 1.0
    assert view.backend_errors == {} and view.backend_sample_s >= 0
    assert exported[("chopper_agent_sample_rate_hertz", ())] == view.sample_rate_hz == 10.0
    assert exported[("chopper_agent_sampler_ticks_total", ())] == view.sampler_ticks_total == 3
    assert exported[("chopper_agent_sampler_missed_ticks_total", ())] == view.sampler_missed_ticks_total
    assert exported[("chopper_agent_sampler_lag_seconds", ())] == view.sampler_lag_s
    for name, fill in view.buffers.items():
        assert fill == BufferFill(
            int(exported[("chopper_agent_buffer_items", (("buffer", name),))]),
            int(exported[("chopper_agent_buffer_capacity_items", (("buffer", name),))]),
            int(exported[("chopper_agent_buffer_overwritten_total", (("buffer", name),))]),
            int(exported[("chopper_agent_buffer_bytes", (("buffer", name),))]),
            int(exported[("chopper_agent_buffer_capacity_bytes", (("buffer", name),))]))
        assert 0 <= fill.bytes_held <= fill.max_bytes and fill.max_bytes > 0
    assert view.buffers["samples"].items == 6 and view.buffers["markers"].items == 2
    assert view.markers_rejected == {"step_never_began": 1}
    assert exported[("chopper_agent_markers_rejected_total", (("reason", "step_never_began"),))] == 1
    assert view.messages_undecodable == {"Subscribe": 1}
    assert exported[("chopper_agent_messages_undecodable_total", (("method", "Subscribe"),))] == 1
    assert view.step_summaries_total == exported[("chopper_agent_step_summaries_total", ())] == 1
    assert view.tracked_ranks == exported[("chopper_agent_ranks", ())] == 1
    assert view.ranks_retired == {"idle": 0, "limit": 0}
    assert (view.marker_streams, view.subscribers, view.socket_recreated_total) == (0, 0, 0)
    assert view.rpc_refused == {} and view.delivery == {} and view.marker_fields_dropped == {}
    assert view.workload_owners == {} and view.workload_sources == {} and view.host is None
    [(key, state)] = view.rank_states
    assert key == ("j", 0) and state.last_step == 0
    assert view.rank_figures[key].tokens == exported[("chopper_rank_tokens_total", (("gpu", "0"), ("rank", "0"),
                                                                                   ("training_job", "j")))] == 8


def test_view_returns_copies(agent: Agent) -> None:
    view = agent.view
    view.markers_rejected["step_never_began"] = 99
    view.backend_errors["open"] = 5
    view.latest_samples.clear()
    assert agent.rejected["step_never_began"] == 1 and agent.sampler.health.errors == {} and len(agent.latest) == 2


def test_the_collector_reads_the_view_only() -> None:
    agent = busy_agent(HostSampler())
    through_view = support.scrape(AgentCollector(AgentView(agent)))  # a view of its own: nothing shared with agent.view
    assert support.section_errors(through_view, "agent") == dict.fromkeys(catalog.SECTIONS, 0.0)
    through_agent = support.scrape(AgentCollector(agent.view))
    assert {name: set(series) for name, series in through_view.items()} == \
        {name: set(series) for name, series in through_agent.items()}
    assert "chopper_host_load1" in through_view and "chopper_rank_tokens_total" in through_view


def test_the_collector_module_never_names_the_daemon() -> None:
    """Not even for typing: the collector is built from an ``AgentView``, so it needs nothing of ``Agent``."""
    source = (Path(__file__).resolve().parents[2] / "agent" / "metrics.py").read_text()
    assert "agent.daemon" not in source
