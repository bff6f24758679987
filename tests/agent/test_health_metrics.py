"""GPU health on the agent's /metrics: each counter kind in its family, the chip-wide scope, the status."""
from __future__ import annotations

import os
import time

from agent.backends.simulated import SimulatedBackend
from agent.config import load_settings
from agent.daemon import Agent
from agent.metrics import AgentCollector
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.schema import ERROR_KINDS, ErrorCount
from tests.support.scrape import scrape

S = 10**9

# One counter of every kind, as a backend reports them (values are counts or 0/1 states).
READING = (
    ErrorCount("xid", "", "79", 1.0), ErrorCount("ecc_corrected", "volatile", "umc", 5.0),
    ErrorCount("ecc_uncorrected", "aggregate", "total", 1.0), ErrorCount("ecc_deferred", "volatile", "gfx", 2.0),
    ErrorCount("retired_pages", "", "double_bit", 3.0), ErrorCount("retirement_pending", "", "", 0.0),
    ErrorCount("remapped_rows", "", "uncorrectable", 4.0), ErrorCount("remap_pending", "", "", 1.0),
    ErrorCount("remap_failed", "", "", 0.0), ErrorCount("bad_pages", "", "retired", 6.0),
    ErrorCount("pcie_replay", "", "", 7.0), ErrorCount("pcie_nak_sent", "", "", 8.0),
    ErrorCount("pcie_nak_received", "", "", 9.0), ErrorCount("link_crc", "", "flit", 10.0),
    ErrorCount("link_replay", "", "", 11.0), ErrorCount("link_recovery", "", "", 12.0),
    ErrorCount("xgmi_error", "", "", 2.0, chip_wide=True),
)


def _agent() -> Agent:
    settings = load_settings(["--node", "n1", "--backend", "simulated", "--sim-gpus", "2"], env={})
    agent = Agent(settings, SimulatedBackend(settings.node, gpus=2), host=None)
    agent.open_backend()
    agent.tick(time.time_ns())
    return agent


def _series(m: dict, name: str, **labels: str) -> float:
    [value] = [v for key, v in m[name].items() if labels.items() <= dict(key).items()]
    return value


def test_every_error_kind_lands_in_its_family_with_its_scope() -> None:
    assert {e.kind for e in READING} == set(ERROR_KINDS)
    agent = _agent()
    now = time.time_ns()
    agent.health.update(1, now - 10**9, tuple(e._replace(value=0.0) for e in READING))
    agent.health.update(1, now, READING)
    m = scrape(AgentCollector(agent.view))
    g = {"gpu": "1", "scope": "device"}
    assert _series(m, "chopper_gpu_xid_errors_total", xid="79", **g) == 1.0
    assert _series(m, "chopper_gpu_ecc_errors_total", severity="corrected", window="volatile", block="umc", **g) == 5
    assert _series(m, "chopper_gpu_ecc_errors_total", severity="uncorrected", window="aggregate", block="total",
                   **g) == 1
    assert _series(m, "chopper_gpu_ecc_errors_total", severity="deferred", block="gfx", **g) == 2
    assert _series(m, "chopper_gpu_retired_pages", cause="double_bit", **g) == 3
    assert _series(m, "chopper_gpu_remapped_rows", **{"class": "uncorrectable"}, **g) == 4
    assert _series(m, "chopper_gpu_memory_repair_state", state="remap_pending", **g) == 1
    assert _series(m, "chopper_gpu_bad_pages", status="retired", **g) == 6
    assert _series(m, "chopper_gpu_pcie_replays_total", **g) == 7
    assert _series(m, "chopper_gpu_pcie_naks_total", direction="received", **g) == 9
    assert _series(m, "chopper_gpu_link_errors_total", type="crc_flit", **g) == 10
    assert _series(m, "chopper_gpu_link_errors_total", type="recovery", **g) == 12
    assert _series(m, "chopper_gpu_xgmi_error_state", gpu="1", scope="chip") == 2
    # XID 79 and an uncorrected error within the window: critical. GPU 0's counters (the simulator's) are quiet.
    assert _series(m, "chopper_gpu_health_status", gpu="1") == 2
    assert _series(m, "chopper_gpu_health_status", gpu="0") == 0


def test_identity_and_counter_flops_ride_on_the_gpu_series() -> None:
    m = scrape(AgentCollector(_agent().view))
    [info] = [dict(key) for key in m["chopper_gpu_info"] if dict(key)["gpu"] == "0"]
    assert info["compute_share"] == "1" and info["partition"] == "" and info["chip_uuid"] == info["uuid"]
    # The simulated backend models matrix activity; its counter-derived FLOP utilisation follows it.
    assert 0.0 <= _series(m, "chopper_gpu_counter_flops_ratio", gpu="0") <= 1.0


def test_a_step_during_which_its_gpu_corrected_errors_is_flagged_live() -> None:
    """Rank 0 on GPU 1 runs step 0 for 1 s and step 1 for 2 s; the simulator gives GPU 1 a burst of 7 corrected
    ECC errors from 1.2 s on, read once a second."""
    settings = load_settings(["--node", "n1", "--backend", "simulated", "--sim-gpus", "2"], env={})
    agent = Agent(settings, SimulatedBackend("n1", gpus=2, health_events=["1:ecc_corrected:1.2:7"]), host=None)
    agent.open_backend()
    t0 = time.time_ns() - 10 * S
    agent.tick(t0)
    markers = [pb.Marker(kind=pb.MARKER_KIND_STEP_BEGIN, step=0, ts_ns=t0),
               pb.Marker(kind=pb.MARKER_KIND_STEP_END, step=0, ts_ns=t0 + S, flops=1e12, tokens=8),
               pb.Marker(kind=pb.MARKER_KIND_STEP_BEGIN, step=1, ts_ns=t0 + S),
               pb.Marker(kind=pb.MARKER_KIND_STEP_END, step=1, ts_ns=t0 + 3 * S, flops=1e12, tokens=8)]
    assert not agent.push_markers(pb.MarkerBatch(job="j", rank=0, gpu=1, seq=1, pid=os.getpid(),
                                                 markers=markers)).rejected
    for i in (1, 2, 3, 4):
        agent.tick(t0 + i * S)
    summaries, _, _ = agent.summaries.read(0, 10)
    by_step = {s.step: s for s in summaries}
    assert list(by_step[1].gpu_errors) == ["ecc_corrected"] and "gpu_errors" in by_step[1].flags
    assert list(by_step[0].gpu_errors) == [] and "gpu_errors" not in by_step[0].flags
    m = scrape(AgentCollector(agent.view))
    assert _series(m, "chopper_rank_flagged_steps_total", rank="0", flag="gpu_errors") == 1
    assert _series(m, "chopper_gpu_ecc_errors_total", gpu="1", severity="corrected", block="total") == 7
    assert _series(m, "chopper_gpu_health_status", gpu="1") == 1  # corrected errors: a warning
    assert _series(m, "chopper_gpu_health_status", gpu="0") == 0
