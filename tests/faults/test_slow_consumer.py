"""A consumer stops reading the agent's stream for seconds: the agent neither stalls nor grows, and counts the skip.

Two ``Subscribe(samples)`` consumers run side by side against an agent sampling 8 GPUs at
100 Hz with a 2,000-sample ring buffer: a fast one reading everything, and a slow one that
stops reading for ``STALL_S`` (longer than the buffer holds). gRPC's flow control blocks the
slow stream's sender; when it reads again it must learn how many samples it missed.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc

from chopper.demo.run import metric_sum
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import agent_pb2_grpc as pb_grpc
from tests.faults.harness import (
    STEP_TIME_TOLERANCE,
    finish_trainer,
    peak_rss_mib,
    rss_mib,
    start_trainer,
    step_time_ratio,
    time_until,
)
from tests.faults.records import FaultRecord
from tests.support.daemons import AgentProcess

AGENT_RSS_CEILING_MIB = 300.0
STALL_S = 5.0


class Reader:
    """One Subscribe(samples) stream read in a thread; ``paused`` stops reading."""

    def __init__(self, target: str) -> None:
        # Without BDP probing the receive window stays at 64 KiB, so a reader that stops reading
        # stops the agent's sender within a second instead of after megabytes of client buffer.
        self.channel = grpc.insecure_channel(target, options=[("grpc.http2.bdp_probe", 0)])
        self.stream = pb_grpc.AgentStub(self.channel).Subscribe(pb.SubscribeRequest(samples=True))
        self.items: list[tuple[int, int]] = []  # (ts_ns, gpu) of every sample received
        self.missed = 0
        self.reading = threading.Event()
        self.reading.set()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for batch in self.stream:
                self.items += [(s.ts_ns, s.gpu) for s in batch.samples]
                self.missed = batch.missed_total
                self.reading.wait()
        except grpc.RpcError:
            pass  # closed at the end of the test

    def close(self) -> None:
        self.reading.set()
        self.channel.close()
        self.thread.join(5)


def test_slow_consumer(tmp_path: Path, fault_record: FaultRecord) -> None:
    rec = fault_record
    rec.fault = (f"a Subscribe consumer stops reading for {STALL_S:g} s (longer than the 2,000-sample buffer holds "
                 "at 8 GPUs x 100 Hz) beside a fast consumer and a trainer")
    rec.promise = ("training and the other consumer unaffected; agent memory bounded; the slow consumer told "
                   "exactly how many samples it missed")
    agent = AgentProcess(tmp_path, "--sim-gpus", "8", "--sample-hz", "100", "--sample-buffer", "2000", nice=10).start()
    assert agent.proc is not None
    try:
        trainer = start_trainer(agent.target, 9.0)
        time_until(lambda: metric_sum(agent.metrics(), "chopper_rank_steps_total", training_job="faults") > 0,
                   timeout_s=30)
        fast, slow = Reader(agent.target), Reader(agent.target)
        time.sleep(1.0)
        stalled_at = time.monotonic()
        slow.reading.clear()
        rss_before = rss_mib(agent.proc.pid)
        time.sleep(STALL_S)
        rss_after = rss_mib(agent.proc.pid)
        slow.reading.set()
        resumed_at = time.monotonic()
        # Caught up: its newest sample as new as the fast consumer's, give or take half a second
        # (the samples' own stamps trail the clock by the backend's lag, agent.backends.simulated).
        rec.recovery_s = round(time_until(lambda: bool(slow.items) and fast.items[-1][0] - slow.items[-1][0] < 0.5e9,
                                          timeout_s=10), 2)
        time.sleep(1.0)
        slow.close()
        fast.close()
        result = finish_trainer(trainer)
        text = agent.metrics()
        rec.peak_rss_mib = round(peak_rss_mib(agent.proc.pid), 1)
    finally:
        agent.terminate()
    # The samples between the slow consumer's first and last: the fast one saw them all, and the
    # slow one must have received each or counted it as missed.
    first, last = slow.items[0], slow.items[-1]
    expected = {item for item in fast.items if first <= item <= last}
    skipped = expected - set(slow.items)
    received = metric_sum(text, "chopper_rank_markers_received_total", training_job="faults")
    ratio, inside, outside = step_time_ratio(result.times, [(stalled_at, resumed_at + rec.recovery_s)])
    rec.step_time_ratio = round(ratio, 4)
    rec.rss_ceiling_mib = AGENT_RSS_CEILING_MIB
    rec.lost = abs(len(skipped) - slow.missed) + result.uncounted + int(
        result.marked - result.client["dropped"] - received)
    rec.duplicated = len(slow.items) - len(set(slow.items))
    rec.counted_losses = slow.missed
    rec.outcome = (f"slow consumer got {len(slow.items)} samples, skipped {len(skipped)} and was told it missed "
                   f"{slow.missed}; the fast one saw all {len(expected)} of that span and missed {fast.missed}; "
                   f"agent RSS {rss_before:.0f} → {rss_after:.0f} MiB over the stall; trainer markers "
                   f"{received:.0f} of {result.marked}")
    assert slow.missed > 0, "the stall did not outlast the buffer: nothing was tested"
    assert fast.missed == 0
    assert rec.lost == 0 and rec.duplicated == 0
    assert rss_after < rss_before + 20
    assert abs(ratio - 1) <= STEP_TIME_TOLERANCE, f"step time ratio {ratio:.4f} ({inside} in, {outside} out)"
    assert rec.peak_rss_mib < AGENT_RSS_CEILING_MIB
