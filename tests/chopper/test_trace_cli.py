"""``chopper trace`` on the four real traces and on bad input."""
from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chopper.cli import main
from tests.support.kineto_data import KINETO_DIR as DATA
from tests.support.kineto_data import requires_kineto

needs_data = requires_kineto
RANK_KEYS = ("rank", "idle_time_us", "compute_time_us", "non_compute_time_us", "kernel_time_us",
             "comm_comp_overlap_pct", "kernel_types", "top_kernels", "launch", "iterations",
             "idle_split", "phases", "host", "memory_transfer_pct")
# REFERENCE.md: trace → (rank, idle, compute, non-compute, kernel span, overlap %, kernel types µs)
REFERENCE: dict[str, tuple[Any, ...]] = {
    "a100_alexnet.json.gz": (0, 12929684, 10637, 55690, 12996011, None, {"MEMORY": 55511, "COMPUTATION": 10637}),
    "nccl_128ranks_rank0.json.gz": (0, 321378, 106252, 172428, 600058, 11.81, {
        "COMMUNICATION": 171780, "COMPUTATION": 83182, "COMPUTATION overlapping COMMUNICATION": 23056,
        "COMMUNICATION overlapping MEMORY": 479, "MEMORY": 169}),
    "nccl_128ranks_rank1.json.gz": (1, 328671, 135548, 136455, 600674, 20.05, {
        "COMMUNICATION": 133804, "COMPUTATION": 101841, "COMPUTATION overlapping COMMUNICATION": 33691,
        "MEMORY": 2119}),
    "rocm_mi250_toy_train.json.gz": (0, 8780, 96, 35, 8911, None, {"COMPUTATION": 96, "MEMORY": 35}),
}


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["trace", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def _event(cat: str, name: str, ts: float, dur: float, pid: int = 1, tid: int = 1, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _small(kernel_args: dict[str, Any]) -> dict[str, Any]:
    return {"schemaVersion": 1, "traceEvents": [
        _event("user_annotation", "ProfilerStep#7", 100, 100),
        _event("cpu_op", "aten::mm", 120, 20),
        _event("cuda_runtime", "cudaLaunchKernel", 125, 5, correlation=5),
        _event("kernel", "ampere_sgemm_128x64_tn", 140, 30, pid=0, tid=7, **kernel_args),
    ]}


@needs_data
@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_json_figures_equal_the_reference(capsys: pytest.CaptureFixture[str], name: str) -> None:
    rc, out, err = _run(capsys, str(DATA / name), "--json", "--top", "3")
    assert rc == 0, err
    result = json.loads(out)
    (r,) = result["ranks"]
    for key in RANK_KEYS:
        assert key in r, key
    rank, idle, compute, non_compute, span, overlap, types = REFERENCE[name]
    assert (r["rank"], r["idle_time_us"], r["compute_time_us"], r["non_compute_time_us"], r["kernel_time_us"]) == (
        rank, idle, compute, non_compute, span)
    assert (None if r["comm_comp_overlap_pct"] is None else round(r["comm_comp_overlap_pct"], 2)) == overlap
    assert {k: v for k, v in r["kernel_types"].items() if k in types} == types
    assert len(r["top_kernels"]) == 3
    assert r["idle_split"]["host_wait_us"] + r["idle_split"]["kernel_wait_us"] == pytest.approx(idle)
    # The GPU's wait on launches is part of its idle time, so it cannot exceed the span.
    la = r["launch"]
    assert 0 < la["gpu_wait_on_launch_us"] == r["idle_split"]["host_wait_us"] <= idle < span
    assert la["gpu_wait_on_launch_pct"] == pytest.approx(100 * la["gpu_wait_on_launch_us"] / span)
    assert 0 <= la["launch_delay_median_us"] <= la["launch_delay_p95_us"] <= la["launch_delay_max_us"]
    assert "straggler_lead_us" not in r and "stragglers" not in result


@needs_data
@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_table(capsys: pytest.CaptureFixture[str], name: str) -> None:
    rc, out, err = _run(capsys, str(DATA / name))
    assert rc == 0 and err == ""
    rank, idle, *_ = REFERENCE[name]
    assert out.startswith(f"rank {rank}  {DATA / name}")
    assert f"idle {idle:,.1f} µs" in out
    for section in ("kernel types", "top kernels", "launch delay by CPU op", "iterations", "phases",
                    "host threads", "idle split: host-wait"):
        assert section in out, section


@needs_data
def test_table_names_the_top_kernel_and_its_share(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _run(capsys, str(DATA / "nccl_128ranks_rank0.json.gz"), "--top", "1")
    line = next(x for x in out.splitlines() if "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t" in x)
    assert line.split()[-1] == "65.2"


@needs_data
def test_two_ranks_of_one_job_give_straggler_lead(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for name in ("nccl_128ranks_rank0.json.gz", "nccl_128ranks_rank1.json.gz"):
        shutil.copy(DATA / name, tmp_path / name)
    rc, out, err = _run(capsys, str(tmp_path), "--json")
    assert rc == 0, err
    result = json.loads(out)
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    assert all(r["straggler_lead_us"] > 0 for r in result["ranks"])
    assert result["stragglers"][0]["op"] == "nccl:all_to_all"
    # A file and a directory together, as the table.
    rc, out, _ = _run(capsys, str(DATA / "nccl_128ranks_rank0.json.gz"), str(DATA / "nccl_128ranks_rank1.json.gz"))
    assert rc == 0 and "largest straggler leads" in out and "straggler lead: mean" in out


@needs_data
def test_console_script_runs(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "chopper.cli", "trace", str(DATA / "rocm_mi250_toy_train.json.gz"),
                           "--json"], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ranks"][0]["memory_transfer_pct"] == pytest.approx(26.7, abs=0.05)


# --- bad input ------------------------------------------------------------------------------------


@needs_data
def test_truncated_gzip(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    raw = (DATA / "nccl_128ranks_rank0.json.gz").read_bytes()
    bad = tmp_path / "cut_rank0.json.gz"
    bad.write_bytes(raw[: len(raw) // 2])
    rc, out, err = _run(capsys, str(bad))
    assert rc == 2 and out == ""
    assert f"chopper trace: {bad}: truncated or corrupt gzip" in err


def test_json_that_is_not_a_trace(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model": "llama", "layers": 32}))
    rc, _, err = _run(capsys, str(bad))
    assert rc == 2 and f"{bad}: no 'traceEvents' list" in err


def test_trace_with_no_kernels(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    obj = _small({"correlation": 5, "device": 0, "stream": 7})
    obj["traceEvents"] = obj["traceEvents"][:3]
    bad = tmp_path / "cpu_only.json"
    bad.write_text(json.dumps(obj))
    rc, _, err = _run(capsys, str(bad))
    assert rc == 2 and f"{bad}: no GPU kernels" in err and "ProfilerActivity.CUDA" in err


def test_missing_correlation_ids_warn_and_still_analyze(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "nocorr.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump(_small({"device": 0, "stream": 7}), fh)
    rc, out, err = _run(capsys, str(path), "--json")
    assert rc == 0
    assert f"chopper trace: warning: {path}: 1 of 1 GPU kernels have no correlation id" in err
    r = json.loads(out)["ranks"][0]
    assert r["launch"]["unlinked_kernels"] == 1 and r["launch"]["kernels"] == 0
    assert r["phases"][3] == {"phase": "unknown", "kernels": 1, "kernel_us": 30.0, "share_pct": 100.0}


@needs_data
def test_mixed_rank_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # alexnet and the nccl job's rank 0 both claim rank 0: two runs mixed in one directory.
    for name in ("a100_alexnet.json.gz", "nccl_128ranks_rank0.json.gz"):
        shutil.copy(DATA / name, tmp_path / name)
    rc, out, err = _run(capsys, str(tmp_path))
    assert rc == 2 and out == ""
    assert "a100_alexnet.json.gz and" in err and "nccl_128ranks_rank0.json.gz both hold rank 0" in err


def test_empty_directory_and_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, _, err = _run(capsys, str(tmp_path))
    assert rc == 2 and f"{tmp_path}: no .json or .json.gz traces" in err
    rc, _, err = _run(capsys, str(tmp_path / "nope.json.gz"))
    assert rc == 2 and "nope.json.gz: no such trace file" in err


def test_top_must_be_positive(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["trace", str(tmp_path), "--top", "0"])
    assert exc.value.code == 2
    assert "must be positive" in capsys.readouterr().err
