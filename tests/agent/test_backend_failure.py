"""A backend that loses its GPU mid-run never stops the agent: it reports, retries and recovers.

The NVML seam is faked with the H100 fixture the nvidia backend's own tests read (``tests.support.nvml_fake``).
"""
from __future__ import annotations

from typing import Any

import pynvml

from agent.config import load_settings
from agent.daemon import Agent
from agent.metrics import AgentCollector
from chopper.daemon.text_format import Registry
from tests.support.nvml_fake import FakeNode, backend_for, load_fixture


def scrape(agent: Agent) -> str:
    registry = Registry()
    registry.register(AgentCollector(agent.view))
    return registry.render().decode()


def test_device_lost_then_recovered() -> None:
    node = FakeNode(load_fixture())
    now = [node.at(0)]
    settings = load_settings(["--node", "node-a", "--backend", "nvidia"], env={})
    agent = Agent(settings, backend_for(node), realtime_ns=lambda: now[0])
    agent.open_backend()
    agent.tick(now[0])
    assert agent.sampler.health.up and len(agent.samples) == 2

    answer = node.nv.nvmlDeviceGetFieldValues.side_effect

    def lost(handle: Any, ids: Any) -> Any:
        raise pynvml.NVMLError_GpuIsLost()

    node.nv.nvmlDeviceGetFieldValues.side_effect = lost
    now[0] = node.at(1)
    agent.tick(now[0])
    assert not agent.sampler.health.up and agent.sampler.health.errors["device_lost"] == 1
    text = scrape(agent)
    assert 'chopper_agent_backend_up{backend="nvidia",node="node-a"} 0.0' in text
    assert 'chopper_agent_backend_errors_total{backend="nvidia",kind="device_lost",node="node-a"} 1.0' in text
    assert agent.info().backend == "nvidia"  # the daemon still answers

    # Within the backoff nothing is retried; after it, the backend is reopened and samples flow.
    node.nv.nvmlDeviceGetFieldValues.side_effect = answer
    agent.tick(now[0] + 500_000_000)
    assert not agent.sampler.health.up and len(agent.samples) == 2
    agent.tick(now[0] + 1_000_000_000)
    assert agent.sampler.health.up and len(agent.samples) == 4
    assert node.nv.nvmlInit.call_count == 2
