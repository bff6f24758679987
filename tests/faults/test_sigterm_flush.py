"""SIGTERM to the aggregator while agents deliver and it flushes (WAL group commits every 20 ms, Parquet every 0.2 s).

Twice: SIGTERM, wait for the exit, start it again on the same store. A graceful stop must
finish what it flushes (no temporary file left, exit 0), and across the stops every step
summary must be stored exactly once.
"""
from __future__ import annotations

import time
from pathlib import Path

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
STOPS = 2


def test_sigterm_during_flush(tmp_path: Path, fault_record: FaultRecord) -> None:
    rec = fault_record
    rec.fault = (f"SIGTERM to the aggregator {STOPS} times while agents deliver and it flushes (WAL commits every "
                 "20 ms, Parquet every 0.2 s), restarted each time on the same store")
    rec.promise = "a clean exit (0, no temporary file); every step summary stored exactly once across the stops"
    store = tmp_path / "store"
    agg = AggregatorProcess(tmp_path, "agg", "--store-dir", str(store), "--flush-interval-s", "0.2", nice=10).start()
    agent = AgentProcess(tmp_path, "--aggregators", agg.address, "--delivery-interval-s", "0.05", nice=10).start()
    assert agg.proc is not None
    exits, stop_s, restart_s, windows = [], [], [], []
    try:
        trainers = start_ranks(agent.target, 10.0, 2)
        time_until(lambda: delivery_total(agent, "acked_total") > 0, timeout_s=30)
        for _ in range(STOPS):
            time.sleep(1.0)
            began = time.monotonic()
            agg.stop()
            stop_s.append(time.monotonic() - began)
            exits.append(agg.proc.returncode)
            leftovers = [p.name for p in store.rglob(".*.tmp")]
            restarted = time.monotonic()
            agg.start()
            acked = delivery_total(agent, "acked_total")
            time_until(lambda: delivery_total(agent, "acked_total") > acked or delivered_all(agent),  # noqa: B023
                       timeout_s=20)
            restart_s.append(time.monotonic() - restarted)
            windows.append((began, time.monotonic()))
            assert not leftovers, f"temporary files after a graceful stop: {leftovers}"
        results = [finish_trainer(t) for t in trainers]
        time_until(lambda: delivered_all(agent, len(expected_rows(results))), timeout_s=30)
        counted = delivery_total(agent, "lost_total") + agg.value("chopper_aggregator_summaries_lost_total")
        rec.peak_rss_mib = round(peak_rss_mib(agg.proc.pid), 1)
    finally:
        agent.terminate()
        agg.stop()
    exits.append(agg.proc.returncode)
    frame = stored_rows(store)
    rec.lost, rec.duplicated = store_accounting(frame, expected_rows(results))
    rec.counted_losses = int(counted)
    rec.recovery_s = round(max(restart_s), 2)
    rec.rss_ceiling_mib = AGGREGATOR_RSS_CEILING_MIB
    ratio, inside, outside = step_time_ratio(results[0].times, windows)
    rec.step_time_ratio = round(ratio, 4)
    rec.outcome = (f"exit codes {exits}; graceful stops took {', '.join(f'{s:.1f}' for s in stop_s)} s; acks resumed "
                   f"{', '.join(f'{s:.1f}' for s in restart_s)} s after each restart; {len(frame)} rows stored")
    assert exits == [0] * (STOPS + 1)
    assert rec.lost == 0 and rec.duplicated == 0 and rec.counted_losses == 0
    assert abs(ratio - 1) <= STEP_TIME_TOLERANCE, f"step time ratio {ratio:.4f} ({inside} in, {outside} out)"
    assert rec.peak_rss_mib < AGGREGATOR_RSS_CEILING_MIB
