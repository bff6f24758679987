"""Parameters of the rules and alerts: windows, thresholds, durations and scrape selectors.

Every field has a default that suits a production cluster scraped every 15-30 s; ``docs/ALERTS.md``
lists them. ``python -m dashboards --set dvfs_clock_ratio=0.8`` renders with other values, and the
end-to-end test renders a fast variant (1 s scrapes, seconds-long windows) from the same code.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


def _p(default: Any, help_text: str) -> Any:  # Any: a dataclass field() stands in for the default
    return field(default=default, metadata={"help": help_text})


@dataclass(frozen=True)
class RuleParams:
    """Everything the rules can be told; durations are Prometheus durations (``30s``, ``5m``)."""

    rate_window: str = _p("2m", "window of the recording rules' rates and averages (at least 4 scrape intervals)")
    agent_selector: str = _p('job="chopper-agent"', "label matchers of the agents' scrape targets in `up`")
    aggregator_selector: str = _p('job="chopper-aggregator"', "label matchers of the aggregators' scrape targets")
    dvfs_clock_ratio: float = _p(0.85, "DVFS: a busy GPU below this fraction of its max clock is throttled")
    dvfs_busy_ratio: float = _p(0.5, "DVFS: a GPU counts as busy above this engine activity (0-1)")
    dvfs_for: str = _p("5m", "DVFS: how long the clock must stay low before the alert fires")
    straggler_score_ratio: float = _p(
        0.1, "straggler: slowest rank's compute excess over the median, as a fraction of the step time")
    straggler_for: str = _p("10m", "straggler: how long a power/thermal straggler must persist")
    mfu_drop_ratio: float = _p(0.2, "MFU drop: fire when MFU is this fraction below the job's baseline")
    mfu_baseline_window: str = _p("1h", "MFU drop: the baseline is the job's median 5m MFU over this window")
    mfu_for: str = _p("15m", "MFU drop: how long MFU must stay below the baseline")
    stall_window: str = _p("10m", "job stalled: a rank inside a step that sent no marker for this long")
    stall_for: str = _p("1m", "job stalled: how long the stall must persist before the alert fires")
    down_for: str = _p("2m", "agent/aggregator down: how long a scrape target must fail")
    backend_for: str = _p("2m", "backend failing: how long chopper_agent_backend_up must stay 0")
    missed_ticks_ratio: float = _p(0.05, "telemetry loss: fraction of sampler ticks missed over rate_window")
    health_window: str = _p("5m", "GPU health: window in which a new XID, uncorrected ECC error or bad page fires")
    health_for: str = _p("10m", "GPU health: how long a corrected-error, PCIe replay or NVLink error rate must last")
    ecc_corrected_per_s: float = _p(0.1, "GPU health: corrected ECC errors per second (over rate_window) that warn")
    pcie_replays_per_s: float = _p(0.1, "GPU health: PCIe replays per second (over rate_window) that warn")
    link_errors_per_s: float = _p(0.1, "GPU health: NVLink errors per second, all types (over rate_window), that warn")
    runbook_base_url: str = _p(
        "https://github.com/chopper-telemetry/chopper/blob/main/docs/ALERTS.md",
        "where docs/ALERTS.md is served: each alert's runbook_url is this with the alert's anchor (#its name in lower "
        "case)")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "str" and f.name.endswith(("_window", "_for")) and not DURATION.match(value):
                raise ValueError(f"{f.name}: {value!r} is not a Prometheus duration; use e.g. 30s, 5m or 1h")
            if f.type == "str" and f.name.endswith("_selector") and "=" not in value:
                raise ValueError(f"{f.name}: {value!r} is not label matchers; use e.g. job=\"chopper-agent\"")
            if f.type == "str" and f.name.endswith("_url") and not value.startswith(("https://", "http://")):
                raise ValueError(f"{f.name}: {value!r} is not a URL; use e.g. https://git.example.com/chopper/"
                                 "blob/main/docs/ALERTS.md")
            if f.type == "float" and f.name.endswith("_ratio") and not 0.0 < value < 1.0:
                raise ValueError(f"{f.name}: {value!r} is out of range; use a fraction between 0 and 1")
            if f.type == "float" and not value > 0.0:
                raise ValueError(f"{f.name}: {value!r} is out of range; use a rate above 0")

    @classmethod
    def from_assignments(cls, assignments: Iterable[str]) -> RuleParams:
        """Defaults overridden by ``key=value`` strings (``--set``).

        Raises:
            ValueError: An unknown key, a malformed assignment or a value out of range, named.
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, object] = {}
        for item in assignments:
            key, sep, raw = item.partition("=")
            if not sep:
                raise ValueError(f"{item!r} is not key=value; e.g. --set dvfs_clock_ratio=0.8")
            if key not in fields:
                raise ValueError(f"unknown parameter {key!r}; known: {', '.join(fields)}")
            if fields[key].type == "float":
                try:
                    values[key] = float(raw)
                except ValueError:
                    raise ValueError(f"{key}: {raw!r} is not a number") from None
            else:
                values[key] = raw
        return cls(**values)  # type: ignore[arg-type]


def param_help() -> list[tuple[str, object, str]]:
    """``(name, default, help)`` of every parameter, in declaration order."""
    return [(f.name, f.default, f.metadata["help"]) for f in dataclasses.fields(RuleParams)]
