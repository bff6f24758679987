"""A broken client floods the agent with markers: memory stays bounded, the other ranks' markers still arrive.

The flooder (``tests/faults/flood.py``) offers markers as fast as gRPC takes them, in big
batches on one stream, beside a well-behaved trainer on the same agent. The agent runs with
``--marker-buffer 100000 --summary-buffer 10000`` and the flood goes on until those ring buffers
have overwritten old items (at least ``FLOOD_S``, at most ``FLOOD_MAX_S``: how fast the agent
parses depends on what else this machine runs), so the RSS ceiling always checks the bound they
promise. The trainer then runs ``TRAIN_AFTER_S`` more and is stopped. The agent runs at nice 10 as
``deploy/systemd`` runs it, and so does the flooder (a rank that would have its own cores on a
real node; this machine has two for all of them).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from chopper.demo.run import metric_sum
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

# Measured: ~250 MiB once the ring buffers are full. The servers run without HTTP/2 BDP probing
# (chopper/daemon/serving.py), so a stream's receive window stays small and gRPC paces the flooder to what
# the agent parses: RSS plateaus instead of growing with the offered rate (it reached 528 MiB with
# probing on). When the buffers fill depends on how fast this machine lets the agent parse, so the
# bound is the ceiling, not the shape of the climb. The unit's MemoryMax is 2G.
AGENT_RSS_CEILING_MIB = 400.0
FLOOD_S = 4.0  # the flood lasts at least this long, seconds,
FLOOD_MAX_S = 30.0  # and ends sooner than this once the buffers have overwritten
TRAIN_AFTER_S = 2.0  # steps after the flood, for the step-time ratio's outside side
# Markers per flood message: big enough to offer far more than the agent takes, small enough that
# what it already took in when the flood is cancelled is worked off within a second or two.
BATCH = 4_000  # just under the 4096-marker batch limit (chopper.schema)
SETTLE_S = 0.5


def test_marker_flood(tmp_path: Path, fault_record: FaultRecord) -> None:
    rec = fault_record
    rec.fault = (f"a broken client floods the agent's socket with markers for at least {FLOOD_S:g} s, until its "
                 f"buffers overflow (batches of {BATCH:,} well-formed markers, as fast as gRPC takes them) beside a "
                 "well-behaved trainer")
    rec.promise = ("training unaffected; the agent's memory bounded by its buffers; the other ranks' markers all "
                   "arrive; what the agent drops or refuses is counted")
    agent = AgentProcess(tmp_path, "--marker-buffer", "100000", "--summary-buffer", "10000", nice=10).start()
    assert agent.proc is not None
    try:
        trainer = start_trainer(agent.target, FLOOD_MAX_S + 30)
        time_until(lambda: metric_sum(agent.metrics(), "chopper_rank_steps_total", training_job="faults") > 0,
                   timeout_s=30)
        time.sleep(1.5)
        flood_at = time.monotonic()
        flooder = subprocess.Popen(
            ["nice", "-n", "10", sys.executable, "-m", "tests.faults.flood", "--agent", agent.target,
             "--duration", str(FLOOD_MAX_S), "--batch", str(BATCH)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        rss = []
        ending = False
        while flooder.poll() is None:
            rss.append(rss_mib(agent.proc.pid))
            if (not ending and time.monotonic() - flood_at >= FLOOD_S
                    and metric_sum(agent.metrics(), "chopper_agent_buffer_overwritten_total") > 0):
                flooder.terminate()
                ending = True
            time.sleep(0.25)
        flood_end = time.monotonic()
        time.sleep(SETTLE_S + TRAIN_AFTER_S)
        trainer.terminate()
        result = finish_trainer(trainer)
        # The agent may still be reading flood messages it had taken in: wait for the trainer's markers.
        trainer_done = time.monotonic()
        time_until(lambda: metric_sum(agent.metrics(), "chopper_rank_markers_received_total", training_job="faults")
                   >= result.marked - result.client["dropped"], timeout_s=30)
        rec.recovery_s = round(time.monotonic() - trainer_done, 2)
        text = agent.metrics()
        rec.peak_rss_mib = round(peak_rss_mib(agent.proc.pid), 1)
    finally:
        agent.terminate()
    out, err = flooder.communicate()
    assert flooder.returncode == 0, err[-2000:]
    flood = json.loads(out.strip().splitlines()[-1])
    received = metric_sum(text, "chopper_rank_markers_received_total", training_job="faults")
    flood_received = metric_sum(text, "chopper_rank_markers_received_total", training_job="flood")
    overwritten = metric_sum(text, "chopper_agent_buffer_overwritten_total")
    rejected = metric_sum(text, "chopper_agent_markers_rejected_total")
    refused = metric_sum(text, "chopper_agent_rpc_refused_total", rpc="PushMarkers")
    ratio, inside, outside = step_time_ratio(result.times, [(flood_at, flood_end + SETTLE_S)])
    rec.step_time_ratio = round(ratio, 4)
    rec.rss_ceiling_mib = AGENT_RSS_CEILING_MIB
    rec.lost = result.uncounted + int(result.marked - result.client["dropped"] - received)
    rec.counted_losses = int(result.client["dropped"] + overwritten + rejected)
    rec.outcome = (f"flood offered {flood['offered']:,} markers in {flood['seconds']:.1f} s "
                   f"({flood['offered_per_s']:,.0f}/s), agent accepted {flood_received:,.0f}, {flood['streams']} "
                   f"streams, refused calls {refused:.0f}; buffers overwrote {overwritten:,.0f} old items (counted); "
                   f"trainer: {received:.0f} of {result.marked} markers arrived ({rec.recovery_s:g} s after it ended), "
                   f"{result.client['dropped']} dropped; agent RSS during the flood {rss[0]:.0f} → "
                   f"{rss[len(rss) // 2]:.0f} → {rss[-1]:.0f} MiB")
    assert rec.lost == 0, "a well-behaved rank's markers went missing"
    assert flood["offered"] > 0 and flood_received > 0
    assert overwritten > 0, "the flood did not reach the buffers' bound: the RSS ceiling tested nothing"
    assert abs(ratio - 1) <= STEP_TIME_TOLERANCE, f"step time ratio {ratio:.4f} ({inside} in, {outside} out)"
    assert rec.peak_rss_mib < AGENT_RSS_CEILING_MIB
