"""Trace reader: frames, rank detection, ROCm naming, hierarchy, streaming memory, bad input."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chopper.trace import Trace, TraceError, load_trace, load_traces
from chopper.trace.frames import (
    CPU_OP_COLUMNS,
    FLOW_COLUMNS,
    GPU_ANNOTATION_COLUMNS,
    KERNEL_COLUMNS,
    RUNTIME_COLUMNS,
)
from chopper.trace.hierarchy import HIERARCHY_COLUMNS, build, innermost_containing
from tests.support.kineto_data import KINETO_DIR as DATA
from tests.support.kineto_data import requires_kineto

needs_data = requires_kineto


def _event(cat: str, name: str, ts: float, dur: float, pid: int = 1, tid: int = 1, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _small_trace(kernel_args: dict[str, Any] | None = None) -> dict[str, Any]:
    """One step: an op launching one GEMM, inside a layer annotation, inside ProfilerStep#7."""
    kernel_args = {"correlation": 5, "device": 0, "stream": 7} if kernel_args is None else kernel_args
    return {
        "schemaVersion": 1,
        "traceEvents": [
            _event("user_annotation", "ProfilerStep#7", 100, 100),
            _event("user_annotation", "Layer3", 110, 50),
            _event("cpu_op", "aten::mm", 120, 20, **{"External id": 9}),
            _event("cuda_runtime", "cudaLaunchKernel", 125, 5, correlation=5),
            _event("kernel", "ampere_sgemm_128x64_tn", 140, 30, pid=0, tid=7, **kernel_args),
            {"ph": "s", "cat": "ac2g", "id": 5, "pid": 1, "tid": 1, "ts": 125, "name": "ac2g"},
        ],
    }


def _write(path: Path, obj: Any) -> Path:
    text = json.dumps(obj)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


# --- frames ------------------------------------------------------------------------------------


def test_frames_follow_the_column_contract(tmp_path: Path) -> None:
    t = load_trace(_write(tmp_path / "t.json", _small_trace()))
    assert tuple(t.kernels.columns) == KERNEL_COLUMNS
    assert tuple(t.runtime.columns) == RUNTIME_COLUMNS
    assert tuple(t.cpu_ops.columns) == CPU_OP_COLUMNS
    assert tuple(t.gpu_annotations.columns) == GPU_ANNOTATION_COLUMNS
    assert tuple(t.flows.columns) == FLOW_COLUMNS
    k = t.kernels.iloc[0]
    assert (k["ts_ns"], k["dur_ns"], k["end_ns"]) == (140_000, 30_000, 170_000)
    assert (k["device"], k["stream"], k["correlation"]) == (0, 7, 5)
    for frame in (t.kernels, t.runtime, t.cpu_ops):
        assert frame["ts_ns"].dtype == np.int64 and frame["end_ns"].dtype == np.int64
    assert t.cpu_ops["external_id"].tolist() == [-1, -1, 9]
    assert t.flows.iloc[0]["phase"] == "s" and t.flows.iloc[0]["cat"] == "ac2g"
    assert t.device_type == "cuda" and not t.fractional_ts and t.warnings == []


def test_float_microseconds_become_rounded_nanoseconds_exactly(tmp_path: Path) -> None:
    obj = _small_trace()
    obj["traceEvents"][4]["ts"] = 4203669603454.206
    obj["traceEvents"][4]["dur"] = 22.441
    t = load_trace(_write(tmp_path / "t.json", obj))
    assert t.fractional_ts
    assert t.kernels.iloc[0]["ts_ns"] == 4203669603454206
    assert t.kernels.iloc[0]["dur_ns"] == 22441


