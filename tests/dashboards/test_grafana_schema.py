"""The committed dashboards type-check against Grafana's published schema (``@grafana/schema``, tsc); broken ones fail.

The tsc tests skip only where node is absent; ``make test`` installs node, npm and the pinned npm
packages (``dashboards/schema/package-lock.json``), so in CI they always run.
"""
from __future__ import annotations

import copy
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from dashboards.schema import tscheck
from tests.support.hazards import HazardOutcome

BOARDS = sorted(tscheck.JSON_DIR.glob("*.json"))
needs_node = pytest.mark.skipif(shutil.which("node") is None,
                                reason="node is missing: `make test` installs it (Debian packages nodejs and npm)")


def board(name: str) -> dict[str, Any]:
    return json.loads((tscheck.JSON_DIR / f"{name}.json").read_text())


def first_panel(b: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(panel for _, panel in tscheck.panels(b) if panel["type"] == kind)


@needs_node
def test_committed_dashboards_match_grafanas_schema() -> None:
    assert len(BOARDS) >= 4, f"expected the rendered dashboards in {tscheck.JSON_DIR}"
    started = time.monotonic()
    errors = tscheck.check_files(BOARDS)
    elapsed = time.monotonic() - started
    assert errors == [], "\n".join(map(str, errors))
    assert elapsed < 30, f"the schema check took {elapsed:.1f} s"


def test_every_allowance_is_still_needed() -> None:
    used = [a for path in BOARDS for a in tscheck.allow(json.loads(path.read_text()))[1]]
    stale = [f"{a.scope} {a.key}" for a in tscheck.ALLOWANCES if a not in used]
    assert stale == [], "no committed dashboard needs these allowances any more: remove them from tscheck.ALLOWANCES"


def test_allowances_drop_and_fill_only_their_own_scope() -> None:
    original = board("job")
    allowed, _ = tscheck.allow(original)
    table, timeseries = first_panel(allowed, "table"), first_panel(allowed, "timeseries")
    assert "footer" not in table["options"] and "footer" in first_panel(original, "table")["options"]
    assert table["fieldConfig"]["defaults"]["custom"]["cellOptions"] == {"type": "auto"}
    assert "cellOptions" not in timeseries["fieldConfig"]["defaults"]["custom"]
    assert all("auto" not in v for v in allowed["templating"]["list"])
    assert original == board("job"), "allow() changed its input"


def test_literal_tags_every_line_with_its_json_path() -> None:
    lines = tscheck.literal({"panels": [{"gridPos": {"x": 0}}, 3], "tags": []})
    assert lines == [
        ("{", ""),
        ('  "panels": [', "panels"),
        ("    {", "panels[0]"),
        ('      "gridPos": {', "panels[0].gridPos"),
        ('        "x": 0,', "panels[0].gridPos.x"),
        ("      },", "panels[0].gridPos"),
        ("    },", "panels[0]"),
        ("    3,", "panels[1]"),
        ("  ],", "panels"),
        ('  "tags": [],', "tags"),
        ("}", ""),
    ]


def target(b: dict[str, Any], kind: str) -> tuple[str, dict[str, Any]]:
    """``(JSON path, object)`` of ``b`` (kind ``board``), its first ``query`` variable, or its first ``kind`` panel."""
    if kind == "board":
        return "", b
    if kind == "variable":
        i, var = next((i, v) for i, v in enumerate(b["templating"]["list"]) if v["type"] == "query")
        return f"templating.list[{i}]", var
    return next((path, panel) for path, panel in tscheck.panels(b) if panel["type"] == kind)


# case -> (dashboard, what to break, dotted key in it, value, tsc code or "schema", text the message must hold)
BROKEN = {
    "gridPos a string": ("job", "timeseries", "gridPos", "x", "TS2322", "h: number"),
    "refresh a number": ("job", "board", "refresh", 30, "TS2322", "'number' is not assignable to type 'string"),
    "unknown top-level field": ("gpu", "board", "refreshEvery", "30s", "TS2353", "refreshEvery"),
    "gridPos without h": ("gpu", "row", "gridPos", {"w": 24, "x": 0, "y": 0}, "TS2741", "'h' is missing"),
    "legend mode not an enum value": ("job", "timeseries", "options.legend.displayMode", "lists", "TS2820",
                                      "Did you mean '\"list\"'"),
    "timeseries option misspelt": ("job", "timeseries", "options.tooltips", {"mode": "multi"}, "TS2353", "tooltips"),
    "custom field config of the wrong type": ("job", "timeseries", "fieldConfig.defaults.custom.fillOpacity", "5",
                                              "TS2322", "number"),
    "stat panel with custom field config": ("fleet", "stat", "fieldConfig.defaults.custom.fillOpacity", 5, "TS2322",
                                            "never"),
    "heatmap option of the wrong type": ("job", "heatmap", "options.calculate", "yes", "TS2322", "boolean"),
    "panel type with no schema": ("job", "timeseries", "type", "timeserie", "schema",
                                  "panel type 'timeserie' has no schema in @grafana/schema"),
    "variable type unknown": ("gpu", "variable", "type", "querry", "TS2820", "Did you mean '\"query\"'"),
}


def broken(name: str, kind: str, key: str, value: object) -> tuple[dict[str, Any], str]:
    """Dashboard ``name`` with ``key`` of its ``kind`` target set to ``value``, and the JSON path of ``key``."""
    b = copy.deepcopy(board(name))
    path, item = target(b, kind)
    *parents, leaf = key.split(".")
    for part in parents:
        item = item.setdefault(part, {})
    item[leaf] = value
    return b, f"{path}.{key}" if path else key


@needs_node
@pytest.mark.hazard(item=17, input="dashboards with a gridPos of \"x\", a numeric refresh, an unknown top-level field, "
                    "a gridPos without h, a legend mode outside its enum, a misspelt panel option, a string opacity, "
                    "custom field config on a stat panel, a string heatmap flag, an unknown panel and variable type",
                    promise="each is rejected by tsc against @grafana/schema, naming the dashboard, the JSON path "
                    "and the schema's type")
def test_broken_dashboards_are_rejected_naming_the_field(hazard: HazardOutcome) -> None:
    boards, expected = {}, {}
    for case, (name, kind, key, value, code, text) in BROKEN.items():
        boards[f"{case}.json"], path = broken(name, kind, key, value)
        expected[f"{case}.json"] = (path, code, text)
    errors = tscheck.check(boards)
    for dashboard, (path, code, text) in expected.items():
        found = [e for e in errors if e.dashboard == dashboard]
        assert [(e.path, e.code) for e in found] == [(path, code)], "\n".join(map(str, found))
        assert text in found[0].message, str(found[0])
    hazard.outcome = (f"{len(BROKEN)} of {len(BROKEN)} broken dashboards rejected, each with one error at the "
                      f"mutated JSON path, e.g. '{str(errors[0])[:110]}…'")


def test_missing_packages_name_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(tscheck.SchemaToolMissing, match=r"npm ci --prefix dashboards/schema"):
        tscheck.check({"job.json": board("job")}, node_modules=tmp_path)
    (tmp_path / ".bin").mkdir()
    (tmp_path / ".bin/tsc").touch()
    with pytest.raises(tscheck.SchemaToolMissing, match=r"@grafana/schema is missing"):
        tscheck.check({"job.json": board("job")}, node_modules=tmp_path)


@needs_node
@pytest.mark.hazard(item=17, input="dashboard JSON that is a list, panels that are a string and a number, a "
                    "fieldConfig that is a string, templating that is a list",
                    promise="each is an error naming the dashboard and the JSON path, never a crash of the check")
def test_malformed_dashboards_are_errors_not_crashes(hazard: HazardOutcome) -> None:
    shapes = board("job")
    shapes["panels"] = ["x", 3, {**first_panel(board("job"), "timeseries"), "fieldConfig": "y"}]
    shapes["templating"] = []
    errors = tscheck.check({"list.json": [], "shapes.json": shapes})
    where = sorted({(e.dashboard, e.path) for e in errors})
    assert where == [("list.json", ""), ("shapes.json", "panels[0]"), ("shapes.json", "panels[1]"),
                     ("shapes.json", "panels[2].fieldConfig"), ("shapes.json", "templating")], \
        "\n".join(map(str, errors))
    assert "a dashboard is one JSON object, not list" in str(errors[0])
    hazard.outcome = f"{len(errors)} errors at {len(where)} JSON paths in 2 malformed dashboards, no exception"


@needs_node
def test_main_reports_each_error_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**board("gpu"), "refresh": 30}))
    assert tscheck.main([str(bad)]) == 1
    assert f"{bad}: refresh: TS2322" in capsys.readouterr().err
    assert tscheck.main([]) == 0
