"""The agent's live step summaries equal ``chopper attribute`` of a recording of the same run."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from chopper.attribution import attribute_run
from chopper.demo.run import metric_sum
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.runs import consumer
from chopper.runs.record import record
from tests.support.daemons import AgentProcess
from tests.support.polling import wait_until
from tests.support.recording import observe_recorder_streams
from tests.support.training import finish_training, start_training

TERMS = ("step_time_s", "ideal_s", "matrix_util_loss_s", "dvfs_loss_s", "dvfs_power_s", "dvfs_thermal_s",
         "dvfs_unattributed_s", "idle_s", "mfu", "busy_ratio", "mean_gfx_clock_mhz", "max_temp_c", "energy_j",
         "link_tx_bytes", "link_rx_bytes")


def live_summaries(target: str) -> pd.DataFrame:
    channel, stream = consumer.subscribe(target, pb.SubscribeRequest(step_summaries=True, since_ns=1))
    rows = []
    deadline = time.monotonic() + 10
    try:
        for batch in stream:
            rows += [{**{f.name: getattr(s, f.name) for f in pb.StepSummary.DESCRIPTOR.fields
                         if f.name not in ("flags", "phase_times")},
                      "phase_s": {p.name: p.seconds for p in s.phase_times}} for s in batch.step_summaries]
            if time.monotonic() > deadline or len(batch.step_summaries) < 4096:
                break
    finally:
        channel.close()
    return pd.DataFrame(rows)


@pytest.mark.slow
def test_live_summaries_equal_offline_attribution(agent_process: AgentProcess, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    stop = threading.Event()
    out = tmp_path / "run"
    observed = observe_recorder_streams(monkeypatch)
    recorder = threading.Thread(target=record, args=(agent_process.target, out, None, time.time_ns(), stop))
    recorder.start()
    sent = finish_training(start_training(agent_process.target, ranks=2, duration_s=5.0))
    steps = sent["0"]["steps"] + sent["1"]["steps"]
    markers = sum(2 * (n["steps"] + n["phases"] + n["collectives"]) for n in sent.values())
    # The agent summarises the last steps once a sample covers their end, and the recorder, which can
    # lag by seconds on a busy machine, must hold every marker and a sample from after that before it
    # stops: a stop drops what is in flight. A shortfall fails the length check below.
    wait_until(lambda: metric_sum(agent_process.metrics(), "chopper_agent_step_summaries_total") >= steps,
               timeout_s=30)
    summarised_ns = time.time_ns()
    wait_until(lambda: bool(observed) and observed[0].markers >= markers and observed[0].last_sample_ns > summarised_ns,
               timeout_s=30)
    stop.set()
    recorder.join(30)
    assert not recorder.is_alive(), "record() did not return after the stop event"
    live = live_summaries(agent_process.target)
    offline = attribute_run(out).steps
    assert len(live) == len(offline) == steps
    joined = live.merge(offline, on=["job", "rank", "step"], suffixes=("_live", ""), validate="1:1")
    for term in TERMS:
        assert np.allclose(joined[f"{term}_live"], joined[term], rtol=1e-6, atol=1e-9, equal_nan=True), term
    # Straggler wait needs every rank: offline moves it out of the exposed time the agent reports.
    assert np.allclose(joined["exposed_comm_s_live"], joined["exposed_comm_s"] + joined["straggler_wait_s"],
                       rtol=1e-6, atol=1e-9)
    assert (joined["exposed_comm_s_live"] > 0).all()  # the demo's all_reduce runs outside any phase
    # The simulated links carry each all_reduce's gradient bytes: every step moves some.
    assert (joined["link_tx_bytes_live"] > 0).all() and (joined["link_rx_bytes_live"] > 0).all()
    # Phase times: the same names per step, the same seconds.
    for live_phases, offline_phases in zip(joined["phase_s_live"], joined["phase_s"], strict=True):
        assert live_phases.keys() == offline_phases.keys() and {"forward", "backward", "optimizer"} <= set(live_phases)
        for name, seconds in offline_phases.items():
            assert live_phases[name] == pytest.approx(seconds, rel=1e-9, abs=1e-9), name
