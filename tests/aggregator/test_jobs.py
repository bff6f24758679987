"""JobTable: ranks joined by (job, step), completion, timeouts, late and vanished ranks, stragglers, windows."""
from __future__ import annotations

import math

import numpy as np
import pytest

from aggregator.jobs import CAUSES, ROW_COLUMNS, JobTable
from tests.support.summaries import NS, summary

T0 = 1_700_000_000 * NS


def joined_table(**kw: float) -> JobTable:
    """A table whose join period is over for jobs first seen at T0 (join_s=0)."""
    kw.setdefault("step_timeout_s", 30.0)
    kw.setdefault("join_s", 0.0)
    return JobTable(**kw)  # type: ignore[arg-type]


def test_ranks_join_by_step_and_complete_when_all_reported() -> None:
    table = joined_table()
    # Step 0 from all four ranks discovers the rank set; with join_s=0 it completes at once.
    done = table.add([summary("j", r, 0) for r in range(4)], T0)
    assert [(s.step, s.complete, s.ranks_reported) for s in done.steps] == [(0, True, 4)]
    # Ranks deliver step 1 and 2 interleaved, from different batches: joined by step number.
    assert table.add([summary("j", 0, 1), summary("j", 1, 2), summary("j", 2, 1)], T0 + NS).steps == []
    done = table.add([summary("j", 3, 1), summary("j", 1, 1)], T0 + 2 * NS)
    assert [(s.step, s.complete, s.ranks_reported, s.ranks_expected) for s in done.steps] == [(1, True, 4, 4)]
    assert sorted(done.rows["rank"]) == [0, 1, 2, 3] and list(done.rows.columns) == list(ROW_COLUMNS)
    assert table.jobs["j"].open.keys() == {2}


def test_join_period_holds_steps_until_the_rank_set_is_known() -> None:
    table = JobTable(step_timeout_s=30.0, join_s=5.0)
    # Node 0's ranks arrive first; without a join period step 0 would complete with 2 of 4 ranks.
    assert table.add([summary("j", 0, 0), summary("j", 1, 0)], T0).steps == []
    assert table.add([summary("j", 2, 0), summary("j", 3, 0)], T0 + NS).steps == []
    done = table.expire(T0 + 5 * NS)
    assert [(s.step, s.complete, s.ranks_reported) for s in done.steps] == [(0, True, 4)]
    assert table.jobs["j"].rank_set_changes_total == 0


def test_timeout_finalizes_incomplete_and_counts_the_missing_rank() -> None:
    table = joined_table(step_timeout_s=10.0)
    table.add([summary("j", r, 0) for r in range(3)], T0)
    table.add([summary("j", 0, 1), summary("j", 1, 1)], T0 + NS)  # rank 2 silent
    assert table.expire(T0 + 10 * NS).steps == []  # 9 s after step 1's first summary
    done = table.expire(T0 + 11 * NS)
    assert [(s.step, s.complete, s.ranks_reported, s.ranks_expected) for s in done.steps] == [(1, False, 2, 3)]
    assert not done.rows["complete"].any()
    job = table.jobs["j"]
    assert (job.incomplete_total, job.missing_rank_steps_total, job.ranks[2].missing_steps) == (1, 1, 1)


def test_receive_time_not_node_time_drives_the_timeout() -> None:
    table = joined_table(step_timeout_s=10.0)
    # A node clock 30 s behind or ahead changes neither joining nor timing out.
    table.add([summary("j", 0, 0, skew_s=-30.0), summary("j", 1, 0, skew_s=30.0)], T0)
    table.add([summary("j", 0, 1, skew_s=-30.0)], T0 + NS)
    assert table.expire(T0 + 9 * NS).steps == []
    done = table.add([summary("j", 1, 1, skew_s=30.0)], T0 + 9 * NS)
    assert [(s.step, s.complete) for s in done.steps] == [(1, True)]
    # Same attribution as unskewed ranks: nothing compares timestamps across nodes.
    ref = joined_table().add([summary("k", 0, 1), summary("k", 1, 1)], T0)
    cols = ["straggler_wait_s", "exposed_comm_s", "job_step_time_s", "straggler_score"]
    assert np.allclose(done.rows[cols].to_numpy(dtype=float), ref.rows[cols].to_numpy(dtype=float), equal_nan=True)


def test_late_rank_is_counted_and_stored_flagged_without_refinalizing() -> None:
    table = joined_table(step_timeout_s=5.0)
    table.add([summary("j", r, 0) for r in range(3)], T0)
    table.add([summary("j", 0, 1), summary("j", 1, 1)], T0 + NS)
    table.expire(T0 + 6 * NS)
    late = table.add([summary("j", 2, 1)], T0 + 7 * NS)
    assert late.steps == [] and table.jobs["j"].late_total == 1
    row = late.rows.iloc[0]
    assert bool(row["late"]) and not bool(row["slowest"]) and row["straggler_wait_s"] == 0.0
    assert row["job_step_time_s"] == pytest.approx(1.0) and not bool(row["complete"])
    assert 1 not in table.jobs["j"].open  # no new open step for a finalized one


