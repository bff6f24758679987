"""Subscribers of step summaries are told where the ranks are about once a second, steps or not."""
from __future__ import annotations

import itertools
import time
from pathlib import Path

from chopper.positions import describe
from chopper.proto.chopper.v1 import agent_pb2 as pb
from tests.support.running_servers import RunningAgent


def test_a_rank_inside_a_collective_is_reported_every_second(tmp_path: Path) -> None:
    running = RunningAgent(tmp_path)
    try:
        t0 = time.time_ns()
        batch = pb.MarkerBatch(job="j", rank=1, gpu=1, seq=1, pid=5, markers=[
            pb.Marker(kind=pb.MARKER_KIND_STEP_BEGIN, step=3, ts_ns=t0),
            pb.Marker(kind=pb.MARKER_KIND_COLLECTIVE_BEGIN, step=3, ts_ns=t0 + 1000, name="all_reduce"),
        ])
        assert running.stub.PushMarkers(iter([batch])).accepted == 2
        stream = running.stub.Subscribe(pb.SubscribeRequest(step_summaries=True), timeout=20)
        seen: list[tuple[float, list[pb.RankPosition]]] = []
        for reply in stream:
            assert not reply.step_summaries
            seen.append((time.monotonic(), list(reply.positions)))
            if len(seen) == 3:
                break
        stream.cancel()
        assert all(len(positions) == 1 for _, positions in seen)
        p = seen[-1][1][0]
        assert (p.job, p.node, p.rank, p.gpu, p.step, p.collective) == ("j", "n1", 1, 1, 3, "all_reduce")
        assert describe([p]).startswith("rank 1 inside collective all_reduce of step 3 for ")
        gaps = [b - a for (a, _), (b, _) in itertools.pairwise(seen)]
        assert all(0.9 <= g <= 2.0 for g in gaps), gaps
        # A subscriber of samples or markers only gets no positions.
        markers = running.stub.Subscribe(pb.SubscribeRequest(markers=True, since_ns=t0), timeout=20)
        first = next(iter(markers))
        markers.cancel()
        assert len(first.markers) == 2 and not first.positions
    finally:
        running.stop()
