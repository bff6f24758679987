"""Phase times of a real training loop, timed independently, against the agent's live step summaries.

The loop runs a real PyTorch model on CPU and marks each phase with ``chopper.Client``; it times each
phase with ``time.perf_counter``, a clock the markers do not use, inside and outside the marker calls. A
``data`` phase entered twice per step checks that repeated windows add up, and a user phase
``train`` around forward and backward checks that nested phases each count.
"""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator

import pytest

from chopper.client import Client
from chopper.demo.run import metric_sum
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.runs import consumer
from tests.support.daemons import AgentProcess
from tests.support.polling import wait_until

torch = pytest.importorskip("torch")

STEPS = 12
SLEEP_S = 0.015
# CLOCK_REALTIME (the markers) and perf_counter (the loop) drift apart by far less than this in a phase.
CLOCK_S = 1e-5


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


class PhaseTimer:
    """``client.phase(name)`` bracketed by ``perf_counter`` inside and outside the marker calls.

    The marker window lies between the two brackets whatever the scheduler does: ``inner`` times only
    the work, ``outer`` also the marker calls, so a preemption between a marker and the work (common
    on a loaded machine) widens ``outer`` instead of failing the check.
    """

    def __init__(self, client: Client) -> None:
        self.client = client
        self.inner: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.outer: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    @contextlib.contextmanager
    def phase(self, step: int, name: str) -> Iterator[None]:
        t_out = time.perf_counter()
        with self.client.phase(name):
            t_in = time.perf_counter()
            yield
            self.inner[step][name] += time.perf_counter() - t_in
        self.outer[step][name] += time.perf_counter() - t_out


@pytest.mark.slow
def test_phase_times_equal_the_loop_s_own_timing(agent_process: AgentProcess) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    client = Client("phases", 0, 0, agent_process.target, control=False)
    timer = PhaseTimer(client)
    for i in range(STEPS):
        with client.step(i, flops=1e9, tokens=64):
            for _ in range(2):  # two loads per step, each a known sleep
                with timer.phase(i, "data"):
                    time.sleep(SLEEP_S)
            with timer.phase(i, "train"):
                with timer.phase(i, "forward"):
                    loss = torch.nn.functional.mse_loss(model(x), y)
                with timer.phase(i, "backward"):
                    opt.zero_grad()
                    loss.backward()
            with timer.phase(i, "optimizer"):
                opt.step()
    client.shutdown(timeout=10)
    assert client.stats()["dropped"] == 0
    assert wait_until(lambda: metric_sum(agent_process.metrics(), "chopper_agent_step_summaries_total") >= STEPS,
                      timeout_s=30)
    live = {s.step: {p.name: p.seconds for p in s.phase_times} for s in summaries(agent_process.target, STEPS)}
    assert sorted(live) == list(range(STEPS))
    for step, phases in live.items():
        assert phases.keys() == timer.inner[step].keys(), step
        for name, inner in timer.inner[step].items():
            # The marker window holds the timed work and lies inside the calls around it.
            outer = timer.outer[step][name]
            assert inner - CLOCK_S <= phases[name] <= outer + CLOCK_S, (step, name, phases[name], inner, outer)
        assert phases["data"] >= 2 * SLEEP_S
    # The same figures on /metrics, summed over the steps.
    text = agent_process.metrics()
    for name in ("data", "train", "forward", "backward", "optimizer"):
        total = metric_sum(text, "chopper_rank_phase_seconds_total", training_job="phases", phase=name)
        inner = sum(timer.inner[i][name] for i in range(STEPS))
        outer = sum(timer.outer[i][name] for i in range(STEPS))
        assert inner - STEPS * CLOCK_S <= total <= outer + STEPS * CLOCK_S, (name, total, inner, outer)
