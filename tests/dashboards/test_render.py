"""Dashboards and rules as code: rendered files current, rules valid and unit-tested, names from the catalogs."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dashboards import render
from dashboards.alerts import alerts
from dashboards.names import CATALOG, C
from dashboards.params import RuleParams
from dashboards.recording import records

ROOT = render.ROOT
RULES = ROOT / render.RULES
RULE_TESTS = sorted((ROOT / "dashboards/rules/tests").glob("*.yaml"))
IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is missing: it comes with the Debian package prometheus, which `make test` installs")
    return subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def panel_targets(board: dict) -> list[tuple[str, dict]]:
    """``(panel title, target)`` of every query of a dashboard, rows' panels included."""
    out = []
    for panel in board["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            out += [(inner["title"], t) for t in inner.get("targets", [])]
    return out


def test_committed_files_are_current() -> None:
    assert render.main(["--check"]) == 0, "rendered files are stale: run `make dashboards` and commit"


def test_check_names_a_stale_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert render.main(["--out", str(tmp_path)]) == 0
    (tmp_path / render.RULES).write_text("groups: []\n")
    assert render.main(["--check", "--out", str(tmp_path)]) == 1
    assert f"stale: {render.RULES} (run `make dashboards`)" in capsys.readouterr().err


def test_promtool_check_rules_is_clean() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(records(RuleParams())) + len(alerts(RuleParams()))} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = promtool("test", "rules", *map(str, RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_TESTS)


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    firing, quiet = set(), set()
    for path in RULE_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            quiet |= {t["alertname"] for t in test.get("alert_rule_test", []) if t["exp_alerts"] == []}
            for t in test.get("promql_expr_test", []):
                firing |= {m for s in t["exp_samples"] if 'alertstate="firing"' in s["labels"]
                           for m in re.findall(r'alertname="(\w+)"', s["labels"])}
    names = {a.name for a in alerts(RuleParams())}
    assert names - firing == set(), "alerts never seen firing in dashboards/rules/tests"
    assert names - quiet == set(), "alerts never checked not to fire in dashboards/rules/tests"


@pytest.mark.parametrize("change", ["dvfs_clock_ratio=0.4", "dvfs_busy_ratio=0.95", "straggler_score_ratio=0.5",
                                    "mfu_drop_ratio=0.5", "stall_window=20m", "down_for=10m",
                                    "missed_ticks_ratio=0.5", "backend_for=10m"])
def test_unit_tests_fail_when_a_threshold_moves(tmp_path: Path, change: str) -> None:
    """The promtool tests pin every threshold: moving one makes them fail."""
    assert render.main(["--set", change, "--out", str(tmp_path)]) == 0
    tests = tmp_path / "dashboards/rules/tests"
    tests.mkdir()
    for path in RULE_TESTS:
        shutil.copy(path, tests)
    result = promtool("test", "rules", *(str(tests / p.name) for p in RULE_TESTS))
    assert result.returncode == 1 and "FAILED" in result.stdout + result.stderr


def test_every_metric_name_comes_from_a_catalog_or_a_recording_rule() -> None:
    recorded = {r.record for r in records(RuleParams())}
    exprs = [r.expr for r in records(RuleParams())] + [a.expr for a in alerts(RuleParams())]
    for text in render.dashboard_json(RuleParams()).values():
        board = json.loads(text)
        exprs += [t["expr"] for _, t in panel_targets(board)]
        exprs += [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    used = {tok for e in exprs for tok in IDENT.findall(e) if "chopper_" in tok}
    assert used - set(CATALOG) - recorded == set()
    assert len(used & set(CATALOG)) > 60  # the dashboards cover most of both catalogs


def test_unknown_metric_name_fails_at_render() -> None:
    with pytest.raises(AttributeError, match=r"chopper_gpu_clock_mhz is in neither agent/catalog\.py"):
        _ = C.gpu_clock_mhz


def test_dashboards_are_well_formed() -> None:
    uids = set()
    for name, text in render.dashboard_json(RuleParams()).items():
        board = json.loads(text)
        uids.add(board["uid"])
        assert board["schemaVersion"] == 42 and board["tags"] == ["chopper"]
        panels = board["panels"]
        ids = [p["id"] for p in panels]
        assert len(ids) == len(set(ids)) and 0 not in ids, name
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        targets = panel_targets(board)
        assert len(targets) >= 8, name
        for title, target in targets:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
            assert target["refId"] and target["expr"], title
            for var in re.findall(r"\$(\w+)", target["expr"]):
                assert var == "__rate_interval" or var in variables, f"{name}/{title}: ${var} is not a variable"
        for p in panels:
            grid = p["gridPos"]
            assert grid["x"] + grid["w"] <= 24, (name, p["title"])
    assert uids == {"chopper-fleet", "chopper-job", "chopper-gpu", "chopper-health"}


def test_kubernetes_manifests_hold_the_same_rules_and_dashboards() -> None:
    generated = ROOT / render.K8S_DIR
    rule = yaml.safe_load((generated / "prometheusrule.yaml").read_text())
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    maps = list(yaml.safe_load_all((generated / "dashboards-configmap.yaml").read_text()))
    assert [m["metadata"]["labels"]["grafana_dashboard"] for m in maps] == ["1"] * 4
    for m in maps:
        (key, text), = m["data"].items()
        assert json.loads(text) == json.loads((ROOT / render.JSON_DIR / key.removeprefix("chopper-")).read_text())


def test_grafana_provisioning_points_at_the_dashboards() -> None:
    prov = ROOT / "deploy/grafana/provisioning"
    provider = yaml.safe_load((prov / "dashboards/chopper.yaml").read_text())["providers"][0]
    assert provider["type"] == "file" and provider["options"]["path"]
    source = yaml.safe_load((prov / "datasources/chopper.yaml").read_text())["datasources"][0]
    assert source["type"] == "prometheus" and source["isDefault"] is True


@pytest.mark.parametrize(("argv", "message"), [
    (["--set", "dvfs_for=5 minutes"], "dvfs_for: '5 minutes' is not a Prometheus duration; use e.g. 30s"),
    (["--set", "dvfs_clock_ratio=85"], "dvfs_clock_ratio: 85.0 is out of range; use a fraction between 0 and 1"),
    (["--set", "dvfs_clock_ratio=high"], "dvfs_clock_ratio: 'high' is not a number"),
    (["--set", "dvfs_ratio=0.8"], "unknown parameter 'dvfs_ratio'; known: rate_window, agent_selector"),
    (["--set", "dvfs_for"], "'dvfs_for' is not key=value"),
    (["--set", "agent_selector=chopper"], "agent_selector: 'chopper' is not label matchers"),
])
def test_bad_parameters_name_the_key_and_the_fix(argv: list[str], message: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert render.main([*argv, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
