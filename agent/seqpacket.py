"""A unix ``SOCK_SEQPACKET`` socket for trainers, served by one selector thread until ``stop()``.

The agent's sockets beside gRPC (``agent.marker_socket``, ``agent.control_socket``) share this:
gRPC's sync server keeps a worker thread for every open stream, and a trainer keeps its streams
open for its whole life; here one thread serves every connection, waiting in ``select`` with no
timeout (it wakes only for connections and for ``stop()``), and a connection is an fd and a few
hundred bytes.

What this class does for each: the socket file is bound owner-only and then given the file mode
and group of the gRPC socket (``agent.unix_socket``); connections take slots of a
``StreamSlots`` of ``MAX_CONNECTIONS``, keyed by the peer's process id (``SO_PEERCRED``), one
over closed at once (``too_many_streams``, ``streams_per_client``); open connections count as
open streams of the RPC the socket stands beside (``RPC``: ``Agent.open_streams``), refusals in
``chopper_agent_rpc_refused_total{rpc, reason}``. A subclass names that RPC, its
``TRANSPORT`` (for logs) and its thread, and says what a connection holds (``_open``), how a
readable one is read (``_read``), what its close undoes (``_closed``) and what follows a turn of
the loop (``_after_turn``).
"""
from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.config import AgentSettings
from agent.unix_socket import UNIX_PATH_MAX_BYTES, owner_only, prepare_socket_path, remove_socket, share_socket
from chopper.daemon.logs import LogGate
from chopper.daemon.ratelimit import StreamSlots
from chopper.daemon.serving import STREAM_SHARE

log = logging.getLogger(__name__)

# Connections open at once (each an fd and a few hundred bytes here; no thread).
MAX_CONNECTIONS = 1024
# Connections waiting to be accepted.
BACKLOG = 128
REFUSAL_LOG_INTERVAL_S = 10.0
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_WAKE = "wake"  # the selector key data of stop()'s wake-up socket


@dataclass
class Connection:
    """One trainer's connection: its socket (non-blocking) and process id (-1 when the kernel does not say)."""

    sock: socket.socket
    pid: int


class SeqpacketServer:
    """Serves a ``SOCK_SEQPACKET`` socket at ``path`` on a thread of its own (module docstring).

    Args:
        agent: The agent whose counters the connections share (``open_streams``, ``refusals``).
        path: The socket file.
        settings: ``socket_mode`` and ``socket_group`` are used.

    Raises:
        agent.unix_socket.SocketPathError, agent.unix_socket.SocketInUse: as for the gRPC socket
            (``prepare_socket_path``); ConfigError: the socket cannot be given ``socket_group``.
    """

    RPC = ""  # the RPC the socket stands beside: the ``rpc`` label of its counters
    TRANSPORT = ""  # its name in logs
    THREAD_NAME = ""

    def __init__(self, agent: Any, path: Path, settings: AgentSettings) -> None:
        self.agent = agent
        self.path = path
        self.slots = StreamSlots(MAX_CONNECTIONS, max(1, int(MAX_CONNECTIONS * STREAM_SHARE)))
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._log_gate = LogGate(REFUSAL_LOG_INTERVAL_S)
        prepare_socket_path(self.path, socket.SOCK_SEQPACKET, UNIX_PATH_MAX_BYTES)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with owner_only():
                self._listener.bind(str(self.path))
        except BaseException:
            self._listener.close()  # the path is not ours: leave whatever is there
            raise
        try:
            share_socket(self.path, settings)
            self._listener.listen(BACKLOG)
        except BaseException:
            self._listener.close()
            remove_socket(str(self.path))
            raise
        self._listener.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        # stop() writes a byte here, so the thread can wait in select with no timeout (no wake-ups while idle).
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._thread = threading.Thread(target=self._run, name=self.THREAD_NAME, daemon=True)

    def start(self) -> SeqpacketServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving: open connections are closed (their trainers reconnect) and the socket file removed."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")
        self._thread.join(timeout=5.0)
        for key in list(self._selector.get_map().values()):
            if isinstance(key.data, Connection):
                self._close(key.data)
        self._selector.close()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
        remove_socket(str(self.path))

    @property
    def connections(self) -> int:
        """Connections open on the socket now."""
        return self.slots.open

    # -- what a subclass says ----------------------------------------------------------------

    def _open(self, sock: socket.socket, pid: int) -> Connection:
        """The connection of an accepted trainer."""
        return Connection(sock, pid)

    def _read(self, conn: Any) -> int:
        """Read a readable connection; returns how many datagrams were read."""
        raise NotImplementedError

    def _closed(self, conn: Any) -> None:
        """Undo what the connection held, as it is closed."""

    def _after_turn(self, busiest: int) -> None:
        """After a turn of the loop in which no connection gave more than ``busiest`` datagrams."""

    # -- the loop ------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                ready = self._selector.select()
            except OSError as exc:  # only a selector closed under us; never let the thread die silently
                log.warning("event=%s_select_failed error=%r", self.TRANSPORT, str(exc))
                time.sleep(1.0)
                continue
            busiest = 0
            for key, _ in ready:
                conn = key.data
                try:
                    if conn is None:
                        self._accept()
                    elif isinstance(conn, Connection):
                        busiest = max(busiest, self._read(conn))
                except Exception as exc:  # one trainer's trouble must not stop the others'
                    log.warning("event=%s_error error=%r", self.TRANSPORT, f"{type(exc).__name__}: {exc}")
                    if isinstance(conn, Connection):
                        self._close(conn)
            if not self._stop.is_set():
                self._after_turn(busiest)

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError as exc:  # out of descriptors: the trainer retries, over gRPC meanwhile
            self._log_once("accept", "event=%s_accept_failed error=%r", self.TRANSPORT, exc.strerror)
            return
        pid = _peer_pid(sock)
        refused = self.slots.acquire(pid)
        if refused:
            self.agent.refusals.rpc(self.RPC, refused)
            self._log_refused(refused, pid)
            sock.close()
            return
        sock.setblocking(False)
        conn = self._open(sock, pid)
        self.agent.count(self.agent.open_streams, self.RPC)
        self._selector.register(sock, selectors.EVENT_READ, conn)

    def _refuse(self, conn: Connection, reason: str) -> None:
        """Count and log a refusal of what ``conn`` sent (the connection stays unless the caller closes it)."""
        self.agent.refusals.rpc(self.RPC, reason)
        self._log_refused(reason, conn.pid)

    def _log_refused(self, reason: str, pid: int) -> None:
        self._log_once(reason, "event=rpc_refused rpc=%s reason=%s client=pid:%d transport=%s", self.RPC, reason, pid,
                       self.TRANSPORT)

    def _close(self, conn: Connection) -> None:
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            return  # closed already
        self._closed(conn)  # before the socket closes: what it held may still write to it until undone
        conn.sock.close()
        self.slots.release(conn.pid)
        self.agent.count(self.agent.open_streams, self.RPC, -1)

    def _log_once(self, key: str, message: str, *args: Any) -> None:
        """Log ``message`` at most once per ``REFUSAL_LOG_INTERVAL_S`` for ``key``."""
        if self._log_gate.due(key):
            log.warning(message, *args)


def _peer_pid(sock: socket.socket) -> int:
    """The connecting process's id (``SO_PEERCRED``), -1 when the kernel does not say."""
    try:
        pid, _, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    except OSError as exc:
        if exc.errno not in (errno.ENOPROTOOPT, errno.EINVAL):
            raise
        return -1
    return pid
