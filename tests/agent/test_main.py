"""``chopper-agent`` as a user runs it: bad input exits non-zero with a clear message; listeners on port 0."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.main import main
from chopper.demo.run import free_port, scrape
from chopper.runs import consumer
from tests.support.log_lines import daemon_log


def test_bad_config_value_exits_2_naming_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--sample-hz", "500"]) == 2
    assert "bad configuration: sample_hz: 500.0 is out of range" in capsys.readouterr().err


def test_unknown_backend_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--backend", "tpu"]) == 2
    assert "backend: 'tpu' is not a backend; choose one of auto, amd, nvidia, simulated, replay" in (
        capsys.readouterr().err
    )


def test_malformed_yaml_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("backend: simulated\nsample_hz: : 3\n")
    assert main(["--config", str(cfg)]) == 2
    assert f"config file {cfg}: is not valid YAML" in capsys.readouterr().err


def test_explicit_vendor_backend_without_library_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    # No AMD GPU or ROCm here: naming the backend explicitly must fail loudly, never fall back.
    assert main(["--backend", "amd", "--socket-path", "/tmp/chopper-unused.sock"]) == 2
    assert "backend 'amd' cannot run here" in capsys.readouterr().err


def test_replay_of_bad_run_dir_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--backend", "replay", "--replay-dir", str(tmp_path / "missing")]) == 2
    assert "backend 'replay' cannot run here" in capsys.readouterr().err


def test_unreachable_agent_message() -> None:
    with pytest.raises(consumer.AgentUnreachable, match=r"is chopper-agent running, and is this its --socket-path"):
        consumer.wait_for_info("unix:///nonexistent/agent.sock", timeout_s=0.5)


def test_cli_info_against_missing_agent_exits_1() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "chopper.cli", "info", "--agent", "unix:///nonexistent/agent.sock"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 1
    assert "no Chopper agent answered at unix:///nonexistent/agent.sock" in done.stderr


def test_auto_without_gpu_says_simulated_plainly(tmp_path: Path) -> None:
    sock = tmp_path / "a.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "--backend", "auto", "--socket-path", str(sock),
         "--metrics-listen", f"127.0.0.1:{free_port()}", "--sim-gpus", "2"],
        stderr=subprocess.PIPE, text=True,
    )
    try:
        info = consumer.wait_for_info(f"unix://{sock}", timeout_s=30)
        assert info.backend == "simulated" and all(d.vendor == "simulated" for d in info.devices)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0
    assert "event=no_gpu_found backend=simulated" in err and "serving SIMULATED GPUs" in err


def test_agent_process_replays_a_recorded_run(tmp_path: Path) -> None:
    from chopper.proto.chopper.v1 import agent_pb2 as pb
    from chopper.runs.rundir import write_run
    from chopper.schema import DeviceInfo, Sample

    t0 = 1_700_000_000 * 10**9
    device = DeviceInfo("rec-node", 0, "amd", "AMD Instinct MI300X", "u-0", 2100.0, 1307.4e12, 192 * 2**30, 750.0)
    samples = [Sample(ts_ns=t0 + i * 10**8, node="rec-node", gpu=0, gfx_clock_mhz=1500.0 + i, power_w=600.0,
                      energy_j=60.0 * i) for i in range(50)]
    run = write_run(tmp_path / "run", [device], samples, [])
    sock = tmp_path / "a.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "--backend", "replay", "--replay-dir", str(run), "--replay-speed", "10",
         "--node", "live", "--socket-path", str(sock), "--metrics-listen", f"127.0.0.1:{free_port()}"],
        stderr=subprocess.PIPE, text=True,
    )
    try:
        target = f"unix://{sock}"
        info = consumer.wait_for_info(target, timeout_s=30)
        assert info.backend == "replay" and info.devices[0].model == "AMD Instinct MI300X"
        channel, stream = consumer.subscribe(target, pb.SubscribeRequest(samples=True, since_ns=1))
        clocks: list[float] = []
        for batch in stream:
            clocks += [s.gfx_clock_mhz for s in batch.samples]
            if len(clocks) >= 10:
                break
        channel.close()
        assert clocks[:10] == [1500.0 + i for i in range(10)]
    finally:
        proc.terminate()
        proc.communicate(timeout=15)
    assert proc.returncode == 0


def test_port_0_listeners_log_the_ports_they_bound_and_serve_there(tmp_path: Path) -> None:
    with daemon_log([sys.executable, "-m", "agent", "--backend", "simulated", "--sim-gpus", "1", "--node", "n0",
                     "--socket-path", str(tmp_path / "a.sock"), "--metrics-listen", "127.0.0.1:0",
                     "--grpc-listen", "127.0.0.1:0"]) as log:
        metrics, grpc = log.bound("metrics_listen"), log.bound("grpc_listen")
        assert metrics.startswith("127.0.0.1:") and grpc.startswith("127.0.0.1:") and metrics != grpc
        assert 'chopper_agent_info{backend="simulated",node="n0"' in scrape(f"http://{metrics}/metrics")
        assert consumer.wait_for_info(grpc, timeout_s=30).node == "n0"
        # The start line names the address bound too, not the :0 asked for.
        started = log.wait_for(r"event=started .* grpc=(\S+) metrics=http://(\S+)/metrics ")
        assert (started[1], started[2]) == (grpc, metrics), started[0]
