"""The agent's /metrics: a section that cannot be built costs its own series, never the scrape."""
from __future__ import annotations

import logging
import time

import pytest

from agent import catalog
from agent.backends.simulated import SimulatedBackend
from agent.config import load_settings
from agent.daemon import Agent
from agent.host import HostSampler
from agent.metrics import HEALTH_METRICS, AgentCollector
from tests.support.hazards import HazardOutcome
from tests.support.scrape import scrape, section_errors

# The chopper_gpu_* families the health section fills (and not the gpus section).
HEALTH_SERIES = {"chopper_gpu_health_status", *HEALTH_METRICS.values()}


def sampled_agent() -> Agent:
    settings = load_settings(["--node", "n1", "--backend", "simulated", "--sim-gpus", "2"], env={})
    agent = Agent(settings, SimulatedBackend(settings.node, gpus=2), host=HostSampler())
    agent.open_backend()
    agent.tick(time.time_ns())
    return agent


def test_the_collector_sections_are_the_documented_ones() -> None:
    collector = AgentCollector(sampled_agent().view)
    assert list(collector.fills) == list(catalog.SECTIONS)
    m = scrape(collector)
    assert section_errors(m, "agent") == dict.fromkeys(catalog.SECTIONS, 0.0)  # every section, 0 from the first scrape
    assert "chopper_gpu_power_watts" in m and "chopper_host_load1" in m and "chopper_agent_info" in m


@pytest.mark.hazard(item=5, input="a GPU's latest sample the gpus section cannot read, and rank_states() raising",
                    promise="the scrape answers with every other family; the failing sections are counted and "
                            "logged once per period")
def test_a_failing_section_costs_its_own_families_only(caplog: pytest.LogCaptureFixture,
                                                       hazard: HazardOutcome) -> None:
    agent = sampled_agent()
    collector = AgentCollector(agent.view)
    healthy = scrape(collector)
    agent.latest[1] = object()  # type: ignore[assignment]  # GPU 0 is exported first, then GPU 1 fails

    def broken() -> list[object]:
        raise RuntimeError("rank table unreadable")

    agent.rank_states = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="agent.metrics"):
        m = scrape(collector)
        m = scrape(collector)
    # GPU 0's series went with the section; the health series are a section of their own and stay.
    assert not [name for name in m if name.startswith("chopper_gpu_") and name not in HEALTH_SERIES]
    assert not [name for name in m if name.startswith("chopper_rank_")]
    kept = {name for name in healthy if not name.startswith(("chopper_gpu_", "chopper_rank_")) or name in HEALTH_SERIES}
    assert kept <= set(m) and "chopper_host_load1" in kept and "chopper_agent_backend_up" in kept
    errors = section_errors(m, "agent")
    assert errors == {**dict.fromkeys(catalog.SECTIONS, 0.0), "gpus": 2.0, "ranks": 2.0}
    lines = [r.getMessage() for r in caplog.records if r.name == "agent.metrics"]
    assert sorted(line.split()[1] for line in lines) == ["section=gpus", "section=ranks"]  # once each, 2 scrapes
    hazard.outcome = (f"2 scrapes with 2 broken sections: {len(m)} families of {len(healthy)} kept, gpus and ranks "
                      f"counted 2 each, {len(lines)} log lines")
