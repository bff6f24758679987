"""Phase times of a real training loop, timed independently, against the agent's live step summaries.

The loop runs a real PyTorch model on CPU and marks each phase with ``chopper.Client``; inside every
phase it times the work itself with ``time.perf_counter``, a clock the markers do not use. A
``data`` phase entered twice per step checks that repeated windows add up, and a user phase
``train`` around forward and backward checks that nested phases each count.
"""
from __future__ import annotations

import time
from collections import defaultdict

import pytest

from chopper import consumer
from chopper.client import Client
from chopper.proto.chopper.v1 import agent_pb2 as pb
from tests.e2e.conftest import AgentProcess, metric_sum, wait_until

torch = pytest.importorskip("torch")

STEPS = 12
SLEEP_S = 0.015
# A marker costs microseconds; CLOCK_REALTIME and perf_counter drift apart by far less than this.
TOLERANCE_S = 1e-3


def summaries(target: str, want: int) -> list[pb.StepSummary]:
    channel, stream = consumer.subscribe(target, pb.SubscribeRequest(step_summaries=True, since_ns=1))
    got: list[pb.StepSummary] = []
    try:
        for batch in stream:
            got += batch.step_summaries
            if len(got) >= want:
                break
    finally:
        channel.close()
    return got


@pytest.mark.slow
def test_phase_times_equal_the_loop_s_own_timing(agent_process: AgentProcess) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    client = Client("phases", 0, 0, agent_process.target, control=False)
    measured: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for i in range(STEPS):
        m = measured[i]
        with client.step(i, flops=1e9, tokens=64):
            for _ in range(2):  # two loads per step, each a known sleep
                with client.phase("data"):
                    t = time.perf_counter()
                    time.sleep(SLEEP_S)
                    m["data"] += time.perf_counter() - t
            with client.phase("train"):
                t_train = time.perf_counter()
                with client.phase("forward"):
                    t = time.perf_counter()
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    m["forward"] += time.perf_counter() - t
                with client.phase("backward"):
                    t = time.perf_counter()
                    opt.zero_grad()
                    loss.backward()
                    m["backward"] += time.perf_counter() - t
                m["train"] += time.perf_counter() - t_train
            with client.phase("optimizer"):
                t = time.perf_counter()
                opt.step()
                m["optimizer"] += time.perf_counter() - t
    client.shutdown(timeout=10)
    assert client.stats()["dropped"] == 0
    assert wait_until(lambda: metric_sum(agent_process.metrics(), "chopper_agent_step_summaries_total") >= STEPS,
                      timeout_s=30)
    live = {s.step: {p.name: p.seconds for p in s.phase_times} for s in summaries(agent_process.target, STEPS)}
    assert sorted(live) == list(range(STEPS))
    for step, phases in live.items():
        assert phases.keys() == measured[step].keys(), step
        for name, seconds in measured[step].items():
            # The marker window holds the timed work and the marker calls around it: never shorter.
            assert seconds - 1e-5 <= phases[name] <= seconds + TOLERANCE_S, (step, name, phases[name], seconds)
        assert phases["data"] >= 2 * SLEEP_S
    # The same figures on /metrics, summed over the steps.
    text = agent_process.metrics()
    for name in ("data", "train", "forward", "backward", "optimizer"):
        total = metric_sum(text, "chopper_rank_phase_seconds_total", job="phases", phase=name)
        assert total == pytest.approx(sum(measured[i][name] for i in range(STEPS)), abs=STEPS * TOLERANCE_S), name
