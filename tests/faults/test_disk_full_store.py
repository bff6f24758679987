"""Disk full under the aggregator's store and write-ahead log, then freed: it recovers by itself, losing nothing.

"Full" is ``RLIMIT_FSIZE`` lowered to 1 byte on the running aggregator (``prlimit``, no root
needed): every write that would grow a file fails with ``EFBIG`` (CPython ignores ``SIGXFSZ``),
as writes fail with ``ENOSPC`` on a full disk. "Freed" raises the limit back.
"""
from __future__ import annotations

import resource
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
FULL_S = 3.0


def _set_file_size_limit(pid: int, soft: int) -> None:
    _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (hard if soft == resource.RLIM_INFINITY else soft, hard))


def test_disk_full_under_the_store(tmp_path: Path, fault_record: FaultRecord) -> None:
    rec = fault_record
    rec.fault = (f"disk full for {FULL_S:g} s under the aggregator's Parquet store and write-ahead log "
                 "(RLIMIT_FSIZE: every write that grows a file fails), then freed")
    rec.promise = ("training unaffected; nothing acknowledged is lost (acks stop, agents keep and resend); "
                   "failures counted; the aggregator resumes by itself")
    store = tmp_path / "store"
    agg = AggregatorProcess(tmp_path, "agg", "--store-dir", str(store), "--flush-interval-s", "0.5").start()
    agent = AgentProcess(tmp_path, "--aggregators", agg.address, "--delivery-interval-s", "0.05").start()
    assert agg.proc is not None
    try:
        trainers = start_ranks(agent.target, 8.0, 2)
        time_until(lambda: delivery_total(agent, "acked_total") > 0, timeout_s=30)
        time.sleep(1.0)
        full_at = time.monotonic()
        _set_file_size_limit(agg.proc.pid, 1)
        time_until(lambda: agg.value("chopper_aggregator_wal_up") == 0, timeout_s=20)  # nice 10 under a busy machine
        time.sleep(FULL_S)
        failing = agg.metrics()
        held = delivery_total(agent, "pending_items")
        _set_file_size_limit(agg.proc.pid, resource.RLIM_INFINITY)
        freed_at = time.monotonic()
        acked = delivery_total(agent, "acked_total")
        time_until(lambda: agg.value("chopper_aggregator_wal_up") == 1
                   and delivery_total(agent, "acked_total") > acked, timeout_s=20)
        recovered_at = time.monotonic()
        results = [finish_trainer(t) for t in trainers]
        time_until(lambda: delivered_all(agent, len(expected_rows(results))), timeout_s=30)
        counted = delivery_total(agent, "lost_total") + agg.value("chopper_aggregator_store_rows_dropped_total")
        rec.peak_rss_mib = round(peak_rss_mib(agg.proc.pid), 1)
    finally:
        agent.terminate()
        agg.stop()
    frame = stored_rows(store)
    rec.lost, rec.duplicated = store_accounting(frame, expected_rows(results))
    rec.counted_losses = int(counted)
    rec.recovery_s = round(recovered_at - freed_at, 2)
    rec.rss_ceiling_mib = AGGREGATOR_RSS_CEILING_MIB
    ratio, inside, outside = step_time_ratio(results[0].times, [(full_at, recovered_at)])
    rec.step_time_ratio = round(ratio, 4)
    errors = metric_sum(failing, "chopper_aggregator_wal_write_errors_total")
    flush_errors = metric_sum(failing, "chopper_aggregator_store_flush_errors_total")
    leftovers = [p.name for p in store.rglob(".*.tmp")]
    rec.outcome = (f"while full: {errors:.0f} WAL commit failures and {flush_errors:.0f} store write failures "
                   f"counted, wal_up 0, agent held {held:.0f} unacknowledged summaries; after: {len(frame)} rows "
                   f"stored, {len(leftovers)} temp files left")
    assert agg.proc.returncode == 0
    assert errors > 0 and held > 0
    assert rec.lost == 0 and rec.duplicated == 0 and rec.counted_losses == 0
    assert not leftovers
    assert abs(ratio - 1) <= STEP_TIME_TOLERANCE, f"step time ratio {ratio:.4f} ({inside} in, {outside} out)"
    assert rec.peak_rss_mib < AGGREGATOR_RSS_CEILING_MIB
