"""Where each rank is, at the aggregator: delivered in SummaryBatch.positions, answered by QuerySteps."""
from __future__ import annotations

from pathlib import Path

import pytest

from aggregator.positions import PositionTable
from chopper.positions import describe
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from tests.support.hazards import HazardOutcome
from tests.support.running_servers import RunningAggregator

NS = 1_000_000_000


def _at(job: str, rank: int, collective: str = "all_reduce", step: int = 40) -> pb.RankPosition:
    return pb.RankPosition(job=job, node="n1", rank=rank, gpu=rank, step=step, step_begin_ns=NS,
                           collective=collective, collective_begin_ns=2 * NS, as_of_ns=122 * NS)


@pytest.mark.hazard(item=16, input="a delivered position with rank -1, beside good ones, in batches without summaries",
                    promise="the bad position is dropped and counted (rejected), the good ones answer QuerySteps")
def test_positions_delivered_without_summaries_answer_query_steps(tmp_path: Path, hazard: HazardOutcome) -> None:
    agg = RunningAggregator(tmp_path)
    try:
        batches = [
            apb.SummaryBatch(agent="n1", incarnation="i1", positions=[_at("j", 1), _at("j", 0), _at("other", 0)]),
            apb.SummaryBatch(agent="n2", incarnation="i2",
                             positions=[_at("j", 2, collective=""), pb.RankPosition(job="j", rank=-1)]),
        ]
        acks = list(agg.stub.Deliver(iter(batches), timeout=10))
        assert [a.acked_seq for a in acks] == [0, 0]
        reply = agg.stub.QuerySteps(apb.QueryStepsRequest(job="j"), timeout=10)
        assert not reply.steps and [p.rank for p in reply.positions] == [0, 1, 2]
        assert describe(reply.positions) == ("ranks 0-1 inside collective all_reduce of step 40 for 120 s; "
                                             "rank 2 inside step 40 for 121 s")
        m = agg.scrape()
        assert m[("chopper_aggregator_rank_positions", ())] == 4.0
        assert m[("chopper_aggregator_rank_positions_dropped_total", (("reason", "rejected"),))] == 1.0
        hazard.outcome = (f"{len(reply.positions)} positions of job j answered, 1 rejected and counted, "
                          f"{len(acks)} batches acknowledged")
    finally:
        agg.stop()


def test_an_agent_that_stops_reporting_a_rank_forgets_it_and_silence_expires() -> None:
    table = PositionTable(expiry_s=10.0)
    table.update("n1", [_at("j", 0), _at("j", 1)], now_ns=0)
    table.update("n2", [_at("j", 2)], now_ns=0)
    table.update("n1", [_at("j", 1, collective="all_gather")], now_ns=NS)  # n1 retired rank 0
    assert [(p.rank, p.collective) for p in table.query("j")] == [(1, "all_gather"), (2, "all_reduce")]
    table.update("n3", [_at("j", 1, collective="broadcast")], now_ns=2 * NS)  # the rank moved to n3
    table.update("n1", [_at("j", 5)], now_ns=3 * NS)  # n1's report no longer owns rank 1
    assert [(p.rank, p.collective) for p in table.query("j")] == [(1, "broadcast"), (2, "all_reduce"),
                                                                   (5, "all_reduce")]
    assert table.expire(10 * NS) == 1 and [p.rank for p in table.query("j")] == [1, 5]  # n2 went silent
    assert table.expire(13 * NS) == 2 and not table.query("j") and len(table) == 0
    assert table.expired_total == 3


@pytest.mark.hazard(item=16, input="positions of 50 (job, rank)s delivered to a table bounded at 20",
                    promise="the table holds 20, the ones updated longest ago evicted and counted")
def test_bounded_the_oldest_evicted(hazard: HazardOutcome) -> None:
    table = PositionTable(max_positions=20)
    for i in range(50):
        table.update(f"n{i}", [_at(f"job{i}", 0)], now_ns=i)
    assert len(table) == 20 and table.evicted_total == 30
    assert not table.query("job29") and [p.job for p in table.query("job30")] == ["job30"]
    hazard.outcome = f"{len(table)} held of 50 delivered, {table.evicted_total} evicted, the newest kept"


def test_chopper_where_asks_the_aggregator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from chopper import cli

    agg = RunningAggregator(tmp_path)
    try:
        batch = apb.SummaryBatch(agent="n1", incarnation="i1", positions=[_at("j", 0), _at("j", 1, collective="")])
        list(agg.stub.Deliver(iter([batch]), timeout=10))
        assert cli.main(["where", "--aggregator", agg.address, "--job", "j"]) == 0
        assert capsys.readouterr().out == ("job j: rank 0 inside collective all_reduce of step 40 for 120 s; "
                                           "rank 1 inside step 40 for 121 s\n")
        assert cli.main(["where", "--aggregator", agg.address, "--job", "j", "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        assert [(r["rank"], r.get("collective", "")) for r in rows] == [(0, "all_reduce"), (1, "")]
        assert cli.main(["where", "--aggregator", agg.address, "--job", "nobody"]) == 1
        assert "holds no position of job 'nobody'" in capsys.readouterr().err
    finally:
        agg.stop()
