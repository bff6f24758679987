"""The marker socket (agent.marker_socket), in process: a real agent, real unix sockets, the real client."""
from __future__ import annotations

import os
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.marker_socket import MarkerSocket
from agent.unix_socket import SocketInUse
from chopper.client import Client
from chopper.daemon.ratelimit import StreamSlots
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.schema import marker_socket_path
from tests.support.markers import steps_batch
from tests.support.polling import wait_until
from tests.support.running_servers import RunningAgent


@pytest.fixture
def running(tmp_path: Path) -> Iterator[RunningAgent]:
    r = RunningAgent(tmp_path, marker_socket=True)
    yield r
    r.stop()


def _connect(running: RunningAgent) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(5.0)
    sock.connect(marker_socket_path(running.settings.socket_path))
    return sock


def _received(running: RunningAgent, job: str) -> int:
    """Markers the agent took in from rank 0 of ``job``."""
    state = dict(running.agent.rank_states()).get((job, 0))
    return 0 if state is None else sum(state.received.values())


def _answer(sock: socket.socket) -> pb.PushMarkersResponse:
    """End the stream and read the agent's answer."""
    sock.shutdown(socket.SHUT_WR)
    response = pb.PushMarkersResponse()
    response.ParseFromString(sock.recv(65536))
    assert sock.recv(65536) == b""  # and the agent closed
    return response


def test_client_markers_go_over_the_socket_and_arrive(running: RunningAgent) -> None:
    client = Client(job="sock", rank=0, gpu=0, agent=running.target, control=False)
    try:
        for i in range(40):
            with client.step(i, flops=1e9, tokens=8), client.phase("forward"):
                pass
        assert wait_until(lambda: _received(running, "sock") == 160)
        assert running.marker_socket is not None and running.marker_socket.connections == 1
        assert running.agent.open_streams["PushMarkers"] == 1
    finally:
        client.shutdown(timeout=5.0)
    stats = client.stats()
    assert (stats["queued"], stats["sent"], stats["dropped"]) == (160, 160, 0)
    wait_until(lambda: running.agent.open_streams["PushMarkers"] == 0, timeout_s=5)
    assert dict(running.agent.rank_states())[("sock", 0)].batches_lost == 0


def test_a_stream_is_answered_with_what_became_of_its_markers(running: RunningAgent) -> None:
    sock = _connect(running)
    t0 = time.time_ns()
    sock.send(steps_batch(0, 3, t0).SerializeToString())
    bad = pb.MarkerBatch(job="j", rank=1, gpu=1, seq=2, markers=[
        pb.Marker(kind=pb.MARKER_KIND_STEP_END, step=9, ts_ns=t0 + 10**9)])
    sock.send(bad.SerializeToString())
    response = _answer(sock)
    assert (response.accepted, response.rejected) == (12, 1)
    assert "step_end for step 9 that never began" in response.errors[0]
    assert running.agent.rejected["step_never_began"] == 1


def test_bad_datagrams_cost_only_themselves(running: RunningAgent) -> None:
    """Garbage, an oversized datagram and one past the rate each count; the stream goes on."""
    sock = _connect(running)
    sock.send(b"\xff\xff\xff\x07garbage")
    # RunningAgent's max_message_bytes is 64 KiB; the kernel takes up to the send buffer.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 512 * 1024)
    sock.send(b"\x00" * (100 * 1024))
    sock.send(steps_batch(0, 2, time.time_ns()).SerializeToString())
    response = _answer(sock)
    assert response.accepted == 8
    assert running.agent.undecodable["PushMarkers"] == 1
    assert running.agent.refusals.snapshot()[("PushMarkers", "too_large")] == 1


