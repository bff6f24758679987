"""The GPU check without a GPU: the whole run against the simulated backend, and its refusals.

The dry run is the check itself (``python -m benchmarks.gpu``, the command ``make gpu-check``
runs) with a real agent process, a real torch loop on the CPU and a real recording; only the
vendor library and CUDA are missing.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.gpu.check import CannotRun, preflight, torch_device
from tests.gpu.runs import check_run

REPO = Path(__file__).resolve().parents[2]


def run_check(*args: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    code = f"{prelude}import sys; from benchmarks.gpu.check import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_dry_run_records_a_consistent_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = run_check("--backend", "simulated", "--duration", "2", "--warmup", "0.5", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| MFU, FLOP-derived (independent) |" in done.stdout and "Throttle residency" in done.stdout
    assert (out / "agent.log").read_text().count("backend=simulated") >= 1
    rec = check_run(out, vendors=("simulated",))
    assert rec["loop"]["timer"] == "perf_counter" and rec["backend"] == "simulated"


def test_missing_vendor_library_is_named() -> None:
    done = run_check("--backend", "nvidia", prelude="import sys; sys.modules['pynvml'] = None; ")
    assert done.returncode == 2, done.stderr
    assert "cannot run on this machine" in done.stderr and "nvidia-ml-py" in done.stderr, done.stderr


def test_no_gpu_says_so() -> None:
    try:
        backend, devices = preflight("auto")
    except CannotRun as exc:
        assert "no GPU answered" in str(exc) and "nvidia:" in str(exc) and "amd:" in str(exc)
    else:
        pytest.skip(f"a GPU answers here ({backend}: {devices[0].model})")


@pytest.mark.skipif(torch.version.cuda is not None, reason="torch is built for CUDA here")
def test_torch_without_cuda_is_refused() -> None:
    with pytest.raises(CannotRun, match="not built for CUDA"):
        torch_device("nvidia", torch)


def test_make_gpu_check_without_wheels_says_how_to_get_them() -> None:
    done = subprocess.run(["make", "--no-print-directory", "gpu-check", "GPU_WHEELS=/nonexistent"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "make gpu-wheels" in done.stderr, done.stderr
