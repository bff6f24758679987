"""A capture never outlives its bounds: a real agent, a real 2-rank gloo job, and an agent that asks too much.

The job (``tests/e2e/capture_bound_job.py``) logs per step whether torch.profiler is on, its RSS and
its step time, so each test measures in the ranks themselves when profiling stopped and what it
cost, rather than what the agent or the client says about it.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from chopper.demo.run import free_port
from chopper.profiler import MAX_STEPS
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import agent_pb2_grpc
from tests.e2e.capture_bound_job import JOB
from tests.support.daemons import AgentProcess
from tests.support.polling import wait_until
from tests.support.profiler_traces import step_events
from tests.support.training import stop_training

pytestmark = pytest.mark.slow
BIG = 10**9
JOB_S = 240.0  # outlives every check however loaded the machine; each test kills the job when done


def start_job(target: str, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.e2e.capture_bound_job", "--agent", target, "--out", str(out),
                             "--duration", str(JOB_S), "--port", str(free_port())],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def steps(out: Path, rank: int) -> list[dict[str, Any]]:
    """The rank's step log so far (a line being written is left for the next read)."""
    path = out / f"rank{rank}.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            break
    return rows


def wait_steps(out: Path, n: int, job: subprocess.Popen[str], timeout_s: float = 120) -> None:
    assert wait_until(lambda: job.poll() is None and min(len(steps(out, r)) for r in (0, 1)) >= n,
                      timeout_s=timeout_s), f"the job did not reach {n} steps:\n{job_error(job)}"


def job_error(job: subprocess.Popen[str]) -> str:
    if job.poll() is None:
        return "(still running)"
    return job.communicate()[1][-3000:]


def request(target: str, **fields: Any) -> tuple[grpc.StatusCode, str, pb.CaptureReply | None]:
    with grpc.insecure_channel(target) as channel:
        try:
            reply = agent_pb2_grpc.AgentStub(channel).RequestCapture(pb.CaptureRequest(job=JOB, **fields), timeout=60)
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or "", None
    return grpc.StatusCode.OK, "", reply


def median_step_s(rows: list[dict[str, Any]]) -> float:
    return statistics.median(r["step_s"] for r in rows)


def rss_rate(rows: list[dict[str, Any]]) -> float:
    """RSS growth over ``rows``, bytes per second of wall time."""
    return (rows[-1]["rss"] - rows[0]["rss"]) / max(1e-9, (rows[-1]["wall_ns"] - rows[0]["wall_ns"]) / 1e9)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    running = AgentProcess(tmp_path).start()
    yield running
    if running.proc is not None and running.proc.poll() is None:
        running.terminate()


@pytest.mark.hazard(item=3, input="RequestCapture for 10^9 steps",
                    promise="refused clearly over the documented maximum of steps; the ranks never profile")
def test_a_capture_of_a_billion_steps_is_refused_and_no_rank_profiles(agent: AgentProcess, tmp_path: Path,
                                                                      hazard) -> None:
    out = tmp_path / "job"
    out.mkdir()
    job = start_job(agent.target, out)
    try:
        wait_steps(out, 10, job)
        cli = subprocess.run([sys.executable, "-m", "chopper.cli", "capture", "--agent", agent.target, "--job", JOB,
                              "--steps", str(BIG), "--out", str(tmp_path / "cap")],
                             capture_output=True, text=True, timeout=60)
        assert cli.returncode == 2 and f"1 to {MAX_STEPS} steps" in cli.stderr, cli.stderr
        assert not (tmp_path / "cap").exists()
        # The agent's own check, for a client that does not check (a short timeout, so that an agent that
        # accepted would answer soon, with the ranks profiling on).
        code, details, _ = request(agent.target, steps=BIG, out_dir=str(tmp_path / "traces"), timeout_s=3)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and f"steps must be 1 to {MAX_STEPS}" in details, details
        seen = min(len(steps(out, r)) for r in (0, 1))
        wait_steps(out, seen + 20, job)
        profiled = {r: sum(s["profiling"] for s in steps(out, r)) for r in (0, 1)}
        assert profiled == {0: 0, 1: 0}
    finally:
        stop_training(job)
    hazard.outcome = (f"CLI exit 2 ('1 to {MAX_STEPS} steps'), agent INVALID_ARGUMENT naming the maximum; "
                      f"0 steps profiled in either rank over the next {20}+ steps")


@pytest.mark.hazard(item=3, input="RequestCapture whose timeout (5 s) passes before its steps are done",
                    promise="the ranks stop profiling at the deadline: RSS stops growing, step time returns to "
                            "its baseline")
