"""Aggregator gRPC in process over a real TCP socket: Deliver with duplicates, QuerySteps, garbage, health, /metrics."""
from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from aggregator import catalog
from aggregator.jobs import JobTable
from aggregator.ledger import Ledger
from aggregator.metrics import AggregatorCollector
from aggregator.server import build_server
from aggregator.service import Aggregator
from aggregator.store import Store
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from chopper.proto.chopper.v1 import aggregator_pb2_grpc
from tests.support.summaries import NS, summary

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000 * NS


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


class Running:
    def __init__(self, tmp: Path, top_k: int = 0) -> None:
        self.clock = Clock()
        self.store = Store(tmp / "steps", flush_rows=1_000_000)
        self.core = Aggregator(Ledger(), JobTable(30.0, join_s=5.0), self.store, recent_steps_per_job=3,
                               clock=self.clock)
        self.server, port = build_server(self.core, "127.0.0.1:0")
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = aggregator_pb2_grpc.AggregatorStub(self.channel)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(AggregatorCollector(self.core, top_k))

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = generate_latest(self.registry).decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(text) for s in f.samples}

    def settle(self) -> None:
        """Let the jobs' join period pass, so that steps with every rank complete."""
        self.clock.now += 5 * NS
        self.core.tick()

    def stop(self) -> None:
        self.channel.close()
        self.server.stop(0)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    r = Running(tmp_path)
    yield r
    r.stop()


def batch(agent: str, inc: str, seqs: list[int], steps: list[int], ranks: list[int], hot: int = -1) -> apb.SummaryBatch:
    b = apb.SummaryBatch(agent=agent, incarnation=inc, seq=seqs)
    b.summaries.extend(summary("j", r, s, hot=(r == hot)) for s in steps for r in ranks)
    return b


def test_deliver_acks_and_duplicates_are_not_counted_twice(running: Running) -> None:
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
    assert m[("chopper_job_steps_finalized_total", (("job", "j"),))] == 2
    assert m[("chopper_job_slowest_rank_info", (("cause", "thermal"), ("gpu", "3"), ("job", "j"), ("node", "node0"),
                                                ("rank", "3")))] == 1
    assert m[("chopper_job_straggler_score_ratio", (("job", "j"),))] == pytest.approx(0.10)
    assert m[("chopper_job_mfu_ratio", (("job", "j"), ("window", "1m")))] == pytest.approx(0.5)
    wait = m[("chopper_job_rank_step_seconds_total", (("cause", "straggler_wait"), ("gpu", "0"), ("job", "j"),
                                                      ("node", "node0"), ("rank", "0")))]
    assert wait == pytest.approx(0.20)  # 0.10 s at each of the two steps
    # Shutdown writes every row once.
    running.core.close()
    assert running.store.rows_written_total == 8


def test_query_steps_returns_the_last_n(running: Running) -> None:
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


def test_garbled_and_invalid_messages_are_refused_and_counted(running: Running) -> None:
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
    r = Running(tmp_path, top_k=2)
    try:
        hot = {5, 11}
        summaries = [summary("big", rank, step, hot=rank in hot) for step in range(3) for rank in range(16)]
        r.core.jobs.add(summaries, T0)
        r.core.jobs.add([summary("small", rank, 0) for rank in range(2)], T0)
        r.settle()
        m = r.scrape()
        shown = {dict(labels)["rank"] for (name, labels) in m if name == "chopper_job_rank_step_time_seconds"
                 and dict(labels)["job"] == "big"}
        assert shown == {"5", "11"}
        assert len({dict(labels)["rank"] for (name, labels) in m if name == "chopper_job_rank_step_time_seconds"
                    and dict(labels)["job"] == "small"}) == 2  # not larger than k: all ranks
        assert m[("chopper_aggregator_rank_series_omitted", ())] == 14
    finally:
        r.stop()


def test_docs_aggregator_metrics_md_is_current() -> None:
    assert (ROOT / "docs" / "AGGREGATOR_METRICS.md").read_text() == catalog.markdown(), (
        "run: python -m aggregator.catalog > docs/AGGREGATOR_METRICS.md")


def test_names_follow_house_style_and_every_exported_name_is_cataloged(running: Running) -> None:
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
