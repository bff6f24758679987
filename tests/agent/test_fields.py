"""Field selection: profiles and exclusions pick the families a scrape carries; a typo is refused."""
from __future__ import annotations

from pathlib import Path

import pytest

from agent import fields
from agent.catalog import BY_NAME
from agent.config import ConfigError, load_settings
from agent.metrics import AgentCollector
from chopper.daemon.exposition import Families
from tests.support.hazards import HazardOutcome
from tests.support.scrape import scrape
from tests.support.simulated_node import SimulatedNode


def test_profiles_pick_their_families_and_keep_the_agents_own_health() -> None:
    full, standard, gpu = (fields.selected(p) for p in ("full", "standard", "gpu"))
    assert full == frozenset(fields.ALL)
    assert full - standard == {"chopper_gpu_link_bytes_total"}
    assert all(name.startswith(("chopper_gpu_", "chopper_host_", "chopper_agent_")) for name in gpu)
    assert "chopper_gpu_ecc_errors_total" in gpu and "chopper_rank_steps_total" not in gpu
    kept = fields.selected("full", ["chopper_inspector_*", "chopper_agent_backend_up"])
    assert not any(name.startswith("chopper_inspector_") for name in kept)
    assert kept >= fields.ALWAYS  # the agent's own health cannot be excluded


@pytest.mark.hazard(item=17, input="metrics_profile 'minimal', metrics_exclude 'chopper_gpu_ecc_error_total' "
                    "(a misspelt name) and 'chopper_nothing_*'",
                    promise="refused with the valid profiles or the closest catalog names")
def test_a_profile_or_exclusion_that_names_nothing_is_refused(hazard: HazardOutcome) -> None:
    with pytest.raises(fields.FieldSelectionError, match="'minimal' is not a metrics profile; use one of full, "
                       "standard, gpu"):
        fields.selected("minimal")
    with pytest.raises(fields.FieldSelectionError, match="did you mean chopper_gpu_ecc_errors_total"):
        fields.selected("full", ["chopper_gpu_ecc_error_total"])
    with pytest.raises(fields.FieldSelectionError, match="'chopper_nothing_\\*' matches no metric of the catalog"):
        fields.selected("full", ["chopper_nothing_*"])
    hazard.outcome = "3 selections refused, each naming the profiles or the closest catalog name"


def test_a_scrape_carries_only_the_selected_families() -> None:
    node = SimulatedNode()
    agent = node.agent
    agent.tick(node.now)
    full = scrape(AgentCollector(agent.view))
    gpu_only = scrape(AgentCollector(agent.view, exported=fields.selected("gpu", ["chopper_gpu_mem_*"])))
    assert "chopper_gpu_power_watts" in gpu_only and "chopper_agent_backend_up" in gpu_only
    assert "chopper_gpu_mem_clock_hertz" in full and not [n for n in gpu_only if n.startswith("chopper_gpu_mem_")]
    assert set(gpu_only) < set(full)
    with pytest.raises(KeyError):  # a misspelt name in the code fails whether or not it is selected
        Families(BY_NAME, exported=frozenset()).add("chopper_gpu_powr_watts", (), 1.0)


def test_the_selection_is_an_agent_setting_taken_as_a_list_or_comma_separated(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("metrics_profile: gpu\nmetrics_exclude:\n  - chopper_gpu_link_bytes_total\n  - chopper_host_*\n")
    s = load_settings(["--config", str(cfg)], env={})
    assert (s.metrics_profile, s.metrics_exclude) == ("gpu", ("chopper_gpu_link_bytes_total", "chopper_host_*"))
    s = load_settings([], env={"CHOPPER_AGENT_METRICS_EXCLUDE": "chopper_inspector_*, chopper_rank_position_seconds"})
    assert s.metrics_exclude == ("chopper_inspector_*", "chopper_rank_position_seconds")
    with pytest.raises(ConfigError, match=r"^metrics_exclude: 'chopper_gpu_ecc_error_total' matches no metric .* "
                       "did you mean chopper_gpu_ecc_errors_total"):
        load_settings(["--metrics-exclude", "chopper_gpu_ecc_error_total"], env={})
    cfg.write_text("metrics_exclude:\n  - chopper_host_*, chopper_rank_*\n")
    with pytest.raises(ConfigError, match="has an item with a comma; give each name as its own item"):
        load_settings(["--config", str(cfg)], env={})
