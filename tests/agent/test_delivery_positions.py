"""Where the ranks are reaches the aggregator replica that owns each job, once a second, summaries or not."""
from __future__ import annotations

import threading
from pathlib import Path

from agent.buffers import RingBuffer
from agent.delivery import Forwarder, route
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from tests.support.polling import wait_until
from tests.support.running_servers import RunningAggregator


def test_each_replica_gets_the_positions_of_its_jobs_without_any_summary(tmp_path: Path) -> None:
    replicas = [RunningAggregator(tmp_path / "a"), RunningAggregator(tmp_path / "b")]
    addresses = [r.address for r in replicas]
    jobs = [f"job-{i}" for i in range(6)]
    reads: list[int] = []
    lock = threading.Lock()

    def positions() -> list[pb.RankPosition]:
        with lock:
            reads.append(len(reads))
            step = len(reads)
        return [pb.RankPosition(job=job, rank=rank, step=step, collective="all_reduce") for job in jobs
                for rank in (0, 1)]

    fwd = Forwarder(RingBuffer[pb.StepSummary](16), "n1", ",".join(addresses), interval_s=0.02, positions=positions)
    fwd.start()
    try:
        members = tuple(sorted(addresses))

        def held() -> dict[str, list[int]]:
            out = {}
            for replica, address in zip(replicas, addresses, strict=True):
                for job in jobs:
                    ranks = [p.rank for p in replica.stub.QuerySteps(apb.QueryStepsRequest(job=job)).positions]
                    out[f"{job}@{address}"] = ranks
            return out

        assert wait_until(lambda: all(held()[f"{j}@{route(j, members)}"] == [0, 1] for j in jobs), timeout_s=15)
        # Only the owner holds a job's positions.
        assert all(not ranks for key, ranks in held().items() if key.split("@")[1] != route(key.split("@")[0], members))
        # About once a second per replica stream, although the router polls every 20 ms.
        before = len(reads)
        threading.Event().wait(2.0)
        assert 2 <= len(reads) - before <= 2 * 3, len(reads) - before
        assert fwd.snapshot() and all(d["sent"] == 0 for d in fwd.snapshot().values())
    finally:
        fwd.stop()
        for r in replicas:
            r.stop()
