"""Fuzz the gRPC trust boundary in process: request decoding, marker validation, summary ingest.

Properties:

- ``chopper.daemon.grpc_decode.decoder`` turns any bytes into either the expected message (which
  serializes again) or a ``Garbled`` whose error says what was wrong; it never raises.
- ``agent.markers.MarkerIngest.ingest`` accounts for every marker of any decodable batch exactly
  once (accepted, or rejected with a documented reason and a non-empty message), keeps each
  closed step inside its own bounds, and holds bounded state however many begins a rank sends.
- ``aggregator.service.Aggregator.deliver`` takes any batch the server lets through without
  raising, rejects only with documented reasons, and every row it finalizes reaches the Parquet
  store and reads back (a job name must never be able to block the store).
"""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agent import markers
from agent.markers import REJECTION_REASONS, MarkerIngest
from aggregator import jobs
from aggregator.jobs import JobTable
from aggregator.ledger import Ledger
from aggregator.metrics import AggregatorCollector
from aggregator.server import _batch_problem
from aggregator.service import Aggregator
from aggregator.store import Store
from chopper.attribution.store_reader import read_step_store
from chopper.daemon.grpc_decode import Garbled, decoder
from chopper.daemon.text_format import Registry
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from chopper.schema import marker_count
from tests.support.markers import marker_columns
from tests.support.strategies import fuzz, length_delimited, wire

NS = 1_000_000_000
NOW = 1_700_000_000 * NS
# Every request type either server decodes.
REQUESTS = (pb.MarkerBatch, pb.GetInfoRequest, pb.SubscribeRequest, pb.ControlHello, pb.CaptureRequest,
            pb.CaptureResult, apb.SummaryBatch, apb.QueryStepsRequest)
HEADER_REASONS = {"bad_job", "bad_rank", "bad_gpu", "batch_too_large", "bad_columns"}


@pytest.mark.slow
@fuzz(400, timeout_s=120)
@given(st.sampled_from(REQUESTS).flatmap(lambda c: st.tuples(st.just(c), wire(c))))
@example((pb.MarkerBatch, length_delimited(1, b"\xff")))  # invalid UTF-8 in a string field
@example((apb.SummaryBatch, length_delimited(4, b"\x08\x01", 2**40)))  # claims 1 TiB
def test_decoder_answers_any_bytes(case: tuple[type, bytes]) -> None:
    cls, raw = case
    out = decoder(cls.FromString)(raw)
    if isinstance(out, Garbled):
        assert str(out.error), "a garbled message must say what was wrong"
    else:
        assert isinstance(out, cls)
        assert cls.FromString(out.SerializeToString()) == out


# Markers a real client could plausibly send, so that the per-rank state machine is exercised:
# timestamps around the agent's clock, few steps and names, every kind (and unknown ones).
_plausible_marker = st.builds(
    pb.Marker,
    ts_ns=st.one_of(st.integers(NOW - NS, NOW + NS), st.integers(-(2**63), 2**63 - 1)),
    kind=st.one_of(st.integers(1, 6), st.integers(-1, 9)),
    step=st.integers(-1, 3),
    name=st.sampled_from(["", "forward", "backward", "all_reduce", "x" * 257, "a\x00b"]),
    flops=st.floats(),
    tokens=st.integers(-1, 2**40),
    bytes=st.integers(-1, 2**40),
    clock=st.integers(0, 3),
)
_plausible_batch = st.builds(
    pb.MarkerBatch,
    job=st.sampled_from(["j", "", "x" * 257, "a\nb"]),
    rank=st.integers(-1, 3),
    gpu=st.integers(-2, 2),
    seq=st.integers(0, 2**64 - 1),
    markers=st.lists(_plausible_marker, max_size=40),
    client_dropped_total=st.integers(0, 2**64 - 1),
    pid=st.integers(-(2**63), 2**63 - 1),
)


def _in_columns(batch: pb.MarkerBatch) -> pb.MarkerBatch:
    out = pb.MarkerBatch()
    out.CopyFrom(batch)
    out.ClearField("markers")
    out.columns.CopyFrom(marker_columns(list(batch.markers)))
    return out


# Columns as chopper.Client sends them, and columns free to disagree in length or name index.
_column_batch = _plausible_batch.map(_in_columns)
_small = st.lists(st.integers(-1, 5), max_size=5)
_garbled_columns = st.builds(
    pb.MarkerBatch, job=st.just("j"), rank=st.just(0), gpu=st.just(0),
    columns=st.builds(pb.MarkerColumns, ts_ns=st.lists(st.integers(NOW - 10**9, NOW + 10**9), max_size=5),
                      kind=st.lists(st.integers(0, 7), max_size=5), step=_small,
                      name=st.lists(st.integers(0, 3), max_size=5), names=st.lists(st.sampled_from(["", "forward"]),
                                                                                   max_size=3),
                      flops=st.lists(st.floats(), max_size=5), tokens=_small, bytes=_small,
                      clock=st.lists(st.integers(0, 3), max_size=5)),
)


def _check_ingest(ingest: MarkerIngest, batch: pb.MarkerBatch) -> None:
    result = ingest.ingest(batch, NOW)
    rejected = sum(result.rejected.values())
    assert set(result.rejected) <= set(REJECTION_REASONS)
    if set(result.rejected) & HEADER_REASONS:
        assert (len(result.accepted), rejected) == (0, max(1, marker_count(batch)))
    else:
        assert len(result.accepted) + rejected == marker_count(batch)
    assert bool(result.errors) == bool(rejected)
    assert len(result.errors) <= markers.MAX_ERRORS_REPORTED and all(result.errors)
    for closed in result.closed_steps:
        assert closed.begin_ns <= closed.end_ns
        assert all(closed.begin_ns <= b <= e <= closed.end_ns for _, b, e, _, _ in closed.intervals)
    for state in ingest.ranks.values():
        held = sum(map(len, state.open_phases.values())) + sum(map(len, state.open_collectives.values()))
        assert held <= markers.MAX_OPEN_INTERVALS


