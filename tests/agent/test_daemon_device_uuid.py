"""A rank named only by its device UUID drives the simulated GPU the agent resolved, not the batch's index."""
from __future__ import annotations

from collections.abc import Sequence

from agent.backends.simulated import SimulatedBackend
from agent.config import load_settings
from agent.daemon import Agent
from agent.marker_wire import MarkerRow
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.schema import MarkerKind

S = 10**9
T0 = 1_800_000_000 * S


class ObservedBackend(SimulatedBackend):
    """The simulated backend, remembering which GPU each observed marker went to."""

    def __init__(self) -> None:
        super().__init__("n", gpus=4)
        self.observed: list[tuple[int, MarkerKind]] = []

    def observe_markers(self, gpu: int, markers: Sequence[MarkerRow]) -> None:
        self.observed += [(gpu, MarkerKind(row[1])) for row in markers]
        super().observe_markers(gpu, markers)


def test_markers_of_a_rank_named_by_uuid_load_that_gpu() -> None:
    backend = ObservedBackend()
    settings = load_settings(["--node", "n", "--backend", "simulated", "--sim-gpus", "4"], env={})
    agent = Agent(settings, backend, realtime_ns=lambda: T0)
    agent.open_backend()
    uuid = agent.devices[3].uuid
    agent.push_markers(pb.MarkerBatch(job="j", rank=0, gpu=-1, device_uuid=uuid, seq=1, pid=7,
                                      markers=[pb.Marker(kind=pb.MARKER_KIND_STEP_BEGIN, ts_ns=T0, step=0)]))
    assert backend.observed == [(3, MarkerKind.STEP_BEGIN)] and backend.ignored_markers == 0
