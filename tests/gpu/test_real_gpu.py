"""The GPU check for real, shortened: on a machine whose torch sees a GPU and whose vendor library answers."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.gpu.runs import check_run

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="this torch sees no GPU (a CPU build?)")]
REPO = Path(__file__).resolve().parents[2]


def test_check_on_the_gpu(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu", "--duration", "10", "--warmup", "3", "--out",
                           str(out)], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    rec = check_run(out, vendors=("nvidia", "amd"))
    assert rec["loop"]["timer"] == "device events"
