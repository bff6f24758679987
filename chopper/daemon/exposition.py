"""Metric catalogs and their Prometheus exposition, the same for both daemons.

Each daemon keeps its own catalog (``agent/catalog.py``, ``aggregator/catalog.py``): a tuple of
``MetricSpec`` that is the single source of its metric names. This module holds what the two
share:

- ``MetricSpec``, the catalog's row;
- ``Families``, the metric families of one scrape (``chopper.daemon.text_format.Family``), built
  from a catalog on first use (a collector's ``collect()`` fills a fresh one per scrape);
- ``Sections``, which runs each section of a ``collect()`` on its own, so that a section that
  raises costs its own series, is counted and is logged at a bounded rate, while the scrape
  returns every other family (STYLE rule 2: a failure never fails the scrape);
- the Markdown rendering of a catalog (``docs/METRICS.md``, ``docs/AGGREGATOR_METRICS.md``),
  and the reason tables of the access checks and reloads that both daemons count.
"""
from __future__ import annotations

import logging
import math
import textwrap
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from chopper.daemon.labels import JOB_LABEL
from chopper.daemon.text_format import Family

T = TypeVar("T")

# Each daemon's catalog doc, under docs/.
DOCS = {"agent": "METRICS.md", "aggregator": "AGGREGATOR_METRICS.md"}
# Seconds between two log lines of one failing section: a scrape every few seconds must not
# write a traceback every few seconds; the counter keeps the total.
SECTION_LOG_PERIOD_S = 300.0


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One exported metric.

    Attributes:
        name: Full metric name (counters include ``_total``).
        kind: ``gauge``, ``counter`` or ``info`` (a gauge fixed at 1 that carries labels).
        help: One sentence with the unit.
        labels: Label names, in order.
    """

    name: str
    kind: str
    help: str
    labels: tuple[str, ...]




class Families:
    """The families of one scrape, created from the catalog on first use.

    Args:
        catalog: The daemon's specs by name; adding a name it lacks raises ``KeyError``.
        job_label: The label name the catalog's ``JOB_LABEL`` is exported under (``JOB_LABELS``).
        exported: The names to export (the agent's field selection, ``agent.fields``); None: all.
            Adding any other name is a no-op.
    """

    def __init__(self, catalog: Mapping[str, MetricSpec], job_label: str = JOB_LABEL,
                 exported: frozenset[str] | None = None) -> None:
        self._catalog = catalog
        self._job_label = job_label
        self._exported = exported
        self._families: dict[str, Family] = {}

    def add(self, name: str, labels: tuple[str, ...], value: float | None) -> None:
        """Add one series; a value that is None or NaN (unknown, or unreadable on this backend) is left out."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return
        if self._exported is not None and name not in self._exported:
            if name not in self._catalog:
                raise KeyError(name)  # a misspelt name fails whether or not it is selected
            return
        family = self._families.get(name)
        if family is None:
            spec = self._catalog[name]
            labels_of = spec.labels if self._job_label == JOB_LABEL else tuple(
                self._job_label if label == JOB_LABEL else label for label in spec.labels)
            family = self._families[name] = Family(name, "counter" if spec.kind == "counter" else "gauge",
                                                   spec.help, labels_of)
        family.add_metric(list(labels), value)

    def part(self) -> Families:
        """An empty ``Families`` of the same catalog, for one section to fill before ``merge``."""
        return Families(self._catalog, self._job_label, self._exported)

    def merge(self, part: Families) -> None:
        """Take in the series of ``part`` (a family both hold gets the other's samples after its own)."""
        for name, family in part._families.items():
            mine = self._families.get(name)
            if mine is None:
                self._families[name] = family
            else:
                mine.samples.extend(family.samples)

    def __iter__(self) -> Iterator[Family]:
        return iter(self._families.values())


class Sections:
    """The guarded sections of one collector, with a failure count per section.

    ``run`` fills a section into its own ``Families.part`` and merges it only when the section
    returns, so a section that raises leaves none of its series, not a half-filled family. Each
    failure adds one to the section's count; the first failure of a section is logged with its
    traceback, later ones at most once per ``log_period_s`` with the number since the last line.
    Collectors may be scraped from several threads at once, so the counts are locked.

    Args:
        names: Every section, so each count is exported from the first scrape (0 until it fails).
        logger: Where the failures are logged.
        clock: Monotonic seconds (injected in tests).
        log_period_s: Least seconds between two log lines of one section.
    """

    def __init__(self, names: Iterable[str], logger: logging.Logger, clock: Callable[[], float] = time.monotonic,
                 log_period_s: float = SECTION_LOG_PERIOD_S) -> None:
        self.errors: dict[str, int] = dict.fromkeys(names, 0)
        self._logger = logger
        self._clock = clock
        self._period_s = log_period_s
        self._lock = threading.Lock()
        self._logged_at: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def run(self, fam: Families, name: str, fill: Callable[[Families], T]) -> T | None:
        """Fill section ``name`` into ``fam`` with ``fill``; what ``fill`` returns, or None when it raised."""
        part = fam.part()
        try:
            result = fill(part)
        except Exception:  # any bug or bad state of one section: the scrape goes on without it
            self._failed(name)
            return None
        fam.merge(part)
        return result

    def export(self, fam: Families, metric: str, labels: tuple[str, ...] = ()) -> None:
        """Add the failure count of every section to ``metric``, labelled ``(*labels, section)``."""
        with self._lock:
            counts = sorted(self.errors.items())
        for name, count in counts:
            fam.add(metric, (*labels, name), float(count))

    def _failed(self, name: str) -> None:
        with self._lock:
            self.errors[name] = self.errors.get(name, 0) + 1
            now = self._clock()
            last = self._logged_at.get(name)
            if last is not None and now - last < self._period_s:
                self._unlogged[name] = self._unlogged.get(name, 0) + 1
                return
            self._logged_at[name] = now
            since, total = self._unlogged.pop(name, 0), self.errors[name]
        self._logger.warning("event=metrics_section_failed section=%s failures_not_logged=%d total=%d", name, since,
                             total, exc_info=True)


def catalog_doc(title: str, module: str, notes: str, metrics: Iterable[MetricSpec], own: Iterable[str],
                sections: Mapping[str, str], token_file: bool = True) -> str:
    """A daemon's metric catalog as Markdown, what ``python -m <module>`` prints.

    In order: the title, how the doc is made, ``notes``, the table of ``metrics``; the daemon's
    ``own`` sections (lines); the tables of the refusals and refused reloads (``refusal_tables``);
    the table of its collector's ``sections``.

    Args:
        title: The doc's heading.
        module: The catalog's module (``agent.catalog``): its metrics are named ``chopper_<daemon>_*``.
        notes: One paragraph: what the reader needs for this catalog's table, after the common rules.
        metrics: The catalog.
        own: The daemon's own sections, as lines.
        sections: The collector's sections and the series of each (``Sections``).
        token_file: Whether the daemon has a token file (its reloads have a table too).
    """
    daemon = module.partition(".")[0]
    prefix = f"chopper_{daemon}"
    intro = (f"Generated from `{module.replace('.', '/')}.py` by `python -m {module} > docs/{DOCS[daemon]}`; a test "
             "fails when this file and the catalog disagree. Names follow `chopper_<subsystem>_<name>_<unit>` in base "
             f"units; counters end in `_total`; step numbers are never labels. {notes}")
    lines = [f"# {title}", "", *textwrap.wrap(intro, width=104), "",
             "| name | type | labels | help |", "|---|---|---|---|"]
    lines += [f"| `{m.name}` | {m.kind} | {', '.join(m.labels)} | {m.help} |" for m in metrics]
    lines += own
    lines += refusal_tables(prefix, token_file)
    lines += section_table(prefix, sections)
    return "\n".join(lines) + "\n"


def reason_table(heading: str, reasons: Mapping[str, str], intro: Iterable[str] = ()) -> list[str]:
    """A ``## heading`` section: the ``intro`` lines, then one row per reason and its meaning."""
    lines = ["", f"## {heading}", ""]
    if intro:
        lines += [*intro, ""]
    lines += ["| reason | meaning |", "|---|---|"]
    lines += [f"| `{reason}` | {meaning} |" for reason, meaning in reasons.items()]
    return lines


def refusal_tables(prefix: str, token_file: bool = True) -> list[str]:
    """The reason tables of ``<prefix>_rpc_refused_total`` and of the refused reloads (``token_file``: it has one)."""
    # Imported here: only the docs need them, and the catalogs that dashboards and rules import stay light.
    from chopper.daemon import auth, tls
    from chopper.daemon.access import REFUSAL_REASONS

    lines = reason_table(f"Refusal reasons (`{prefix}_rpc_refused_total{{reason}}`)", REFUSAL_REASONS)
    lines += ["", "A series appears with its first refusal. docs/SECURITY.md says what each check guards."]
    names = [f"`{prefix}_token_file_reloads_refused_total`"] if token_file else []
    names.append(f"`{prefix}_tls_reloads_refused_total`")
    reload_reasons = dict(tls.REFUSAL_REASONS)
    if token_file:
        reload_reasons["unusable"] = (f"token file: {auth.REFUSAL_REASONS['unusable']}; "
                                      f"TLS files: {tls.REFUSAL_REASONS['unusable']}")
    lines += reason_table(f"Refused reloads ({' and '.join(names)}, `reason`)", reload_reasons, intro=(
        "A file that holds secrets or trust is re-read when it changes (the token file at the next protected",
        "call, TLS files at the next connection, and all of them on SIGHUP). A change that is refused leaves",
        "what was in force before; it is logged (`event=token_file_refused`, `event=tls_reload_failed`) and",
        "counted once per broken state. Each series is 0 from start while its files are set."))
    return lines


def section_table(prefix: str, sections: Mapping[str, str]) -> list[str]:
    """The table of the guarded sections of a daemon's ``collect()`` (``<prefix>_metrics_section_errors_total``)."""
    lines = ["", f"## Collector sections (`{prefix}_metrics_section_errors_total{{section}}`)", "",
             "Each section of a scrape is built on its own: a section that fails (a bug, or state it cannot read)",
             "leaves out its own series only, the scrape still answers with every other one, and the failure is",
             "counted here and logged (`event=metrics_section_failed`, with the traceback; at most once per",
             f"{SECTION_LOG_PERIOD_S:g} s per section). Every section's series is 0 from the first scrape.", "",
             "| section | series |", "|---|---|"]
    lines += [f"| `{name}` | {series} |" for name, series in sections.items()]
    return lines
