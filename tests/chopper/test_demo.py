"""``chopper demo`` as a newcomer runs it: a real process, a real agent, real gloo training, a real report.

The scenario is known from outside the pipeline: the simulated node caps every GPU's power and
gives GPU 1 failed cooling, and rank r runs on GPU r. The verdict the demo prints is computed from
the recorded run alone, so naming rank 1 as the slowest for a thermal cause and rank 0's loss as
power is the telemetry finding the scenario, not repeating it. MFU is checked against the
trainers' own step clocks (``time.perf_counter``, no markers).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from chopper.runs.rundir import read_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

DURATION_S = 15


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    tmp = tmp_path_factory.mktemp("demo")
    proc = subprocess.run(
        [sys.executable, "-m", "chopper.cli", "demo", "--duration", str(DURATION_S), "--backend", "simulated"],
        capture_output=True, text=True, timeout=220, check=False, env={**os.environ, "TMPDIR": str(tmp)},
    )
    return proc, tmp


def _line(out: str, pattern: str) -> re.Match[str]:
    match = re.search(pattern, out, re.MULTILINE)
    assert match, f"no line matching {pattern!r} in the demo's output:\n{out[-4000:]}"
    return match


def test_demo_says_simulated_and_accounts_for_every_marker(
    demo: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    proc, tmp = demo
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = proc.stdout
    _line(out, r"^SIMULATED node .*\(no GPU is measured\): 8 × MI300X \(simulated\), vendor=simulated")
    _line(out, r"^all markers accounted for: yes$")
    # Every device the demo recorded says simulated.
    run_dir = Path(_line(out, r"^recorded run: (\S+)$").group(1))
    devices = read_run(run_dir).devices
    assert len(devices) == 8 and set(devices["vendor"]) == {"simulated"}
    assert set(devices["model"]) == {"MI300X (simulated)"}
    # Readable in 100 columns, but for the lines that carry the temporary directory's path.
    wide = [line for line in out.splitlines() if len(line) > 100 and str(tmp) not in line]
    assert not wide, wide


def test_verdict_names_the_overheating_gpus_rank_and_the_power_capped_one(
    demo: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    out = demo[0].stdout
    slowest = _line(out, r"^  slowest: rank (\d+) in (\d+) of (\d+) steps, on gpu (\d+)")
    rank, named, steps, gpu = map(int, slowest.groups())
    assert (rank, gpu) == (1, 1)
    assert named > steps / 2, slowest.group(0)
    _line(out, r"^    against the job's median \d+ MHz, up to 100 °C, throttled for thermal$")
    # Each rank's DVFS loss, causes largest first: power on the capped GPU, thermal on the hot one.
    power = _line(out, r"^  rank 0: gpu 0, (\d+) MHz, up to (\d+) °C, DVFS ([\d.]+)% of its time \(power ")
    thermal = _line(out, r"^  rank 1: gpu 1, (\d+) MHz, up to 100 °C, DVFS ([\d.]+)% of its time \(thermal ")
    assert int(thermal.group(1)) < 0.9 * int(power.group(1))
    assert int(power.group(2)) < 90 and float(power.group(3)) > 2.0 and float(thermal.group(2)) > 10.0
    causes = _line(out, r"^    DVFS by cause: (.*)$").group(1)
    assert "thermal" in causes and "power" in causes, causes


def test_mfu_is_plausible_and_agrees_with_the_trainers_own_clocks(
    demo: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    out = demo[0].stdout
    mfu = _line(out, r"^  MFU ([\d.]+)% \(by the trainers' own clocks: ([\d.]+)%\)")
    recorded, timed = float(mfu.group(1)), float(mfu.group(2))
    assert 20.0 < recorded < 55.0, mfu.group(0)
    assert recorded == pytest.approx(timed, rel=0.05)
    # The live table shows the same stand-in model: no step reads MFU 0.0% or ideal 0.0 ms.
    rows = [line.split() for line in out.splitlines() if line.startswith("demo ")]
    assert rows and all(float(r[4]) > 100.0 and float(r[9]) > 1.0 for r in rows), rows[:5]


def test_report_is_written(demo: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    report = Path(_line(demo[0].stdout, r"^report: (\S+)$").group(1))
    text = report.read_text()
    # Titled after the run directory, so the page says the GPUs were simulated; figures drawn.
    assert "Chopper report: simulated-run" in text and "<svg" in text