def test_base_time_puts_every_frame_on_the_realtime_clock(tmp_path: Path) -> None:
    base = 1_790_857_026_000_000_000
    for where in ("head", "tail"):  # Kineto writes top-level keys before or after the events
        obj = _small_trace()
        events = obj.pop("traceEvents")
        obj = {"baseTimeNanoseconds": base, "traceEvents": events} if where == "head" else \
            {"traceEvents": events, "baseTimeNanoseconds": base}
        t = load_trace(_write(tmp_path / f"{where}.json", obj))
        plain = load_trace(_write(tmp_path / f"{where}-plain.json", {"traceEvents": events}))
        assert t.clock_offset_ns == base and plain.clock_offset_ns == 0
        for frame in ("kernels", "runtime", "cpu_ops", "flows"):
            shifted, original = getattr(t, frame), getattr(plain, frame)
            assert (shifted["ts_ns"] - original["ts_ns"] == base).all(), frame
            if "end_ns" in shifted:
                assert (shifted["end_ns"] - shifted["ts_ns"] == original["dur_ns"]).all(), frame


@needs_data
def test_real_rocm_trace_lands_on_its_recording_date() -> None:
    t = load_trace(DATA / "rocm_mi250_toy_train.json.gz")
    assert t.clock_offset_ns == t.metadata["baseTimeNanoseconds"]
    first = np.datetime64(int(t.kernels["ts_ns"].min()), "ns")
    assert np.datetime64("2024-12-31") <= first < np.datetime64("2025-03-01")  # base is 2024-12-31 08:06 UTC


def test_top_level_keys_before_and_after_events_are_metadata(tmp_path: Path) -> None:
    obj = {"distributedInfo": {"rank": 3, "world_size": 8}, **_small_trace(),
           "traceName": "x]y", "baseTimeNanoseconds": 1735632360000000000}
    t = load_trace(_write(tmp_path / "t.json.gz", obj))
    assert (t.rank, t.world_size) == (3, 8)
    assert t.metadata["baseTimeNanoseconds"] == 1735632360000000000
    assert t.metadata["traceName"] == "x]y"
    assert t.metadata["distributedInfo"] == {"rank": 3, "world_size": 8}


# --- rank detection ----------------------------------------------------------------------------


def test_rank_from_file_name_when_distributed_info_is_missing(tmp_path: Path) -> None:
    t = load_trace(_write(tmp_path / "job_rank12.1700000000.pt.trace.json", _small_trace()))
    assert (t.rank, t.world_size) == (12, None)
    assert load_trace(_write(tmp_path / "worker.json", _small_trace())).rank == 0


@needs_data
def test_rank_from_distributed_info_on_real_traces() -> None:
    traces = load_traces([DATA / "nccl_128ranks_rank1.json.gz", DATA / "nccl_128ranks_rank0.json.gz"])
    assert [t.rank for t in traces] == [0, 1]
    assert {t.world_size for t in traces} == {128}


# --- ROCm ----------------------------------------------------------------------------------------


@needs_data
def test_rocm_trace_naming() -> None:
    t = load_trace(DATA / "rocm_mi250_toy_train.json.gz")
    assert isinstance(t, Trace) and t.device_type == "rocm"
    assert t.fractional_ts
    assert t.runtime["name"].str.startswith("hip").all()
    assert (t.kernels["device"] == 2).all()
    assert t.kernels["name"].str.startswith("Cijk_").sum() == 2
    assert set(t.gpu_annotations["name"]) == {"ProfilerStep#1", "Optimizer.step#SGD.step"}
    assert set(t.flows["cat"]) == {"ac2g", "fwdbwd"}
    assert t.metadata["baseTimeNanoseconds"] == 1735632360000000000
    assert load_trace(DATA / "a100_alexnet.json.gz").device_type == "cuda"


# --- hierarchy -----------------------------------------------------------------------------------


def test_hierarchy_links_kernel_to_op_layer_step(tmp_path: Path) -> None:
    h = build(load_trace(_write(tmp_path / "t.json", _small_trace())))
    assert set(HIERARCHY_COLUMNS) <= set(h.columns)
    row = h.iloc[0]
    assert (row["kernel_class"], row["kernel_type"]) == ("COMPUTATION", "GEMM")
    assert (row["cpu_op"], row["layer"], row["phase"], row["iteration"]) == ("aten::mm", "Layer3", "forward", 7)
    assert (row["launch_ts_ns"], row["launch_thread"], row["rank"]) == (125_000, 1, 0)


