"""The job side of ``chopper capture``: torch.profiler over this process's next steps, bounded.

Three parts:

* **The bounds** every end of a capture enforces, one set of numbers: the agent refuses a request
  over ``MAX_STEPS`` steps or ``MAX_SECONDS`` seconds (``agent/capture.py``), ``chopper capture``
  refuses them before asking (``chopper.runs.capture``), and a training process stops its
  profiler at either whatever its agent asked for, because a profiler left running costs the job
  memory and step time until it ends (torch.profiler keeps every event).
* **``ProfilerWindow``**: one capture in one process, torch.profiler between two step boundaries.
* **``CaptureControl``**: what the marker client (``chopper.client``) hands capture work to. A
  control thread holds one ``Control`` stream to the agent, reconnecting (on the agent's control
  socket where it has one, ``agent.control_socket``, else over gRPC), and stores the capture
  command it receives; the training thread starts the window at its next step entry (the
  profiler belongs to the thread that trains), steps it, and reports how it ended with
  ``ReportCapture`` from a short-lived thread. A stop from the agent (``STOP_STEPS``) or the
  agent going away ends the window at the next step boundary. The client's hot path reads one
  flag, ``CaptureControl.active``, which is False unless a command is pending or a window runs.

This module imports neither torch nor grpc at import time (``import chopper`` stays light):
torch loads when a capture starts, grpc in the control and report threads.
"""
from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from chopper import local_socket

logger = logging.getLogger("chopper.client")

# The most steps one capture profiles. A capture looks at a handful of steps; torch.profiler keeps
# every event of every profiled step in memory until it stops (~70 MB/s of RSS on a small CPU
# model), so a long profile is a cost to the job, not a better trace.
MAX_STEPS = 100
# The longest a capture runs, seconds: MAX_STEPS steps of 9 s. The agent's timeout, and the job's
# own limit on how long its profiler stays on.
MAX_SECONDS = 900.0
# The agent's timeout when a request gives none (0), seconds.
DEFAULT_SECONDS = 600.0
# ``CaptureCommand.steps`` of this or less: stop the capture ``capture_id`` now (the agent sends it
# when its timeout passed with the rank still profiling).
STOP_STEPS = 0
# The most bytes a command on the control socket (agent.control_socket) takes: a trace_dir is a path.
COMMAND_MAX_BYTES = 16 * 1024


