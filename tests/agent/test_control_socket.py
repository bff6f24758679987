"""The control socket (agent.control_socket), in process: a real agent, real unix sockets, the real client."""
from __future__ import annotations

import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from chopper.client import Client
from chopper.profiler import STOP_STEPS
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.schema import control_socket_path
from tests.support.polling import wait_until
from tests.support.running_servers import RunningAgent


@pytest.fixture
def running(tmp_path: Path) -> Iterator[RunningAgent]:
    r = RunningAgent(tmp_path, control_socket=True)
    yield r
    r.stop()


def _connect(running: RunningAgent) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(5.0)
    sock.connect(control_socket_path(running.settings.socket_path))
    return sock


def _capture(running: RunningAgent, job: str, out: Path, timeout_s: float) -> tuple[threading.Thread, list]:
    """``RequestCapture`` of 2 steps of ``job`` from a thread (it waits for the ranks); its reply lands in the list."""
    replies: list = []
    request = pb.CaptureRequest(job=job, steps=2, out_dir=str(out), timeout_s=timeout_s)
    thread = threading.Thread(target=lambda: replies.append(running.stub.RequestCapture(request, timeout=30)))
    thread.start()
    return thread, replies


def test_a_clients_control_stream_holds_no_grpc_stream_and_gets_its_command(running: RunningAgent,
                                                                             tmp_path: Path) -> None:
    client = Client(job="ctl", rank=0, gpu=0, agent=running.target)
    try:
        assert wait_until(lambda: running.agent.captures.jobs() == {"ctl": {0}}, timeout_s=10)
        assert running.control_socket is not None and running.control_socket.connections == 1
        assert running.agent.open_streams["Control"] == 1  # counted as gRPC's are: this one stream
        thread, replies = _capture(running, "ctl", tmp_path / "traces", timeout_s=30)
        # The command is pending in the client until its next step; no step comes, so it waits.
        assert wait_until(lambda: client._captures.active, timeout_s=10)
    finally:
        client.shutdown(timeout=5.0)
    thread.join(30)
    # The process went away before it profiled: the capture ends at once, missing that rank.
    assert list(replies[0].missing_ranks) == [0] and not replies[0].results
    assert wait_until(lambda: running.agent.open_streams["Control"] == 0, timeout_s=5)
    assert running.agent.captures.jobs() == {}


def test_commands_arrive_as_datagrams_and_the_timeout_sends_a_stop(running: RunningAgent, tmp_path: Path) -> None:
    sock = _connect(running)
    sock.send(pb.ControlHello(job="raw", rank=3, pid=42).SerializeToString())
    assert wait_until(lambda: running.agent.captures.jobs() == {"raw": {3}}, timeout_s=5)
    thread, replies = _capture(running, "raw", tmp_path / "traces", timeout_s=0.5)
    start, stop = pb.ControlCommand(), pb.ControlCommand()
    start.ParseFromString(sock.recv(65536))
    stop.ParseFromString(sock.recv(65536))  # the rank never reported: told to stop when the timeout passed
    thread.join(30)
    assert (start.capture.steps, start.capture.trace_dir) == (2, str(tmp_path / "traces"))
    assert (stop.capture.capture_id, stop.capture.steps) == (start.capture.capture_id, STOP_STEPS)
    assert list(replies[0].missing_ranks) == [3]
    sock.close()
    assert wait_until(lambda: running.agent.captures.jobs() == {}, timeout_s=5)


@pytest.mark.parametrize("sent", [
    [b"\xff\xff\xff"],
    [pb.ControlHello(rank=1).SerializeToString()],
    [pb.ControlHello(job="j").SerializeToString(), b"more"],
], ids=["not-protobuf", "no-job", "after-hello"])
def test_anything_but_one_hello_closes_the_stream_and_counts(running: RunningAgent, sent: list[bytes]) -> None:
    sock = _connect(running)
    for datagram in sent:
        sock.send(datagram)
    assert sock.recv(16) == b""  # closed by the agent
    assert running.agent.undecodable["Control"] == 1
    assert wait_until(lambda: running.agent.captures.jobs() == {} and running.agent.open_streams["Control"] == 0,
                      timeout_s=5)


def test_without_a_control_socket_the_client_holds_its_stream_over_grpc(tmp_path: Path) -> None:
    running = RunningAgent(tmp_path)  # an agent without one (older, or a TCP target)
    client = Client(job="g", rank=1, gpu=0, agent=running.target)
    try:
        assert wait_until(lambda: running.agent.captures.jobs() == {"g": {1}}, timeout_s=10)
        assert running.agent.open_streams["Control"] == 1
    finally:
        client.shutdown(timeout=5.0)
        running.stop()


def test_socket_file_has_the_agents_mode_and_goes_at_stop(tmp_path: Path) -> None:
    running = RunningAgent(tmp_path, control_socket=True, socket_mode="0600")
    path = Path(control_socket_path(running.settings.socket_path))
    assert stat.S_ISSOCK(os.lstat(path).st_mode) and stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    running.stop()
    assert not path.exists()
