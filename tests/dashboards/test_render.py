"""Dashboards and rules as code: rendered files current, rules valid and unit-tested, names from the catalogs."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dashboards import fleet, gpu, job, render, rulefile
from dashboards.alerts import alerts
from dashboards.cluster import MATCHER, filter_cluster, keep_cluster
from dashboards.names import CATALOG, C
from dashboards.params import RuleParams
from dashboards.recording import records

ROOT = render.ROOT
RULES = ROOT / render.RULES
RULE_TESTS = sorted((ROOT / "dashboards/rules/tests").glob("*.yaml"))
IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
GROUPING = re.compile(r"\b(?:by|on)\s*\(([^()]*)\)")
# A series selector: a metric or recording-rule name and its matchers.
SELECTOR = re.compile(r'(?<![\w:"$])(chopper_\w*|[a-z_]+:[\w:]+|up|ALERTS)(\{[^}]*\})?(?![\w:(])')


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
                                    "missed_ticks_ratio=0.5", "backend_for=10m", "health_window=1m",
                                    "health_for=20m", "ecc_corrected_per_s=0.5", "pcie_replays_per_s=0.5",
                                    "link_errors_per_s=0.5"])
def test_unit_tests_fail_when_a_threshold_moves(tmp_path: Path, change: str) -> None:
    """The promtool tests pin every threshold: moving one makes them fail."""
    assert render.main(["--set", change, "--out", str(tmp_path)]) == 0
    tests = tmp_path / "dashboards/rules/tests"
    tests.mkdir()
    for path in RULE_TESTS:
        shutil.copy(path, tests)
    result = promtool("test", "rules", *(str(tests / p.name) for p in RULE_TESTS))
    assert result.returncode == 1 and "FAILED" in result.stdout + result.stderr


def used_names() -> set[str]:
    """Every metric and recording-rule name the rules, alerts and dashboards read."""
    exprs = [r.expr for r in records(RuleParams())] + [a.expr for a in alerts(RuleParams())]
    for text in render.dashboard_json(RuleParams()).values():
        board = json.loads(text)
        exprs += [t["expr"] for _, t in panel_targets(board)]
        exprs += [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return {tok for e in exprs for tok in IDENT.findall(e) if "chopper_" in tok}


def test_every_metric_name_comes_from_a_catalog_or_a_recording_rule() -> None:
    recorded = {r.record for r in records(RuleParams())}
    used = used_names()
    assert used - set(CATALOG) - recorded == set()
    assert len(used & set(CATALOG)) > 60  # the dashboards cover most of both catalogs


def test_deprecated_metrics_are_read_by_nothing_and_name_their_recording_rule() -> None:
    """A metric whose help says it is deprecated is left for other readers for one release: no rule or
    dashboard of ours reads it, and its help names the recording rule to read instead."""
    recorded = {r.record for r in records(RuleParams())}
    deprecated = {name: spec.help for name, spec in CATALOG.items() if spec.help.startswith("Deprecated")}
    assert {"chopper_job_mfu_ratio", "chopper_job_energy_per_token_joules", "chopper_rank_mfu_ratio"} <= set(deprecated)
    assert used_names() & set(deprecated) == set()
    for name, help_text in deprecated.items():
        named = set(re.findall(r"\b[a-z_]+:[a-z_]+:[a-z_]+\b", help_text))
        assert named and named <= recorded, f"{name}: {help_text}"


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
    (["--set", "runbook_base_url=docs/ALERTS.md"], "runbook_base_url: 'docs/ALERTS.md' is not a URL; use e.g. https://"),
    (["--set", "pcie_replays_per_s=0"], "pcie_replays_per_s: 0.0 is out of range; use a rate above 0"),
])
def test_bad_parameters_name_the_key_and_the_fix(argv: list[str], message: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert render.main([*argv, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_every_alert_links_its_runbook_section() -> None:
    """runbook_url is the base URL and the anchor of the alert's own heading in docs/ALERTS.md."""
    doc = (ROOT / "docs/ALERTS.md").read_text()
    anchors = {line.removeprefix("### ").lower() for line in doc.splitlines() if line.startswith("### ")}
    base = "https://git.example.com/chopper/blob/main/docs/ALERTS.md"
    rules = [r for g in rulefile.rule_groups(RuleParams(runbook_base_url=base)) for r in g["rules"] if "alert" in r]
    assert len(rules) == len(alerts(RuleParams())) > 8
    for rule in rules:
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}, rule["alert"]
        url = rule["annotations"]["runbook_url"]
        assert url == f"{base}#{rule['alert'].lower()}" and url.rpartition("#")[2] in anchors, url


