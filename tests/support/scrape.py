"""One in-process scrape of a collector, parsed: what its families hold and its section failure counts."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from chopper.daemon.text_format import Collector, Registry

# Sample name -> its series: sorted (label, value) pairs -> sample value.
Series = dict[str, dict[tuple[tuple[str, str], ...], float]]


def scrape(collector: Collector) -> Series:
    """The samples of one scrape of ``collector`` (in a registry of its own), by name and labels."""
    registry = Registry()
    registry.register(collector)
    out: Series = {}
    for family in text_string_to_metric_families(registry.render().decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def section_errors(m: Series, daemon: str) -> dict[str, float]:
    """``chopper_<daemon>_metrics_section_errors_total`` by section."""
    return {dict(labels)["section"]: v for labels, v in m[f"chopper_{daemon}_metrics_section_errors_total"].items()}