@needs_data
def test_hierarchy_on_nccl_trace_assigns_iterations_and_phases() -> None:
    h = build(load_trace(DATA / "nccl_128ranks_rank0.json.gz"))
    assert set(h["iteration"]) == {551, 552}
    assert {"forward", "backward", "optimizer"} <= set(h["phase"])
    assert (h["kernel_class"] == "COMMUNICATION").sum() == (h["name"].str.startswith("nccl")).sum() > 0
    assert h["cpu_op"].notna().mean() > 0.95
    assert (h["launch_ts_ns"] > 0).all()
    assert "DistributedDataParallel.forward" in set(h["layer"])


@needs_data
def test_hierarchy_on_rocm_trace_finds_backward_via_autograd_thread() -> None:
    h = build(load_trace(DATA / "rocm_mi250_toy_train.json.gz"))
    assert h["phase"].value_counts().to_dict() == {"forward": 8, "backward": 7, "optimizer": 1}
    assert set(h["iteration"]) == {1}
    assert set(h.loc[h["phase"] == "backward", "launch_thread"]) == {598009}
    assert set(h.loc[h["name"].str.startswith("Cijk_"), "kernel_type"]) == {"GEMM"}


def test_innermost_containing_prefers_latest_starting_container() -> None:
    #   0 [0, 100]  ⊃  1 [10, 50] ⊃ 2 [20, 30];  3 [60, 90]; other thread 4 [0, 100]
    s = np.array([0, 10, 20, 60, 0])
    e = np.array([100, 50, 30, 90, 100])
    g = np.array([0, 0, 0, 0, 1])
    q = innermost_containing(s, e, g, np.array([25, 35, 55, 70, 95, 5, 25]), np.array([26, 36, 56, 71, 200, 6, 26]),
                             np.array([0, 0, 0, 0, 0, 1, 2]))
    assert q.tolist() == [2, 1, 0, 3, -1, 4, -1]


# --- streaming -----------------------------------------------------------------------------------


_RSS_PROBE = """
import resource, sys, time
from chopper.trace import load_trace
import ijson, numpy, pandas  # imported before the baseline so only parsing counts
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
trace = load_trace(sys.argv[1])
elapsed = time.perf_counter() - t0
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(len(trace.kernels), len(trace.runtime), (after - before) * 1024, elapsed)
"""


@pytest.mark.slow
def test_streaming_peak_memory_stays_below_three_times_file_size(tmp_path: Path) -> None:
    # ~100 MB of realistic events (long kernel names, args), written without building them in memory.
    path = tmp_path / "big.json"
    name = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, " + "x" * 120
    with path.open("w") as fh:
        fh.write('{"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": [')
        for i in range(140_000):
            ts = 1_000_000 + 10 * i
            fh.write(json.dumps(_event("cpu_op", "aten::fill_", ts, 8, **{"External id": i, "Input Dims": [[1024]]})))
            fh.write(",")
            fh.write(json.dumps(_event("cuda_runtime", "cudaLaunchKernel", ts + 1, 3, correlation=i, cbid=211)))
            fh.write(",")
            fh.write(json.dumps(_event("kernel", f"{name}{i % 50}", ts + 5, 4, pid=0, tid=7, correlation=i, device=0,
                                       stream=7, grid=[1, 1, 1], block=[128, 1, 1], **{"registers per thread": 32})))
            fh.write(",")
        fh.write('{"ph": "i", "name": "end", "ts": 0, "pid": 0, "tid": 0}]}')
    size = path.stat().st_size
    assert size > 90e6
    # A fresh process, so the peak RSS growth is this parse's alone (tracemalloc would be ~10x slower).
    out = subprocess.run([sys.executable, "-c", _RSS_PROBE, str(path)], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2], timeout=120)
    kernels, runtime, growth, elapsed = out.stdout.split()
    assert (int(kernels), int(runtime)) == (140_000, 140_000)
    # Measured: RSS growth ≈ 0.9–1.2x the file size (101 MB file: +95–125 MB peak, 1.8 s); the raw
    # events as Python dicts would take ~10x.
    assert int(growth) < 3 * size, (int(growth), size)
    print(f"streamed {size / 1e6:.0f} MB in {float(elapsed):.1f} s, peak RSS growth {int(growth) / 1e6:.0f} MB")


