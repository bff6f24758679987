"""Aggregator killed (-9) while agents deliver, restarted on its store: nothing lost, nothing doubled."""
from __future__ import annotations

import time
from pathlib import Path

from chopper.demo.run import metric_sum
from tests.faults.harness import (
    STEP_TIME_TOLERANCE,
    delivered_all,
    delivery_total,
    expected_rows,
    finish_trainer,
    peak_rss_mib,
    start_ranks,
    step_time_ratio,
    store_accounting,
    stored_rows,
    time_until,
)
from tests.faults.records import FaultRecord
from tests.support.daemons import AgentProcess, AggregatorProcess

AGGREGATOR_RSS_CEILING_MIB = 400.0
DOWN_S = 1.5


def test_aggregator_kill_and_restart(tmp_path: Path, fault_record: FaultRecord) -> None:
    rec = fault_record
    rec.fault = f"aggregator killed with SIGKILL while agents deliver, restarted {DOWN_S:g} s later on its store"
    rec.promise = ("training unaffected; every step summary stored exactly once (write-ahead log, agents resend "
                   "what was not acknowledged)")
    store = tmp_path / "store"
    agg = AggregatorProcess(tmp_path, "agg", "--store-dir", str(store), "--flush-interval-s", "1").start()
    agent = AgentProcess(tmp_path, "--aggregators", agg.address, "--delivery-interval-s", "0.05").start()
    try:
        trainers = start_ranks(agent.target, 7.0, 2)
        time_until(lambda: delivery_total(agent, "acked_total") > 0, timeout_s=30)
        time.sleep(1.5)
        killed_at = time.monotonic()
        agg.kill()
        time.sleep(DOWN_S)
        restarted_at = time.monotonic()
        agg.start()
        acked = delivery_total(agent, "acked_total")
        time_until(lambda: delivery_total(agent, "acked_total") > acked, timeout_s=20)
        recovered_at = time.monotonic()
        results = [finish_trainer(t) for t in trainers]
        time_until(lambda: delivered_all(agent, len(expected_rows(results))), timeout_s=30)
        counted = delivery_total(agent, "lost_total") + agg.value("chopper_aggregator_summaries_lost_total")
        rec.peak_rss_mib = round(peak_rss_mib(agg.proc.pid), 1)  # type: ignore[union-attr]
        made = metric_sum(agent.metrics(), "chopper_agent_step_summaries_total")
    finally:
        agent.terminate()
        agg.stop()
    frame = stored_rows(store)
    expected = expected_rows(results)
    rec.lost, rec.duplicated = store_accounting(frame, expected)
    rec.counted_losses = int(counted)
    rec.recovery_s = round(recovered_at - restarted_at, 2)
    rec.rss_ceiling_mib = AGGREGATOR_RSS_CEILING_MIB
    ratio, inside, outside = step_time_ratio(results[0].times, [(killed_at, recovered_at)])
    rec.step_time_ratio = round(ratio, 4)
    rec.outcome = (f"{len(expected)} rank-steps marked, {made:.0f} summaries made, {len(frame)} rows stored "
                   f"after the restart and a graceful stop; {inside} steps during the outage")
    assert agg.proc is not None and agg.proc.returncode == 0
    assert made == len(expected)
    assert rec.lost == 0 and rec.duplicated == 0 and len(frame) == len(expected)
    assert rec.counted_losses == 0
    assert abs(ratio - 1) <= STEP_TIME_TOLERANCE, f"step time ratio {ratio:.4f} ({inside} in, {outside} out)"
    assert rec.peak_rss_mib < AGGREGATOR_RSS_CEILING_MIB
