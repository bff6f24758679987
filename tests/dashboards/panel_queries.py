"""Every query of the committed dashboards, run against a real Prometheus as Grafana would run it.

Grafana fills each query variable from its ``label_values(...)`` query, in order, and expands
``$__rate_interval``; so do these helpers. A multi-value variable (``cluster``, ``node``, ``gpu``)
takes its All value, ``.*``, as a dashboard opened fresh does; a single-value one (``job``) its
first value.
"""
from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request

from dashboards import render

RATE_INTERVAL = "5s"  # Grafana's $__rate_interval for 1 s scrapes: four scrape intervals and a bit


def fetch(prom: str, path: str, params: dict[str, str]) -> list[dict]:
    """``/api/v1/<path>`` of Prometheus at ``prom``: the result list (the series list for ``series``)."""
    url = f"http://{prom}/api/v1/{path}?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            data = json.load(response)["data"]
    except urllib.error.HTTPError as exc:  # a bad query: Prometheus says why
        raise AssertionError(f"{params}: {exc.read().decode()}") from None
    return list(data if path == "series" else data["result"])


def substitute(expr: str, values: dict[str, str]) -> str:
    """``expr`` with the variables' values and ``$__rate_interval`` filled in."""
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    return re.sub(r"\$(\w+)", lambda m: values[m.group(1)], expr)


def variables(prom: str, board: dict) -> dict[str, str] | str:
    """A value for every query variable of ``board``, in order; or which variable has none yet."""
    values: dict[str, str] = {}
    for var in board["templating"]["list"]:
        if var["type"] != "query":
            continue
        if var.get("includeAll"):
            values[var["name"]] = var["allValue"]
            continue
        selector, label = re.fullmatch(r"label_values\((.*), (\w+)\)", var["query"]).groups()  # type: ignore[union-attr]
        series = fetch(prom, "series", {"match[]": substitute(selector, values)})
        found = sorted({s[label] for s in series if label in s})
        if not found:
            return f"variable ${var['name']} has no values: {var['query']}"
        values[var["name"]] = found[0]
    return values


def empty_panel_queries(prom: str, may_be_empty: frozenset[str] = frozenset()) -> list[str]:
    """Every query of every committed dashboard that returns no data now (or over the last 20 s).

    Args:
        prom: host:port of Prometheus.
        may_be_empty: Metric names whose queries are not checked (series the agents under test never
            export, each with its reason at the caller).
    """
    empty, now = [], time.time()
    for path in sorted((render.ROOT / render.JSON_DIR).glob("*.json")):
        board = json.loads(path.read_text())
        values = variables(prom, board)
        if isinstance(values, str):
            empty.append(f"{path.name}: {values}")
            continue
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                if any(name in target["expr"] for name in may_be_empty):
                    continue
                expr = substitute(target["expr"], values)
                if target.get("instant"):
                    result = fetch(prom, "query", {"query": expr})
                else:
                    result = fetch(prom, "query_range", {"query": expr, "start": str(now - 20), "end": str(now),
                                                         "step": "1"})
                if not result:
                    empty.append(f"{path.name} / {panel['title']} / {target['refId']}: {expr}")
    return empty
