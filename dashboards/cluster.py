"""The ``cluster`` label: kept by every aggregation and join, filtered on by every dashboard query.

Platform teams that run one Prometheus per cluster name it with a ``cluster`` label, added by
``external_labels`` (seen where the clusters' series meet: Thanos, Mimir, federation) or by
relabelling at scrape time (seen by the rules too). Chopper never exports it. The rules and
dashboards are written without it and these rewrites add it:

1. ``keep_cluster``: every ``by (...)`` and ``on (...)`` list gets ``cluster``, so an
   aggregation keeps one series per cluster and a join never matches two clusters' GPUs that share
   a node name. Where the label is absent, grouping or matching on it changes nothing.
2. ``filter_cluster``: every series selector gets ``cluster=~"$cluster"`` (the dashboards'
   variable). Its "All" value is ``.*``, which also matches a series without the label, so the
   dashboards answer on a Prometheus that has no ``cluster`` label at all.
"""
from __future__ import annotations

import re

CLUSTER = "cluster"
MATCHER = f'{CLUSTER}=~"${CLUSTER}"'
_GROUPING = re.compile(r"\b(by|on)\s*\(([^()]*)\)")
# A metric or recording-rule name (chopper_*, level:metric:operations, up, ALERTS) with its optional
# matchers; not a function (followed by "(") and not part of a longer name, a label value or a variable.
_SELECTOR = re.compile(r'(?<![\w:"$.])(chopper_[A-Za-z0-9_:]*|[a-z_]+:[A-Za-z0-9_:]+|up|ALERTS)'
                       r"(\{[^}]*\})?(?![\w:({])")


def keep_cluster(expr: str) -> str:
    """``expr`` with ``cluster`` first in every ``by`` and ``on`` label list that lacks it."""
    def add(m: re.Match[str]) -> str:
        labels = [label.strip() for label in m.group(2).split(",") if label.strip()]
        if CLUSTER in labels:
            return m.group(0)
        return f"{m.group(1)} ({', '.join([CLUSTER, *labels])})"

    return _GROUPING.sub(add, expr)


def filter_cluster(expr: str) -> str:
    """``expr`` with ``cluster=~"$cluster"`` in every series selector."""
    def add(m: re.Match[str]) -> str:
        name, matchers = m.group(1), (m.group(2) or "{}")[1:-1].strip()
        return f"{name}{{{matchers + ', ' if matchers else ''}{MATCHER}}}"

    return _SELECTOR.sub(add, expr)
