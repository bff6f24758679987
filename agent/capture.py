"""On-demand deep capture: the agent's side of ``chopper capture`` (docs/CAPTURE.md).

Training processes hold one ``Control`` stream each (``attach``/``detach``), over gRPC
(``agent.server``) or the control socket (``agent.control_socket``); either hands ``attach`` what
takes the stream's commands (``CommandSink``). A capture request, in steps:

1. Validate: 1 to ``MAX_STEPS`` steps, a timeout of at most ``MAX_SECONDS``, an absolute
   ``out_dir``; the job has a connected process (else ``CaptureNotFound``), every asked rank too;
   no capture of the job runs now (else ``CaptureBusy``, naming when the running one started).
2. Send ``ControlCommand{capture}`` to the newest process of each chosen rank.
3. Raise the sampler's rate for the window (never lower it), so counters resolve the profiled
   steps; the rate in force before the first running capture comes back after the last one.
4. Wait until every chosen rank reported (``report``), its process went away, or the timeout.
5. Tell each chosen rank still profiling to stop (``CaptureCommand{steps: STOP_STEPS}``): a
   capture never outlives its timeout. Each process also stops on its own after ``MAX_STEPS``
   steps or ``MAX_SECONDS`` (``chopper.profiler.ProfilerWindow``), whatever an agent asked.
6. Answer with each rank's result and the ranks that never reported.

Nothing guards ``RequestCapture`` but the socket's mode and group (and the TLS listener's client
certificates) unless ``token_file`` is set; ``log_access`` says so at start.

No gRPC here: ``agent.server`` maps the exceptions to status codes.
"""
from __future__ import annotations

import datetime
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from agent.sampler import FixedRateTicker
from chopper.profiler import DEFAULT_SECONDS, MAX_SECONDS, MAX_STEPS, STOP_STEPS
from chopper.proto.chopper.v1 import agent_pb2 as pb

if TYPE_CHECKING:
    from agent.config import AgentSettings

log = logging.getLogger(__name__)

# A capture samples at least this fast unless the request says otherwise: 10 ms resolves the
# phases of a step that lasts a few hundred ms, and 100 Hz is what every backend sustains.
CAPTURE_SAMPLE_HZ = 100.0
MAX_SAMPLE_HZ = 1000.0
DEFAULT_TIMEOUT_S = DEFAULT_SECONDS
MAX_TIMEOUT_S = MAX_SECONDS


class CaptureError(Exception):
    """A capture request that cannot be served; the message names the problem and the fix."""


class CaptureNotFound(CaptureError):
    """No connected process of that job (or rank)."""


class CaptureBusy(CaptureError):
    """Another capture of the same job is running."""


class CaptureInvalid(CaptureError):
    """The request itself is malformed."""


class CommandSink(Protocol):
    """What takes a stream's commands: a queue its gRPC call reads, or its connection's sender.

    ``put`` is called with the capture manager's lock held and must not block.
    """

    def put(self, command: pb.ControlCommand) -> None: ...


@dataclass(eq=False)
class Listener:
    """One training process's open ``Control`` stream."""

    job: str
    rank: int
    pid: int
    order: int
    commands: CommandSink


@dataclass(eq=False)
class _Active:
    capture_id: str
    job: str
    steps: int
    started_ns: int
    pending: dict[int, Listener]
    results: dict[int, pb.CaptureResult] = field(default_factory=dict)
    gone: set[int] = field(default_factory=set)


