"""``docs/ALERTS.md``: every alert with its expression, parameters and runbook, and the recording rules."""
from __future__ import annotations

from dashboards.alerts import alerts
from dashboards.params import RuleParams, param_help
from dashboards.recording import MFU_GAP_DOC, records


def markdown(p: RuleParams) -> str:
    """The alerts document for parameters ``p`` (the committed file uses the defaults)."""
    defaults = {name: (default, help_text) for name, default, help_text in param_help()}
    lines = [
        "# Alerts and recording rules",
        "",
        "Generated from `dashboards/alerts.py`, `dashboards/recording.py` and `dashboards/params.py` by",
        "`make dashboards`; a test fails when this file is stale. The rules file is",
        "`dashboards/rules/rules.yaml` (Kubernetes: `deploy/kubernetes/base/generated/prometheusrule.yaml`).",
        "Render with other thresholds: `python -m dashboards --set dvfs_clock_ratio=0.8 --out DIR`.",
        "",
        "The training job is the `training_job` label (`job` stays Prometheus' scrape job), so a plain scrape",
        "config works: `deploy/prometheus/prometheus.yml`. Daemons run with `job_label: job` (the label of",
        "earlier releases) need `honor_labels: true` and rules rendered for that label; see deploy/README.md.",
        "Every aggregation and join keeps a `cluster` label where Prometheus adds one (external_labels or",
        "relabelling; `dashboards/cluster.py`), and every alert's `runbook_url` annotation points at its",
        "section below (`runbook_base_url`).",
        "",
        "## Parameters",
        "",
        "| parameter | default | meaning |",
        "|---|---|---|",
    ]
    lines += [f"| `{name}` | `{default}` | {help_text} |" for name, (default, help_text) in defaults.items()]
    lines += ["", "## Alerts", ""]
    for a in alerts(p):
        lines += [
            f"### {a.name}",
            "",
            f"Severity `{a.severity}`, fires after `{a.for_}`. {a.summary}",
            "",
            *([a.doc, ""] if a.doc else []),
            "```promql",
            a.expr,
            "```",
            "",
            "Parameters: " + ", ".join(f"`{name}` = `{getattr(p, name)}`" for name in a.params) + ".",
            "",
            f"**Runbook.** {a.runbook}",
            "",
        ]
    lines += ["## Recording rules", "", f"Window: `rate_window` = `{p.rate_window}`.", "",
              "| record | meaning |", "|---|---|"]
    lines += [f"| `{r.record}` | {r.help} |" for r in records(p)]
    lines += ["", "### Marker MFU against the FLOP counters", "", MFU_GAP_DOC]
    return "\n".join(lines) + "\n"
