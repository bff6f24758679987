"""The agent's gRPC surface: a thin servicer over ``agent.daemon.Agent``, plus health.

Servicers only decode and encode; logic lives in ``Agent``. Messages are decoded by our own
deserializers so that a garbled message is counted and answered with a clear
``INVALID_ARGUMENT`` instead of gRPC's generic internal error. The server listens on a unix
socket (for trainers; permission bits and group from the settings) and optionally on TCP, over
TLS or mutual TLS when configured. Every RPC passes ``chopper.daemon.access``: size and per-client rate
limits, and a bearer token for ``RequestCapture`` when ``token_file`` is set (docs/SECURITY.md).
"""
from __future__ import annotations

import contextlib
import grp
import logging
import math
import os
import queue
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from agent.capture import CaptureBusy, CaptureError, CaptureInvalid, CaptureNotFound
from agent.config import AgentSettings, ConfigError
from agent.daemon import Agent
from chopper.daemon.grpc_decode import Garbled, decoder
from chopper.daemon.serving import SecureServer, server_tls
from chopper.proto.chopper.v1 import agent_pb2 as pb

log = logging.getLogger(__name__)

SERVICE = "chopper.v1.Agent"
# Long-lived trainer and subscriber streams each hold a worker thread.
MAX_WORKERS = 256
READ_LIMIT = 4096
IDLE_WAIT_S = 0.5
# Each streamed message costs gRPC far more than its items do: coalesce ticks into batches this
# far apart (adds at most this much latency).
BATCH_INTERVAL_S = 0.05
REJECTION_LOG_INTERVAL_S = 10.0
# Unknown-device warnings (one per rank) let through per period; the rest are counted in the next line.
DEVICE_WARNINGS_PER_PERIOD = 20
DEVICE_WARNING_PERIOD_S = 60.0
# A live agent accepts at once; a hung one is not waited for longer than this at start.
PROBE_TIMEOUT_S = 2.0


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


