"""One measured outcome per fault scenario, collected by the suite and rendered as ``docs/RELIABILITY.md``.

A scenario fills a ``FaultRecord`` as it measures (``tests/faults/conftest.py`` hands it one);
``passed`` is set from the test's own outcome, so a row can only say "yes" when every assertion
of its scenario held. When ``CHOPPER_RELIABILITY_JSON`` names a file, the session appends its
records there as JSON lines (``python -m tests.faults`` sets it, then renders the file).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ENV = "CHOPPER_RELIABILITY_JSON"


@dataclass
class FaultRecord:
    """What one fault did, in the units of ``docs/RELIABILITY.md``.

    Attributes:
        fault: What was broken, and how.
        promise: What the design promises under it.
        lost: Items lost without being counted anywhere (must be 0).
        duplicated: Items stored or counted twice (must be 0).
        counted_losses: Items lost and counted as lost (client drops, missed items, rejections).
        recovery_s: Seconds from the end of the fault to the daemon serving normally again.
        peak_rss_mib: Highest resident set size of the faulted daemon (VmHWM), MiB.
        rss_ceiling_mib: The ceiling the scenario asserts, MiB.
        step_time_ratio: Median step time during the fault / median step time outside it.
        outcome: What else was measured, in words with numbers.
        passed: Every assertion of the scenario held (set from the test outcome).
        test: The pytest node id that produced the row.
    """

    fault: str = ""
    promise: str = ""
    lost: int | None = None
    duplicated: int | None = None
    counted_losses: int | None = None
    recovery_s: float | None = None
    peak_rss_mib: float | None = None
    rss_ceiling_mib: float | None = None
    step_time_ratio: float | None = None
    outcome: str = ""
    passed: bool = False
    test: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def append(path: str | Path, row: dict[str, Any]) -> None:
    """Append one row (a FaultRecord or a bad-input row) as a JSON line."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, default=_json_default) + "\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


def save(record: FaultRecord) -> None:
    """Append ``record`` to the file named by ``CHOPPER_RELIABILITY_JSON``, if set."""
    path = os.environ.get(ENV)
    if path:
        append(path, {"type": "fault", **asdict(record)})


def load(path: str | Path) -> list[dict[str, Any]]:
    """Every row appended to ``path``."""
    text = Path(path).read_text(encoding="utf-8") if Path(path).exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]
