"""Metric names for dashboards and rules, taken from the agent and aggregator catalogs.

``C.gpu_busy_ratio`` is ``"chopper_gpu_busy_ratio"``: the attribute is the catalog name without
its ``chopper_`` prefix, and a name that neither ``agent/catalog.py`` nor ``aggregator/catalog.py``
defines raises ``AttributeError`` when the dashboards are rendered, so a renamed metric breaks
``make dashboards`` instead of silently emptying a panel.
"""
from __future__ import annotations

from agent.catalog import METRICS as AGENT_METRICS
from aggregator.catalog import METRICS as AGGREGATOR_METRICS
from chopper.daemon.exposition import MetricSpec

PREFIX = "chopper_"
CATALOG: dict[str, MetricSpec] = {m.name: m for m in (*AGENT_METRICS, *AGGREGATOR_METRICS)}


class _Names:
    """Attribute access to catalog names (see the module docstring)."""

    def __getattr__(self, attr: str) -> str:
        name = PREFIX + attr
        if name not in CATALOG:
            raise AttributeError(f"{name} is in neither agent/catalog.py nor aggregator/catalog.py; "
                                 "use a catalog name or add the metric to its catalog first")
        return name


C = _Names()
