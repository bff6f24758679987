"""An agent on a simulated node, driven directly (no gRPC) on a clock the test moves."""
from __future__ import annotations

from agent.backends.simulated import SimulatedBackend
from agent.config import load_settings
from agent.daemon import Agent
from chopper.proto.chopper.v1 import agent_pb2 as pb
from tests.support.summaries import NS

T0 = 1_800_000_000 * NS


class SimulatedNode:
    """An agent of node "n" with 2 simulated GPUs and the extra command-line ``flags``; ``now`` is its clock (ns)."""

    def __init__(self, *flags: str) -> None:
        self.now = T0
        settings = load_settings(["--node", "n", "--backend", "simulated", "--sim-gpus", "2", *flags], env={})
        self.agent = Agent(settings, SimulatedBackend("n", gpus=2), realtime_ns=lambda: self.now)
        self.agent.open_backend()
        self.seq: dict[tuple[str, int], int] = {}

    def send(self, job: str, rank: int, *markers: tuple[pb.MarkerKind, int], stamped_s: float | None = None) -> None:
        """Push one batch of ``(kind, step)`` markers from rank ``rank`` (on GPU ``rank``) of ``job``, stamped now
        or ``stamped_s`` seconds after the start (a trainer whose clock runs ahead of the agent's)."""
        seq = self.seq[(job, rank)] = self.seq.get((job, rank), 0) + 1
        ts_ns = self.now if stamped_s is None else T0 + int(stamped_s * NS)
        self.agent.push_markers(pb.MarkerBatch(
            job=job, rank=rank, gpu=rank, seq=seq, pid=100 + rank,
            markers=[pb.Marker(kind=k, ts_ns=ts_ns, step=step) for k, step in markers]))

    def at(self, seconds: float) -> None:
        """Move the clock to ``seconds`` after the start."""
        self.now = T0 + int(seconds * NS)

    def tracked(self) -> set[tuple[str, int]]:
        """The (job, rank) pairs the agent holds state for."""
        return {key for key, _ in self.agent.rank_states()}
