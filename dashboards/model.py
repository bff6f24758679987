"""What an alert rule is: its expression, labels, annotations and runbook (``dashboards/alerts.py``)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Alert:
    """One alert rule.

    Attributes:
        name: Alert name.
        expr: PromQL; every series it returns is one firing alert.
        for_: How long the expression must hold (Prometheus duration; "0s": at once).
        severity: ``warning`` or ``critical`` (the ``severity`` label).
        summary: One line, Go-templated with ``$labels`` / ``$value``.
        description: What is wrong and how it was measured, templated.
        runbook: What to check and do, in order: the alert's section of ``docs/ALERTS.md``, which
            the ``runbook_url`` annotation points at.
        params: The ``RuleParams`` fields this rule uses.
        doc: More about the rule for ``docs/ALERTS.md`` (markdown), "" for none.
    """

    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    runbook: str
    params: tuple[str, ...]
    doc: str = ""

    def runbook_url(self, base: str) -> str:
        """The alert's section of ``docs/ALERTS.md`` under ``base`` (its ``### name`` heading's anchor,
        as GitHub and most Markdown renderers make it: the name in lower case)."""
        return f"{base}#{self.name.lower()}"