def test_every_aggregation_and_join_keeps_the_cluster() -> None:
    exprs = [r.expr for r in records(RuleParams())] + [a.expr for a in alerts(RuleParams())]
    for text in render.dashboard_json(RuleParams()).values():
        exprs += [t["expr"] for _, t in panel_targets(json.loads(text))]
    lists = [m.group(1) for e in exprs for m in GROUPING.finditer(e)]
    assert len(lists) > 80
    assert [g for g in lists if "cluster" not in [label.strip() for label in g.split(",")]] == []


def test_every_dashboard_query_filters_on_the_cluster_variable() -> None:
    for name, text in render.dashboard_json(RuleParams()).items():
        board = json.loads(text)
        variables = {v["name"]: v for v in board["templating"]["list"]}
        cluster = variables["cluster"]
        # All is ".*": it matches a series without the label, so a Prometheus without one shows everything.
        assert (cluster["allValue"], cluster["includeAll"], cluster["current"]["value"]) == (".*", True, "$__all")
        queries = [t["expr"] for _, t in panel_targets(board)]
        queries += [v["query"] for v in variables.values() if v["type"] == "query" and v["name"] != "cluster"]
        for expr in queries:
            selectors = SELECTOR.findall(expr)
            assert selectors and all(MATCHER in matchers for _, matchers in selectors), f"{name}: {expr}"


def test_cluster_rewrites_leave_strings_functions_and_variables_alone() -> None:
    expr = ('sum by (node) (rate(chopper_gpu_busy_ratio{node=~"$node"}[$__rate_interval]))\n'
            '* on (node) group_left (rank) label_replace(up{job="chopper-agent"}, "x", "chopper_y", "", "")')
    assert filter_cluster(keep_cluster(expr)) == (
        'sum by (cluster, node) (rate(chopper_gpu_busy_ratio{node=~"$node", cluster=~"$cluster"}'
        '[$__rate_interval]))\n* on (cluster, node) group_left (rank) label_replace(up{job="chopper-agent", '
        'cluster=~"$cluster"}, "x", "chopper_y", "", "")')
    assert keep_cluster("max by (cluster, gpu) (x)") == "max by (cluster, gpu) (x)"


def _links(board: dict) -> list[str]:
    return [link["url"] for p in board["panels"] for link in p.get("fieldConfig", {}).get("defaults", {}).get(
        "links", [])]


def test_drill_down_goes_fleet_to_job_to_gpu_carrying_the_variables() -> None:
    boards = {name: json.loads(text) for name, text in render.dashboard_json(RuleParams()).items()}
    carried = "&${datasource:queryparam}&${cluster:queryparam}&${__url_time_range}"
    fleet_links, job_links = _links(boards["fleet"]), _links(boards["job"])
    assert f"/d/{job.UID}?var-job=${{__field.labels.training_job}}{carried}" in fleet_links
    assert f"/d/{gpu.UID}?var-node=${{__field.labels.node}}&var-gpu=${{__field.labels.gpu}}{carried}" in fleet_links
    assert job_links and set(job_links) == {
        f"/d/{gpu.UID}?var-node=${{__data.fields.node}}&var-gpu=${{__data.fields.gpu}}{carried}"}
    for url in fleet_links + job_links:
        target = {fleet.UID: "fleet", job.UID: "job", gpu.UID: "gpu"}[url.split("/")[2].split("?")[0]]
        names = {v["name"] for v in boards[target]["templating"]["list"]}
        assert set(re.findall(r"var-(\w+)=", url)) <= names, url


def test_the_gpu_dashboard_has_a_health_row() -> None:
    board = json.loads(render.dashboard_json(RuleParams())["gpu"])
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert "Health" in rows
    start = next(i for i, p in enumerate(board["panels"]) if p["title"] == "Health")
    end = next(i for i, p in enumerate(board["panels"]) if i > start and p["type"] == "row")
    exprs = " ".join(t["expr"] for p in board["panels"][start:end] for t in p.get("targets", []))
    for name in (C.gpu_health_status, C.gpu_xid_errors_total, C.gpu_ecc_errors_total, C.gpu_remapped_rows,
                 C.gpu_pcie_replays_total, C.gpu_link_errors_total, C.gpu_memory_temperature_celsius,
                 C.gpu_vr_temperature_celsius, C.gpu_bad_pages, C.gpu_xgmi_error_state):
        assert name in exprs, name
