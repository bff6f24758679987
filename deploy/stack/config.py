"""Prometheus and Alertmanager configuration of the local stack, as YAML text (no I/O)."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml


def prometheus_yaml(agent_metrics: str, aggregator_metrics: str, alertmanager: str, rules: Sequence[Path],
                    scrape_interval_s: float) -> str:
    """``prometheus.yml`` scraping the agent and the aggregator, alerting to ``alertmanager``.

    Args:
        agent_metrics: host:port of the agent's /metrics.
        aggregator_metrics: host:port of the aggregator's /metrics.
        alertmanager: host:port of Alertmanager.
        rules: Rule files to load (absolute paths).
        scrape_interval_s: Scrape and rule evaluation interval, seconds.
    """
    interval = f"{scrape_interval_s:g}s"
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(p) for p in rules],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        # A plain scrape: Chopper's series name the training job training_job, never Prometheus' job.
        "scrape_configs": [
            {"job_name": name, "static_configs": [{"targets": [target]}]}
            for name, target in (("chopper-agent", agent_metrics), ("chopper-aggregator", aggregator_metrics))
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


def alertmanager_yaml() -> str:
    """``alertmanager.yml`` that keeps every alert visible in its UI and sends none anywhere."""
    config = {
        "route": {"receiver": "ui-only", "group_by": ["alertname", "training_job"], "group_wait": "1s"},
        "receivers": [{"name": "ui-only"}],
    }
    return yaml.safe_dump(config, sort_keys=False)
