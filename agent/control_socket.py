"""The control socket: trainers' ``Control`` streams as unix ``SOCK_SEQPACKET`` connections beside gRPC.

Why. A training process holds its ``Control`` stream (``chopper capture``, docs/CAPTURE.md) for
its whole life, silent unless a capture is asked for, and gRPC's sync server keeps a worker thread
for every open stream: 64 trainers held 63 of the agent's threads and about 3 MiB of its memory
(docs/PERFORMANCE.md). Here one thread (``chopper-control``, ``agent.seqpacket``) holds every
trainer's stream, and wakes only when one connects, says hello or leaves.

Protocol, at ``chopper.schema.control_socket_path(socket_path)`` (``<socket_path>.control``): a
trainer connects and sends one datagram, its ``ControlHello``; the agent sends each
``ControlCommand`` for it as one datagram, as the gRPC stream would yield it; the stream ends when
either side closes. The trainer sends nothing after its hello. The socket has the file mode and
group of the gRPC socket.

Connections take slots as on the marker socket, refused ones counted in
``chopper_agent_rpc_refused_total{rpc="Control"}`` (``too_many_streams``,
``streams_per_client``). A first datagram that is not a ``ControlHello`` with a job, or any
datagram after it, counts in ``chopper_agent_messages_undecodable_total{method="Control"}`` and
closes the connection. A command that cannot be sent at once (the trainer stopped reading, its
queue full) is lost like one sent to a process that died: the capture waits for that rank until
its timeout.
"""
from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import DecodeError

from agent.capture import Listener
from agent.config import AgentSettings
from agent.daemon import Agent
from agent.seqpacket import Connection, SeqpacketServer
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.schema import control_socket_path

log = logging.getLogger(__name__)

# A ControlHello is a job name, a rank and a pid: well under this.
HELLO_MAX_BYTES = 4096


class _Commands:
    """A stream's ``CommandSink``: each command one datagram on the trainer's connection, never blocking."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def put(self, command: pb.ControlCommand) -> None:
        try:
            self._sock.send(command.SerializeToString(), socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)
        except OSError as exc:  # gone, or not reading: the capture waits for this rank until its timeout
            log.warning("event=control_command_lost error=%r", exc.strerror)


@dataclass
class _ControlStream(Connection):
    """One trainer's ``Control`` stream: None until its hello."""

    listener: Listener | None = None


class ControlSocket(SeqpacketServer):
    """Serves ``control_socket_path(settings.socket_path)`` on a thread of its own until ``stop()``.

    Args:
        agent: The agent whose ``captures`` the streams attach to.
        settings: ``socket_path``, ``socket_mode`` and ``socket_group`` are used.

    Raises:
        As ``agent.seqpacket.SeqpacketServer``.
    """

    RPC = "Control"
    TRANSPORT = "control_socket"
    THREAD_NAME = "chopper-control"

    def __init__(self, agent: Agent, settings: AgentSettings) -> None:
        super().__init__(agent, Path(control_socket_path(settings.socket_path)), settings)

    def _open(self, sock: socket.socket, pid: int) -> _ControlStream:
        return _ControlStream(sock, pid)

    def _read(self, conn: _ControlStream) -> int:
        """The hello attaches the stream; the end of the stream, or anything else, closes it."""
        try:
            data = conn.sock.recv(HELLO_MAX_BYTES)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:  # reset by a trainer that died
            self._close(conn)
            return 0
        if not data:
            self._close(conn)
            return 0
        hello = None if conn.listener is not None else _hello(data)
        if hello is None:
            self.agent.count(self.agent.undecodable, self.RPC)
            self._log_once("undecodable", "event=control_socket_undecodable pid=%d size=%d after_hello=%s", conn.pid,
                           len(data), conn.listener is not None)
            self._close(conn)
            return 1
        conn.listener = self.agent.captures.attach(hello.job, hello.rank, hello.pid, _Commands(conn.sock))
        return 1

    def _closed(self, conn: _ControlStream) -> None:
        if conn.listener is not None:
            self.agent.captures.detach(conn.listener)


def _hello(data: bytes) -> pb.ControlHello | None:
    """``data`` as a ``ControlHello`` that names its job; None when it is not one."""
    hello = pb.ControlHello()
    try:
        hello.ParseFromString(data)
    except DecodeError:
        return None
    return hello if hello.job else None
