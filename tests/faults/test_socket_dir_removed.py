"""The trainers' socket directory is removed under a running agent (``rm -rf /run/chopper``).

A trainer already connected keeps its stream; one that starts afterwards finds no socket. The
promise: training unaffected either way, every marker that cannot be delivered counted by the
client, and the agent serving new trainers again by itself.
"""
from __future__ import annotations

import shutil
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
HEAL_TIMEOUT_S = 5.0


def test_socket_directory_removed(tmp_path: Path, fault_record: FaultRecord) -> None:
    rec = fault_record
    rec.fault = "the trainers' socket directory is removed (rm -rf) under a running agent; a new trainer starts after"
    rec.promise = ("training unaffected; undeliverable markers counted by the client; the agent serves new "
                   "trainers again by itself")
    rundir = tmp_path / "run-chopper"
    rundir.mkdir()
    agent = AgentProcess(rundir, nice=10).start()
    assert agent.proc is not None

    def steps(rank: int) -> float:
        return metric_sum(agent.metrics(), "chopper_rank_steps_total", training_job="faults", rank=str(rank))

    try:
        connected = start_trainer(agent.target, 7.0, "--rank", "0", "--gpu", "0")
        time_until(lambda: steps(0) > 0, timeout_s=30)
        time.sleep(1.5)
        removed_at = time.monotonic()
        shutil.rmtree(rundir)
        newcomer = start_trainer(agent.target, 4.0, "--rank", "1", "--gpu", "1")
        try:
            rec.recovery_s = round(time_until(lambda: steps(1) > 0, timeout_s=HEAL_TIMEOUT_S), 2)
        except AssertionError:
            rec.recovery_s = None
        first = finish_trainer(connected)
        second = finish_trainer(newcomer)
        text = agent.metrics()
        rec.peak_rss_mib = round(peak_rss_mib(agent.proc.pid), 1)
    finally:
        if agent.proc.poll() is None:
            agent.proc.terminate()
            agent.proc.wait(15)
    got = [metric_sum(text, "chopper_rank_markers_received_total", training_job="faults", rank=str(r)) for r in (0, 1)]
    ratio, inside, outside = step_time_ratio(first.times, [(removed_at, removed_at + 5.0)])
    rec.step_time_ratio = round(ratio, 4)
    rec.rss_ceiling_mib = AGENT_RSS_CEILING_MIB
    rec.lost = sum(r.uncounted + int(r.marked - r.client["dropped"] - g) for r, g in zip((first, second), got,
                                                                                       strict=True))
    rec.counted_losses = int(first.client["dropped"] + second.client["dropped"])
    rec.outcome = (f"connected trainer: {got[0]:.0f} of {first.marked} markers received, {first.client['dropped']} "
                   f"dropped; new trainer: {got[1]:.0f} of {second.marked} received, {second.client['dropped']} "
                   f"dropped and counted ({second.client['last_error'][:60]}); "
                   f"{'served again' if rec.recovery_s is not None else f'not served within {HEAL_TIMEOUT_S:g} s'}")
    assert rec.lost == 0, "markers lost without being counted"
    assert abs(ratio - 1) <= STEP_TIME_TOLERANCE, f"step time ratio {ratio:.4f} ({inside} in, {outside} out)"
    assert rec.peak_rss_mib < AGENT_RSS_CEILING_MIB
    assert rec.recovery_s is not None, "the agent did not recreate its socket: new trainers cannot connect"