# --- bad input -----------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"nope\.json: no such trace file"):
        load_trace(tmp_path / "nope.json")


def test_truncated_gzip(tmp_path: Path) -> None:
    good = _write(tmp_path / "good.json.gz", _small_trace()).read_bytes()
    bad = tmp_path / "cut.json.gz"
    bad.write_bytes(good[: len(good) // 2])
    with pytest.raises(TraceError, match=r"cut\.json\.gz: truncated or corrupt gzip.*copy or record it again"):
        load_trace(bad)


def test_not_json(tmp_path: Path) -> None:
    p = tmp_path / "notes.json"
    p.write_text("this is not json {")
    with pytest.raises(TraceError, match=r"notes\.json: not valid JSON"):
        load_trace(p)


def test_truncated_plain_json(tmp_path: Path) -> None:
    p = tmp_path / "cut.json"
    p.write_text(json.dumps(_small_trace())[:-40])
    with pytest.raises(TraceError, match=r"cut\.json: not valid JSON or cut short"):
        load_trace(p)


@pytest.mark.parametrize("obj", [{"foo": 1}, {"traceEvents": {"a": 1}}, [1, 2]])
def test_json_that_is_not_a_trace(tmp_path: Path, obj: Any) -> None:
    with pytest.raises(TraceError, match=r"other\.json: .*(traceEvents|not a Kineto trace)"):
        load_trace(_write(tmp_path / "other.json", obj))


def test_cpu_only_profile_says_so(tmp_path: Path) -> None:
    obj = _small_trace()
    obj["traceEvents"] = [e for e in obj["traceEvents"] if e.get("cat") != "kernel"]
    with pytest.raises(TraceError, match=r"cpu\.json: no GPU kernels.*CPU-only profile.*ProfilerActivity\.CUDA"):
        load_trace(_write(tmp_path / "cpu.json", obj))


def test_kernels_without_correlation_are_kept_and_reported(tmp_path: Path) -> None:
    t = load_trace(_write(tmp_path / "nocorr.json", _small_trace({"device": 0, "stream": 7})))
    assert t.kernels["correlation"].tolist() == [-1]
    assert len(t.warnings) == 1
    assert "1 of 1 GPU kernels have no correlation id" in t.warnings[0]
    assert "cpu_op, layer, phase and iteration" in t.warnings[0]
    h = build(t)
    assert (h.iloc[0]["phase"], h.iloc[0]["iteration"], h.iloc[0]["cpu_op"]) == ("unknown", -1, None)


def test_duplicate_ranks_name_both_files(tmp_path: Path) -> None:
    a = _write(tmp_path / "a_rank0.json", _small_trace())
    b = _write(tmp_path / "b_rank0.json", _small_trace())
    with pytest.raises(TraceError, match=r"a_rank0\.json and .*b_rank0\.json both hold rank 0"):
        load_traces([a, b])


def test_mixed_world_sizes_name_both_files(tmp_path: Path) -> None:
    _write(tmp_path / "a.json", {"distributedInfo": {"rank": 0, "world_size": 2}, **_small_trace()})
    _write(tmp_path / "b.json", {"distributedInfo": {"rank": 1, "world_size": 4}, **_small_trace()})
    with pytest.raises(TraceError, match=r"a\.json \(world size 2\) and .*b\.json \(world size 4\).*different jobs"):
        load_traces(tmp_path)


def test_directory_of_traces_loads_sorted_by_rank(tmp_path: Path) -> None:
    for r in (2, 0, 1):
        _write(tmp_path / f"t_rank{r}.json.gz", _small_trace())
    assert [t.rank for t in load_traces(tmp_path)] == [0, 1, 2]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TraceError, match=r"empty: no \.json or \.json\.gz traces"):
        load_traces(empty)
