"""``chopper record`` writes the Inspector collectives an agent sends (``TelemetryBatch.collectives``).

The agent here is a gRPC ``Agent`` servicer on a real unix socket that answers ``GetInfo`` and
one ``Subscribe`` batch, so the records cross the wire exactly as the agent sends them; the
record values follow an Inspector v4.0 AllReduce of 8 ranks on one node (its ``msg_size_bytes``,
``exec_time_us`` and bus bandwidth), as docs/INSPECTOR.md maps them.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import agent_pb2_grpc
from chopper.runs.record import record
from chopper.runs.rundir import COLLECTIVE_COLUMNS, read_run
from tests.support.hazards import HazardOutcome
from tests.support.marker_recorder import short_socket_path, start_server

T0 = 1_765_000_000_000_000_000


def _record(seq: int, **change: Any) -> pb.CollectiveRecord:
    fields: dict[str, Any] = dict(
        job="train", node="n1", rank=3, gpu=3, collective="AllReduce", begin_ns=T0 + seq * 10**6,
        end_ns=T0 + seq * 10**6 + 412_000, placed=True, exec_s=412e-6, timing_source="kernel_gpu",
        bytes=67_108_864, algo_bandwidth_gbs=162.9, bus_bandwidth_gbs=285.1, comm_id="0x5e1f7c2a9d3b4e60",
        comm_rank=3, comm_ranks=8, comm_nodes=1, seq=seq, pid=7123, format_version="v4.0",
    )
    return pb.CollectiveRecord(**(fields | change))


class _Agent(agent_pb2_grpc.AgentServicer):
    """One GPU; one batch of markers and collectives, then the stream ends (the agent went away)."""

    def __init__(self, collectives: list[pb.CollectiveRecord]) -> None:
        self.collectives = collectives
        self.requests: list[pb.SubscribeRequest] = []

    def GetInfo(self, request: pb.InfoRequest, context: grpc.ServicerContext) -> pb.AgentInfo:
        return pb.AgentInfo(node="n1", devices=[pb.DeviceInfo(node="n1", gpu=3, vendor="nvidia", model="H100",
                                                              uuid="GPU-3", max_gfx_clock_mhz=1980.0,
                                                              peak_flops=989e12)])

    def Subscribe(self, request: pb.SubscribeRequest, context: grpc.ServicerContext) -> Iterator[pb.TelemetryBatch]:
        self.requests.append(request)
        marker = pb.MarkerRecord(job="train", node="n1", rank=3, gpu=3,
                                 marker=pb.Marker(kind=pb.MARKER_KIND_STEP_BEGIN, ts_ns=T0, step=1))
        yield pb.TelemetryBatch(markers=[marker], collectives=self.collectives)


@pytest.fixture
def socket_path(tmp_path: Path) -> Iterator[Path]:
    yield from short_socket_path(tmp_path)


def _recorded(socket_path: Path, out: Path, collectives: list[pb.CollectiveRecord]) -> tuple[Any, _Agent]:
    agent = _Agent(collectives)
    server = start_server(socket_path, agent)
    try:
        stats = record(f"unix://{socket_path}", out, duration_s=30.0, since_ns=1)
    finally:
        server.stop(None)
    return stats, agent


def test_inspector_collectives_become_the_collectives_table(socket_path: Path, tmp_path: Path) -> None:
    sent = [_record(41), _record(42, placed=False, timing_source="kernel_cpu")]
    stats, agent = _recorded(socket_path, tmp_path / "run", sent)
    # They come with the markers: the request needs no flag of its own.
    assert agent.requests[0].markers
    assert (stats.collectives, stats.unfit_collectives, stats.markers, stats.ended_by) == (2, 0, 1, "agent")
    table = read_run(tmp_path / "run").collectives
    assert len(table) == 2
    for row, record_sent in zip(table.to_dict("records"), sent, strict=True):
        assert row == {c: getattr(record_sent, c) for c in COLLECTIVE_COLUMNS}


@pytest.mark.hazard(item=1, input="Inspector records the data model cannot hold sent to chopper record: bytes "
                    "2**64-1, an end before its begin, an infinite exec time, a GPU index 70000",
                    promise="each is left out and counted; every other record, sample and marker is written")
def test_records_that_do_not_fit_are_left_out_and_counted(socket_path: Path, tmp_path: Path,
                                                          hazard: HazardOutcome) -> None:
    bad = [_record(1, bytes=2**64 - 1), _record(2, end_ns=T0), _record(3, exec_s=float("inf")),
           _record(4, gpu=70_000)]
    stats, _ = _recorded(socket_path, tmp_path / "run", [*bad, _record(5)])
    assert (stats.collectives, stats.unfit_collectives) == (1, 4)
    run = read_run(tmp_path / "run")
    assert run.collectives["seq"].tolist() == [5] and len(run.markers) == 1
    hazard.outcome = f"{stats.unfit_collectives} unfit records left out and counted; 1 record and 1 marker written"


def test_a_recording_without_collectives_has_an_empty_table(socket_path: Path, tmp_path: Path) -> None:
    stats, _ = _recorded(socket_path, tmp_path / "run", [])
    assert stats.collectives == 0
    assert read_run(tmp_path / "run").collectives.empty
