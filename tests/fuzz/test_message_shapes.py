"""gRPC request decoding (``chopper.daemon.grpc_decode``) costs what the bytes cost, whatever their nesting.

protobuf's parser (upb) refuses groups nested beyond its recursion limit (100) before it builds
anything, so a request of unknown groups nested 1,000 to 100,000 deep is answered as ``Garbled``;
unknown length-delimited fields nested in each other are kept as opaque bytes, never descended.
Either way the work is linear in the request's size. Ratios between sizes measured in the
same run, the least of five timings; peak Python allocations by ``tracemalloc``.
"""
from __future__ import annotations

import time
import tracemalloc
from typing import Any

import pytest

from chopper.daemon.grpc_decode import Garbled, decoder
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from tests.support.strategies import length_delimited


def _groups(depth: int) -> bytes:
    """Unknown field 15 as start-group / end-group pairs, nested ``depth`` deep."""
    return b"\x7b" * depth + b"\x7c" * depth


def _fields(depth: int) -> bytes:
    """Unknown length-delimited field 15 holding itself, ``depth`` deep."""
    data = b""
    for _ in range(depth):
        data = length_delimited(15, data, len(data))
    return data


@pytest.mark.hazard(item=13, input="gRPC requests of unknown groups or fields nested 1,000 to 100,000 deep",
                    promise="groups refused as garbled, opaque fields kept; time and memory linear in the request")
@pytest.mark.parametrize("shape", [_groups, _fields], ids=["groups", "length-delimited"])
def test_deep_requests_are_refused_in_linear_work(shape: Any, hazard: Any) -> None:
    seconds, peaks = [], []
    for depth in (1_000, 10_000, 100_000) if shape is _groups else (300, 3_000):
        data = shape(depth)
        for parse in (pb.MarkerBatch.FromString, apb.SummaryBatch.FromString):
            assert isinstance(decoder(parse)(data), Garbled) == (shape is _groups)
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            decoder(pb.MarkerBatch.FromString)(data)
            best = min(best, time.perf_counter() - start)
        tracemalloc.start()
        decoder(pb.MarkerBatch.FromString)(data)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        seconds.append((len(data), best))
    (n0, t0), (n1, t1) = seconds[0], seconds[-1]
    hazard.outcome = (f"{shape.__name__.strip('_')}: {n1 / n0:.0f}x the bytes ({n0:,} → {n1:,}) took {t1 / t0:.1f}x "
                      f"the time ({t0 * 1e6:.0f} → {t1 * 1e6:.0f} µs), peak allocations {peaks[0]:,} → {peaks[-1]:,} "
                      f"bytes; {'every request Garbled' if shape is _groups else 'decoded, fields kept opaque'}")
    # Linear would be n1/n0; refusing early is less. Twice linear still fails a quadratic parser.
    assert t1 / t0 < 2 * n1 / n0 + 2, hazard.outcome
    assert peaks[-1] < 2 * peaks[0] + 64 * n1, hazard.outcome