@pytest.mark.slow
@fuzz(300, timeout_s=120)
@given(st.lists(st.one_of(_plausible_batch, _column_batch, _garbled_columns, wire(pb.MarkerBatch, _plausible_batch)),
                min_size=1, max_size=6))
def test_marker_ingest_accounts_for_every_marker(batches: list[pb.MarkerBatch | bytes]) -> None:
    ingest = MarkerIngest("n1", gpu_count=2)
    for item in batches:
        batch = decoder(pb.MarkerBatch.FromString)(item) if isinstance(item, bytes) else item
        if not isinstance(batch, Garbled):
            _check_ingest(ingest, batch)


def test_open_phases_of_a_rank_are_bounded() -> None:
    """A client that only ever begins phases (never a step_begin, never an end) cannot grow the agent."""
    ingest = MarkerIngest("n1", gpu_count=1)
    begins = [pb.Marker(kind=pb.MARKER_KIND_PHASE_BEGIN, step=0, ts_ns=NOW, name=f"p{i}") for i in range(1000)]
    rejected = 0
    for seq in range(1, 3 * markers.MAX_OPEN_INTERVALS // 1000 + 2):
        result = ingest.ingest(pb.MarkerBatch(job="j", rank=0, gpu=0, seq=seq, markers=begins), NOW)
        rejected += result.rejected["too_many_open"]
        _check_ingest(ingest, pb.MarkerBatch(job="j", rank=0, gpu=0, seq=seq))
    assert rejected > 0


# Step summaries near the shape an agent sends, with every field free to be hostile.
_summary = st.builds(
    pb.StepSummary,
    job=st.one_of(st.sampled_from(["j", "k", "", "x" * 300, "日本語" * 30, "a\x00b", ".."]), st.text(max_size=30)),
    node=st.sampled_from(["n0", "", "a\x00b"]),
    rank=st.integers(-1, 3),
    gpu=st.integers(-1, 8),
    step=st.one_of(st.integers(-1, 4), st.integers(-(2**63), 2**63 - 1)),
    begin_ns=st.integers(-(2**63), 2**63 - 1),
    end_ns=st.integers(-(2**63), 2**63 - 1),
    step_time_s=st.one_of(st.floats(0, 10), st.floats()),
    ideal_s=st.floats(),
    idle_s=st.one_of(st.floats(0, 1), st.floats()),
    exposed_comm_s=st.one_of(st.floats(0, 1), st.floats()),
    energy_j=st.floats(),
    tokens=st.integers(-(2**63), 2**63 - 1),
    flags=st.lists(st.sampled_from(["no_flops", "late", "x" * 300]), max_size=3),
)
_summary_batch = st.builds(
    lambda sums, agent, lost: apb.SummaryBatch(agent=agent, incarnation="i", seq=range(1, len(sums) + 1),
                                               summaries=sums, lost_total=lost),
    st.lists(_summary, max_size=8), st.sampled_from(["a", "b"]), st.integers(0, 2**64 - 1),
)


@fuzz(150, timeout_s=180)
@given(st.lists(st.one_of(_summary_batch, wire(apb.SummaryBatch, _summary_batch)), min_size=1, max_size=4))
@example([apb.SummaryBatch(agent="a", incarnation="i", seq=[1], summaries=[pb.StepSummary(job="x" * 256)])])
@example([apb.SummaryBatch(agent="a", incarnation="i", seq=[1], summaries=[  # shares overflowed to inf
    pb.StepSummary(job="j", step_time_s=5e-324, idle_s=1e308)])])
@example([apb.SummaryBatch(agent="a", incarnation="i", seq=[1, 2], summaries=[  # ranks without GPU samples
    pb.StepSummary(job="j", rank=r, step=1, step_time_s=1.0, idle_s=math.nan) for r in range(2)])])
@pytest.mark.filterwarnings("error::RuntimeWarning")  # an overflow or a NaN division is a defect here
def test_aggregator_ingest_stores_what_it_accepts(batches: list[apb.SummaryBatch | bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        now = [NOW]
        store = Store(Path(tmp) / "steps", flush_rows=1)
        core = Aggregator(Ledger(), JobTable(30.0, join_s=0.0), store, clock=lambda: now[0])
        registry = Registry()
        registry.register(AggregatorCollector(core, 2))
        for item in batches:
            batch = decoder(apb.SummaryBatch.FromString)(item) if isinstance(item, bytes) else item
            if isinstance(batch, Garbled) or _batch_problem(batch):
                continue  # the server answers INVALID_ARGUMENT (tests/fuzz/test_servers.py)
            core.deliver(batch)
            now[0] += 40 * NS
            core.tick()
            registry.render()
        core.close()
        assert set(core.jobs.rejected) == set(jobs.REJECTION_REASONS)
        assert store.flush_errors_total == 0, "a summary the aggregator took must not block the store"
        # Every summary the ledger took as new was either rejected, with a reason, or stored.
        assert store.rows_written_total + sum(core.jobs.rejected.values()) == core.ledger.stats()["received_total"]
        if store.rows_written_total:
            rows = read_step_store(Path(tmp) / "steps").steps
            assert len(rows) == store.rows_written_total
            assert all(math.isfinite(t) and t >= 0 for t in rows["step_time_s"])

