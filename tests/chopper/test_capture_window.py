"""The job side of a capture: torch.profiler bounded in steps and seconds whatever the agent asked (real torch)."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from chopper.profiler import MAX_SECONDS, MAX_STEPS, STOP_STEPS, CaptureControl, ProfilerWindow
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.runs.capture import bounds_problem
from chopper.trace.discover import trace_files
from tests.support.profiler_traces import step_events


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def profiling() -> bool:
    return bool(torch._C._autograd._profiler_enabled())


def traced_steps(path: str) -> list[str]:
    return sorted(e["name"] for e in step_events(path))


def run(window: ProfilerWindow, steps: int, clock: Clock, step_s: float) -> str:
    """Step until the window ends (or ``steps`` steps); returns the error it ended with."""
    for i in range(steps):
        ending = window.begin_step(i)
        if ending:
            return ending
        torch.ones(8).add_(1)
        clock.now += step_s
        ended = window.end_step()
        if ended is not None:
            return ended
    raise AssertionError("the window never ended")


@pytest.mark.slow  # the first torch.profiler start of a process loads Kineto: seconds on a loaded machine
@pytest.mark.hazard(item=3, input="a capture command whose steps never end in time (agent gone quiet, no stop)",
                    promise="the job stops its profiler after MAX_SECONDS whatever the agent said")
def test_the_profiler_stops_at_the_jobs_own_deadline(tmp_path: Path, hazard) -> None:
    clock = Clock()
    window = ProfilerWindow("c1", MAX_STEPS, str(tmp_path), clock=clock)
    window.start()
    assert profiling()
    # Steps of 100 s: the time bound comes long before the 100th step.
    error = run(window, MAX_STEPS, clock, step_s=100.0)
    assert f"the profiler ran {MAX_SECONDS:g} s" in error
    path, error = window.finish(0, error)
    assert not profiling()
    assert window.done == int(MAX_SECONDS // 100) and len(traced_steps(path)) == window.done
    hazard.outcome = (f"profiler off after {window.done} steps of 100 s (clock injected), at the {MAX_SECONDS:g} s "
                      f"bound; trace of {window.done} ProfilerStep# written; error {error!r}")


@pytest.mark.slow
def test_steps_over_the_maximum_are_clamped_and_said() -> None:
    clock = Clock()
    window = ProfilerWindow("c2", 10**9, "/nonexistent", clock=clock)
    assert window.steps == MAX_STEPS and "asked for 1000000000 steps" in window.note
    window.start()
    try:
        assert run(window, MAX_STEPS + 5, clock, step_s=0.001) == window.note
        assert window.done == MAX_STEPS
    finally:
        window.finish(0, "")
    assert not profiling()
    assert ProfilerWindow("c3", 3, "/x").note == ""


@pytest.mark.slow
def test_a_stop_from_another_thread_ends_the_window_at_the_next_step(tmp_path: Path) -> None:
    clock = Clock()
    window = ProfilerWindow("c4", 50, str(tmp_path), clock=clock)
    window.start()
    assert window.begin_step(0) == ""
    assert window.end_step() is None
    stopper = threading.Thread(target=window.stop, args=("the agent's timeout passed",))
    stopper.start()
    stopper.join()
    window.stop("a second reason")  # the first one wins
    assert window.begin_step(1) == "the agent's timeout passed"
    path, _ = window.finish(3, "the agent's timeout passed")
    assert path.endswith("rank3.pt.trace.json.gz") and traced_steps(path) == ["ProfilerStep#0"]
    assert not profiling()


@pytest.mark.slow
def test_a_trace_that_cannot_be_written_is_an_error_not_an_exception(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    window = ProfilerWindow("c5", 1, str(blocker / "traces"))
    window.start()
    window.begin_step(0)
    assert window.end_step() == ""
    path, error = window.finish(0, "")
    assert path == "" and "could not write the trace" in error and not profiling()


@pytest.mark.parametrize(("steps", "timeout_s", "named"), [
    (0, 10.0, "steps: 0"), (MAX_STEPS + 1, 10.0, f"steps: {MAX_STEPS + 1}"), (10**10, 10.0, "steps: 10000000000"),
    (1, MAX_SECONDS + 1, "timeout_s"), (1, float("nan"), "timeout_s"), (1, -1.0, "timeout_s"),
])
def test_the_cli_refuses_out_of_bounds_requests_naming_the_bound(steps: int, timeout_s: float, named: str) -> None:
    problem = bounds_problem(steps, timeout_s)
    assert problem is not None and problem.startswith(named)
    assert bounds_problem(MAX_STEPS, MAX_SECONDS) is None and bounds_problem(1, 0.0) is None


def control(tmp_path: Path) -> CaptureControl:
    """A controller whose agent is absent: its reports are only kept in ``results``."""
    return CaptureControl(f"unix://{tmp_path}/absent.sock", "job", 2, 1234, (), 0.05, 0.1)


def command(capture_id: str, steps: int, trace_dir: Path) -> pb.CaptureCommand:
    return pb.CaptureCommand(capture_id=capture_id, steps=steps, trace_dir=str(trace_dir))


@pytest.mark.slow
def test_the_control_profiles_the_commanded_steps_and_reports_the_trace(tmp_path: Path) -> None:
    captures = control(tmp_path)
    assert not captures.active
    captures._on_command(command("c6", 2, tmp_path / "traces"))
    captures._on_command(command("c7", 2, tmp_path / "other"))  # one capture at a time
    assert captures.active
    for i in range(4):
        if captures.active:
            captures.step_begin(i)
        torch.ones(8).add_(1)
        if captures.active:
            captures.step_end()
    assert not captures.active and not profiling()
    busy, done = captures.results
    assert (busy["capture_id"], busy["error"]) == ("c7", "this process is already capturing")
    assert (done["capture_id"], done["rank"], done["pid"], done["steps"], done["error"]) == ("c6", 2, 1234, 2, "")
    assert done["trace_path"] == str(tmp_path / "traces" / "rank2.pt.trace.json.gz")
    assert trace_files(tmp_path) == [Path(done["trace_path"])]  # where every command looks for traces
    assert traced_steps(done["trace_path"]) == ["ProfilerStep#0", "ProfilerStep#1"]
    assert 0 < done["begin_ns"] < done["end_ns"]


@pytest.mark.slow
def test_a_stop_command_ends_the_window_with_a_partial_trace(tmp_path: Path) -> None:
    captures = control(tmp_path)
    captures._on_command(command("c8", 50, tmp_path))
    captures.step_begin(0)
    captures.step_end()
    captures._on_command(command("c8", STOP_STEPS, tmp_path))
    captures.step_begin(1)
    assert not captures.active and not profiling()
    (result,) = captures.results
    assert result["steps"] == 1
    assert result["error"] == "the agent's timeout passed after 1 of 50 steps; trace is partial"
    assert traced_steps(result["trace_path"]) == ["ProfilerStep#0"]


def test_a_stop_before_the_window_starts_drops_the_command(tmp_path: Path) -> None:
    captures = control(tmp_path)
    captures._on_command(command("c9", 5, tmp_path))
    captures._on_command(command("c9", STOP_STEPS, tmp_path))
    captures.step_begin(0)
    assert not captures.active and captures.results == [] and not profiling()

