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

One thread (``chopper-markers``) serves every connection (``agent.seqpacket``: no thread and a
few hundred bytes per connection, slots and counters as on gRPC). A readable connection gives up
to ``READS_PER_TURN`` datagrams a turn, each read into one reused buffer of ``max_message_bytes``
(resident only as far as datagrams have reached into it) and parsed, then taken in by
``agent.marker_streams.MarkerStreams`` exactly as a ``PushMarkers`` message is.

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
``COALESCE_S`` later, well inside what waits on them (step summaries and subscribers' batches
every second: ``agent.daemon``, ``agent.server``). The bound was the simulated backend's, which
laid markers on its GPUs' timelines as they came, so markers that arrived after it sampled past
them were missing from its samples (0.1 s did that often, and 20 ms now and then on a loaded
machine, to the few trainers of the tests and the demo, which is why they are not coalesced); it
now runs behind the clock (``agent.backends.simulated.AGENT_LAG_S``).

Limits, as on gRPC (``chopper.daemon.access``), counted in ``chopper_agent_rpc_refused_total``
under ``rpc="PushMarkers"``: a datagram over ``max_message_bytes`` is ``too_large``, one beyond
the connection's ``rate_limit_messages_per_s`` bucket ``rate_limited``; either is dropped alone
(the connection stays, the agent counts the gap in the batches' ``seq``). A datagram that is not
a ``MarkerBatch`` counts in ``chopper_agent_messages_undecodable_total{method="PushMarkers"}``
and is dropped.
"""
from __future__ import annotations

import contextlib
import logging
import mmap
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from agent.config import AgentSettings
from agent.marker_streams import MarkerStreams
from agent.seqpacket import Connection, SeqpacketServer
from chopper.daemon.ratelimit import RateLimiter, TokenBucket
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.schema import marker_socket_path

log = logging.getLogger(__name__)

# Datagrams read from one connection before the others get their turn.
READS_PER_TURN = 64
# A turn in which no connection gave more datagrams than this is light: the thread then sleeps COALESCE_S.
# Below half the kernel's default queue of a connection (net.unix.max_dgram_qlen = 10), so a sender
# that fills its queue in one sleep makes the next turn busy.
LIGHT_TURN = 4
COALESCE_S = 0.02
# Trainers connected from which wake-ups are coalesced (module docstring).
COALESCE_CONNECTIONS = 8


@dataclass
class _Stream(Connection):
    """One trainer's stream on the marker socket."""

    bucket: TokenBucket | None = None
    response: Any = field(default_factory=pb.PushMarkersResponse)


class MarkerSocket(SeqpacketServer):
    """Serves ``marker_socket_path(settings.socket_path)`` on a thread of its own until ``stop()``.

    Args:
        markers: Takes each batch in (shared with the gRPC servicer, so both count and log alike).
        settings: ``socket_path``, ``socket_mode``, ``socket_group``, ``max_message_bytes`` and
            ``rate_limit_messages_per_s`` are used.

    Raises:
        As ``agent.seqpacket.SeqpacketServer``.
    """

    RPC = "PushMarkers"
    TRANSPORT = "marker_socket"
    THREAD_NAME = "chopper-markers"

    def __init__(self, markers: MarkerStreams, settings: AgentSettings) -> None:
        self.markers = markers
        self._messages = RateLimiter(settings.rate_limit_messages_per_s)
        # Anonymous memory the kernel maps on first touch: only as much of it is resident as the largest
        # datagram read so far (a few KiB for batches of markers), not the 4 MiB a bytearray zero-fills.
        self._buffer = mmap.mmap(-1, settings.max_message_bytes)
        self._view = memoryview(self._buffer)
        super().__init__(markers.agent, Path(marker_socket_path(settings.socket_path)), settings)

    def _open(self, sock: socket.socket, pid: int) -> _Stream:
        return _Stream(sock, pid, self._messages.stream_bucket())

    def _after_turn(self, busiest: int) -> None:
        if busiest <= LIGHT_TURN and self.slots.open >= COALESCE_CONNECTIONS:
            time.sleep(COALESCE_S)  # module docstring: what arrives meanwhile is read in one wake-up

    def _read(self, conn: _Stream) -> int:
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

    def _answer(self, conn: _Stream) -> None:
        with contextlib.suppress(OSError):  # a trainer that left without waiting for it: nothing to tell
            conn.sock.send(conn.response.SerializeToString(), socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)
        self._close(conn)