class ProfilerWindow:
    """The job side of one capture: ``torch.profiler`` over this process's next steps, bounded.

    ``CaptureControl`` calls ``start``, then ``begin_step``/``end_step`` around each step and
    ``finish`` from the training thread (the profiler belongs to the thread that trains); ``stop``
    may be called from any thread. The window ends at the first step boundary where any of these
    holds: ``steps`` steps were profiled (at most ``MAX_STEPS``, whatever was asked);
    ``max_seconds`` passed since ``start``; ``stop`` was called (the agent's timeout passed, or the
    agent went away). Each step is wrapped in our own ``ProfilerStep#<step>`` range rather than
    ``prof.step()``, so the trace's iterations are exactly the marked steps.

    Args:
        capture_id: The agent's id of the capture.
        steps: Steps asked for; clamped to ``1..MAX_STEPS`` (``note`` says so).
        trace_dir: Where ``finish`` writes ``rank<R>.pt.trace.json.gz``.
        max_seconds: Longest the profiler stays on, seconds.
        clock: Monotonic seconds (injected in tests).
    """

    def __init__(self, capture_id: str, steps: int, trace_dir: str, *, max_seconds: float = MAX_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.capture_id = capture_id
        self.steps = min(max(1, steps), MAX_STEPS)
        self.note = "" if steps <= MAX_STEPS else (f"asked for {steps} steps; profiled at most {MAX_STEPS}, the most "
                                                   "one capture profiles")
        self.trace_dir = trace_dir
        self.done = 0
        self.begin_ns = 0  # CLOCK_REALTIME of the first profiled step's begin
        self.end_ns = 0  # and of the last one's end
        self._max_s = max_seconds
        self._clock = clock
        self._deadline = 0.0
        self._stop = ""  # why to end early, set from any thread
        self._prof: Any = None
        self._range: Any = None  # the open ProfilerStep#N record_function

    def start(self) -> None:
        """Start ``torch.profiler`` (CPU, plus the GPU where torch sees one; ROCm traces through CUDA).

        Raises:
            Exception: Whatever torch raises; the profiler is then off.
        """
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        prof = profile(activities=activities, record_shapes=False)
        prof.start()
        self._prof = prof
        self._deadline = self._clock() + self._max_s

    def stop(self, reason: str) -> None:
        """End the window at the next step boundary, with ``reason`` as its error (first reason wins)."""
        if not self._stop:
            self._stop = reason

    def _ending(self) -> str:
        if self._stop:
            return self._stop
        if self._clock() >= self._deadline:
            return (f"stopped after {self.done} of {self.steps} steps: the profiler ran {self._max_s:g} s, the "
                    "longest a capture runs")
        return ""

    def begin_step(self, step: int) -> str:
        """At a step's entry: open its range; returns why to ``finish`` instead ("" to profile it)."""
        ending = self._ending()
        if ending:
            return ending
        import torch

        self._range = torch.profiler.record_function(f"ProfilerStep#{step}")
        self._range.__enter__()
        if not self.begin_ns:
            self.begin_ns = time.time_ns()
        return ""

    def end_step(self) -> str | None:
        """At a step's exit: close its range; returns None to go on, else the error to ``finish`` with
        ("" when every step asked for was profiled)."""
        if self._range is None:
            return None
        self._range.__exit__(None, None, None)
        self._range = None
        self.done += 1
        self.end_ns = time.time_ns()
        if self.done >= self.steps:
            return self.note
        return self._ending() or None

    def finish(self, rank: int, error: str) -> tuple[str, str]:
        """Stop the profiler and write the trace (partial when ``error``); returns (path or "", error)."""
        path = ""
        try:
            if self._range is not None:
                self._range.__exit__(None, None, None)
                self._range = None
            self._prof.stop()
            out = str(Path(self.trace_dir) / f"rank{rank}.pt.trace.json.gz")
            Path(self.trace_dir).mkdir(parents=True, exist_ok=True)
            self._prof.export_chrome_trace(out)
            path = out
        except Exception as e:  # the trace is lost, training is not
            error = f"{error}; " if error else ""
            error += f"could not write the trace: {type(e).__name__}: {e}"
        return path, error


class CaptureControl:
    """Capture commands from the agent, acted on in the training thread (module docstring).

    Args:
        target: gRPC target of the node agent.
        job, rank, pid: This process as the agent knows it (``ControlHello``, ``CaptureResult``).
        metadata: Invocation metadata of the ``Control`` stream (the client's process id).
        initial_backoff_s: First reconnect delay of the control stream, seconds; doubles per failure.
        max_backoff_s: Cap of that delay, seconds.
        control_path: The agent's control socket, tried before gRPC at each connect; "" for none
            (a TCP target).
    """

    def __init__(self, target: str, job: str, rank: int, pid: int, metadata: tuple[tuple[str, str], ...],
                 initial_backoff_s: float, max_backoff_s: float, *, control_path: str = "") -> None:
        self.target = target
        self.control_path = control_path
        self._who: dict[str, Any] = {"job": job, "rank": rank, "pid": pid}  # as ControlHello and CaptureResult say it
        self._metadata = metadata
        self._backoff_s = (initial_backoff_s, max_backoff_s)
        # A command is pending or a window runs: the client's hot path reads only this.
        self.active = False
        self.results: list[dict[str, Any]] = []  # how each capture of this process ended, as reported
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._call: Any = None
        self._sock: socket.socket | None = None  # the control socket connection, while one is open
        self._cmd: Any = None  # the command waiting for the next step entry
        self._window: ProfilerWindow | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the control thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="chopper-control", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        """Write what a running window profiled (training ended inside it) and close the control stream."""
        self._stop_event.set()
        if self._window is not None:
            self._finish(f"training stopped after {self._window.done} of {self._window.steps} steps")
        call = self._call
        if call is not None:
            call.cancel()
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # the control thread's recv returns

    # ------------------------------------------------------------------- training thread

    def step_begin(self, step: int) -> None:
        """At a step entry: start a pending capture, open this step's range. Never raises."""
        try:
            window = self._window
            if window is None:
                window = self._start_window()
                if window is None:
                    return
            ending = window.begin_step(step)
            if ending:
                self._finish(ending)
        except Exception as e:
            self._failed(f"{type(e).__name__}: {e}")

    def step_end(self) -> None:
        """At a step exit: close the step's range; finish after the window's last step. Never raises."""
        try:
            window = self._window
            if window is None:
                return
            ending = window.end_step()
            if ending is not None:
                self._finish(ending)
        except Exception as e:
            self._failed(f"{type(e).__name__}: {e}")

    def _start_window(self) -> ProfilerWindow | None:
        """Start ``torch.profiler`` for the pending command; None when there is none or it cannot start."""
        with self._lock:  # taken and installed at once, so that a stop finds one or the other
            cmd, self._cmd = self._cmd, None
            if cmd is None:
                self.active = False
                return None
            window = self._window = ProfilerWindow(cmd.capture_id, cmd.steps, cmd.trace_dir)
        try:
            window.start()
        except Exception as e:
            self._window = None
            self.active = self._cmd is not None
            self._report(cmd.capture_id, "", 0, f"cannot start torch.profiler: {type(e).__name__}: {e}", 0, 0)
            return None
        logger.info("event=capture_started id=%s steps=%d trace_dir=%r", window.capture_id, window.steps,
                    window.trace_dir)
        if window.note:
            logger.warning("event=capture_clamped id=%s note=%r", window.capture_id, window.note)
        return window

    def _finish(self, error: str) -> None:
        """Stop the profiler, write the trace (partial when ``error``), report to the agent."""
        window = self._window
        if window is None:
            return
        self._window = None
        self.active = self._cmd is not None
        path, error = window.finish(self._who["rank"], error)
        logger.info("event=capture_done id=%s steps=%d path=%r error=%r", window.capture_id, window.done, path, error)
        self._report(window.capture_id, path, window.done, error, window.begin_ns, window.end_ns)

    def _failed(self, error: str) -> None:
        # Profiling must never break training: give the capture up, report why.
        logger.warning("event=capture_failed error=%r", error)
        try:
            self._finish(error)
        except Exception:
            self._window = None
            self.active = False

    def _report(self, capture_id: str, path: str, steps: int, error: str, begin_ns: int, end_ns: int) -> None:
        """Tell the agent how this rank's part ended, from a short-lived thread (never blocks training)."""
        result: dict[str, Any] = {"capture_id": capture_id, **self._who, "trace_path": path, "steps": steps,
                                  "error": error, "begin_ns": begin_ns, "end_ns": end_ns}
        self.results.append(result)

        def send() -> None:
            try:
                import grpc

                from chopper.proto.chopper.v1 import agent_pb2, agent_pb2_grpc

                with grpc.insecure_channel(self.target) as channel:
                    agent_pb2_grpc.AgentStub(channel).ReportCapture(agent_pb2.CaptureResult(**result), timeout=5.0)
            except Exception as e:  # the agent may be gone: the trace on disk is what matters
                logger.info("event=capture_report_failed error=%r", str(e))

        threading.Thread(target=send, name="chopper-capture-report", daemon=True).start()

    # -------------------------------------------------------------------- control thread

    def _run(self) -> None:
        """Control thread: ``_serve``, and never a traceback: captures fail, markers go on."""
        try:
            self._serve()
        except BaseException as e:
            logger.warning("event=control_failed target=%r error=%r note='chopper capture cannot profile this "
                           "process; markers are unaffected'", self.target, f"{type(e).__name__}: {e}")

    def _serve(self) -> None:
        """Hold one ``Control`` stream, reconnecting; store capture commands."""
        try:
            import grpc

            from chopper.proto.chopper.v1 import agent_pb2, agent_pb2_grpc
        except Exception:
            return
        initial, most = self._backoff_s
        backoff = initial
        channel = grpc.insecure_channel(self.target)  # connects only when a stream goes over gRPC
        try:
            stub = agent_pb2_grpc.AgentStub(channel)
            hello = agent_pb2.ControlHello(**self._who)
            while not self._stop_event.is_set():
                sock = self._connect_control_socket()
                try:
                    if sock is not None:
                        commands: Iterator[Any] = self._socket_commands(sock, hello, agent_pb2)
                    else:
                        call = stub.Control(hello, wait_for_ready=False, metadata=self._metadata)
                        self._call = commands = call
                        if self._stop_event.is_set():
                            call.cancel()
                    for command in commands:
                        backoff = initial
                        if command.HasField("capture"):
                            self._on_command(command.capture)
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                        return  # an agent older than captures: nothing to listen for
                except Exception:
                    logger.debug("event=control_error", exc_info=True)
                finally:
                    if sock is not None:
                        self._sock = None
                        sock.close()
                self._lost()
                self._stop_event.wait(backoff)
                backoff = min(backoff * 2, most)
        finally:
            channel.close()

    def _connect_control_socket(self) -> socket.socket | None:
        """A connection to the agent's control socket; None when there is none to reach (gRPC carries the stream)."""
        sock = local_socket.connect(self.control_path)  # the control thread waits in recv; shutdown() wakes it
        if sock is None:
            return None
        self._sock = sock
        if self._stop_event.is_set():  # shutdown() ran before the socket was there to wake
            sock.shutdown(socket.SHUT_RDWR)
        return sock

    @staticmethod
    def _socket_commands(sock: socket.socket, hello: Any, pb2: Any) -> Iterator[Any]:
        """The stream on the control socket: the hello, then a ``ControlCommand`` a datagram until the agent closes."""
        sock.send(hello.SerializeToString(), socket.MSG_NOSIGNAL)
        while data := sock.recv(COMMAND_MAX_BYTES):
            command = pb2.ControlCommand()
            command.ParseFromString(data)
            yield command

    def _on_command(self, cmd: Any) -> None:
        if cmd.steps <= STOP_STEPS:
            self._stop(cmd.capture_id, "the agent's timeout passed")
            return
        with self._lock:
            busy = self._window is not None or self._cmd is not None
            if not busy:
                self._cmd = cmd
                self.active = True
        if busy:
            self._report(cmd.capture_id, "", 0, "this process is already capturing", 0, 0)

    def _stop(self, capture_id: str, why: str) -> None:
        """End capture ``capture_id`` at the next step boundary, or drop it if it has not started."""
        with self._lock:
            cmd = self._cmd
            if cmd is not None and cmd.capture_id == capture_id:
                self._cmd = None
            window = self._window
        if window is not None and window.capture_id == capture_id:
            window.stop(f"{why} after {window.done} of {window.steps} steps; trace is partial")

    def _lost(self) -> None:
        """The agent went away: drop a pending command, end a running window at the next step."""
        with self._lock:
            self._cmd = None
        window = self._window
        if window is not None:
            window.stop(f"the agent went away after {window.done} of {window.steps} steps; trace is partial")
        else:
            self.active = False
