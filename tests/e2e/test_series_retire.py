"""Finished jobs retire: a real agent's /metrics, scraped over HTTP, holds the series of live jobs only.

Real ``chopper.Client`` objects push markers over the agent's real unix socket, as training
processes do; the agent runs with a short ``rank_idle_s`` so the test does not wait minutes.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from agent.daemon import POSITIONS_MAX_AGE_NS
from chopper.client import Client
from chopper.demo.run import metric_sum
from tests.support.daemons import AgentProcess
from tests.support.polling import wait_until

STEPS = 3
PHASE_S = 0.01
RANK_SERIES = re.compile(r'^chopper_rank_\w+\{[^}]*training_job="([^"]+)"', re.MULTILINE)


def run_job(target: str, job: str, ranks: int = 2) -> None:
    """One short job: ``ranks`` clients, ``STEPS`` steps of a forward and a backward phase each."""
    clients = [Client(job, rank, rank, target, control=False) for rank in range(ranks)]
    for i in range(STEPS):
        for c in clients:
            with c.step(i, flops=1e9, tokens=128):
                with c.phase("forward"):
                    time.sleep(PHASE_S)
                with c.phase("backward"):
                    time.sleep(PHASE_S)
    for c in clients:
        c.shutdown(timeout=10)
        assert c.stats()["dropped"] == 0, c.stats()


def series(text: str) -> list[str]:
    """Every series of a scrape by name and labels, a job's name replaced by ``J``."""
    lines = [line.rpartition(" ")[0] for line in text.splitlines() if line and not line.startswith("#")]
    return sorted(re.sub(r'training_job="[^"]*"', 'training_job="J"', line) for line in lines)


def jobs_with_series(text: str) -> set[str]:
    return set(RANK_SERIES.findall(text))


def summarised(agent: AgentProcess, total: int) -> None:
    assert wait_until(lambda: metric_sum(agent.metrics(), "chopper_agent_step_summaries_total") >= total,
                      timeout_s=30), agent.log()[-2000:]
    # Where the ranks are is read at most every POSITIONS_MAX_AGE_NS and shared by every scrape:
    # let the polls above age out, so the next scrape shows the ranks as they are now.
    time.sleep(POSITIONS_MAX_AGE_NS / 1e9 + 0.05)


@pytest.mark.slow
def test_series_of_twenty_finished_jobs_retire(tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path, "--rank-idle-s", "2").start()
    try:
        # The host's CPU ratio is known from its second reading on: wait, so the series set is settled.
        assert wait_until(lambda: "chopper_host_cpu_busy_ratio{" in agent.metrics(), timeout_s=30)
        run_job(agent.target, "job-00")
        summarised(agent, 2 * STEPS)
        one_job = agent.metrics()
        assert jobs_with_series(one_job) == {"job-00"}
        for n in range(1, 20):
            run_job(agent.target, f"job-{n:02d}")
        summarised(agent, 20 * 2 * STEPS)
        burst = agent.metrics()
        # Until their jobs have been silent for rank_idle_s, finished jobs keep their series.
        assert len(jobs_with_series(burst)) > 1 and len(series(burst)) > len(series(one_job))
        assert wait_until(lambda: metric_sum(agent.metrics(), "chopper_agent_ranks") == 0, timeout_s=30)
        run_job(agent.target, "job-20")
        summarised(agent, 21 * 2 * STEPS)
        last = agent.metrics()
        assert jobs_with_series(last) == {"job-20"}
        assert series(last) == series(one_job), "\n".join(sorted(set(series(last)) ^ set(series(one_job))))
        assert metric_sum(last, "chopper_agent_ranks_retired_total", reason="idle") == 20 * 2
        assert metric_sum(last, "chopper_agent_ranks_retired_total", reason="limit") == 0
        assert metric_sum(last, "chopper_agent_ranks") == 2
    finally:
        agent.terminate()


@pytest.mark.slow
def test_ranks_beyond_the_limit_evict_the_one_silent_longest(tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path, "--max-ranks", "4").start()
    try:
        for n in range(6):
            run_job(agent.target, f"job-{n}", ranks=1)
        summarised(agent, 6 * STEPS)
        text = agent.metrics()
        assert jobs_with_series(text) == {"job-2", "job-3", "job-4", "job-5"}
        assert metric_sum(text, "chopper_agent_ranks_retired_total", reason="limit") == 2
        assert metric_sum(text, "chopper_agent_ranks") == 4
    finally:
        agent.terminate()