def test_the_ranks_stop_profiling_when_the_capture_times_out(agent: AgentProcess, tmp_path: Path, hazard) -> None:
    out = tmp_path / "job"
    out.mkdir()
    job = start_job(agent.target, out)
    try:
        wait_steps(out, 30, job)
        before = {r: len(steps(out, r)) for r in (0, 1)}
        # 100 steps take over 8 s (each sleeps 80 ms): the 5 s timeout passes inside the window.
        code, details, reply = request(agent.target, steps=MAX_STEPS, out_dir=str(tmp_path / "traces"), timeout_s=5)
        assert code == grpc.StatusCode.OK and reply is not None, details
        assert sorted(reply.missing_ranks) == [0, 1]
        deadline_ns = reply.ended_ns

        def stopped_long_since() -> bool:
            rows = {r: steps(out, r) for r in (0, 1)}
            return all(sum(s["wall_ns"] > deadline_ns for s in rows[r]) >= 40 and not any(
                s["profiling"] for s in rows[r][-40:]) for r in rows)

        assert wait_until(stopped_long_since, timeout_s=120), "a rank kept profiling after the deadline"
    finally:
        stop_training(job)

    figures = []
    for rank in (0, 1):
        rows = steps(out, rank)
        profiled = [s for s in rows if s["profiling"]]
        assert profiled, f"rank {rank} never profiled: its profiler took the whole timeout to start"
        first_off = next(i for i, s in enumerate(rows) if s["profiling"] is False and s["wall_ns"] > deadline_ns
                         and i > rows.index(profiled[-1]))
        late = [s for s in profiled if s["wall_ns"] > deadline_ns]
        baseline = rows[max(0, before[rank] - 20):before[rank]]
        during = profiled
        after = rows[first_off + 5:first_off + 40]  # the stop's own export is in the first steps after it
        # The step the profiler stopped in also wrote the trace, in the training thread: its excess is the export.
        export_s = profiled[-1]["step_s"] - median_step_s(during)
        step_ratio = median_step_s(after) / median_step_s(baseline)
        assert len(late) <= 3, f"rank {rank}: {len(late)} steps profiled after the deadline"
        assert step_ratio < 1.5, f"rank {rank}: step time after the capture {step_ratio:.2f}x its baseline"
        grow_during, grow_after = rss_rate(during), rss_rate(after)
        assert grow_after <= max(0.25 * grow_during, 2e6), (rank, grow_during, grow_after)
        traced = len(step_events(tmp_path / "traces" / f"rank{rank}.pt.trace.json.gz"))
        assert traced == len(profiled)  # the partial trace was written, one ProfilerStep# per profiled step
        figures.append(f"rank {rank}: {len(profiled)} steps profiled, {len(late)} ending after the deadline (the "
                       f"stop lands at a step boundary; that step also exported the trace, {export_s:.1f} s); "
                       f"step time after/baseline {step_ratio:.2f} "
                       f"(during {median_step_s(during) / median_step_s(baseline):.2f}); RSS "
                       f"{grow_during / 1e6:.1f} MB/s while profiling, {grow_after / 1e6:.2f} MB/s after")
    hazard.outcome = "; ".join(figures)


class RogueAgent:
    """An agent that asks every process for a capture of 10^9 steps and never stops it: an old or broken one.

    A real gRPC server on a unix socket: it takes the markers, answers ``Control`` with one such command,
    and keeps what ``ReportCapture`` says.
    """

    def __init__(self, socket: Path) -> None:
        self.reports: list[pb.CaptureResult] = []
        self._stop = threading.Event()
        handlers = grpc.method_handlers_generic_handler("chopper.v1.Agent", {
            "PushMarkers": grpc.stream_unary_rpc_method_handler(
                self.push, pb.MarkerBatch.FromString, pb.PushMarkersResponse.SerializeToString),
            "Control": grpc.unary_stream_rpc_method_handler(
                self.control, pb.ControlHello.FromString, pb.ControlCommand.SerializeToString),
            "ReportCapture": grpc.unary_unary_rpc_method_handler(
                self.report, pb.CaptureResult.FromString, pb.CaptureAck.SerializeToString),
        })
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), handlers=[handlers])
        self.server.add_insecure_port(f"unix:{socket}")
        self.target = f"unix://{socket}"
        self.server.start()

    def push(self, batches: Iterator[pb.MarkerBatch], context: grpc.ServicerContext) -> pb.PushMarkersResponse:
        return pb.PushMarkersResponse(accepted=sum(len(b.markers) for b in batches))

    def control(self, hello: pb.ControlHello, context: grpc.ServicerContext) -> Iterator[pb.ControlCommand]:
        yield pb.ControlCommand(capture=pb.CaptureCommand(capture_id=f"rogue-{hello.rank}", steps=BIG,
                                                          trace_dir=str(Path(self.target[7:]).parent / "traces")))
        while context.is_active() and not self._stop.wait(0.2):
            pass

    def report(self, result: pb.CaptureResult, context: grpc.ServicerContext) -> pb.CaptureAck:
        self.reports.append(result)
        return pb.CaptureAck()

    def stop(self) -> None:
        self._stop.set()
        self.server.stop(0)


@pytest.mark.hazard(item=3, input="an agent (old or broken) commands a capture of 10^9 steps and never stops it",
                    promise="the job stops its profiler at its own bound, whatever the agent said")
def test_the_job_bounds_its_profiler_whatever_the_agent_asks(tmp_path: Path, hazard) -> None:
    rogue = RogueAgent(tmp_path / "rogue.sock")
    out = tmp_path / "job"
    out.mkdir()
    job = start_job(rogue.target, out)
    try:
        assert wait_until(lambda: len(rogue.reports) == 2, timeout_s=180), (
            f"ranks still profiling: {[sum(s['profiling'] for s in steps(out, r)) for r in (0, 1)]} steps so far; "
            f"{job_error(job)}")
        seen = {r: len(steps(out, r)) for r in (0, 1)}
        wait_steps(out, max(seen.values()) + 20, job)
    finally:
        stop_training(job)
        rogue.stop()
    profiled = {r: sum(s["profiling"] for s in steps(out, r)) for r in (0, 1)}
    tail_on = {r: sum(s["profiling"] for s in steps(out, r)[seen[r]:]) for r in (0, 1)}
    assert profiled == {0: MAX_STEPS, 1: MAX_STEPS} and tail_on == {0: 0, 1: 0}, (profiled, tail_on)
    assert sorted((r.rank, r.steps) for r in rogue.reports) == [(0, MAX_STEPS), (1, MAX_STEPS)]
    assert all(f"at most {MAX_STEPS}" in r.error and r.trace_path for r in rogue.reports), rogue.reports
    hazard.outcome = (f"each rank profiled exactly {MAX_STEPS} steps, wrote its trace, reported "
                      f"'{rogue.reports[0].error}', and profiled 0 of the next 20+ steps")
