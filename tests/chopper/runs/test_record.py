"""``chopper record`` against a real agent process and a real 2-rank training job."""
from __future__ import annotations

import math
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from chopper.demo.run import metric_sum
from chopper.runs.record import OutputNotEmpty, RecordStats, record
from chopper.runs.rundir import read_run
from tests.support.daemons import AgentProcess
from tests.support.polling import wait_until
from tests.support.recording import observe_recorder_streams
from tests.support.training import finish_training, start_training

# Markers per unit the trainer reports: each step, phase and collective is a begin and an end.
KINDS = {
    "step_begin": "steps", "step_end": "steps", "phase_begin": "phases", "phase_end": "phases",
    "collective_begin": "collectives", "collective_end": "collectives",
}
SUMMARY = re.compile(r"^recorded (\d+) samples of (\d+) GPUs and (\d+) markers over [\d.]+ s into (.+)$", re.M)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    proc = AgentProcess(tmp_path).start()
    yield proc
    if proc.proc is not None and proc.proc.poll() is None:
        proc.terminate()


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "chopper.cli", "record", *args]


def _popen_recording(*args: str) -> subprocess.Popen[str]:
    """Start ``chopper record`` and return once its signal handlers are in place (the banner is out)."""
    proc = subprocess.Popen(_cli(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    banner = proc.stderr.readline()
    assert banner.startswith("chopper: recording from"), banner
    return proc


def _wait_until_streaming(agent: AgentProcess) -> None:
    """Return once the CLI's stream is open and the agent has sampled into it for a while.

    The banner comes out before the CLI connects, and a starved CLI can take seconds to subscribe:
    stopping it or killing the agent before then records nothing.
    """
    assert wait_until(lambda: metric_sum(agent.metrics(), "chopper_agent_subscribers") >= 1, timeout_s=30), \
        "chopper record did not subscribe"
    ticks = metric_sum(agent.metrics(), "chopper_agent_sampler_ticks_total")
    # Several ticks while subscribed (at least two samples per GPU are asserted), then a moment for
    # the batches to cross the socket.
    assert wait_until(lambda: metric_sum(agent.metrics(), "chopper_agent_sampler_ticks_total") >= ticks + 10,
                      timeout_s=30), "the agent stopped sampling"
    time.sleep(0.5)


def _assert_simulated_node(run_dir: Path) -> None:
    run = read_run(run_dir)
    assert len(run.devices) == 4
    assert set(run.devices["vendor"]) == {"simulated"}
    assert set(run.devices["node"]) == {"e2e-node"}
    assert sorted(run.samples["gpu"].unique()) == [0, 1, 2, 3]
    for gpu, rows in run.samples.groupby("gpu"):
        energy = rows.sort_values("ts_ns", kind="stable")["energy_j"].to_numpy()
        assert len(energy) > 1, f"gpu {gpu} has too few samples"
        assert (np.diff(energy) >= 0).all(), f"gpu {gpu}: cumulative energy went backwards"
    # Each sample's links (three XGMI peers per simulated GPU of four) add up to its summed counters.
    per_sample = run.links.groupby(["ts_ns", "gpu"])
    assert (per_sample.size() == 3).all() and len(per_sample) == len(run.samples)
    summed = run.samples.set_index(["ts_ns", "gpu"])[["link_tx_bytes", "link_rx_bytes"]]
    links = per_sample[["tx_bytes", "rx_bytes"]].sum().reindex(summed.index)
    assert np.allclose(links["tx_bytes"], summed["link_tx_bytes"], rtol=1e-12, atol=0)
    assert np.allclose(links["rx_bytes"], summed["link_rx_bytes"], rtol=1e-12, atol=0)


@pytest.mark.slow
def test_records_every_marker_of_a_training_run(agent: AgentProcess, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    # The test stops record() only once it holds every marker (a stop drops what is in flight).
    observed = observe_recorder_streams(monkeypatch)
    stop = threading.Event()
    result: list[RecordStats] = []
    since = time.time_ns()
    recorder = threading.Thread(target=lambda: result.append(record(agent.target, out, None, since, stop)))
    recorder.start()
    sent = finish_training(start_training(agent.target, ranks=2, duration_s=3))

    def received(rank: str) -> float:
        return metric_sum(agent.metrics(), "chopper_rank_markers_received_total", training_job="e2e", rank=rank,
                          kind="step_end")

    assert all(wait_until(lambda r=r: received(r) == sent[r]["steps"], timeout_s=30) for r in sent)
    # The agent has every marker; the recorder gets them on its next stream batches. A shortfall is
    # reported kind by kind below.
    total = sum(counts[what] for counts in sent.values() for what in KINDS.values())
    wait_until(lambda: bool(observed) and observed[0].markers >= total, timeout_s=30)
    stop.set()
    recorder.join(timeout=30)
    assert not recorder.is_alive(), "record() did not return after the stop event"

    stats = result[0]
    assert stats.ended_by == "stop" and stats.agent_error is None
    assert stats.missed == 0
    assert stats.gpus == 4 and stats.devices == 4
    _assert_simulated_node(out)
    run = read_run(out)
    assert stats.samples == len(run.samples) and stats.markers == len(run.markers)
    assert stats.links == len(run.links) and stats.unfit_links == 0
    markers = run.markers
    assert set(markers["job"]) == {"e2e"} and set(markers["node"]) == {"e2e-node"}
    for rank, counts in sent.items():
        assert counts["steps"] > 1, "training ran too few steps to be a meaningful test"
        mine = markers[markers["rank"] == int(rank)]
        for kind, what in KINDS.items():
            assert int((mine["kind"] == kind).sum()) == counts[what], f"rank {rank} {kind}"
    # Payload fields are NaN where the data model does not define them, never a made-up 0.
    step_end = markers[markers["kind"] == "step_end"]
    assert (step_end["flops"] > 0).all() and (step_end["tokens"] > 0).all()
    assert step_end["bytes"].isna().all()
    assert markers.loc[markers["kind"] == "phase_begin", ["flops", "tokens", "bytes"]].isna().all().all()
    assert (markers.loc[markers["kind"] == "collective_end", "bytes"] > 0).all()


def test_since_buffer_replays_what_the_agent_already_holds(agent: AgentProcess, tmp_path: Path) -> None:
    # The first sample, then a second more: the buffers hold samples from well before the recording starts.
    assert wait_until(lambda: metric_sum(agent.metrics(), "chopper_agent_buffer_items", buffer="samples") > 0,
                      timeout_s=30)
    time.sleep(1.0)
    began = time.time_ns()
    # Seconds, not fractions: a starved recorder must still get a batch before its duration ends.
    stats = record(agent.target, tmp_path / "run", 3.0, since_ns=1)
    assert stats.ended_by == "duration"
    run = read_run(tmp_path / "run")
    assert int(run.samples["ts_ns"].min()) < began - 500_000_000
    live = record(agent.target, tmp_path / "live", 3.0, since_ns=time.time_ns())
    assert int(read_run(tmp_path / "live").samples["ts_ns"].min()) >= began
    assert live.samples > 0


def test_cli_records_for_a_duration(agent: AgentProcess, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(_cli("--agent", agent.target, "--out", str(out), "--duration", "2"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    match = SUMMARY.search(proc.stdout)
    assert match, proc.stdout
    assert int(match[1]) > 0 and int(match[2]) == 4 and match[4] == str(out)
    assert int(match[1]) == len(read_run(out).samples)
    _assert_simulated_node(out)
    assert "warning" not in proc.stderr


def test_cli_unreachable_agent_exits_1(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(_cli("--agent", f"unix://{tmp_path}/nobody.sock", "--out", str(out), "--duration", "1"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "no Chopper agent answered" in proc.stderr and "nobody.sock" in proc.stderr
    assert not out.exists(), "nothing is created when there is nothing to record"


def test_cli_refuses_a_non_empty_out_dir(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    # The refusal comes before any connection attempt, so no agent is needed.
    proc = subprocess.run(_cli("--agent", f"unix://{tmp_path}/nobody.sock", "--out", str(out)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--force" in proc.stderr and str(out) in proc.stderr
    assert (out / "notes.txt").read_text() == "keep me"
    with pytest.raises(OutputNotEmpty, match="--force"):
        record(f"unix://{tmp_path}/nobody.sock", out, 1.0, since_ns=1)


def test_cli_force_writes_into_a_non_empty_out_dir(agent: AgentProcess, tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    # Seconds, not fractions: a starved recorder must still get a batch before its duration ends.
    proc = subprocess.run(_cli("--agent", agent.target, "--out", str(out), "--duration", "3", "--force"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert len(read_run(out).samples) > 0
    assert (out / "notes.txt").read_text() == "keep me"


def test_agent_killed_mid_record_keeps_what_was_collected(agent: AgentProcess, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _popen_recording("--agent", agent.target, "--out", str(out))
    _wait_until_streaming(agent)
    agent.kill()
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "agent went away" in stderr and "wrote what was recorded" in stderr
    match = SUMMARY.search(stdout)
    assert match and int(match[1]) > 0, stdout
    assert int(match[1]) == len(read_run(out).samples)
    _assert_simulated_node(out)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_and_writes(agent: AgentProcess, tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "run"
    proc = _popen_recording("--agent", agent.target, "--out", str(out))
    _wait_until_streaming(agent)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    match = SUMMARY.search(stdout)
    assert match and int(match[1]) > 0, stdout
    run = read_run(out)
    assert int(match[1]) == len(run.samples)
    assert not math.isnan(float(run.samples["energy_j"].iloc[-1]))
