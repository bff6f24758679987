"""A step of a rank is stored once, whoever delivers it: copies from other incarnations, forgotten incarnations
or other agent names are dropped when identical and set aside when they differ, across restarts too."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from aggregator.jobs import JobTable
from aggregator.stepindex import Seen, StepIndex, digest
from aggregator.store import ASIDE_DIR
from chopper.demo.run import metric_sum
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from tests.support.aggregator_life import life, stored
from tests.support.daemons import AggregatorProcess
from tests.support.fake_clock import START_NS, FakeClock
from tests.support.grpc_delivery import deliver
from tests.support.hazards import HazardOutcome
from tests.support.summaries import NS, summary

T0 = 1_700_000_000 * NS


def _steps(job: str, ranks: int, steps: range, step_time_s: float = 1.0) -> list[pb.StepSummary]:
    out = []
    for s in steps:
        for r in range(ranks):
            one = summary(job, r, s)
            one.step_time_s = step_time_s
            out.append(one)
    return out


def test_the_index_is_bounded_and_says_what_it_cannot_tell() -> None:
    index = StepIndex(max_keys=8, max_steps=100)
    for step in range(4):
        index.add("j", step, np.arange(4), np.arange(4) + 10 * step)
    assert index.keys == 8 and len(index) == 2  # steps 0 and 1 went, oldest first
    assert index.lookup("j", 3, 2) == 32
    assert index.lookup("j", 3, 9) is Seen.NEW_RANK
    assert index.lookup("j", 1, 0) is Seen.BEYOND  # may have been stored: nothing can tell
    assert index.lookup("j", 7, 0) is Seen.NEW_STEP and index.lookup("other", 0, 0) is Seen.NEW_STEP
    index.add("j", 3, np.array([9]), np.array([99]))  # a late rank joins its step: 9 keys, so step 2 goes
    assert index.lookup("j", 3, 9) == 99 and index.keys == 5 and len(index) == 1
    assert index.lookup("j", 2, 0) is Seen.BEYOND
    with pytest.raises(ValueError):
        StepIndex(max_keys=0)


def test_copies_are_dropped_or_set_aside_and_late_ranks_stored_once() -> None:
    table = JobTable(5.0, join_s=0.0, job_expiry_s=10.0)
    first = table.add(_steps("j", 2, range(3)), T0)
    assert len(first.rows) == 6 and first.aside is None
    again = table.add(_steps("j", 2, range(3)), T0 + NS)  # identical copies, e.g. from a new incarnation
    assert len(again.rows) == 0 and again.aside is None and table.rejected["duplicate_rank_step"] == 6
    other = table.add(_steps("j", 2, range(1), step_time_s=0.9), T0 + NS)
    assert len(other.rows) == 0 and other.aside is not None and len(other.aside) == 2
    assert all("conflict" in f for f in other.aside["flags"]) and table.rejected["conflict"] == 2
    # A rank missing from a finalized step is late, stored flagged, once: its copy in the same call too.
    late = table.add([summary("j", 5, 1), summary("j", 5, 1)], T0 + 2 * NS)
    assert list(late.rows["late"]) == [True] and table.rejected["duplicate_rank_step"] == 7
    # A forgotten job's steps are still known.
    table.expire(T0 + 30 * NS)
    assert "j" not in table.jobs
    assert not len(table.add(_steps("j", 2, range(3)), T0 + 31 * NS).rows)
    assert table.rejected["duplicate_rank_step"] == 13
    # Past the index's memory a copy cannot be told from a new step: set aside, flagged.
    small = JobTable(5.0, join_s=0.0, index=StepIndex(max_keys=4))
    small.add(_steps("k", 2, range(4)), T0)
    beyond = small.add(_steps("k", 2, range(1)), T0 + NS)
    assert beyond.aside is not None and all("unverifiable" in f for f in beyond.aside["flags"])
    assert small.rejected["unverifiable"] == 2 and not len(beyond.rows)


def test_digest_tells_content_apart() -> None:
    a, b = summary("j", 0, 0), summary("j", 0, 0)
    assert digest(a) == digest(b) != 0
    b.tokens += 1
    assert digest(a) != digest(b)


@pytest.mark.hazard(item=9, input="the same 36 rank-steps from 4 incarnations and agent names, one life after a "
                                  "restart, in process",
                    promise="each (job, rank, step) stored once; identical copies counted as duplicates and "
                            "acknowledged, others counted and set aside; the index survives the restart")
def test_copies_across_a_restart_in_process(tmp_path: Path, hazard: HazardOutcome) -> None:
    clock = FakeClock(START_NS)
    core = life(tmp_path, clock)
    steps = _steps("d", 4, range(9))

    def send(agent: str, incarnation: str, summaries: list[pb.StepSummary]) -> int:
        clock.now += 2 * NS
        return core.deliver(apb.SummaryBatch(agent=agent, incarnation=incarnation,
                                             seq=range(1, len(summaries) + 1), summaries=summaries))

    acks = [send("node0", "i0", steps), send("node0", "i1", steps), send("node1", "i0", steps)]
    core.tick()
    core.close()  # the store is written; the log keeps only the ledger
    core = life(tmp_path, clock)
    assert core.jobs.index.keys == 36  # rebuilt from the store
    acks += [send("node0", "i2", steps), send("node2", "i9", _steps("d", 4, range(9), step_time_s=0.9))]
    core.close()
    frame = stored(tmp_path)
    aside = pd.read_parquet(tmp_path / ASIDE_DIR)
    assert acks == [36] * 5  # every copy acknowledged: the agents let go of them
    assert len(frame) == 36 and not frame.duplicated(["job", "rank", "step"]).any()
    assert len(aside) == 36 and all("conflict" in f for f in aside["flags"])
    assert core.jobs.rejected["duplicate_rank_step"] == 36  # the last life's: i2's copies
    hazard.outcome = (f"5 x 36 delivered and acknowledged; {len(frame)} rows stored, {len(aside)} conflicting "
                      "copies in _conflicts, duplicates counted (72 before the restart, 36 after)")


@pytest.mark.slow
@pytest.mark.hazard(item=9, input="36 rank-steps re-delivered over gRPC to a real aggregator by a new incarnation, a "
                                  "second agent name, a new incarnation after a restart, and with other content",
                    promise="a step of a rank is stored once whoever delivers it; chopper attribute counts 36 "
                            "rank-steps; identical copies counted, conflicting ones counted and kept aside")
def test_redelivery_to_a_real_aggregator_is_stored_once(tmp_path: Path, hazard: HazardOutcome) -> None:
    store = tmp_path / "store"
    agg = AggregatorProcess(tmp_path, "agg", "--store-dir", str(store), "--step-timeout-s", "1",
                            "--flush-interval-s", "0.5").start()
    steps = [_steps("d", 4, range(s, s + 1)) for s in range(9)]
    other = [_steps("d", 4, range(s, s + 1), step_time_s=0.9) for s in range(9)]
    acked = 0
    try:
        acked += deliver(agg.address, "node0", "inc-a", steps)[-1]
        deadline = time.monotonic() + 30
        while agg.value("chopper_job_steps_finalized_total", training_job="d") < 9:
            assert time.monotonic() < deadline, agg.log()[-2000:]
            time.sleep(0.2)
        acked += deliver(agg.address, "node0", "inc-b", steps)[-1]  # the agent restarted
        acked += deliver(agg.address, "node1", "inc-c", steps)[-1]  # a second agent name
        before = agg.value("chopper_aggregator_summaries_rejected_total", reason="duplicate_rank_step")
        agg.stop()
        agg.start()
        acked += deliver(agg.address, "node0", "inc-d", steps)[-1]
        acked += deliver(agg.address, "node2", "inc-e", other)[-1]
        metrics = agg.metrics()
        after = metric_sum(metrics, "chopper_aggregator_summaries_rejected_total", reason="duplicate_rank_step")
        conflicts = metric_sum(metrics, "chopper_aggregator_summaries_rejected_total", reason="conflict")
        index_keys = metric_sum(metrics, "chopper_aggregator_step_index_keys")
    finally:
        agg.stop()
    assert agg.proc is not None and agg.proc.returncode == 0
    frame = pd.read_parquet(store)
    aside = pd.read_parquet(store / ASIDE_DIR)
    cli = Path(sys.executable).with_name("chopper")  # the console script the package installs
    done = subprocess.run([str(cli), "attribute", str(store), "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    attributed = len(json.loads(done.stdout)["steps"])
    assert acked == 5 * 36
    assert len(frame) == 36 and not frame.duplicated(["job", "rank", "step"]).any()
    assert attributed == 36
    assert (before, after, conflicts, index_keys) == (72, 36, 36, 36)
    assert len(aside) == 36 and all("conflict" in f for f in aside["flags"])
    hazard.outcome = (f"{acked} summaries delivered and acknowledged (36 x 5); {len(frame)} rows stored, "
                      f"chopper attribute counted {attributed} rank-steps; duplicates counted {before:.0f} before the "
                      f"restart and {after:.0f} after (index rebuilt: {index_keys:.0f} keys), {conflicts:.0f} "
                      f"conflicting copies counted and kept in _conflicts ({len(aside)} rows)")


def test_store_files_the_index_cannot_read_do_not_stop_the_start(tmp_path: Path) -> None:
    clock = FakeClock(START_NS)
    core = life(tmp_path, clock)
    core.deliver(apb.SummaryBatch(agent="node0", incarnation="i0", seq=[1, 2], summaries=_steps("d", 2, range(1))))
    core.close()
    part = tmp_path / "job=d" / "date=2026-01-01"
    part.mkdir(parents=True)
    (part / "part-0.parquet").write_bytes(b"not parquet")
    pd.DataFrame({"step": ["seven"], "rank": ["x"]}).to_parquet(part / "part-1.parquet")
    (part / "part-2.parquet").mkdir()
    core = life(tmp_path, clock)  # recover() reads the store back into the step index
    assert core.index_unreadable_files_total >= 2 and core.jobs.index.keys == 2
    assert core.deliver(apb.SummaryBatch(agent="node9", incarnation="i9", seq=[1, 2],
                                         summaries=_steps("d", 2, range(1)))) == 2
    assert core.jobs.rejected["duplicate_rank_step"] == 2
    core.close()
