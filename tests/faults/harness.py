"""Shared measuring tools of the fault scenarios: the trainer process, step-time ratio, peak RSS.

Process launchers for the agent and the aggregator are the e2e tests' (``tests/e2e``); this module
only adds what the faults measure.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from chopper.demo.run import metric_sum
from tests.support.daemons import AgentProcess

# The bound: training step time within 2 % of its baseline while a fault lasts.
STEP_TIME_TOLERANCE = 0.02
# Steps this close to the trainer's start are warm-up (imports, first connection), not baseline.
WARMUP_S = 1.0


@dataclass
class TrainerResult:
    """What ``tests.support.fault_trainer`` printed: per-step (start, seconds), counts and client stats."""

    times: list[tuple[float, float]]
    steps: int
    marked: int
    client: dict[str, Any]

    @property
    def uncounted(self) -> int:
        """Markers made but neither sent nor counted as dropped (the client promises 0)."""
        return self.marked - int(self.client["sent"]) - int(self.client["dropped"])


def start_trainer(target: str, duration_s: float, *extra: str) -> subprocess.Popen[str]:
    """The trainer stand-in (``tests/support/fault_trainer.py``) against ``target`` for ``duration_s``."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.fault_trainer", "--agent", target, "--duration", str(duration_s), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def finish_trainer(proc: subprocess.Popen[str], timeout_s: float = 60.0) -> TrainerResult:
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, f"trainer failed ({proc.returncode}):\n{err[-3000:]}"
    data = json.loads(out.strip().splitlines()[-1])
    return TrainerResult([tuple(t) for t in data["times"]], data["steps"], data["marked"], data["client"])


def step_time_ratio(times: list[tuple[float, float]], windows: list[tuple[float, float]]) -> tuple[float, int, int]:
    """Median step time of steps inside the fault ``windows`` over the median of the others.

    A step belongs to a window when it starts and ends inside it (monotonic seconds). Steps in
    the first ``WARMUP_S`` are left out of both sides.

    Returns:
        ``(ratio, steps inside, steps outside)``.
    """
    first = times[0][0] + WARMUP_S if times else 0.0
    inside, outside = [], []
    for start, seconds in times:
        if start < first:
            continue
        if any(a <= start and start + seconds <= b for a, b in windows):
            inside.append(seconds)
        elif not any(a < start + seconds and start < b for a, b in windows):
            outside.append(seconds)
    if not inside or not outside:
        return float("nan"), len(inside), len(outside)
    return statistics.median(inside) / statistics.median(outside), len(inside), len(outside)


def _status_mib(pid: int, key: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {key} for pid {pid}")


def peak_rss_mib(pid: int) -> float:
    """Peak resident set size of a live process (``VmHWM``), MiB."""
    return _status_mib(pid, "VmHWM")


def rss_mib(pid: int) -> float:
    """Current resident set size of a live process (``VmRSS``), MiB."""
    return _status_mib(pid, "VmRSS")


def time_until(predicate, timeout_s: float, interval_s: float = 0.05) -> float:  # type: ignore[no-untyped-def]
    """Seconds until ``predicate()`` is true; raises AssertionError after ``timeout_s``."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"not within {timeout_s} s")
        time.sleep(interval_s)
    return time.monotonic() - started


def stored_rows(root: Path) -> pd.DataFrame:
    """The aggregator's Parquet store as users read it (hive partitions, job as text)."""
    frame = pd.read_parquet(root)
    frame["job"] = frame["job"].astype(str)
    return frame


def store_accounting(frame: pd.DataFrame, expected: set[tuple[str, int, int]]) -> tuple[int, int]:
    """``(lost, duplicated)``: expected (job, rank, step) rows missing from the store, and rows stored twice."""
    keys = list(zip(frame["job"], frame["rank"].astype(int), frame["step"].astype(int), strict=True))
    return len(expected - set(keys)), len(keys) - len(set(keys))


def delivery_total(agent: AgentProcess, name: str) -> float:
    """An agent's ``chopper_agent_delivery_<name>`` summed over replicas."""
    return metric_sum(agent.metrics(), f"chopper_agent_delivery_{name}")


def delivered_all(agent: AgentProcess, at_least: int = 1) -> bool:
    """The agent made at least ``at_least`` step summaries and the aggregator acknowledged every one.

    Pass the number of steps the trainers marked once they finished: the agent summarises a step
    only when a sample covers its end, so right after training the last steps may not be made yet.
    """
    made = metric_sum(agent.metrics(), "chopper_agent_step_summaries_total")
    return (made >= at_least and delivery_total(agent, "pending_items") == 0
            and delivery_total(agent, "acked_total") == made)


def start_ranks(target: str, duration_s: float, ranks: int, *extra: str) -> list[subprocess.Popen[str]]:
    """``ranks`` trainer processes of job ``faults`` (rank r drives GPU r)."""
    return [start_trainer(target, duration_s, "--rank", str(r), "--gpu", str(r), *extra) for r in range(ranks)]


def expected_rows(results: list[TrainerResult], job: str = "faults") -> set[tuple[str, int, int]]:
    """(job, rank, step) of every step the trainers marked (rank r is the r-th result)."""
    return {(job, rank, step) for rank, r in enumerate(results) for step in range(r.steps)}
