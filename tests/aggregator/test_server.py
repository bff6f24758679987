"""Aggregator gRPC in process over a real TCP socket: Deliver with duplicates, QuerySteps, garbage, health, /metrics."""
from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from aggregator import catalog
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from tests.support.fake_clock import START_NS
from tests.support.running_servers import RunningAggregator
from tests.support.summaries import summary

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def running(tmp_path: Path) -> Iterator[RunningAggregator]:
    r = RunningAggregator(tmp_path)
    yield r
    r.stop()


def batch(agent: str, inc: str, seqs: list[int], steps: list[int], ranks: list[int], hot: int = -1) -> apb.SummaryBatch:
    b = apb.SummaryBatch(agent=agent, incarnation=inc, seq=seqs)
    b.summaries.extend(summary("j", r, s, hot=(r == hot)) for s in steps for r in ranks)
    return b


def test_deliver_acks_and_duplicates_are_not_counted_twice(running: RunningAggregator) -> None:
    a = [batch("n0", "i0", [1, 2], [0], [0, 1]), batch("n0", "i0", [1, 2, 3, 4], [0, 1], [0, 1])]
    b = [batch("n1", "i1", [1, 2, 3, 4], [0, 1], [2, 3], hot=3), batch("n1", "i1", [3, 4], [1], [2, 3], hot=3)]
    acks = [(ack.incarnation, ack.acked_seq) for ack in running.stub.Deliver(iter(a))]
    assert acks == [("i0", 2), ("i0", 4)]
    acks = [(ack.incarnation, ack.acked_seq) for ack in running.stub.Deliver(iter(b))]
    assert acks == [("i1", 4), ("i1", 4)]
    running.settle()
    job = running.core.jobs.jobs["j"]
    assert (job.steps_finalized_total, job.late_total, running.core.jobs.rejected["duplicate_rank_step"]) == (2, 0, 0)
    m = running.scrape()
    assert m[("chopper_aggregator_summaries_received_total", ())] == 8
    assert m[("chopper_aggregator_summaries_duplicate_total", ())] == 4
    j = ("training_job", "j")
    assert m[("chopper_job_steps_finalized_total", (j,))] == 2
    assert m[("chopper_job_slowest_rank", (j,))] == 3
    assert m[("chopper_job_slowest_rank_cause", (("cause", "thermal"), j))] == 1
    assert m[("chopper_job_rank_slowest", (("gpu", "3"), ("node", "node0"), ("rank", "3"), j))] == 1
    assert m[("chopper_job_straggler_score_ratio", (j,))] == pytest.approx(0.10)
    assert m[("chopper_job_mfu_ratio", (j, ("window", "1m")))] == pytest.approx(0.5)
    # Its window-free form, the counters PromQL divides: 8 rank-steps of 1 s, 0.5 s ideal each, 700 J, 4096 tokens.
    assert m[("chopper_job_step_seconds_total", (("cause", "ideal"), j))] == pytest.approx(8 * 0.5)
    assert m[("chopper_job_flops_step_seconds_total", (j,))] == pytest.approx(8 * 1.0)
    assert m[("chopper_job_energy_joules_total", (j,))] == pytest.approx(8 * 700.0)
    assert m[("chopper_job_tokens_total", (j,))] == 8 * 4096
    wait = m[("chopper_job_rank_step_seconds_total", (("cause", "straggler_wait"), ("gpu", "0"), ("node", "node0"),
                                                      ("rank", "0"), j))]
    assert wait == pytest.approx(0.20)  # 0.10 s at each of the two steps
    # Shutdown writes every row once.
    running.core.close()
    assert running.store.rows_written_total == 8


