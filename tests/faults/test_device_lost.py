"""The GPUs fall off the bus mid-run and come back: the agent keeps serving, counts it, and recovers by itself.

A real agent process over a fake NVML (``tests/faults/nvml_agent.py``, the vendor-library seam):
SIGUSR1 makes every device read raise ``NVMLError_GpuIsLost``, SIGUSR2 brings the GPUs back.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from chopper.demo.run import metric_sum
from tests.faults.harness import (
    STEP_TIME_TOLERANCE,
    finish_trainer,
    peak_rss_mib,
    start_trainer,
    step_time_ratio,
    time_until,
)
from tests.faults.records import FaultRecord
from tests.support.daemons import AgentProcess

AGENT_RSS_CEILING_MIB = 300.0
LOST_S = 2.5


def test_device_lost_then_recovered(tmp_path: Path, fault_record: FaultRecord) -> None:
    rec = fault_record
    rec.fault = f"every GPU falls off the bus (NVML GpuIsLost) for {LOST_S:g} s mid-run, then comes back"
    rec.promise = ("training unaffected; the agent keeps serving markers and /metrics with backend_up 0 and the "
                   "errors counted, and reopens the backend by itself")
    agent = AgentProcess(tmp_path, module="tests.faults.nvml_agent", nice=10).start()
    assert agent.proc is not None

    def value(name: str, **labels: str) -> float:
        return metric_sum(agent.metrics(), name, **labels)

    try:
        trainer = start_trainer(agent.target, 9.0)
        time_until(lambda: value("chopper_rank_steps_total", training_job="faults") > 0, timeout_s=30)
        time.sleep(1.5)
        lost_at = time.monotonic()
        os.kill(agent.proc.pid, signal.SIGUSR1)
        time_until(lambda: value("chopper_agent_backend_up") == 0, timeout_s=20)
        steps_down = value("chopper_rank_steps_total", training_job="faults")
        time.sleep(LOST_S)
        during = agent.metrics()
        os.kill(agent.proc.pid, signal.SIGUSR2)
        back_at = time.monotonic()
        time_until(lambda: value("chopper_agent_backend_up") == 1, timeout_s=40)
        recovered_at = time.monotonic()
        result = finish_trainer(trainer)
        text = agent.metrics()
        rec.peak_rss_mib = round(peak_rss_mib(agent.proc.pid), 1)
    finally:
        agent.terminate()
    received = metric_sum(text, "chopper_rank_markers_received_total", training_job="faults")
    errors = metric_sum(during, "chopper_agent_backend_errors_total")
    steps_during = metric_sum(during, "chopper_rank_steps_total", training_job="faults") - steps_down
    ratio, inside, outside = step_time_ratio(result.times, [(lost_at, recovered_at)])
    rec.step_time_ratio = round(ratio, 4)
    rec.recovery_s = round(recovered_at - back_at, 2)
    rec.rss_ceiling_mib = AGENT_RSS_CEILING_MIB
    rec.lost = result.uncounted + int(result.marked - result.client["dropped"] - received)
    rec.counted_losses = int(result.client["dropped"])
    rec.outcome = (f"{errors:.0f} backend errors counted while lost (backend_up 0), {steps_during:.0f} steps "
                   f"counted meanwhile; {received:.0f} of {result.marked} markers received; backend up again "
                   f"{rec.recovery_s:g} s after the GPUs returned (reopen backoff)")
    assert rec.lost == 0
    assert errors > 0 and steps_during > 0, "the agent stopped taking markers while its backend was down"
    assert metric_sum(text, "chopper_agent_backend_up") == 1
    assert abs(ratio - 1) <= STEP_TIME_TOLERANCE, f"step time ratio {ratio:.4f} ({inside} in, {outside} out)"
    assert rec.peak_rss_mib < AGENT_RSS_CEILING_MIB
