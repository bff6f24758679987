"""Capture requests the agent refuses before touching any training process (docs/CAPTURE.md)."""
from __future__ import annotations

import math

import pytest

from agent.capture import MAX_TIMEOUT_S, CaptureInvalid, CaptureManager
from agent.sampler import FixedRateTicker
from chopper.proto.chopper.v1 import agent_pb2 as pb


@pytest.mark.parametrize(("fields", "message"), [
    ({"steps": 0}, "steps must be at least 1"),
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
