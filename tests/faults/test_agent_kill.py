"""Agent killed (-9) during training and restarted: training unaffected, every lost marker counted."""
from __future__ import annotations

import time
from pathlib import Path

from chopper.demo.run import metric_sum
from tests.faults.harness import (
    STEP_TIME_TOLERANCE,
    finish_trainer,
    peak_rss_mib,
    start_trainer,
    step_time_ratio,
    time_until,
)
from tests.faults.records import FaultRecord
from tests.support.daemons import AgentProcess

AGENT_RSS_CEILING_MIB = 300.0
DOWN_S = 2.0


def _steps(agent: AgentProcess) -> float:
    try:
        return metric_sum(agent.metrics(), "chopper_rank_steps_total", training_job="faults")
    except OSError:
        return 0.0


def test_agent_kill_and_restart(tmp_path: Path, fault_record: FaultRecord) -> None:
    rec = fault_record
    rec.fault = f"agent killed with SIGKILL during training, restarted {DOWN_S:g} s later on the same socket"
    rec.promise = ("training unaffected; the client counts every marker it could not deliver; markers flow to the "
                   "new agent by themselves")
    agent = AgentProcess(tmp_path).start()
    try:
        trainer = start_trainer(agent.target, 9.0)
        time_until(lambda: _steps(agent) > 0, timeout_s=30)
        time.sleep(2.0)
        killed_at = time.monotonic()
        agent.kill()
        time.sleep(DOWN_S)
        restarted_at = time.monotonic()
        agent.start()
        time_until(lambda: _steps(agent) > 0, timeout_s=20)
        rec.recovery_s = round(time.monotonic() - restarted_at, 2)
        flowing_at = time.monotonic()
        result = finish_trainer(trainer)
        text = agent.metrics()
        rec.peak_rss_mib = round(peak_rss_mib(agent.proc.pid), 1)  # type: ignore[union-attr]
    finally:
        agent.terminate()
    ratio, inside, outside = step_time_ratio(result.times, [(killed_at, flowing_at)])
    rec.step_time_ratio = round(ratio, 4)
    rec.rss_ceiling_mib = AGENT_RSS_CEILING_MIB
    rec.lost = result.uncounted
    rec.counted_losses = int(result.client["dropped"])
    rec.duplicated = 0
    last_step = metric_sum(text, "chopper_rank_last_step", training_job="faults")
    rec.outcome = (f"{result.steps} steps, {inside} during the outage; client sent {result.client['sent']}, dropped "
                   f"{result.client['dropped']} (in flight {result.client['dropped_in_flight']}) of {result.marked}; "
                   f"new agent saw the last step ({last_step:.0f})")
    assert rec.lost == 0, "markers lost without being counted"
    assert last_step == result.steps - 1, "the restarted agent did not get the last step"
    assert result.client["dropped"] == result.client["dropped_in_flight"], "only the batch in flight may be lost"
    assert abs(ratio - 1) <= STEP_TIME_TOLERANCE, f"step time ratio {ratio:.4f} ({inside} in, {outside} out)"
    assert rec.peak_rss_mib < AGENT_RSS_CEILING_MIB

