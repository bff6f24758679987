"""Capture requests the agent refuses or ends, and what it says at start about who may ask (docs/CAPTURE.md)."""
from __future__ import annotations

import logging
import math
import queue
import threading
from pathlib import Path

import pytest

from agent.capture import MAX_TIMEOUT_S, CaptureInvalid, CaptureManager, log_access
from agent.config import load_settings
from agent.sampler import FixedRateTicker
from chopper.profiler import MAX_STEPS, STOP_STEPS
from chopper.proto.chopper.v1 import agent_pb2 as pb


@pytest.mark.parametrize(("fields", "message"), [
    ({"steps": 0}, "steps must be 1 to 100"),
    ({"out_dir": "relative/dir"}, "out_dir must be an absolute path"),
    ({"sample_hz": math.nan}, "sample_hz must be 0"),
    ({"sample_hz": -1.0}, "sample_hz must be 0"),
    ({"timeout_s": math.inf}, "timeout_s must be 0"),
    ({"timeout_s": math.nan}, "timeout_s must be 0"),
    ({"timeout_s": MAX_TIMEOUT_S + 1}, "timeout_s must be 0"),
])
def test_out_of_range_requests_are_invalid_with_the_field_named(fields: dict[str, object], message: str) -> None:
    manager = CaptureManager(FixedRateTicker(20.0, lambda now: None))
    request = pb.CaptureRequest(**{"job": "j", "steps": 2, "out_dir": "/tmp/capture", **fields})
    with pytest.raises(CaptureInvalid, match=message):
        manager.request(request)


@pytest.mark.hazard(item=3, input="CaptureRequest with steps 10^9 (and MAX_STEPS + 1)",
                    promise="refused with the documented maximum named, before any process is told to profile")
@pytest.mark.parametrize("steps", [MAX_STEPS + 1, 10**9])
def test_steps_over_the_maximum_are_refused_before_any_command(steps: int, hazard) -> None:
    manager = CaptureManager(FixedRateTicker(20.0, lambda now: None))
    listener = manager.attach("j", 0, 1234, queue.Queue())
    with pytest.raises(CaptureInvalid, match=f"steps must be 1 to {MAX_STEPS}, got {steps}: torch.profiler") as err:
        manager.request(pb.CaptureRequest(job="j", steps=steps, out_dir="/tmp/capture"))
    assert listener.commands.qsize() == 0
    hazard.outcome = f"CaptureInvalid '{str(err.value)[:40]}…'; 0 commands sent to the connected rank"


def test_a_timed_out_capture_tells_the_ranks_still_profiling_to_stop(caplog: pytest.LogCaptureFixture) -> None:
    manager = CaptureManager(FixedRateTicker(20.0, lambda now: None))
    slow, quick = manager.attach("j", 0, 1, queue.Queue()), manager.attach("j", 1, 2, queue.Queue())
    done = threading.Timer(0.05, lambda: manager.report(pb.CaptureResult(
        capture_id=quick.commands.queue[0].capture.capture_id, job="j", rank=1, steps=2)))
    done.start()
    with caplog.at_level(logging.WARNING, logger="agent.capture"):
        reply = manager.request(pb.CaptureRequest(job="j", steps=2, out_dir="/tmp/capture", timeout_s=0.3))
    done.join()
    assert list(reply.missing_ranks) == [0]
    start, stop = slow.commands.get_nowait(), slow.commands.get_nowait()
    assert (start.capture.steps, stop.capture.steps) == (2, STOP_STEPS)
    assert stop.capture.capture_id == start.capture.capture_id == reply.capture_id
    assert quick.commands.qsize() == 1  # the rank that reported is not told anything more
    assert "event=capture_timeout" in caplog.text and "ranks=[0]" in caplog.text


def test_without_a_token_file_the_start_log_names_who_can_request_a_capture(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    socket = str(tmp_path / "a.sock")
    with caplog.at_level(logging.INFO, logger="agent.capture"):
        log_access(load_settings(["--socket-path", socket, "--grpc-listen", "0.0.0.0:9478"], env={}))
        open_record = caplog.records[-1]
        token = tmp_path / "t"
        token.write_text("x\n")
        log_access(load_settings(["--socket-path", socket, "--token-file", str(token)], env={}))
    assert open_record.levelname == "WARNING"
    message = open_record.getMessage()
    assert "event=capture_unprotected" in message and socket in message and "0.0.0.0:9478" in message
    assert "set token_file" in message
    assert caplog.records[-1].levelname == "INFO" and "event=capture_access" in caplog.records[-1].getMessage()
