"""The marker socket: trainers' marker batches over a unix ``SOCK_SEQPACKET`` socket beside gRPC.

Why. gRPC's sync server hands every message of a stream between three threads (its poller, the
stream's worker, the C core's) and keeps a worker thread per open stream: about 100 µs of agent
CPU a message whatever its size, and ~170 KiB a stream (``docs/PERFORMANCE.md``). A trainer's
markers are one-way and local, which is what a unix socket that keeps message boundaries is for
(Dynolog's IPC fabric takes its trainers' messages the same way).

Protocol, at ``chopper.schema.marker_socket_path(socket_path)`` (``<socket_path>.markers``): a
trainer connects, sends each ``MarkerBatch`` as one datagram of its wire bytes (the messages of
``PushMarkers``, either form), and at the end shuts its side down; the agent answers that with one
datagram, the stream's ``PushMarkersResponse``, and closes. The kernel keeps each connection's
datagrams in order and blocks a sender whose queue is full, so nothing is lost between the two
and a slow agent paces its trainers. The socket has the file mode and group of the gRPC socket.

One thread (``chopper-markers``) serves every connection: a selector, with no timeout (it wakes
only for them and for ``stop()``), over the listening socket and the connections. A readable
connection gives up to ``READS_PER_TURN`` datagrams a turn, each read into one reused buffer of
``max_message_bytes`` (resident only as far as datagrams have reached into it) and parsed, then
taken in by ``agent.marker_streams.MarkerStreams`` exactly as a ``PushMarkers`` message is.

Wake-ups are coalesced: with ``COALESCE_CONNECTIONS`` or more trainers connected, after a light
turn (no connection had more than ``LIGHT_TURN`` datagrams waiting) the thread sleeps
``COALESCE_S`` before it selects again, so that the datagrams of many trainers arriving one by one
are read in one wake-up rather than one each (with fewer, a wake-up holds about one datagram
either way). A wake-up, not a datagram, is most of what a light load costs: code that runs
rarely runs from cold caches, and on the 2-core VM of docs/PERFORMANCE.md taking in a batch of 4
markers cost 0.3 ms of CPU when the thread woke for it alone (20 times a second), against about
0.06 ms in a busy loop. A busy turn goes straight on, so a flood is read at full speed; a sender
whose connection queue (``net.unix.max_dgram_qlen``, 10 by default) fills meanwhile waits in the
kernel, in its own sender thread, never in the training loop. Markers reach the agent at most
``COALESCE_S`` later, well inside what waits on them (step summaries every 0.5 s, subscribers
every 0.25 s: ``agent.daemon``, ``agent.server``). The bound is the simulated backend's: it lays
markers on its GPUs' timelines as they come, so markers that arrive after it sampled past them
are missing from its samples (0.1 s did that often, and 20 ms now and then on a loaded machine,
to the few trainers of the tests and the demo, which is why they are not coalesced).

Limits, as on gRPC (``chopper.daemon.access``), counted in ``chopper_agent_rpc_refused_total``
under ``rpc="PushMarkers"``: a datagram over ``max_message_bytes`` is ``too_large``, one beyond
the connection's ``rate_limit_messages_per_s`` bucket ``rate_limited``; either is dropped alone
(the connection stays, the agent counts the gap in the batches' ``seq``). Connections take slots of
a ``StreamSlots`` of ``MAX_CONNECTIONS``, keyed by the peer's process id (``SO_PEERCRED``);
one over is closed at once (``too_many_streams``, ``streams_per_client``). A datagram that is not
a ``MarkerBatch`` counts in ``chopper_agent_messages_undecodable_total{method="PushMarkers"}``
and is dropped.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from agent.config import AgentSettings
from agent.marker_streams import MarkerStreams
from agent.unix_socket import UNIX_PATH_MAX_BYTES, owner_only, prepare_socket_path, remove_socket, share_socket
from chopper.daemon.ratelimit import RateLimiter, StreamSlots, TokenBucket
from chopper.daemon.serving import STREAM_SHARE
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.schema import marker_socket_path

log = logging.getLogger(__name__)

# Connections open at once (each an fd and a few hundred bytes here; no thread).
MAX_CONNECTIONS = 1024
# Datagrams read from one connection before the others get their turn.
READS_PER_TURN = 64
# A turn in which no connection gave more datagrams than this is light: the thread then sleeps COALESCE_S.
# Below half the kernel's default queue of a connection (net.unix.max_dgram_qlen = 10), so a sender
# that fills its queue in one sleep makes the next turn busy.
LIGHT_TURN = 4
COALESCE_S = 0.02
# Trainers connected from which wake-ups are coalesced (module docstring).
COALESCE_CONNECTIONS = 8
# Connections waiting to be accepted.
BACKLOG = 128
REFUSAL_LOG_INTERVAL_S = 10.0
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_WAKE = "wake"  # the selector key data of stop()'s wake-up socket


@dataclass
class _Connection:
    """One trainer's stream on the marker socket."""

    sock: socket.socket
    pid: int
    bucket: TokenBucket | None
    response: Any = field(default_factory=pb.PushMarkersResponse)


