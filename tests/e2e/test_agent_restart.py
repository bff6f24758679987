"""Killing the agent mid-training never hurts training; markers flow again after a restart."""
from __future__ import annotations

import time

import pytest

from chopper.demo.run import metric_sum
from tests.support.daemons import AgentProcess
from tests.support.polling import wait_until
from tests.support.training import finish_training, start_training


@pytest.mark.slow
def test_training_survives_agent_kill_and_restart(agent_process: AgentProcess) -> None:
    training = start_training(agent_process.target, ranks=2, duration_s=12.0)

    def steps_seen() -> float:
        try:
            return metric_sum(agent_process.metrics(), "chopper_rank_steps_total", training_job="e2e")
        except OSError:
            return 0.0

    assert wait_until(lambda: steps_seen() > 0, timeout_s=60), "training never reached the first agent"
    agent_process.kill()  # SIGKILL: no goodbye, the socket file stays behind
    time.sleep(3.0)
    assert training.poll() is None, "training must keep running without its agent"
    agent_process.start()  # a new agent on the same (stale) socket path
    assert wait_until(lambda: steps_seen() > 0, timeout_s=30), "markers did not flow to the restarted agent"
    sent = finish_training(training)
    text = agent_process.metrics()
    for rank, counts in sent.items():
        received = metric_sum(text, "chopper_rank_steps_total", training_job="e2e", rank=rank)
        assert 0 < received < counts["steps"], f"rank {rank}: the new agent saw {received} of {counts['steps']}"
        # The client knows what it could not deliver (queue overflow or batches in flight at the kill);
        # markers it held while the agent was down were delivered after the restart.
        client = counts["client"]
        assert client["sent"] + client["dropped"] == 10 * counts["steps"]  # 10 markers per step
