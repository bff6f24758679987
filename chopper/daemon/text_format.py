"""Metric families and the Prometheus text exposition format (version 0.0.4), for both daemons.

The daemons' collectors build their families per scrape (``chopper.daemon.exposition``) and
``Registry.render`` writes them as Prometheus reads them: per family ``# HELP`` and ``# TYPE``
lines, then one line a series, ``name{label="value",...} value`` with the labels in the order of
their names (as prometheus_client writes them). A counter's name carries its
``_total`` (the catalogs' names do), on its ``HELP`` and ``TYPE`` lines too. Label values escape
backslash, double quote and newline; help texts backslash and newline. Values are Python's
shortest round-trip form of the float (``2.0``, ``1e+16``), infinities ``+Inf``/``-Inf`` and
NaN ``NaN``, as Prometheus parses them.

Why not prometheus_client: the daemons used nothing of it but its families, this format and its
HTTP server, and importing it (with the ``http.server``, ``wsgiref`` and ``email`` modules it
pulls in) took 7.4 MiB of resident memory in a fresh process; under load the agent's RSS fell by
3.7 MiB without it (docs/PERFORMANCE.md). The tests still read every daemon's output with
prometheus_client's parser, and a real Prometheus scrapes it.
"""
from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from typing import Protocol

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LABEL_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n"})
_HELP_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n"})


class Family:
    """One metric's series of one scrape.

    Args:
        name: The metric name (a counter's ends in ``_total``).
        kind: ``counter`` or ``gauge``.
        help: One sentence with the unit.
        labels: The label names, in the order each series gives its values.
    """

    __slots__ = ("_order", "help", "kind", "labels", "name", "samples")

    def __init__(self, name: str, kind: str, help: str, labels: Sequence[str] = ()) -> None:
        if kind not in ("counter", "gauge"):
            raise ValueError(f"metric {name}: kind must be counter or gauge, got {kind!r}")
        self.name = name
        self.kind = kind
        self.help = help
        self.labels = tuple(labels)
        self._order = sorted(range(len(self.labels)), key=self.labels.__getitem__)  # the text's label order
        self.samples: list[tuple[tuple[str, ...], float]] = []  # (label values, value) a series

    def add_metric(self, values: Sequence[str], value: float) -> None:
        """Add the series of label ``values`` (one per label name) with ``value``."""
        if len(values) != len(self.labels):
            raise ValueError(f"metric {self.name}: {len(values)} label values for labels {self.labels}")
        self.samples.append((tuple(values), float(value)))


class Collector(Protocol):
    """What a registry renders: fresh families at every call (``collect`` may run on several threads at once)."""

    def collect(self) -> Iterable[Family]: ...


def format_value(value: float) -> str:
    """``value`` as the text format writes it (module docstring)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def render(families: Iterable[Family]) -> str:
    """The text exposition of ``families``, in their order (module docstring)."""
    out: list[str] = []
    for family in families:
        name = family.name
        out.append(f"# HELP {name} {family.help.translate(_HELP_ESCAPES)}\n# TYPE {name} {family.kind}\n")
        labels, order = family.labels, family._order
        for values, value in family.samples:
            if labels:
                pairs = ",".join(f'{labels[i]}="{values[i].translate(_LABEL_ESCAPES)}"' for i in order)
                out.append(f"{name}{{{pairs}}} {format_value(value)}\n")
            else:
                out.append(f"{name} {format_value(value)}\n")
    return "".join(out)


class Registry:
    """The collectors one ``/metrics`` renders, in the order they were registered."""

    def __init__(self) -> None:
        self._collectors: list[Collector] = []
        self._lock = threading.Lock()

    def register(self, collector: Collector) -> None:
        with self._lock:
            self._collectors.append(collector)

    def render(self) -> bytes:
        """Every collector's families as one text exposition, UTF-8."""
        with self._lock:
            collectors = list(self._collectors)
        return "".join(render(c.collect()) for c in collectors).encode()
