"""The capture join: profiled steps of a trace matched to attribution rows on one clock."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from chopper.runs.capture_join import JOIN_COLUMNS, format_join, join, join_capture, profiler_steps, to_records
from chopper.trace import load_trace
from tests.support.kineto_data import KINETO_DIR, requires_kineto

BASE_NS = 1_790_000_000_000_000_000


def _x(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


def _trace(path: Path, kernels: list[tuple[str, float, float]], rank: int = 0) -> Path:
    """Two profiled steps (µs 0–100 and 100–200 after the base) with the given GPU kernels."""
    events = [_x("user_annotation", "ProfilerStep#4", 0, 100), _x("user_annotation", "ProfilerStep#5", 100, 100)]
    events += [_x("kernel", name, ts, dur, device=0, stream=7, correlation=i + 1)
               for i, (name, ts, dur) in enumerate(kernels)]
    obj = {"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": 2},
           "traceEvents": events, "baseTimeNanoseconds": BASE_NS}
    with gzip.open(path, "wt") as fh:
        json.dump(obj, fh)
    return path


def _steps(rank: int, windows: list[tuple[int, int, int]]) -> pd.DataFrame:
    """Attribution-like rows: (step, begin µs, end µs after the base)."""
    return pd.DataFrame({
        "job": "j", "rank": rank, "step": [s for s, _, _ in windows],
        "begin_ns": [BASE_NS + b * 1000 for _, b, _ in windows], "end_ns": [BASE_NS + e * 1000 for _, _, e in windows],
        "step_time_s": [(e - b) / 1e6 for _, b, e in windows], "busy_ratio": 0.5, "exposed_comm_s": 0.0,
        "idle_s": 0.0, "mean_gfx_clock_mhz": 2100.0,
    })


def test_kernels_are_selected_by_the_marker_window_on_the_realtime_clock(tmp_path: Path) -> None:
    # Step 4: gemm 10–50 and an all-reduce 40–90 → busy 80 µs, comm 50 µs, 40 µs of it exposed.
    # Step 5: an all-reduce alone 120–140, plus a gemm that crosses the step's end (190–230).
    trace = load_trace(_trace(tmp_path / "rank0.json.gz", [
        ("ampere_sgemm_128x64_tn", 10, 40), ("ncclKernel_AllReduce_RING", 40, 50),
        ("ncclKernel_AllReduce_RING", 120, 20), ("ampere_sgemm_128x64_tn", 190, 40)]))
    # Markers 3 µs before the profiler's ranges: the client stamps the step before the range opens.
    joined = join(_steps(0, [(4, -3, 97), (5, 97, 197), (6, 197, 297)]), [trace])
    assert tuple(joined.columns) == JOIN_COLUMNS
    assert joined["step"].tolist() == [4, 5]  # step 6 was not profiled
    assert joined["begin_offset_us"].tolist() == [3.0, 3.0] and joined["end_offset_us"].tolist() == [3.0, 3.0]
    first, second = joined.iloc[0], joined.iloc[1]
    assert first["kernel_busy_s"] == pytest.approx(80e-6) and first["kernel_comm_s"] == pytest.approx(50e-6)
    assert first["kernel_exposed_comm_s"] == pytest.approx(40e-6)
    assert second["kernel_busy_s"] == pytest.approx(27e-6)  # 20 µs all-reduce + 7 µs of the crossing gemm
    assert second["kernel_exposed_comm_s"] == pytest.approx(20e-6)
    assert not joined["cpu_only_trace"].any()
    records = to_records(joined)
    assert json.dumps(records) and records[0]["step"] == 4
    assert "kernel busy %" in format_join(joined)


def test_cpu_only_trace_joins_steps_without_kernel_figures(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    _trace(tmp_path / "traces" / "rank1.pt.trace.json.gz", [], rank=1)
    joined = join_capture(tmp_path, _steps(1, [(4, 0, 100), (5, 100, 200)]))
    assert joined is not None and len(joined) == 2
    assert joined["cpu_only_trace"].all() and joined["kernel_busy_s"].isna().all()
    assert all(r["kernel_busy_s"] is None for r in to_records(joined))
    assert "CPU-only trace" in format_join(joined) and "–" in format_join(joined)


def test_a_directory_without_traces_has_no_join(tmp_path: Path) -> None:
    assert join_capture(tmp_path, _steps(0, [(4, 0, 100)])) is None


@requires_kineto
def test_real_rocm_trace_kernels_fall_in_the_device_side_step_window(tmp_path: Path) -> None:
    """The real MI250 trace, with step 1's markers where device events would put them: the GPU-side
    ProfilerStep#1 range. The CPU-side range opened earlier (the launch queue) and its offset says so."""
    shutil.copy(KINETO_DIR / "rocm_mi250_toy_train.json.gz", tmp_path / "rank0.json.gz")
    trace = load_trace(tmp_path / "rank0.json.gz")
    assert profiler_steps(trace)["step"].tolist() == [1, 2]
    gpu_range = trace.gpu_annotations[trace.gpu_annotations["name"] == "ProfilerStep#1"].iloc[0]
    begin, end = int(gpu_range["ts_ns"]), int(gpu_range["end_ns"])
    steps = pd.DataFrame({"job": "j", "rank": 0, "step": [1], "begin_ns": [begin], "end_ns": [end],
                          "step_time_s": [(end - begin) / 1e9], "busy_ratio": [np.nan], "exposed_comm_s": [0.0],
                          "idle_s": [0.0], "mean_gfx_clock_mhz": [np.nan]})
    row = join(steps, [trace]).iloc[0]
    cpu_range = profiler_steps(trace).iloc[0]
    assert row["begin_offset_us"] == (cpu_range["trace_begin_ns"] - begin) / 1e3 < 0
    # Brute force: mark every nanosecond some kernel covers inside the window.
    covered = np.zeros(end - begin, dtype=bool)
    for k in trace.kernels.itertuples():
        covered[max(k.ts_ns, begin) - begin:max(min(k.end_ns, end) - begin, 0)] = True
    assert row["kernel_busy_s"] == pytest.approx(covered.sum() / 1e9) and row["kernel_busy_s"] > 0