class LogBudget:
    """Lets ``burst`` log lines through per ``period_s``; those held back are counted for the next one let through.

    Warnings that are once per rank (an unresolved GPU) are once per made-up rank under a flood of
    them: this keeps the log to a bounded rate while the counters on ``/metrics`` keep the totals.
    """

    def __init__(self, burst: int, period_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.period_s = period_s
        self._clock = clock
        self._lock = threading.Lock()
        self._window_start = -math.inf
        self._used = 0
        self._held = 0

    def take(self) -> int | None:
        """None when this line is to be held back; else the number held back since the last line let through."""
        with self._lock:
            now = self._clock()
            if now - self._window_start >= self.period_s:
                self._window_start, self._used = now, 0
            if self._used >= self.burst:
                self._held += 1
                return None
            self._used += 1
            held, self._held = self._held, 0
            return held


class AgentServicer:
    """Implements ``chopper.v1.Agent`` over an ``Agent``."""

    def __init__(self, agent: Agent, hub: TelemetryHub) -> None:
        self.agent = agent
        self.hub = hub
        self._last_rejection_log = 0.0
        self._last_field_log = 0.0
        self._device_log = LogBudget(DEVICE_WARNINGS_PER_PERIOD, DEVICE_WARNING_PERIOD_S)

    def PushMarkers(self, requests: Iterator[Any], context: grpc.ServicerContext) -> pb.PushMarkersResponse:
        agent = self.agent
        response = pb.PushMarkersResponse()
        agent.count(agent.open_streams, "PushMarkers")
        try:
            for batch in requests:
                if isinstance(batch, Garbled):
                    agent.count(agent.undecodable, "PushMarkers")
                    context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"message is not a chopper.v1.MarkerBatch ({batch.error}); send markers with the "
                        "chopper client of a matching version",
                    )
                result = agent.push_markers(batch)
                for warning in result.warnings:  # each once per rank and problem (agent.markers)
                    held = self._device_log.take()
                    if held is not None:
                        log.warning("event=unknown_device problem=%r held_back=%d", warning, held)
                response.accepted += len(result.accepted)
                rejected = sum(result.rejected.values())
                if rejected:
                    response.rejected += rejected
                    room = 8 - len(response.errors)
                    response.errors.extend(result.errors[: max(0, room)])
                    self._log_rejections(result.errors)
                if result.field_problems:
                    self._log_field_problems(result.field_problems)
        finally:
            agent.count(agent.open_streams, "PushMarkers", -1)
        return response

    def _log_rejections(self, errors: list[str]) -> None:
        now = time.monotonic()
        if errors and now - self._last_rejection_log >= REJECTION_LOG_INTERVAL_S:
            self._last_rejection_log = now
            log.warning("event=markers_rejected first=%r", errors[0])

    def _log_field_problems(self, problems: list[str]) -> None:
        now = time.monotonic()
        if now - self._last_field_log >= REJECTION_LOG_INTERVAL_S:
            self._last_field_log = now
            log.warning("event=marker_fields_dropped first=%r note='the markers were kept'", problems[0])

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> pb.AgentInfo:
        return self.agent.info()

    def Subscribe(self, request: Any, context: grpc.ServicerContext) -> Iterator[pb.TelemetryBatch]:
        if isinstance(request, Garbled):
            self.agent.count(self.agent.undecodable, "Subscribe")
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"message is not a chopper.v1.SubscribeRequest ({request.error})"
            )
        agent = self.agent
        since = request.since_ns
        streams = [
            (field, buf, buf.first_seq_at_or_after(key, since) if since > 0 else buf.next_seq)
            for wanted, field, buf, key in (
                (request.samples, "samples", agent.samples, lambda s: s.ts_ns),
                (request.markers, "markers", agent.markers, lambda r: r.marker.ts_ns),
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
        agent.count(agent.open_streams, "Subscribe")
        try:
            while context.is_active():
                generation = self.hub.generation
                batch = pb.TelemetryBatch()
                backlog = False
                for i, (field, buf, _) in enumerate(streams):
                    items, cursors[i], missed = buf.read(cursors[i], READ_LIMIT)
                    missed_total += missed
                    backlog |= len(items) == READ_LIMIT
                    getattr(batch, field).extend(items)
                if batch.samples or batch.markers or batch.step_summaries:
                    batch.missed_total = missed_total
                    yield batch
                    if not backlog:  # catching up on a replay goes full speed
                        time.sleep(BATCH_INTERVAL_S)
                else:
                    self.hub.wait(generation, IDLE_WAIT_S)
        finally:
            agent.count(agent.open_streams, "Subscribe", -1)

    def Control(self, request: Any, context: grpc.ServicerContext) -> Iterator[pb.ControlCommand]:
        if isinstance(request, Garbled):
            self.agent.count(self.agent.undecodable, "Control")
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"message is not a chopper.v1.ControlHello ({request.error})"
            )
        if not request.job:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "ControlHello needs the job name")
        agent = self.agent
        listener = agent.captures.attach(request.job, request.rank, request.pid)
        agent.count(agent.open_streams, "Control")
        try:
            while context.is_active():
                try:
                    # The timeout only lets the loop notice a client that went away.
                    yield listener.commands.get(timeout=IDLE_WAIT_S)
                except queue.Empty:
                    continue
        finally:
            agent.captures.detach(listener)
            agent.count(agent.open_streams, "Control", -1)

    def RequestCapture(self, request: Any, context: grpc.ServicerContext) -> pb.CaptureReply:
        if isinstance(request, Garbled):
            self.agent.count(self.agent.undecodable, "RequestCapture")
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"message is not a chopper.v1.CaptureRequest ({request.error})"
            )
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
        if isinstance(request, Garbled):
            self.agent.count(self.agent.undecodable, "ReportCapture")
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"message is not a chopper.v1.CaptureResult ({request.error})"
            )
        self.agent.captures.report(request)
        return pb.CaptureAck()