def test_vanished_rank_times_out_then_leaves_the_expected_set() -> None:
    table = joined_table(step_timeout_s=5.0, vanish_after_steps=3)
    table.add([summary("j", r, 0) for r in range(4)], T0)
    finalized = []
    for t in range(1, 20):  # rank 3 died after step 0; the others go on, one step a second
        now = T0 + t * NS
        if t < 8:
            finalized += table.add([summary("j", r, t) for r in range(3)], now).steps
        finalized += table.expire(now).steps
    job = table.jobs["j"]
    # Three steps time out; then rank 3 is no longer expected and the rest complete.
    assert [(s.step, s.complete) for s in finalized] == [(1, False), (2, False), (3, False), (4, True),
                                                         (5, True), (6, True), (7, True)]
    assert (job.incomplete_total, job.missing_rank_steps_total, job.rank_set_changes_total) == (3, 3, 1)
    assert job.expected == {0, 1, 2} and job.ranks[3].missing_steps == 3
    done = table.add([summary("j", r, 8) for r in range(3)], T0 + 21 * NS)
    assert [(s.step, s.complete) for s in done.steps] == [(8, True)]


def test_hot_gpu_is_named_straggler_with_thermal_cause() -> None:
    table = joined_table()
    done = table.add([summary("j", r, 0, hot=(r == 5)) for r in range(8)], T0)
    (step,) = done.steps
    assert (step.slowest_rank, step.slowest_cause) == (5, "thermal")
    # Compute 0.90 s against a median of 0.80 s, over a median step of 1 s.
    assert step.straggler_score == pytest.approx(0.10)
    rows = done.rows.set_index("rank")
    assert rows.loc[5, "slowest"] and "slowest_rank" in rows.loc[5, "flags"]
    # Everyone else waited 0.10 s for it: moved from exposed to straggler wait.
    assert rows.loc[0, "straggler_wait_s"] == pytest.approx(0.10)
    assert rows.loc[0, "exposed_comm_s"] == pytest.approx(0.05)
    assert rows.loc[5, "straggler_wait_s"] == 0.0
    closure = rows[["ideal_s", "matrix_util_loss_s", "dvfs_loss_s", "exposed_comm_s", "straggler_wait_s", "idle_s"]]
    assert np.allclose(closure.sum(axis=1), rows["step_time_s"])
    job = table.jobs["j"]
    assert job.last_slowest == (5, "node0", 5, "thermal")
    assert job.ranks[5].excess_at(T0) == pytest.approx(0.10)


def test_rolling_windows_mfu_shares_energy_per_token() -> None:
    table = joined_table()
    table.add([summary("j", r, 0) for r in range(2)], T0)
    table.add([summary("j", r, 1, flops=False) for r in range(2)], T0 + 120 * NS)
    job = table.jobs["j"]
    now = T0 + 121 * NS
    # The 1-minute window holds only step 1 (no FLOPs): MFU unknown; the 5-minute one both.
    assert math.isnan(job.mfu(now, 60)) and job.mfu(now, 300) == pytest.approx(0.5)
    shares = job.shares(now, 300)
    assert set(shares) == set(CAUSES) and sum(shares.values()) == pytest.approx(1.0)
    assert shares["compute_unknown"] > 0 and job.shares(now, 60)["ideal"] == 0.0
    assert job.energy_per_token(now, 300) == pytest.approx(700.0 / 4096)
    assert job.shares(T0 + 1000 * NS, 300) == {}
    # The counters PromQL divides: step 1's time stays out of the MFU denominator, not out of the causes.
    ideal = job.seconds[CAUSES.index("ideal")]
    assert (ideal, job.flops_step_seconds, job.seconds.sum()) == pytest.approx((2 * 0.5, 2 * 1.0, 4 * 1.0))
    assert ideal / job.flops_step_seconds == pytest.approx(job.mfu(now, 300))
    assert (job.energy_joules, job.tokens) == pytest.approx((4 * 700.0, 4 * 4096))
    assert job.energy_joules / job.tokens == pytest.approx(job.energy_per_token(now, 300))


def test_energy_per_token_counts_only_steps_with_both_known() -> None:
    """A step without energy (no GPU samples) adds neither its energy nor its tokens: energy per token
    is not pulled down by tokens whose energy nobody measured."""
    table = joined_table()
    blind = summary("j", 1, 0)
    blind.energy_j = math.nan
    table.add([summary("j", 0, 0), blind], T0)
    job = table.jobs["j"]
    assert (job.energy_joules, job.tokens) == (700.0, 4096.0)


