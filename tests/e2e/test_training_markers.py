"""A real 2-rank gloo training job against a real agent process: every marker sent arrives."""
from __future__ import annotations

import pytest

from chopper.demo.run import metric_sum
from tests.support.daemons import AgentProcess
from tests.support.polling import wait_until
from tests.support.training import finish_training, start_training

KINDS = {
    "step_begin": "steps", "step_end": "steps", "phase_begin": "phases", "phase_end": "phases",
    "collective_begin": "collectives", "collective_end": "collectives",
}


@pytest.mark.slow
def test_every_step_phase_and_collective_arrives(agent_process: AgentProcess) -> None:
    # 10 s: on a loaded 2-core machine the two ranks' first steps take seconds each.
    sent = finish_training(start_training(agent_process.target, ranks=2, duration_s=10.0))
    assert set(sent) == {"0", "1"}

    def counted(rank: str, kind: str) -> int:
        return int(metric_sum(agent_process.metrics(), "chopper_rank_markers_received_total",
                                job="e2e", rank=rank, kind=kind))

    for rank, counts in sent.items():
        assert counts["steps"] > 3, "training ran too few steps to be a meaningful test"
        assert counts["client"]["dropped"] == 0
        assert wait_until(lambda rank=rank, counts=counts: counted(rank, "step_end") == counts["steps"])
        for kind, what in KINDS.items():
            assert counted(rank, kind) == counts[what], f"rank {rank} {kind}"
    text = agent_process.metrics()
    assert metric_sum(text, "chopper_agent_markers_rejected_total") == 0
    assert metric_sum(text, "chopper_rank_steps_total", training_job="e2e", rank="0") == sent["0"]["steps"]
    # The simulated GPUs the ranks drive were busy while the others idled.
    assert metric_sum(text, "chopper_gpu_energy_joules_total", gpu="0") > 0
    assert agent_process.terminate() == 0
