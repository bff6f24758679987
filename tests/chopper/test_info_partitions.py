"""`chopper info` against real agents on partitioned simulated chips: a CPX MI300X and a MIG H100."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemons import AgentProcess

DEVICE = re.compile(r"^  gpu (\d+): simulated (.+?) uuid=(\S+) .* peak=([\d.]+) TFLOP/s memory=(\d+) GiB .*"
                    r"partition=(.+?) \(([\d.]+) of chip (\S+)\)(?: memory_partition=(\S+))?$")


def _info(tmp_path: Path, *flags: str) -> list[tuple[str, ...]]:
    agent = AgentProcess(tmp_path, "--sim-gpus", "1", *flags).start()
    try:
        out = subprocess.run([sys.executable, "-m", "chopper.cli", "info", "--agent", agent.target],
                             capture_output=True, text=True, timeout=60)
    finally:
        agent.terminate()
    assert out.returncode == 0, out.stderr
    rows = [m.groups() for line in out.stdout.splitlines() if (m := DEVICE.match(line))]
    assert len(rows) == len(out.stdout.splitlines()) - 1, out.stdout  # every device line is a partition's
    return rows


@pytest.mark.slow
def test_a_cpx_mi300x_lists_eight_partitions_of_one_chip(tmp_path: Path) -> None:
    rows = _info(tmp_path, "--sim-model", "MI300X", "--sim-partition", "CPX", "--sim-memory-partition", "NPS4")
    assert [int(r[0]) for r in rows] == list(range(8))
    assert {r[5] for r in rows} == {"CPX"} and {r[6] for r in rows} == {"0.125"} and {r[8] for r in rows} == {"NPS4"}
    assert len({r[7] for r in rows}) == 1 and len({r[2] for r in rows}) == 8  # one chip, eight devices
    assert all(float(r[3]) == pytest.approx(1307.4 / 8, abs=0.1) for r in rows)  # an eighth of the chip's peak
    assert {int(r[4]) for r in rows} == {24}  # an eighth of 192 GiB


@pytest.mark.slow
def test_a_mig_h100_lists_its_instances(tmp_path: Path) -> None:
    rows = _info(tmp_path, "--sim-model", "H100", "--sim-partition", "3g.40gb")
    assert [int(r[0]) for r in rows] == [0, 1]
    assert {r[5] for r in rows} == {"MIG 3g.40gb"} and {r[6] for r in rows} == {"0.455"}  # 60 of 132 SMs
    assert len({r[7] for r in rows}) == 1 and {r[8] for r in rows} == {None}