def test_query_steps_returns_the_last_n(running: RunningAggregator) -> None:
    running.stub.Deliver(iter([batch("n0", "i0", list(range(1, 11)), [0, 1, 2, 3, 4], [0, 1], hot=1)])).next()
    running.settle()
    got = running.stub.QuerySteps(apb.QueryStepsRequest(job="j", last=2))
    assert [s.step for s in got.steps] == [3, 4]
    step = got.steps[-1]
    assert (step.complete, step.ranks_reported, step.ranks_expected, step.slowest_rank, step.slowest_cause) == (
        True, 2, 2, 1, "thermal")
    assert [r.rank for r in step.ranks] == [0, 1] and step.ranks[0].straggler_wait_s == pytest.approx(0.10)
    assert "slowest_rank" in step.ranks[1].flags
    assert [s.step for s in running.stub.QuerySteps(apb.QueryStepsRequest(job="j")).steps] == [2, 3, 4]  # kept: 3
    assert not running.stub.QuerySteps(apb.QueryStepsRequest(job="other")).steps


def test_garbled_and_invalid_messages_are_refused_and_counted(running: RunningAggregator) -> None:
    raw = running.channel.stream_stream("/chopper.v1.Aggregator/Deliver", request_serializer=None,
                                        response_deserializer=None)
    with pytest.raises(grpc.RpcError) as err:
        list(raw(iter([b"\xff\xff\xff garbage"])))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a chopper.v1.SummaryBatch" in (err.value.details() or "")
    bad = apb.SummaryBatch(agent="n0", incarnation="i0", seq=[1, 2])
    bad.summaries.append(summary("j", 0, 0))
    with pytest.raises(grpc.RpcError) as err:
        list(running.stub.Deliver(iter([bad])))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "2 sequence numbers for 1 summaries" in (err.value.details() or "")
    with pytest.raises(grpc.RpcError) as err:
        running.stub.QuerySteps(apb.QueryStepsRequest())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    m = running.scrape()
    assert m[("chopper_aggregator_messages_undecodable_total", (("method", "Deliver"),))] == 1
    assert m[("chopper_aggregator_batches_invalid_total", ())] == 1
    health = health_pb2_grpc.HealthStub(running.channel)
    reply = health.Check(health_pb2.HealthCheckRequest(service="chopper.v1.Aggregator"))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_rank_series_top_k_keeps_the_worst_ranks(tmp_path: Path) -> None:
    r = RunningAggregator(tmp_path, top_k=2)
    try:
        hot = {5, 11}
        summaries = [summary("big", rank, step, hot=rank in hot) for step in range(3) for rank in range(16)]
        r.core.jobs.add(summaries, START_NS)
        r.core.jobs.add([summary("small", rank, 0) for rank in range(2)], START_NS)
        r.settle()
        m = r.scrape()
        shown = {dict(labels)["rank"] for (name, labels) in m if name == "chopper_job_rank_step_time_seconds"
                 and dict(labels)["training_job"] == "big"}
        assert shown == {"5", "11"}
        assert len({dict(labels)["rank"] for (name, labels) in m if name == "chopper_job_rank_step_time_seconds"
                    and dict(labels)["training_job"] == "small"}) == 2  # not larger than k: all ranks
        assert m[("chopper_aggregator_rank_series_omitted", ())] == 14
    finally:
        r.stop()


def test_docs_aggregator_metrics_md_is_current() -> None:
    assert (ROOT / "docs" / "AGGREGATOR_METRICS.md").read_text() == catalog.markdown(), (
        "run: python -m aggregator.catalog > docs/AGGREGATOR_METRICS.md")


def test_names_follow_house_style_and_every_exported_name_is_cataloged(running: RunningAggregator) -> None:
    names = [m.name for m in catalog.METRICS]
    assert len(names) == len(set(names))
    for m in catalog.METRICS:
        assert re.fullmatch(r"chopper_(job|aggregator)_[a-z0-9_]+", m.name), m.name
        assert (m.kind == "counter") == m.name.endswith("_total"), m.name
        assert "step" not in m.labels and m.help.endswith(".")
        if m.kind == "info":
            assert m.name.endswith("_info")
    running.stub.Deliver(iter([batch("n0", "i0", [1, 2], [0], [0, 1])])).next()
    running.settle()
    exported = {name for name, _ in running.scrape()}
    assert exported <= set(names) and {"chopper_job_mfu_ratio", "chopper_aggregator_jobs"} <= exported
