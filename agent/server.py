"""The agent's gRPC surface: a thin servicer over ``agent.daemon.Agent``, plus health.

Servicers only decode and encode; logic lives in ``Agent``. Every method the ``.proto`` declares
is registered through ``chopper.daemon.grpc_decode.checked_service``, so a garbled message is
counted (``chopper_agent_messages_undecodable_total{method}``) and answered with a clear
``INVALID_ARGUMENT`` before the servicer sees it, instead of gRPC's generic internal error. The
server listens on a unix socket (for trainers; its life is ``agent.unix_socket``) and optionally
on TCP, over TLS or mutual TLS when configured. Every RPC passes ``chopper.daemon.access``: size
and per-client rate limits, and a bearer token for ``RequestCapture`` when ``token_file`` is set
(docs/SECURITY.md).
"""
from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import grpc

from agent.capture import CaptureBusy, CaptureError, CaptureInvalid, CaptureNotFound
from agent.config import AgentSettings
from agent.daemon import Agent
from agent.marker_streams import MarkerStreams
from agent.unix_socket import prepare_socket_path, serve_socket
from agent.wire import length_delimited
from chopper.daemon.grpc_decode import checked_service
from chopper.daemon.serving import SecureServer, server_tls
from chopper.proto.chopper.v1 import agent_pb2 as pb

log = logging.getLogger(__name__)

AGENT_SERVICE = pb.DESCRIPTOR.services_by_name["Agent"]
SERVICE = AGENT_SERVICE.full_name
# What a refusal of a garbled message tells the client to do, by method.
GARBLED_FIXES = {"PushMarkers": "send markers with the chopper client of a matching version"}
# GetInfo's request has no fields: whatever bytes it brings are served, not refused.
UNREAD_REQUESTS = frozenset({"GetInfo"})
# Long-lived trainer and subscriber streams each hold a worker thread.
MAX_WORKERS = 256
READ_LIMIT = 4096
# TelemetryBatch's repeated fields by name, their field numbers (Subscribe frames them itself).
_BATCH_FIELDS = {f.name: f.number for f in pb.TelemetryBatch.DESCRIPTOR.fields}
IDLE_WAIT_S = 0.5
# Each streamed message costs gRPC far more than its items do (it wakes the stream's worker, the
# server's poller and the C core's threads): coalesce ticks into batches this far apart (adds at most
# this much latency). At 8 GPUs and 10 Hz with one subscriber, 0.25 s rather than 0.05 s took the
# agent from 3.3-3.5 % to 2.8-2.9 % of a core, and 1 s rather than 0.25 s from 1.12 % to 0.99 %
# (benchmarks/bench_agent_cpu.py: the stream's threads 3.1 -> 1.7 ms of CPU a second); samples are
# filed every 0.1 s and summaries made every second (agent.daemon), so a subscriber sees them at most
# this much later, as a dashboard refreshing each second would anyway.
BATCH_INTERVAL_S = 1.0
# How often subscribers of step summaries are sent where the ranks are (docs/HANGS.md), s.
POSITIONS_INTERVAL_S = 1.0