def _handlers(servicer: AgentServicer) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "PushMarkers": grpc.stream_unary_rpc_method_handler(
                servicer.PushMarkers, decoder(pb.MarkerBatch.FromString), pb.PushMarkersResponse.SerializeToString
            ),
            "GetInfo": grpc.unary_unary_rpc_method_handler(
                servicer.GetInfo, decoder(pb.GetInfoRequest.FromString), pb.AgentInfo.SerializeToString
            ),
            "Subscribe": grpc.unary_stream_rpc_method_handler(
                servicer.Subscribe, decoder(pb.SubscribeRequest.FromString), pb.TelemetryBatch.SerializeToString
            ),
            "Control": grpc.unary_stream_rpc_method_handler(
                servicer.Control, decoder(pb.ControlHello.FromString), pb.ControlCommand.SerializeToString
            ),
            "RequestCapture": grpc.unary_unary_rpc_method_handler(
                servicer.RequestCapture, decoder(pb.CaptureRequest.FromString), pb.CaptureReply.SerializeToString
            ),
            "ReportCapture": grpc.unary_unary_rpc_method_handler(
                servicer.ReportCapture, decoder(pb.CaptureResult.FromString), pb.CaptureAck.SerializeToString
            ),
        },
    )


class SocketInUse(RuntimeError):
    """Another live process already serves the unix socket path."""


class SocketPathError(ConfigError):
    """``socket_path`` cannot hold the agent's socket; the message names the path, the reason and the fix."""


# gRPC refuses a unix socket path of more than 107 bytes (sockaddr_un.sun_path holds 108 with its NUL).
# SocketKeeper binds a spare beside the path, at "<path>.spare-<n>" (chopper.daemon.serving), so the path
# keeps room for that suffix: n below a million.
UNIX_PATH_MAX_BYTES = 107
SPARE_SUFFIX_BYTES = len(".spare-999999")
MAX_SOCKET_PATH_BYTES = UNIX_PATH_MAX_BYTES - SPARE_SUFFIX_BYTES
_OTHER_PATH = "choose another socket_path (the default is /run/chopper/agent.sock)"


def prepare_socket_path(path: Path) -> None:
    """Make ``path`` ready for the agent to bind its socket, or say why it cannot be.

    1. The path must fit a unix socket address (``MAX_SOCKET_PATH_BYTES``).
    2. Its directory is created if missing, and must be a directory the agent's user can create
       files in.
    3. What is at the path is looked at without following a symbolic link (``lstat``). Nothing:
       ready. A socket: the agent connects to it; only a refused connection (nobody listens: a
       dead agent's leftover) lets it remove the file, and only if the path still names that same
       socket. A listening socket is another live agent's. Anything else (a regular file, a
       directory, a link, a FIFO or device) is never touched: start-up fails naming what is there.

    Raises:
        SocketPathError: The path is too long, its directory is unusable, or something other than
            a stale socket is there.
        SocketInUse: A live process serves the socket.
    """
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH_BYTES:
        raise SocketPathError(
            f"socket_path: {str(path)[:60]!r}... is {size} bytes; a unix socket path holds at most "
            f"{MAX_SOCKET_PATH_BYTES} here ({UNIX_PATH_MAX_BYTES} bytes less room for the spare the agent binds beside "
            f"it); {_OTHER_PATH}, or a shorter directory")
    _prepare_directory(path.parent)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise SocketPathError(f"socket_path: cannot look at {path} ({exc.strerror}); {_OTHER_PATH}") from None
    if not stat.S_ISSOCK(st.st_mode):
        what, fix = _describe(path, st)
        raise SocketPathError(f"socket_path: {path} is {what}, not a socket; the agent replaces only a stale socket "
                              f"and has left it untouched. {fix}")
    if _listening(path):
        raise SocketInUse(f"socket_path: {path} is served by another running agent; stop it or choose another path")
    try:
        current = os.lstat(path)
        if (current.st_dev, current.st_ino) == (st.st_dev, st.st_ino):  # still the socket that refused
            os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise SocketPathError(f"socket_path: {path} is a stale socket (nobody listens) that the agent cannot remove "
                              f"({exc.strerror}); remove it as its owner, or {_OTHER_PATH}") from None


