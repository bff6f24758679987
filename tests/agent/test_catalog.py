"""The metric catalog is the single source of names: docs agree, names follow the house style."""
from __future__ import annotations

import ast
import os
import re
import time
from pathlib import Path

from agent import catalog
from agent.backends.simulated import SimulatedBackend
from agent.config import load_settings
from agent.daemon import Agent
from agent.markers import REJECTION_REASONS
from agent.metrics import AgentCollector
from chopper.proto.chopper.v1 import agent_pb2 as pb
from tests.support.scrape import scrape

ROOT = Path(__file__).resolve().parents[2]
BASE_UNITS = ("_hertz", "_ratio", "_watts", "_joules", "_celsius", "_bytes", "_seconds", "_items",
              "_flops_per_second")
# Counts and states with no unit, as Prometheus' own `up`: each one is a deliberate exception.
UNITLESS = {"chopper_agent_backend_up", "chopper_host_load1", "chopper_rank_last_step", "chopper_rank_open_step",
            "chopper_agent_marker_streams",
            "chopper_agent_subscribers", "chopper_agent_delivery_connected", "chopper_agent_workload_source_up",
            "chopper_agent_ranks", "chopper_inspector_dir_present", "chopper_inspector_files",
            "chopper_inspector_ranks_silent", "chopper_gpu_retired_pages", "chopper_gpu_bad_pages",
            "chopper_gpu_remapped_rows", "chopper_gpu_memory_repair_state", "chopper_gpu_xgmi_error_state",
            "chopper_gpu_health_status"}


def test_docs_metrics_md_is_current() -> None:
    expected = catalog.markdown()
    assert (ROOT / "docs" / "METRICS.md").read_text() == expected, "run: python -m agent.catalog > docs/METRICS.md"


def test_names_follow_house_style() -> None:
    names = [m.name for m in catalog.METRICS]
    assert len(names) == len(set(names))
    for m in catalog.METRICS:
        assert re.fullmatch(r"chopper_(gpu|host|rank|agent|inspector)_[a-z0-9_]+", m.name), m.name
        base = m.name.removesuffix("_total")
        assert m.kind == "info" or m.name in UNITLESS or base.endswith(BASE_UNITS) or m.kind == "counter", m.name
        if m.kind == "info":
            assert m.name.endswith("_info")
        assert (m.kind == "counter") == m.name.endswith("_total"), m.name
        assert "step" not in m.labels and m.help.endswith(".")


def test_every_rejection_reason_is_documented() -> None:
    source = (ROOT / "agent" / "markers.py").read_text()
    used = {
        node.elts[0].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Tuple) and len(node.elts) == 2 and isinstance(node.elts[0], ast.Constant)
        and isinstance(node.elts[0].value, str) and re.fullmatch(r"[a-z_]+", node.elts[0].value)
    }
    assert used and used <= set(REJECTION_REASONS), used - set(REJECTION_REASONS)


def test_phase_series_bound_is_the_one_documented() -> None:
    from agent.steps import MAX_PHASE_SERIES
    from chopper.attribution.phases import OTHER

    text = catalog.BY_NAME["chopper_rank_phase_seconds_total"].help
    assert f"first {MAX_PHASE_SERIES} names" in text and f'phase="{OTHER}"' in text


def test_no_label_is_prometheus_scrape_label_job() -> None:
    """A plain scrape config (no honor_labels) keeps every label: none is named job or instance."""
    labels = {label for m in catalog.METRICS for label in m.labels}
    assert not labels & {"job", "instance"}
    assert {"training_job", "hpc_job"} <= labels


def test_legacy_job_label_shows_the_old_label_names() -> None:
    """job_label="job" exports the training job as job, as releases before it did; nothing else changes."""
    settings = load_settings(["--node", "n1", "--backend", "simulated", "--sim-gpus", "1"], env={})
    agent = Agent(settings, SimulatedBackend("n1", gpus=1), host=None)
    agent.open_backend()
    now = time.time_ns() - 1_000_000_000
    agent.push_markers(pb.MarkerBatch(job="j", rank=0, gpu=0, seq=1, pid=os.getpid(), markers=[
        pb.Marker(kind=pb.MARKER_KIND_STEP_BEGIN, step=0, ts_ns=now),
        pb.Marker(kind=pb.MARKER_KIND_STEP_END, step=0, ts_ns=now + 10_000_000, flops=1e12, tokens=8)]))
    agent.tick(time.time_ns())
    current, legacy = scrape(AgentCollector(agent.view)), scrape(AgentCollector(agent.view, job_label="job"))
    ranks = {name for name in current if name.startswith("chopper_rank_")}
    assert "chopper_rank_steps_total" in ranks
    for name in ranks:
        assert {dict(k)["training_job"] for k in current[name]} == {dict(k)["job"] for k in legacy[name]} == {"j"}
        assert not any("training_job" in dict(k) for k in legacy[name])
    assert set(legacy["chopper_gpu_busy_ratio"]) == set(current["chopper_gpu_busy_ratio"])
