"""The metric catalog is the single source of names: docs agree, names follow the house style."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from agent import catalog
from agent.markers import REJECTION_REASONS

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
