"""Which metric families the agent exports: a profile, less what ``metrics_exclude`` names.

A platform engineer who runs the agent where dcgm-exporter ran may want the GPU series only, or
may want to leave out the highest-cardinality family (per-link bytes: 2 series per link, 18 links
per H100). The agent settings are ``metrics_profile`` (``PROFILES``) and ``metrics_exclude``,
a list of catalog names or shell-style patterns (``chopper_inspector_*``). The agent's own
health series (``chopper_agent_info``, ``chopper_agent_backend_up``, the section error counts)
are always exported: a scrape that shows nothing must still say why.

What each family costs, in series per GPU or rank and in bytes and CPU per scrape, is measured by
``benchmarks/bench_metric_cost.py`` and tabled in docs/PERFORMANCE.md.
"""
from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable

from agent.catalog import METRICS

ALL: tuple[str, ...] = tuple(m.name for m in METRICS)
ALWAYS: frozenset[str] = frozenset({"chopper_agent_info", "chopper_agent_backend_up",
                                    "chopper_agent_backend_errors_total", "chopper_agent_metrics_section_errors_total"})
# Profile -> (patterns of the families it exports, patterns of those it then leaves out).
PROFILES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # Everything in the catalog.
    "full": (("chopper_*",), ()),
    # Everything but the per-link byte counters; their sums per GPU stay.
    "standard": (("chopper_*",), ("chopper_gpu_link_bytes_total",)),
    # A GPU exporter: the GPU and host series with health and the agent's own, no training-job series.
    "gpu": (("chopper_gpu_*", "chopper_host_*", "chopper_agent_*"), ()),
}


class FieldSelectionError(ValueError):
    """A profile or exclusion that names nothing the catalog has; the message names the fix."""


def _matching(pattern: str) -> list[str]:
    return [name for name in ALL if fnmatch.fnmatchcase(name, pattern)]


def selected(profile: str, exclude: Iterable[str] = ()) -> frozenset[str]:
    """The catalog names exported under ``profile`` without the families ``exclude`` matches.

    Raises:
        FieldSelectionError: An unknown profile, or an exclusion that matches no catalog name
            (a typo would otherwise keep the family it meant silently).
    """
    if profile not in PROFILES:
        raise FieldSelectionError(f"{profile!r} is not a metrics profile; use one of {', '.join(PROFILES)}")
    include, leave_out = PROFILES[profile]
    kept = {name for pattern in include for name in _matching(pattern)}
    kept -= {name for pattern in leave_out for name in _matching(pattern)}
    for pattern in exclude:
        names = _matching(pattern)
        if not names:
            close = difflib.get_close_matches(pattern, ALL, n=3)
            hint = f"; did you mean {', '.join(close)}" if close else ""
            raise FieldSelectionError(f"{pattern!r} matches no metric of the catalog (docs/METRICS.md){hint}")
        kept -= set(names)
    return frozenset(kept | ALWAYS)