def test_bad_input_counted() -> None:
    table = joined_table(max_jobs=2)
    table.add([summary("", 0, 0), summary("a", -1, 0), summary("a", 0, -3)], T0)
    assert table.rejected["invalid"] == 3 and not table.jobs
    table.add([summary("a", 0, 0), summary("b", 0, 0), summary("c", 0, 0)], T0)
    assert set(table.jobs) == {"a", "b"} and table.rejected["job_limit"] == 1
    # Step 1 completes after the batch (1-rank job); a resend of it is a duplicate, not a late row.
    table.add([summary("a", 0, 1)], T0)
    resent = table.add([summary("a", 0, 1)], T0 + NS)
    assert table.jobs["a"].late_total == 0 and table.rejected["duplicate_rank_step"] == 1 and not len(resent.rows)
    two = joined_table()
    two.add([summary("x", 0, 0), summary("x", 1, 0)], T0)
    two.add([summary("x", 0, 1), summary("x", 0, 1)], T0)
    assert two.rejected["duplicate_rank_step"] == 1 and two.jobs["x"].duplicate_total == 1
    # A rank appearing after the join period changes the rank set, counted.
    two.add([summary("x", 7, 2)], T0 + NS)
    assert two.jobs["x"].rank_set_changes_total == 1 and len(two.jobs["x"].expected) == 3


def test_close_finalizes_open_steps_and_silent_jobs_expire() -> None:
    table = joined_table(job_expiry_s=60.0)
    table.add([summary("j", r, 0) for r in range(2)], T0)
    table.add([summary("j", 0, 1)], T0)
    done = table.close(T0 + NS)
    assert [(s.step, s.complete) for s in done.steps] == [(1, False)]
    table.expire(T0 + 61 * NS)
    assert not table.jobs and table.jobs_expired_total == 1


def test_memory_per_rank_is_bounded_for_a_large_job() -> None:
    table = joined_table()
    ranks = 10_000
    for step in range(5):
        done = table.add([summary("big", r, step, hot=(r == 4321)) for r in range(ranks)], T0 + step * NS)
        assert [(s.step, s.slowest_rank, s.ranks_reported) for s in done.steps] == [(step, 4321, ranks)]
    job = table.jobs["big"]
    # Nothing of finalized steps is held but one record per step number and per-second buckets.
    assert not job.open and len(job.finalized) == 5 and len(job.buckets) == 5 and len(job.ranks) == ranks


def test_finalize_every_gathers_steps_of_many_small_batches() -> None:
    table = joined_table(finalize_every_s=1.0)
    assert [s.job for s in table.add([summary("a", 0, 0)], T0).steps] == ["a"]  # the first call finalizes
    assert table.add([summary("b", 0, 0)], T0 + NS // 2).steps == []
    assert table.add([summary("c", 0, 0)], T0 + NS // 2).steps == []
    assert table.jobs["b"].open  # still open: a summary for it joins, it is not late
    done = table.add([summary("d", 0, 0)], T0 + NS)
    assert sorted(s.job for s in done.steps) == ["b", "c", "d"] and len(done.rows) == 3
    assert table.add([summary("e", 0, 0)], T0 + NS + 1).steps == []
    assert [s.job for s in table.expire(T0 + NS + 2).steps] == ["e"]


def test_a_vanished_rank_retires_after_rank_expiry_and_a_rejoining_one_starts_afresh() -> None:
    table = joined_table(step_timeout_s=2.0, vanish_after_steps=2, rank_expiry_s=10.0)
    table.add([summary("j", r, 0) for r in range(3)], T0)
    for t in range(1, 16):  # rank 2 died after step 0
        table.add([summary("j", r, t) for r in range(2)], T0 + t * NS)
        table.expire(T0 + t * NS)
        if t == 9:  # out of the rank set, silent 9 s: still held
            assert 2 in table.jobs["j"].ranks and 2 not in table.jobs["j"].expected
    assert sorted(table.jobs["j"].ranks) == [0, 1] and table.ranks_retired == {"idle": 1, "job_expired": 0}
    table.add([summary("j", 2, 16)], T0 + 16 * NS)
    assert table.jobs["j"].ranks[2].missing_steps == 0


def test_expired_jobs_count_their_ranks_and_new_ranks_beyond_the_limit_are_rejected() -> None:
    table = joined_table(job_expiry_s=60.0, max_ranks_per_job=3)
    table.add([summary("j", r, 0) for r in range(4)], T0)
    assert sorted(table.jobs["j"].ranks) == [0, 1, 2] and table.rejected["rank_limit"] == 1
    table.expire(T0 + 61 * NS)
    assert not table.jobs and table.ranks_retired == {"idle": 0, "job_expired": 3}