class MarkerSocket:
    """Serves ``marker_socket_path(settings.socket_path)`` on a thread of its own until ``stop()``.

    Args:
        markers: Takes each batch in (shared with the gRPC servicer, so both count and log alike).
        settings: ``socket_path``, ``socket_mode``, ``socket_group``, ``max_message_bytes`` and
            ``rate_limit_messages_per_s`` are used.

    Raises:
        agent.unix_socket.SocketPathError, agent.unix_socket.SocketInUse: as for the gRPC socket
            (``prepare_socket_path``); ConfigError: the socket cannot be given ``socket_group``.
    """

    def __init__(self, markers: MarkerStreams, settings: AgentSettings) -> None:
        self.markers = markers
        self.agent = markers.agent
        self.path = Path(marker_socket_path(settings.socket_path))
        self.slots = StreamSlots(MAX_CONNECTIONS, max(1, int(MAX_CONNECTIONS * STREAM_SHARE)))
        self._messages = RateLimiter(settings.rate_limit_messages_per_s)
        # Anonymous memory the kernel maps on first touch: only as much of it is resident as the largest
        # datagram read so far (a few KiB for batches of markers), not the 4 MiB a bytearray zero-fills.
        self._buffer = mmap.mmap(-1, settings.max_message_bytes)
        self._view = memoryview(self._buffer)
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._last_log: dict[str, float] = {}
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
        self._thread = threading.Thread(target=self._run, name="chopper-markers", daemon=True)

    def start(self) -> MarkerSocket:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving: open streams are closed (their trainers reconnect) and the socket file removed."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")
        self._thread.join(timeout=5.0)
        for key in list(self._selector.get_map().values()):
            if isinstance(key.data, _Connection):
                self._close(key.data)
        self._selector.close()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
        remove_socket(str(self.path))

    @property
    def connections(self) -> int:
        """Streams open on the socket now."""
        return self.slots.open

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                ready = self._selector.select()
            except OSError as exc:  # only a selector closed under us; never let the thread die silently
                log.warning("event=marker_socket_select_failed error=%r", str(exc))
                time.sleep(1.0)
                continue
            busiest = 0
            for key, _ in ready:
                conn = key.data
                try:
                    if conn is None:
                        self._accept()
                    elif isinstance(conn, _Connection):
                        busiest = max(busiest, self._read(conn))
                except Exception as exc:  # one trainer's trouble must not stop the others' markers
                    log.warning("event=marker_socket_error error=%r", f"{type(exc).__name__}: {exc}")
                    if isinstance(conn, _Connection):
                        self._close(conn)
            if busiest <= LIGHT_TURN and self.slots.open >= COALESCE_CONNECTIONS and not self._stop.is_set():
                time.sleep(COALESCE_S)  # module docstring: what arrives meanwhile is read in one wake-up

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError as exc:  # out of descriptors: the trainer retries, over gRPC meanwhile
            self._log_once("accept", "event=marker_socket_accept_failed error=%r", exc.strerror)
            return
        pid = _peer_pid(sock)
        refused = self.slots.acquire(pid)
        if refused:
            self.agent.refusals.rpc("PushMarkers", refused)
            self._log_once(refused, "event=rpc_refused rpc=PushMarkers reason=%s client=pid:%d transport=marker_socket",
                           refused, pid)
            sock.close()
            return
        sock.setblocking(False)
        conn = _Connection(sock, pid, self._messages.stream_bucket())
        self.agent.count(self.agent.open_streams, "PushMarkers")
        self._selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Connection) -> int:
        """Take in up to ``READS_PER_TURN`` datagrams of ``conn``; an end of stream is answered and closed.

        Returns:
            How many datagrams were read.
        """
        for read in range(READS_PER_TURN):
            try:
                size, _, flags, _ = conn.sock.recvmsg_into([self._view])
            except (BlockingIOError, InterruptedError):
                return read
            except OSError:  # reset by a trainer that died: what it sent before was read
                self._close(conn)
                return read
            if flags & socket.MSG_TRUNC:
                self._refuse(conn, "too_large")
                continue
            if size == 0:  # the trainer shut its side down (an empty datagram carries nothing either)
                self._answer(conn)
                return read
            if conn.bucket is not None and not conn.bucket.take(time.monotonic()):
                self._refuse(conn, "rate_limited")
                continue
            batch = pb.MarkerBatch()
            try:
                batch.ParseFromString(self._view[:size])  # type: ignore[arg-type]  # upb reads any buffer, no copy
            except DecodeError:
                self.agent.count(self.agent.undecodable, "PushMarkers")
                self._log_once("undecodable", "event=marker_socket_undecodable pid=%d size=%d", conn.pid, size)
                continue
            self.markers.take(batch, conn.response)
        return READS_PER_TURN

    def _answer(self, conn: _Connection) -> None:
        with contextlib.suppress(OSError):  # a trainer that left without waiting for it: nothing to tell
            conn.sock.send(conn.response.SerializeToString(), socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)
        self._close(conn)

    def _refuse(self, conn: _Connection, reason: str) -> None:
        self.agent.refusals.rpc("PushMarkers", reason)
        self._log_once(reason, "event=rpc_refused rpc=PushMarkers reason=%s client=pid:%d transport=marker_socket",
                       reason, conn.pid)

    def _close(self, conn: _Connection) -> None:
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            return  # closed already
        conn.sock.close()
        self.slots.release(conn.pid)
        self.agent.count(self.agent.open_streams, "PushMarkers", -1)

    def _log_once(self, key: str, message: str, *args: Any) -> None:
        """Log ``message`` at most once per ``REFUSAL_LOG_INTERVAL_S`` for ``key``."""
        now = time.monotonic()
        if now - self._last_log.get(key, -REFUSAL_LOG_INTERVAL_S) >= REFUSAL_LOG_INTERVAL_S:
            self._last_log[key] = now
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
