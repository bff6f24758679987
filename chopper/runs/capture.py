"""``chopper capture``: profile the next N steps of a job and record the same window (docs/CAPTURE.md).

This is the command's end of a capture; the training process's end is ``chopper.profiler``,
which holds the bounds every end enforces (at most ``MAX_STEPS`` steps and ``MAX_SECONDS``
seconds): the command refuses a request over either before asking the agent.

The command, in steps:

1. Refuse steps or a timeout over the bounds and a non-empty ``out`` (as ``chopper record``
   does), create ``out``.
2. Start recording the agent's samples and markers from now on (``chopper.runs.record`` in a thread),
   so the run covers the whole window however fast the capture starts.
3. ``RequestCapture(job, steps, ranks, out/traces, timeout)``: the agent tells the chosen ranks'
   processes over their ``Control`` streams, raises its sample rate and answers when every rank
   reported (each wrote ``traces/rank<R>.pt.trace.json.gz``), a process went away, or the timeout
   passed; at the timeout it tells the ranks still profiling to stop (``STOP_STEPS``).
4. Let the last samples of the window arrive, stop recording, write the run and
   ``capture.jsonl`` (what each rank reported). A rejected request removes the directory again.
   The directory is laid out for ``chopper.trace.discover``: ``chopper report`` and ``chopper
   attribute`` find the traces under ``traces/`` (``TRACES_DIR``) beside the run's tables.

Exit codes: 0 every chosen rank wrote a full trace; 1 a rank is missing or partial, or the agent
went away (what was recorded is still written); 2 the request was refused (no such job, a capture
already running, bad arguments, a missing or wrong bearer token, the agent's rate limit).
"""
from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chopper.profiler import DEFAULT_SECONDS, MAX_SECONDS, MAX_STEPS

if TYPE_CHECKING:
    from chopper.runs.connect import ClientSecurity
    from chopper.runs.record import RecordStats

# After the reply: samples and markers of the last profiled step reach the recorder within a
# subscriber's batch interval (a second, agent.server.BATCH_INTERVAL_S) and a tick, so this pause
# keeps the window's tail in the run, with a second to spare on a loaded machine.
TAIL_S = 2.0


@dataclass
class CaptureOutcome:
    """What ``run_capture`` did; ``code`` is the exit status."""

    code: int
    message: str


def run_capture(target: str, job: str, steps: int, ranks: list[int], out: Path, *, sample_hz: float = 0.0,
                timeout_s: float = 600.0, security: ClientSecurity | None = None) -> CaptureOutcome:
    """Run one capture end to end (module docstring); never raises for agent or request errors.

    ``security`` carries TLS and the bearer token that ``RequestCapture`` needs when the agent
    has a ``token_file``; a missing or wrong token is a refusal (exit status 2).
    """
    import grpc

    from chopper.proto.chopper.v1 import agent_pb2 as pb
    from chopper.runs import consumer
    from chopper.runs.record import RecordError, check_output, record
    from chopper.trace.discover import TRACES_DIR

    problem = bounds_problem(steps, timeout_s)
    if problem is not None:
        return CaptureOutcome(2, problem)
    out = out.absolute()
    try:
        check_output(out)
    except RecordError as exc:
        return CaptureOutcome(2, str(exc))
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        consumer.wait_for_info(target, timeout_s=5.0, security=security)
    except consumer.AgentUnreachable as exc:
        _remove(out, created)
        return CaptureOutcome(1, str(exc))

    stop = threading.Event()
    recorded: list[RecordStats] = []
    failed: list[str] = []

    def recorder() -> None:
        try:
            recorded.append(record(target, out, None, time.time_ns(), stop, force=True, security=security))
        except Exception as exc:  # reported below; the capture itself still answers
            failed.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=recorder, name="chopper-capture-record", daemon=True)
    thread.start()
    request = pb.CaptureRequest(job=job, steps=steps, ranks=ranks, out_dir=str(out / TRACES_DIR),
                                sample_hz=sample_hz, timeout_s=timeout_s)
    channel, stub = consumer.connect(target, security)
    try:
        reply = stub.RequestCapture(request, timeout=(timeout_s or DEFAULT_SECONDS) + 30.0)
    except grpc.RpcError as exc:
        code = exc.code()
        stop.set()
        thread.join()
        if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
                    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED,
                    grpc.StatusCode.RESOURCE_EXHAUSTED):
            _remove(out, created)
            return CaptureOutcome(2, f"capture refused: {exc.details()}")
        return CaptureOutcome(1, f"the agent went away during the capture ({code.name}: {exc.details()}); "
                                 f"the run in {out} holds what was recorded until then; traces the ranks "
                                 f"wrote are in {out / TRACES_DIR}")
    finally:
        channel.close()
    time.sleep(TAIL_S)
    stop.set()
    thread.join()
    _write_manifest(out, job, steps, reply)
    problems = [f"rank {r.rank}: {r.error}" for r in reply.results if r.error]
    problems += [f"rank {r}: did not report (process gone or timeout)" for r in reply.missing_ranks]
    problems += [f"recording failed: {f}" for f in failed]
    summary = (f"captured {steps} step(s) of job {job} on rank(s) {[r.rank for r in reply.results]} at "
               f"{reply.sample_hz:g} Hz into {out}")
    if recorded:
        summary += f" ({recorded[0].samples} samples, {recorded[0].markers} markers)"
    if problems:
        return CaptureOutcome(1, summary + "; problems: " + "; ".join(problems))
    return CaptureOutcome(0, summary)


