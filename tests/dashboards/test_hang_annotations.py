"""The stalled-job alert says where every rank of the job is: promtool evaluates the committed rules' templates.

The position series are written as the agent exports them (``chopper_rank_open_step``,
``chopper_rank_position_seconds``, agent/metrics.py); promtool runs the description's queries over
them when the alert fires, as Prometheus does. A real Prometheus doing the same over a real hung job
is tests/e2e/test_hang_located.py.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dashboards import render
from dashboards.alerts import alerts
from dashboards.params import RuleParams

RULES = render.ROOT / render.RULES


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    body = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": values}


def _rank(job: str, node: str, rank: int, gpu: int) -> dict[str, str]:
    return {"node": node, "training_job": job, "rank": str(rank), "gpu": str(gpu), "instance": f"{node}:9477",
            "job": "chopper-agent"}


def _inputs() -> list[dict[str, str]]:
    # llm hangs from its first step: ranks 0-2 wait inside all_reduce of step 7 (since 0 s), rank 3 never
    # left backward (since 30 s earlier); only rank 0's marker series are given, so one alert fires.
    # small: one rank inside its step 3, in no phase.
    out = [_series("chopper_rank_markers_received_total", {**_rank("llm", "n1", 0, 0), "kind": "step_begin"}, "1x40"),
           _series("chopper_rank_steps_abandoned_total", _rank("llm", "n1", 0, 0), "0x40")]
    for rank, node, gpu, kind, name, values in ((0, "n1", 0, "collective", "all_reduce", "0+30x40"),
                                                (1, "n1", 1, "collective", "all_reduce", "0+30x40"),
                                                (2, "n2", 0, "collective", "all_reduce", "0+30x40"),
                                                (3, "n2", 1, "phase", "backward", "30+30x40")):
        labels = _rank("llm", node, rank, gpu)
        out += [_series("chopper_rank_open_step", labels, "7x40"),
                _series("chopper_rank_position_seconds", {**labels, "kind": kind, "name": name}, values)]
    small = _rank("small", "n2", 0, 2)
    out += [_series("chopper_rank_markers_received_total", {**small, "kind": "step_begin"}, "1x40"),
            _series("chopper_rank_steps_abandoned_total", small, "0x40"),
            _series("chopper_rank_open_step", small, "3x40"),
            _series("chopper_rank_position_seconds", {**small, "kind": "step", "name": ""}, "60+30x40")]
    return out


def _expected(job: str, node: str, where: str) -> dict:
    stalled = next(a for a in alerts(RuleParams()) if a.name == "ChopperJobStalled")
    return {"exp_labels": {"severity": "critical", "node": node, "training_job": job, "rank": "0"},
            "exp_annotations": {
                "summary": f"Rank 0 of job {job} is stuck inside a step",
                "description": f"Rank 0 of job {job} on {node} began a step and sent no marker for 10m, while its "
                               "agent is up (the rank's series exist only while the agent is scraped). Where the "
                               f"job's ranks are: {where}",
                "runbook_url": stalled.runbook_url(RuleParams().runbook_base_url)}}


def test_the_description_names_each_place_its_ranks_its_step_and_how_long(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: it comes with the Debian package prometheus, which `make test` installs")
    test = {"rule_files": [str(RULES)], "evaluation_interval": "30s", "tests": [{
        "interval": "30s", "input_series": _inputs(),
        "alert_rule_test": [{"eval_time": "12m", "alertname": "ChopperJobStalled", "exp_alerts": [
            _expected("llm", "n1", "3 ranks (0 1 2) inside collective all_reduce of step 7 for up to 12m 0s; "
                                   "1 rank (3) inside phase backward of step 7 for up to 12m 30s"),
            _expected("small", "n2", "1 rank (0) inside step 3 for up to 13m 0s"),
        ]}]}]}
    path = tmp_path / "hangs.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