def _prepare_directory(directory: Path) -> None:
    """Create the socket's directory if missing; it must be a directory the agent's user can write."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise SocketPathError(
            f"socket_path: its directory {directory} cannot be made: a file that is not a directory is in the way on "
            f"that path; {_OTHER_PATH}") from None
    except OSError as exc:
        raise SocketPathError(
            f"socket_path: cannot create its directory {directory} ({exc.strerror}); create it writable by the "
            f"agent's user (deploy/systemd does with RuntimeDirectory=chopper), or {_OTHER_PATH}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise SocketPathError(
            f"socket_path: the agent's user (uid {os.getuid()}) cannot create its socket in {directory}; make that "
            f"directory writable by the user (or its group), or {_OTHER_PATH}")


def _describe(path: Path, st: os.stat_result) -> tuple[str, str]:
    """What a non-socket file at ``path`` is ('a regular file of 5 bytes'), and the fix to offer."""
    mode = st.st_mode
    fix = f"Move it away yourself if it is not needed, or {_OTHER_PATH}"
    if stat.S_ISLNK(mode):
        try:
            return f"a symbolic link to {os.readlink(path)!r} (links are not followed)", fix
        except OSError:
            return "a symbolic link (links are not followed)", fix
    if stat.S_ISDIR(mode):
        return "a directory", f"Name the socket file inside it (e.g. {path / 'agent.sock'}), or {_OTHER_PATH}"
    if stat.S_ISREG(mode):
        return f"a regular file of {st.st_size} bytes", fix
    if stat.S_ISFIFO(mode):
        return "a FIFO", fix
    return ("a device file" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else f"a file of mode {mode:o}"), fix


def _listening(path: Path) -> bool:
    """Whether a process accepts connections on the unix socket ``path``.

    Only a refused connection means nobody listens. Any other failure (a full backlog, a socket
    this user may not connect to) cannot tell, so it is not taken as stale.

    Raises:
        SocketPathError: The connection failed for another reason than a refusal.
    """
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(PROBE_TIMEOUT_S)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        return False
    except OSError as exc:
        raise SocketPathError(
            f"socket_path: {path} is a socket the agent cannot connect to ({exc.strerror or exc}), so it cannot tell "
            f"whether another process serves it; stop that process or remove the socket as its owner, or "
            f"{_OTHER_PATH}") from None
    finally:
        probe.close()
    return True


# RPCs that make the agent act on trainers (profile, write files): a bearer token guards them when
# token_file is set. Trainers' own RPCs (PushMarkers, Control, ReportCapture) are guarded by the
# unix socket's mode and group instead.
TOKEN_RPCS = frozenset({"RequestCapture"})


def build_server(agent: Agent, hub: TelemetryHub, settings: AgentSettings) -> SecureServer:
    """A started gRPC server on the unix socket (and TCP when configured, over TLS with ``tls_cert``), with health.

    The socket is created under umask 0177 (owner only) and only then given ``socket_group`` and
    ``socket_mode``, so no other user can connect in between.
    """
    server = SecureServer(
        [_handlers(AgentServicer(agent, hub))], [SERVICE], agent.refusals, max_workers=MAX_WORKERS,
        max_message_bytes=settings.max_message_bytes, max_send_bytes=64 * 1024 * 1024,
        calls_per_s=settings.rate_limit_calls_per_s, messages_per_s=settings.rate_limit_messages_per_s,
        token_file=settings.token_file, token_rpcs=TOKEN_RPCS,
    )
    sock = Path(settings.socket_path)
    prepare_socket_path(sock)
    if settings.grpc_listen:
        server.add_tcp(settings.grpc_listen, server_tls(settings), key="grpc_listen")
    try:
        with _owner_only():
            _listen_unix(server, sock)
            server.start()
        share_socket(sock, settings)
    except ConfigError:
        server.stop(0)
        raise
    return server


def _listen_unix(server: SecureServer, sock: Path) -> None:
    """Add the unix listener; a bind gRPC refuses after ``prepare_socket_path`` passed is named as ``socket_path``."""
    try:
        server.add_unix(str(sock))
    except RuntimeError as exc:
        raise SocketPathError(f"socket_path: cannot listen on {sock} ({exc}); {_OTHER_PATH}") from None


@contextlib.contextmanager
def _owner_only() -> Iterator[None]:
    """umask 0177 for the block, so a socket is created reachable by its owner only."""
    saved = os.umask(0o177)
    try:
        yield
    finally:
        os.umask(saved)


def share_socket(sock: Path, settings: AgentSettings) -> None:
    """Give the socket ``socket_group`` (when set) and ``socket_mode``.

    Raises:
        ConfigError: The group does not exist, or the agent's user is not in it.
    """
    if settings.socket_group:
        try:
            gid = grp.getgrnam(settings.socket_group).gr_gid
        except KeyError:
            raise ConfigError(
                f"socket_group: no group {settings.socket_group!r} on this node; create it or leave it empty"
            ) from None
        try:
            os.chown(sock, -1, gid)
        except PermissionError:
            raise ConfigError(
                f"socket_group: the agent's user is not in group {settings.socket_group!r}, so it cannot give it "
                "the socket; add the user to the group (no privilege is needed then)"
            ) from None
    os.chmod(sock, int(settings.socket_mode, 8))


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of ``path``, or None when it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class SocketKeeper:
    """Serves the trainers' unix socket again after something removed it.

    ``rm -rf /run/chopper``, a tmpfiles cleanup or a second agent's cleanup leaves the agent
    listening on a socket no new trainer can reach (its file is gone; open streams are unaffected).
    Every ``period_s`` the keeper compares the path's (device, inode) with the socket it made; when
    they differ it recreates the directory, serves the path from a spare gRPC server
    (:meth:`chopper.daemon.serving.SecureServer.serve_unix_again`) with the same mode and group, and
    counts it in ``agent.socket_recreated`` (its only writer; on ``/metrics``). A path another live
    agent now serves is left to it (logged once).

    Args:
        server: The agent's gRPC server.
        agent: The agent; its settings give ``socket_path``, ``socket_group``, ``socket_mode``.
        period_s: Seconds between checks.
    """

    def __init__(self, server: SecureServer, agent: Agent, period_s: float = 1.0) -> None:
        self.server = server
        self.agent = agent
        self.settings = agent.settings
        self.path = Path(agent.settings.socket_path)
        self.period_s = period_s
        self._ours = _identity(self.path)
        self._last_problem = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="socket-keeper", daemon=True)

    def start(self) -> SocketKeeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.check()

    def check(self) -> bool:
        """Recreate the socket if its file is no longer the one this agent made; True when it did."""
        if _identity(self.path) == self._ours:
            return False
        try:
            prepare_socket_path(self.path)
            with _owner_only():
                self.server.serve_unix_again(str(self.path))
            share_socket(self.path, self.settings)
        except (OSError, RuntimeError, SocketInUse, ConfigError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
            if problem != self._last_problem:  # once per distinct problem, not once a second
                log.warning("event=socket_not_recreated path=%s error=%r", self.path, problem)
                self._last_problem = problem
            return False
        self._ours = _identity(self.path)
        self._last_problem = ""
        log.warning("event=socket_recreated path=%s note='its file had been removed; new trainers connect again'",
                    self.path)
        self.agent.socket_recreated += 1
        return True