class TelemetryHub:
    """Wakes subscribers when new telemetry is buffered, without losing a wake-up."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.generation = 0

    def notify(self) -> None:
        with self._cond:
            self.generation += 1
            self._cond.notify_all()

    def wait(self, seen_generation: int, timeout: float) -> None:
        with self._cond:
            if self.generation == seen_generation:
                self._cond.wait(timeout)


class AgentServicer:
    """Implements ``chopper.v1.Agent`` over an ``Agent``."""

    def __init__(self, agent: Agent, hub: TelemetryHub, markers: MarkerStreams | None = None) -> None:
        self.agent = agent
        self.hub = hub
        self.markers = markers if markers is not None else MarkerStreams(agent)

    def PushMarkers(self, requests: Iterator[Any], context: grpc.ServicerContext) -> pb.PushMarkersResponse:
        response = pb.PushMarkersResponse()
        with self.markers.open():
            for batch in requests:
                self.markers.take(batch, response)
        return response

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> pb.AgentInfo:
        return self.agent.info()

    def Subscribe(self, request: Any, context: grpc.ServicerContext) -> Iterator[bytes]:
        """Batches of what the buffers hold from the request's cursors on, as ``TelemetryBatch`` wire bytes."""
        agent = self.agent
        since = request.since_ns
        streams = [
            (field, buf, buf.first_seq_at_or_after(key, since) if since > 0 else buf.next_seq)
            for wanted, field, buf, key in (
                (request.samples, "samples", agent.samples, lambda s: s.ts_ns),
                (request.markers, "markers", agent.markers, lambda r: r.marker.ts_ns),
                # Inspector collectives come with the markers: both are what the job did.
                (request.markers, "collectives", agent.collectives, lambda c: c.end_ns),
                (request.step_summaries, "step_summaries", agent.summaries, lambda s: s.end_ns),
            )
            if wanted
        ]
        if not streams:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "subscribe to at least one of samples, markers, step_summaries"
            )
        cursors = [cursor for _, _, cursor in streams]
        missed_total = 0
        # A follower of step summaries learns where the ranks are, to say where a job that stopped stepping waits.
        positions_due = time.monotonic() if request.step_summaries else math.inf
        agent.count(agent.open_streams, "Subscribe")
        try:
            while context.is_active():
                generation = self.hub.generation
                # The buffers hold their items encoded: framed into the batch's wire form as they are
                # (agent.wire), never decoded and encoded again for each subscriber.
                framed = []
                backlog = False
                for i, (field, buf, _) in enumerate(streams):
                    items, cursors[i], missed = buf.read_held(cursors[i], READ_LIMIT)
                    missed_total += missed
                    backlog |= len(items) == READ_LIMIT
                    if items:
                        framed.append(length_delimited(_BATCH_FIELDS[field], items))
                head = pb.TelemetryBatch()
                if time.monotonic() >= positions_due:
                    positions_due = time.monotonic() + POSITIONS_INTERVAL_S
                    head.positions.extend(agent.rank_positions())
                if framed or head.positions:
                    head.missed_total = missed_total
                    yield head.SerializeToString() + b"".join(framed)
                    if not backlog:  # catching up on a replay goes full speed
                        time.sleep(BATCH_INTERVAL_S)
                else:
                    self.hub.wait(generation, IDLE_WAIT_S)
        finally:
            agent.count(agent.open_streams, "Subscribe", -1)

    def Control(self, request: Any, context: grpc.ServicerContext) -> Iterator[pb.ControlCommand]:
        if not request.job:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "ControlHello needs the job name")
        agent = self.agent
        commands: queue.Queue[pb.ControlCommand | None] = queue.Queue()
        listener = agent.captures.attach(request.job, request.rank, request.pid, commands)
        agent.count(agent.open_streams, "Control")
        # The end of the call (the process went away, or the server stops) wakes the wait with None,
        # so a stream that gets no command costs no wake-ups: a timed wait here woke one thread per
        # training process twice a second.
        ended = not context.add_callback(lambda: commands.put(None))  # False: it ended already
        try:
            while not ended and context.is_active():
                command = commands.get()
                if command is None:
                    return
                yield command
        finally:
            agent.captures.detach(listener)
            agent.count(agent.open_streams, "Control", -1)

    def RequestCapture(self, request: Any, context: grpc.ServicerContext) -> pb.CaptureReply:
        codes: dict[type[CaptureError], grpc.StatusCode] = {
            CaptureNotFound: grpc.StatusCode.NOT_FOUND,
            CaptureBusy: grpc.StatusCode.FAILED_PRECONDITION,
            CaptureInvalid: grpc.StatusCode.INVALID_ARGUMENT,
        }
        try:
            reply = self.agent.captures.request(request)
        except CaptureError as exc:
            context.abort(codes.get(type(exc), grpc.StatusCode.INVALID_ARGUMENT), str(exc))
        log.info("event=capture_done job=%s id=%s ranks=%d missing=%s", request.job, reply.capture_id,
                 len(reply.results), list(reply.missing_ranks))
        return reply

    def ReportCapture(self, request: Any, context: grpc.ServicerContext) -> pb.CaptureAck:
        self.agent.captures.report(request)
        return pb.CaptureAck()


# RPCs that make the agent act on trainers (profile, write files): a bearer token guards them when
# token_file is set. Trainers' own RPCs (PushMarkers, Control, ReportCapture) are guarded by the
# unix socket's mode and group instead.
TOKEN_RPCS = frozenset({"RequestCapture"})


def build_server(agent: Agent, hub: TelemetryHub, settings: AgentSettings,
                 markers: MarkerStreams | None = None) -> tuple[SecureServer, str]:
    """A started gRPC server on the unix socket (and TCP when configured, over TLS with ``tls_cert``), with health.

    The socket is created reachable by its owner only and only then given ``socket_group`` and
    ``socket_mode`` (``agent.unix_socket.serve_socket``), so no other user can connect in between.
    ``markers`` takes ``PushMarkers``' batches (one of its own when None; the agent's marker
    socket shares the one it is given, ``agent.marker_socket``).

    Returns:
        The server and the TCP address it bound (``grpc_listen``'s host with the port the socket
        got, so port 0 reads as the port picked), or "" without ``grpc_listen``.
    """
    handlers = checked_service(AGENT_SERVICE, AgentServicer(agent, hub, markers),
                               partial(agent.count, agent.undecodable), fixes=GARBLED_FIXES, unread=UNREAD_REQUESTS)
    server = SecureServer(
        [handlers], [SERVICE], agent.refusals, max_workers=MAX_WORKERS,
        max_message_bytes=settings.max_message_bytes, max_send_bytes=64 * 1024 * 1024,
        calls_per_s=settings.rate_limit_calls_per_s, messages_per_s=settings.rate_limit_messages_per_s,
        token_file=settings.token_file, token_rpcs=TOKEN_RPCS,
    )
    sock = Path(settings.socket_path)
    prepare_socket_path(sock)
    bound = ""
    if settings.grpc_listen:
        port = server.add_tcp(settings.grpc_listen, server_tls(settings), key="grpc_listen")
        bound = f"{settings.grpc_listen.rpartition(':')[0]}:{port}"
    serve_socket(server, sock, settings)
    return server, bound