def bounds_problem(steps: int, timeout_s: float) -> str | None:
    """Why a capture of ``steps`` steps waiting ``timeout_s`` s (0: the default) is refused, or None."""
    if not 1 <= steps <= MAX_STEPS:
        return (f"steps: {steps} is out of range; a capture profiles 1 to {MAX_STEPS} steps (torch.profiler slows "
                "the job and holds every event in memory while it runs); profile fewer steps, or run several "
                "captures")
    if not (0 <= timeout_s <= MAX_SECONDS):  # also refuses NaN
        return (f"timeout_s: {timeout_s:g} is out of range; use 0 (default {DEFAULT_SECONDS:g} s) to "
                f"{MAX_SECONDS:g} s, the longest a capture runs")
    return None


def _remove(out: Path, created: bool) -> None:
    # Only a directory this command created: a refused capture leaves no half-empty run behind.
    if created:
        shutil.rmtree(out, ignore_errors=True)


def _write_manifest(out: Path, job: str, steps: int, reply: Any) -> None:
    """``capture.jsonl``: one header line, then one line per rank (not ``.json``: trace discovery skips it)."""
    lines = [{"capture_id": reply.capture_id, "job": job, "steps": steps, "sample_hz": reply.sample_hz,
              "started_ns": reply.started_ns, "ended_ns": reply.ended_ns,
              "missing_ranks": list(reply.missing_ranks)}]
    lines += [{"rank": r.rank, "pid": r.pid, "trace_path": r.trace_path, "steps": r.steps, "error": r.error,
               "begin_ns": r.begin_ns, "end_ns": r.end_ns} for r in reply.results]
    (out / "capture.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def main_capture(target: str, job: str, steps: int, ranks: str | None, out: str | None, sample_hz: float,
                 timeout_s: float, security: ClientSecurity | None = None) -> int:
    """The ``chopper capture`` subcommand; prints the outcome and returns the exit status."""
    try:
        rank_list = [int(r) for r in ranks.split(",") if r.strip()] if ranks else []
    except ValueError:
        print(f"chopper: --ranks must be comma-separated integers, got {ranks!r}", file=sys.stderr)
        return 2
    path = Path(out) if out else Path(f"capture-{job}-{time.strftime('%Y%m%d-%H%M%S')}")
    outcome = run_capture(target, job, steps, rank_list, path, sample_hz=sample_hz, timeout_s=timeout_s,
                          security=security)
    print(outcome.message if outcome.code == 0 else f"chopper: {outcome.message}",
          file=sys.stdout if outcome.code == 0 else sys.stderr)
    return outcome.code