def test_messages_over_the_stream_rate_are_refused(tmp_path: Path) -> None:
    running = RunningAgent(tmp_path, marker_socket=True, rate_limit_messages_per_s="1")
    try:
        sock = _connect(running)
        t0 = time.time_ns()
        for i in range(5):  # a bucket of 1 message/s holds max(1, rate x burst) tokens
            batch = steps_batch(i, 1, t0 + i * 10**8)
            batch.seq = i + 1
            sock.send(batch.SerializeToString())
        response = _answer(sock)
        refused = running.agent.refusals.snapshot()[("PushMarkers", "rate_limited")]
        assert refused >= 1 and response.accepted == 4 * (5 - refused)
    finally:
        running.stop()


def test_connections_past_a_process_share_are_closed_and_counted(running: RunningAgent) -> None:
    assert running.marker_socket is not None
    running.marker_socket.slots = StreamSlots(total=4, per_client=2)
    kept = [_connect(running) for _ in range(2)]
    wait_until(lambda: running.marker_socket is not None and running.marker_socket.connections == 2, timeout_s=5)
    third = _connect(running)
    assert third.recv(16) == b""  # closed by the agent, unanswered
    assert running.agent.refusals.snapshot()[("PushMarkers", "streams_per_client")] == 1
    for sock in kept:
        assert _answer(sock).accepted == 0
    wait_until(lambda: running.agent.open_streams["PushMarkers"] == 0, timeout_s=5)


def test_socket_file_has_the_agents_mode_and_goes_at_stop(tmp_path: Path) -> None:
    running = RunningAgent(tmp_path, marker_socket=True, socket_mode="0600")
    path = Path(marker_socket_path(running.settings.socket_path))
    assert stat.S_ISSOCK(os.lstat(path).st_mode) and stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    with pytest.raises(SocketInUse):  # a second agent on the same path
        MarkerSocket(running.markers, running.settings)
    running.stop()
    assert not path.exists()


def test_a_stale_socket_file_is_replaced(tmp_path: Path) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stale.bind(marker_socket_path(str(tmp_path / "a.sock")))
    stale.close()  # the file stays, nobody listens: a dead agent's leftover
    running = RunningAgent(tmp_path, marker_socket=True)
    try:
        assert _answer(_connect(running)).accepted == 0
    finally:
        running.stop()


def test_the_client_falls_back_to_grpc_without_a_marker_socket(tmp_path: Path) -> None:
    running = RunningAgent(tmp_path)  # gRPC only, as an agent of an earlier version serves
    client = Client(job="grpc", rank=0, gpu=0, agent=running.target, control=False)
    try:
        for i in range(10):
            with client.step(i):
                pass
        wait_until(lambda: client.stats()["sent"] == 20, timeout_s=10)
        assert running.agent.open_streams["PushMarkers"] == 1
    finally:
        client.shutdown(timeout=5.0)
        running.stop()
    assert client.stats()["dropped"] == 0


def test_an_agent_restart_costs_at_most_the_batch_in_flight(tmp_path: Path) -> None:
    """Stopping the socket closes the stream; the client goes on over gRPC, then the socket again."""
    running = RunningAgent(tmp_path, marker_socket=True)
    client = Client(job="r", rank=0, gpu=0, agent=running.target, control=False, flush_interval_s=0.01)
    try:
        for i in range(5):
            with client.step(i):
                pass
        wait_until(lambda: client.stats()["sent"] == 10, timeout_s=10)
        assert running.marker_socket is not None
        running.marker_socket.stop()
        for i in range(5, 10):
            with client.step(i):
                pass
            time.sleep(0.02)
        wait_until(lambda: client.stats()["sent"] + client.stats()["dropped"] == 20, timeout_s=10)
        running.marker_socket = MarkerSocket(running.markers, running.settings).start()
        for i in range(10, 15):
            with client.step(i):
                pass
        wait_until(lambda: client.stats()["sent"] + client.stats()["dropped"] == 30, timeout_s=10)
    finally:
        client.shutdown(timeout=5.0)
        running.stop()
    stats = client.stats()
    assert stats["dropped"] <= 2 and stats["sent"] >= 28
    assert _received(running, "r") == stats["sent"]
