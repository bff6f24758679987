"""The agent's unix socket over its life (``agent.unix_socket``), on a real in-process agent and real sockets."""
from __future__ import annotations

import logging
import os
import socket
import stat
from pathlib import Path

import grpc
import pytest

from agent.unix_socket import SocketInUse, SocketKeeper, remove_socket
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import agent_pb2_grpc
from tests.support.hazards import HazardOutcome
from tests.support.running_servers import RunningAgent


def keeper_of(r: RunningAgent) -> SocketKeeper:
    return SocketKeeper(r.server, r.settings, r.agent.socket_served_again)


def test_second_agent_on_same_socket_refused(tmp_path: Path) -> None:
    r = RunningAgent(tmp_path)
    try:
        with pytest.raises(SocketInUse, match="served by another running agent"):
            RunningAgent(tmp_path)
    finally:
        r.stop()


def test_removed_socket_is_served_again_with_its_mode(tmp_path: Path) -> None:
    sub = tmp_path / "run"
    r = RunningAgent(tmp_path, socket_path=str(sub / "a.sock"))
    keeper = keeper_of(r)
    try:
        open_stream = r.stub.GetInfo(pb.GetInfoRequest(), timeout=5)
        assert open_stream.node == "n1" and keeper.check() is False  # our own socket: nothing to do
        for child in sub.iterdir():
            child.unlink()
        sub.rmdir()  # rm -rf /run/chopper under a running agent
        assert keeper.check() is True and keeper.check() is False
        assert stat.S_IMODE(os.stat(sub / "a.sock").st_mode) == 0o660
        with grpc.insecure_channel(f"unix://{sub / 'a.sock'}") as channel:  # a trainer that starts now
            assert agent_pb2_grpc.AgentStub(channel).GetInfo(pb.GetInfoRequest(), timeout=5).node == "n1"
        assert r.stub.GetInfo(pb.GetInfoRequest(), timeout=5).node == "n1"  # the old connection still works
        (sub / "a.sock").unlink()  # removed again: the new spare replaces the first, not beside it
        assert keeper.check() is True and len(r.server.spares) == 1
        assert "chopper_agent_socket_recreated_total{node=\"n1\"} 2.0" in r.registry.render().decode()
    finally:
        r.stop()


@pytest.mark.hazard(item=1, input="a regular file put at socket_path while the agent runs (its socket removed)",
                    promise="the agent serving its socket again never removes what is not a stale socket")
def test_keeper_leaves_a_file_put_at_the_socket_path(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                     hazard: HazardOutcome) -> None:
    r = RunningAgent(tmp_path)
    keeper = keeper_of(r)
    sock = Path(r.settings.socket_path)
    try:
        sock.unlink()
        sock.write_bytes(b"x" * 4096)  # someone's file, where the socket was
        assert keeper.check() is False and keeper.check() is False
        assert sock.read_bytes() == b"x" * 4096
        warnings = [rec.getMessage() for rec in caplog.records if "event=socket_not_recreated" in rec.getMessage()]
        assert len(warnings) == 1 and "is a regular file of 4096 bytes, not a socket" in warnings[0]
        sock.unlink()  # the operator moves it away: served again
        assert keeper.check() is True and stat.S_ISSOCK(os.lstat(sock).st_mode)
        hazard.outcome = ("file of 4,096 bytes kept byte for byte over 2 checks, 1 warning naming it; once moved "
                          "away the socket was served again")
    finally:
        r.stop()


def test_stop_removes_the_socket_and_nothing_else(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sock = tmp_path / "a.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(sock))
    remove_socket(str(sock))
    assert not sock.exists()
    remove_socket(str(sock))  # already gone: nothing to do, nothing said
    sock.write_bytes(b"someone's file")  # put where the socket was while the agent ran
    link = tmp_path / "link.sock"
    link.symlink_to(sock)
    with caplog.at_level(logging.WARNING):
        remove_socket(str(sock))
        remove_socket(str(link))
    assert sock.read_bytes() == b"someone's file" and link.is_symlink()
    assert [r.getMessage().split()[0] for r in caplog.records] == ["event=socket_path_replaced"] * 2
