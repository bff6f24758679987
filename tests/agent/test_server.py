"""The agent's gRPC surface, in process: real server on a real unix socket, simulated backend."""
from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import agent_pb2_grpc
from tests.support.markers import steps_batch
from tests.support.running_servers import RunningAgent


@pytest.fixture
def running(tmp_path: Path) -> Iterator[RunningAgent]:
    r = RunningAgent(tmp_path)
    yield r
    r.stop()


def test_markers_in_summaries_out(running: RunningAgent) -> None:
    t0 = time.time_ns()
    # since_ns replays what the buffers hold, so the subscription cannot miss the markers below.
    stream = running.stub.Subscribe(pb.SubscribeRequest(step_summaries=True, markers=True, since_ns=t0))
    response = running.stub.PushMarkers(iter([steps_batch(0, 5, t0)]))
    assert (response.accepted, response.rejected) == (20, 0)
    summaries, markers = [], []
    for batch in stream:
        summaries += batch.step_summaries
        markers += batch.markers
        if len(summaries) == 5:
            break
    stream.cancel()
    assert [s.step for s in summaries] == [0, 1, 2, 3, 4]
    assert len(markers) == 20 and markers[0].node == "n1" and markers[0].rank == 1
    first = summaries[0]
    assert first.step_time_s == pytest.approx(0.035)
    # The simulated GPU 1 was busy with "forward": its clock and power are real numbers.
    assert 0 < first.mean_gfx_clock_mhz <= 2100 and first.mean_power_w > 0 and first.energy_j > 0


def test_rejections_are_answered_and_counted(running: RunningAgent) -> None:
    bad = pb.MarkerBatch(job="j", rank=0, gpu=0, seq=1, markers=[
        pb.Marker(kind=pb.MARKER_KIND_STEP_END, step=9, ts_ns=time.time_ns()),
    ])
    response = running.stub.PushMarkers(iter([bad]))
    assert response.rejected == 1
    assert "step_end for step 9 that never began" in response.errors[0]
    assert running.agent.rejected["step_never_began"] == 1
    assert running.stub.GetInfo(pb.GetInfoRequest()).backend == "simulated"  # still serving


def test_garbled_and_oversized_messages(running: RunningAgent) -> None:
    push_raw = running.channel.stream_unary("/chopper.v1.Agent/PushMarkers")  # bytes in, bytes out
    with pytest.raises(grpc.RpcError) as err:
        push_raw(iter([b"\xff\xff\xff\x07garbage"]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a chopper.v1.MarkerBatch" in err.value.details()
    assert running.agent.undecodable["PushMarkers"] == 1
    huge = pb.MarkerBatch(job="j", rank=0, gpu=0, seq=1, markers=[
        pb.Marker(kind=pb.MARKER_KIND_PHASE_BEGIN, name="x" * 200, ts_ns=time.time_ns()) for _ in range(1000)
    ])
    with pytest.raises(grpc.RpcError) as err:
        running.stub.PushMarkers(iter([huge]))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert running.stub.GetInfo(pb.GetInfoRequest()).node == "n1"


def test_health_socket_mode_and_info(running: RunningAgent) -> None:
    health = health_pb2_grpc.HealthStub(running.channel)
    status = health.Check(health_pb2.HealthCheckRequest(service="chopper.v1.Agent")).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    assert stat.S_IMODE(os.stat(running.settings.socket_path).st_mode) == 0o660
    info = running.stub.GetInfo(pb.GetInfoRequest())
    assert [d.gpu for d in info.devices] == [0, 1] and info.devices[0].vendor == "simulated"
    assert info.devices[0].peak_flops == pytest.approx(1307.4e12)


def test_optional_tcp_listener(tmp_path: Path) -> None:
    from chopper.demo.run import free_port

    address = f"127.0.0.1:{free_port()}"
    r = RunningAgent(tmp_path, grpc_listen=address)
    try:
        with grpc.insecure_channel(address) as channel:
            assert agent_pb2_grpc.AgentStub(channel).GetInfo(pb.GetInfoRequest(), timeout=5).node == "n1"
    finally:
        r.stop()


def test_metrics_exposition(running: RunningAgent) -> None:
    running.stub.PushMarkers(iter([steps_batch(0, 3, time.time_ns())]))
    deadline = time.monotonic() + 5
    while running.agent.summaries_total < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    text = running.registry.render().decode()
    assert ('chopper_rank_markers_received_total{gpu="1",kind="phase_end",node="n1",rank="1",training_job="j"} 3.0'
            in text)
    assert 'chopper_rank_steps_total{gpu="1",node="n1",rank="1",training_job="j"} 3.0' in text
    assert 'chopper_agent_backend_up{backend="simulated",node="n1"} 1.0' in text
    assert 'chopper_gpu_gfx_clock_max_hertz{gpu="0",model=' in text
    assert "chopper_gpu_throttle_seconds_total{cause=\"thermal\"" in text
    assert "# HELP chopper_gpu_power_watts Mean board/socket power" in text
    assert 'chopper_agent_marker_streams{node="n1"} 0.0' in text  # the push stream has closed
    # The attribution of the three 35 ms steps adds up to their time, cause by cause.
    from chopper.demo.run import metric_sum

    assert metric_sum(text, "chopper_rank_step_seconds_total", training_job="j", rank="1") == pytest.approx(3 * 0.035)
    ideal = metric_sum(text, "chopper_rank_step_seconds_total", training_job="j", rank="1", cause="ideal")
    assert ideal == pytest.approx(3 * 1e12 / 1307.4e12)
    flops_step = metric_sum(text, "chopper_rank_flops_step_seconds_total", training_job="j", rank="1")
    assert flops_step == pytest.approx(3 * 0.035)  # every step declared its FLOPs
    assert metric_sum(text, "chopper_rank_mfu_ratio", training_job="j", rank="1") == pytest.approx(ideal / flops_step)
    assert metric_sum(text, "chopper_rank_tokens_total", training_job="j", rank="1") == 3 * 256
    assert 'chopper_rank_flagged_steps_total{flag="cpu_clock"' in text


def test_log_budget_lets_a_burst_through_per_period_and_counts_the_rest() -> None:
    from agent.marker_streams import LogBudget

    now = [0.0]
    budget = LogBudget(burst=3, period_s=60.0, clock=lambda: now[0])
    assert [budget.take() for _ in range(5)] == [0, 0, 0, None, None]
    now[0] = 61.0
    assert budget.take() == 2  # the first line of the next period tells how many were held back
    assert budget.take() == 0