class CaptureManager:
    """Control streams of training processes and the captures running over them.

    Args:
        ticker: The agent's sampler, whose rate a capture raises.
        realtime_ns: CLOCK_REALTIME source.
    """

    def __init__(self, ticker: FixedRateTicker, realtime_ns: Callable[[], int] = time.time_ns) -> None:
        self._ticker = ticker
        self._now = realtime_ns
        self._cond = threading.Condition()
        self._listeners: list[Listener] = []
        self._active: dict[str, _Active] = {}
        self._base_period_ns: int | None = None
        self._order = itertools.count()

    # -- control streams ---------------------------------------------------------------------

    def attach(self, job: str, rank: int, pid: int, commands: CommandSink) -> Listener:
        """Register a process's control stream, whose commands go to ``commands``."""
        listener = Listener(job, rank, pid, next(self._order), commands)
        with self._cond:
            self._listeners.append(listener)
        return listener

    def detach(self, listener: Listener) -> None:
        """The stream ended: a capture waiting on this process stops waiting for it."""
        with self._cond:
            if listener in self._listeners:
                self._listeners.remove(listener)
            for active in self._active.values():
                if active.pending.get(listener.rank) is listener:
                    del active.pending[listener.rank]
                    active.gone.add(listener.rank)
            self._cond.notify_all()

    def jobs(self) -> dict[str, set[int]]:
        """Connected ranks by job."""
        with self._cond:
            out: dict[str, set[int]] = {}
            for li in self._listeners:
                out.setdefault(li.job, set()).add(li.rank)
            return out

    # -- captures ----------------------------------------------------------------------------

    def report(self, result: pb.CaptureResult) -> None:
        """A process says how its part of a capture ended (late or unknown reports are ignored)."""
        with self._cond:
            active = self._active.get(result.job)
            if active is None or active.capture_id != result.capture_id:
                return
            active.results[result.rank] = result
            active.pending.pop(result.rank, None)
            self._cond.notify_all()

    def request(self, req: pb.CaptureRequest) -> pb.CaptureReply:
        """Run one capture to its end (blocks the calling gRPC thread; see the module docstring)."""
        if not 1 <= req.steps <= MAX_STEPS:
            raise CaptureInvalid(f"steps must be 1 to {MAX_STEPS}, got {req.steps}: torch.profiler slows the job and "
                                 "holds every event in memory while it runs; profile fewer steps, or run several "
                                 "captures")
        if not req.out_dir or not Path(req.out_dir).is_absolute():
            raise CaptureInvalid(f"out_dir must be an absolute path on the node, got {req.out_dir!r}")
        if not 0 <= req.sample_hz <= MAX_SAMPLE_HZ:  # also refuses NaN
            raise CaptureInvalid(f"sample_hz must be 0 (default) to {MAX_SAMPLE_HZ:g}, got {req.sample_hz:g}")
        if not (req.timeout_s <= MAX_TIMEOUT_S or req.timeout_s <= 0):  # NaN and inf fail both
            raise CaptureInvalid(f"timeout_s must be 0 (default {DEFAULT_TIMEOUT_S:g} s) to {MAX_TIMEOUT_S:g} s, "
                                 f"the longest a capture runs, got {req.timeout_s:g}")
        timeout_s = req.timeout_s if req.timeout_s > 0 else DEFAULT_TIMEOUT_S
        with self._cond:
            active = self._start(req)
            hz = self._raise_rate(req.sample_hz or CAPTURE_SAMPLE_HZ)
            deadline = time.monotonic() + timeout_s
            try:
                while active.pending:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            finally:
                self._stop_pending(active)
                del self._active[req.job]
                if not self._active and self._base_period_ns is not None:
                    self._ticker.period_ns = self._base_period_ns
                    self._base_period_ns = None
            missing = sorted(set(active.pending) | active.gone)
            return pb.CaptureReply(
                capture_id=active.capture_id, results=[active.results[r] for r in sorted(active.results)],
                sample_hz=hz, started_ns=active.started_ns, ended_ns=self._now(), missing_ranks=missing,
            )

    def _start(self, req: pb.CaptureRequest) -> _Active:
        """Validate against the connected processes and send the commands (caller holds the lock)."""
        running = self._active.get(req.job)
        if running is not None:
            started = datetime.datetime.fromtimestamp(running.started_ns / 1e9, datetime.UTC)
            since = started.isoformat(timespec="seconds")
            raise CaptureBusy(f"capture already running for job {req.job} since {since} "
                              f"({running.steps} steps, id {running.capture_id}); wait for it to finish")
        newest: dict[int, Listener] = {}
        for li in self._listeners:
            if li.job == req.job and (li.rank not in newest or li.order > newest[li.rank].order):
                newest[li.rank] = li
        if not newest:
            known = sorted({li.job for li in self._listeners})
            raise CaptureNotFound(
                f"no training process of job {req.job!r} is connected to this agent (connected jobs: "
                f"{', '.join(known) or 'none'}); check --job, and that the job calls chopper.init() on this node"
            )
        ranks = sorted(set(req.ranks)) if req.ranks else sorted(newest)
        absent = [r for r in ranks if r not in newest]
        if absent:
            raise CaptureNotFound(f"job {req.job!r} has no connected process of rank(s) {absent} on this node "
                                  f"(connected ranks: {sorted(newest)}); choose --ranks among them")
        active = _Active(uuid.uuid4().hex[:12], req.job, req.steps, self._now(), {r: newest[r] for r in ranks})
        command = pb.ControlCommand(
            capture=pb.CaptureCommand(capture_id=active.capture_id, steps=req.steps, trace_dir=req.out_dir)
        )
        for li in active.pending.values():
            li.commands.put(command)
        self._active[req.job] = active
        return active

    @staticmethod
    def _stop_pending(active: _Active) -> None:
        """Tell the ranks that did not report to stop profiling now (caller holds the lock)."""
        if not active.pending:
            return
        stop = pb.ControlCommand(capture=pb.CaptureCommand(capture_id=active.capture_id, steps=STOP_STEPS))
        for li in active.pending.values():
            li.commands.put(stop)
        log.warning("event=capture_timeout job=%s id=%s ranks=%s note='told to stop profiling; their traces are "
                    "partial'", active.job, active.capture_id, sorted(active.pending))

    def _raise_rate(self, hz: float) -> float:
        """Sample at least ``hz`` until the last running capture ends (caller holds the lock)."""
        if self._base_period_ns is None:
            self._base_period_ns = self._ticker.period_ns
        if hz > self._ticker.hz:
            self._ticker.set_hz(hz)
        return self._ticker.hz


def log_access(settings: AgentSettings) -> None:
    """Say at start who may call ``RequestCapture``: a warning when no ``token_file`` restricts it."""
    if settings.token_file:
        log.info("event=capture_access token_file=%s note='RequestCapture needs a bearer token of that file'",
                 settings.token_file)
        return
    group = f", group {settings.socket_group}" if settings.socket_group else ""
    who = [f"every local user who can connect to socket_path={settings.socket_path} (mode {settings.socket_mode}"
           f"{group})"]
    if settings.grpc_listen:
        who.append(f"every client with a certificate of tls_client_ca on grpc_listen={settings.grpc_listen}"
                   if settings.tls_client_ca else f"every host that reaches grpc_listen={settings.grpc_listen}")
    log.warning("event=capture_unprotected callers=%r note='without token_file, they can make the training processes "
                "of this node run torch.profiler (up to %d steps, %g s per capture) and write traces to a directory "
                "of their choosing; set token_file to a file of bearer tokens, owned by root, mode 0640 "
                "(docs/SECURITY.md)'", " and ".join(who), MAX_STEPS, MAX_SECONDS)
