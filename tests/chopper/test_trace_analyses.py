"""Kernel-level trace analyses on the four real traces of shared/data/kineto, plus small exact cases."""
from __future__ import annotations

import dataclasses
import functools
import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from chopper.trace import Trace, load_trace, load_traces
from chopper.trace.analyses import host, idle, launch, straggler, tables, temporal, top_kernels
from chopper.trace.frames import Columns
from chopper.trace.hierarchy import PHASES, build
from chopper.trace.report import analyze
from tests.support.kineto_data import KINETO_DIR as DATA
from tests.support.kineto_data import requires_kineto

TRACES = ("a100_alexnet.json.gz", "nccl_128ranks_rank0.json.gz", "nccl_128ranks_rank1.json.gz",
          "rocm_mi250_toy_train.json.gz")
NCCL = ("nccl_128ranks_rank0.json.gz", "nccl_128ranks_rank1.json.gz")
needs_data = requires_kineto


@functools.cache
def _trace(name: str) -> Trace:
    return load_trace(DATA / name)


@functools.cache
def _kernels(name: str) -> pd.DataFrame:
    return build(_trace(name))


def _event(cat: str, name: str, ts: float, dur: float, pid: int = 1, tid: int = 1, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _kernel(name: str, ts: float, dur: float, corr: int, stream: int = 7) -> dict[str, Any]:
    return _event("kernel", name, ts, dur, pid=0, tid=stream, correlation=corr, device=0, stream=stream)


def _write(path: Path, events: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def _two_kernels(tmp_path: Path) -> Trace:
    """GEMM [100, 130) launched at 90; the host calls the next launch at 150, which starts at 160.

    The stream idles from 130: 20 µs before the launch call (host-wait, CPU-late), then 10 µs of
    which 5 are the launch call itself and 5 launch-to-start latency (kernel-wait).
    """
    return load_trace(_write(tmp_path / "two.json", [
        _event("cpu_op", "aten::mm", 85, 10), _event("cuda_runtime", "cudaLaunchKernel", 90, 4, correlation=1),
        _kernel("ampere_sgemm_128x64_tn", 100, 30, 1),
        _event("cpu_op", "aten::relu", 148, 10), _event("cuda_runtime", "cudaLaunchKernel", 150, 5, correlation=2),
        _kernel("void at::native::vectorized_elementwise_kernel<4, at::native::relu>(int, float*)", 160, 10, 2),
    ]))


# --- top kernels ----------------------------------------------------------------------------------


@needs_data
@pytest.mark.parametrize("name", TRACES)
def test_top_kernels_columns_and_shares(name: str) -> None:
    top = top_kernels.top_kernels(_kernels(name), 5)
    assert tuple(top.columns) == top_kernels.TOP_KERNEL_COLUMNS
    assert len(top) == 5 and top["total_us"].is_monotonic_decreasing
    assert (top["share_pct"] <= 100).all() and (top["share_pct"] > 0).all()
    every = top_kernels.top_kernels(_kernels(name), None)
    assert every["share_pct"].sum() == pytest.approx(100.0)
    assert every["count"].sum() == len(_trace(name).kernels)
    assert every["total_us"].sum() == pytest.approx(_trace(name).kernels["dur_ns"].sum() / 1000)
    assert np.allclose(every["mean_us"] * every["count"], every["total_us"])


@needs_data
@pytest.mark.parametrize(("name", "kernel", "count", "share"), [
    ("nccl_128ranks_rank0.json.gz", "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", 10, 65.18),
    ("nccl_128ranks_rank1.json.gz", "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", 10, 56.78),
    ("a100_alexnet.json.gz", "Memcpy HtoD", 16, 83.84),
    ("rocm_mi250_toy_train.json.gz", "Memcpy HtoD", 2, 25.60),
])
def test_top_kernel_of_each_trace(name: str, kernel: str, count: int, share: float) -> None:
    first = top_kernels.top_kernels(_kernels(name), 1).iloc[0]
    assert first["short_name"] == kernel and first["name"].startswith(kernel)
    assert first["count"] == count
    assert round(first["share_pct"], 2) == share


def test_short_names_drop_return_type_templates_and_arguments() -> None:
    assert top_kernels.short_name(
        "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<at::native::Foo> >(int, Bar)"
    ) == "at::native::elementwise_kernel"
    assert top_kernels.short_name("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long)") == (
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t")
    assert top_kernels.short_name("Memcpy HtoD (Pageable -> Device)") == "Memcpy HtoD"
    long = top_kernels.short_name("Cijk_" + "A" * 200)
    assert len(long) == top_kernels.SHORT_NAME_CHARS and long.endswith("…")


# --- launch overhead ------------------------------------------------------------------------------


def test_launch_split_on_a_known_case(tmp_path: Path) -> None:
    t = _two_kernels(tmp_path)
    lk = launch.per_kernel(t, build(t))
    assert tuple(lk.columns) == launch.LAUNCH_COLUMNS
    assert lk["cpu_late_us"].tolist() == [0.0, 20.0]  # first kernel of a stream: nothing to be late for
    assert lk["launch_to_start_us"].tolist() == [6.0, 5.0]
    assert lk["launch_latency_us"].tolist() == [6.0, 5.0] and lk["queue_us"].tolist() == [0.0, 0.0]
    assert lk["cpu_op"].tolist() == ["aten::mm", "aten::relu"]
    tot = launch.totals(lk)
    assert (tot["kernels"], tot["cpu_late_kernels"], tot["cpu_late_median_us"]) == (2, 1, 20.0)
    assert (tot["launch_delay_median_us"], tot["launch_delay_p95_us"], tot["launch_delay_max_us"]) == (
        5.5, pytest.approx(5.95), 6.0)
    by = launch.by_op(lk)
    assert tuple(by.columns) == launch.BY_OP_COLUMNS
    assert by["cpu_op"].tolist() == ["aten::mm", "aten::relu"]  # largest p95 delay first
    assert by.iloc[1][["kernels", "cpu_late_kernels", "launch_delay_median_us"]].tolist() == [1, 1, 5.0]


def test_queueing_behind_a_busy_stream_is_not_latency(tmp_path: Path) -> None:
    # Both launched at once; the second waits for the first to finish: queue, no CPU-late.
    t = load_trace(_write(tmp_path / "q.json", [
        _event("cuda_runtime", "cudaLaunchKernel", 0, 2, correlation=1),
        _event("cuda_runtime", "cudaLaunchKernel", 3, 2, correlation=2),
        _kernel("gemm_a", 10, 50, 1), _kernel("gemm_b", 61, 5, 2),
    ]))
    lk = launch.per_kernel(t)
    assert lk["cpu_late_us"].tolist() == [0.0, 0.0]
    assert lk["launch_to_start_us"].tolist() == [8.0, 56.0]
    assert lk["queue_us"].tolist() == [0.0, 55.0] and lk["launch_latency_us"].tolist() == [8.0, 1.0]


def test_unlinked_kernels_are_left_out_of_launch_sums(tmp_path: Path) -> None:
    t = load_trace(_write(tmp_path / "u.json", [
        _event("cuda_runtime", "cudaLaunchKernel", 0, 2, correlation=1),
        _kernel("gemm_a", 10, 5, 1), _event("kernel", "gemm_b", 20, 5, pid=0, tid=7, device=0, stream=7),
    ]))
    lk = launch.per_kernel(t)
    assert np.isnan(lk["cpu_late_us"].iloc[1]) and lk["launch_ts_ns"].iloc[1] == -1
    tot = launch.totals(lk)
    assert (tot["kernels"], tot["unlinked_kernels"], tot["launch_delay_max_us"]) == (1, 1, 8.0)


@needs_data
@pytest.mark.parametrize("name", TRACES)
def test_launch_components_are_non_negative_and_add_up(name: str) -> None:
    lk = launch.per_kernel(_trace(name), _kernels(name))
    assert len(lk) == len(_trace(name).kernels) and lk["launch_overhead_us"].notna().all()
    for col in ("cpu_late_us", "launch_to_start_us", "queue_us", "launch_latency_us"):
        assert (lk[col] >= 0).all(), col
    assert np.allclose(lk["queue_us"] + lk["launch_latency_us"], lk["launch_to_start_us"])
    assert np.allclose(lk["cpu_late_us"] + lk["launch_to_start_us"], lk["launch_overhead_us"])
    tot = launch.totals(lk)
    by = launch.by_op(lk)
    assert by["kernels"].sum() == tot["kernels"] and by["cpu_late_kernels"].sum() == tot["cpu_late_kernels"]
    assert tot["launch_delay_median_us"] <= tot["launch_delay_p95_us"] <= tot["launch_delay_max_us"]
    assert (by["launch_delay_median_us"] <= by["launch_delay_p95_us"]).all()
    # A kernel's CPU-late time is time its own stream sat idle, so per stream it cannot exceed the span.
    span_us = (lk["end_ns"].max() - lk["ts_ns"].min()) / 1000
    assert (lk.groupby(["device", "stream"])["cpu_late_us"].sum() <= span_us).all()


# --- idle split -----------------------------------------------------------------------------------


def test_idle_split_on_a_known_case(tmp_path: Path) -> None:
    g = idle.gaps(_two_kernels(tmp_path))
    assert tuple(g.columns) == idle.GAP_COLUMNS
    assert g[["gap_us", "host_wait_us", "kernel_wait_us", "unattributed_us"]].values.tolist() == [[30, 20, 10, 0]]


def test_gap_before_a_kernel_launched_early_is_all_kernel_wait() -> None:
    g = idle.split_gaps(np.array([0, 100]), np.array([50, 120]), np.array([-5, 10]), np.array([True, True]))
    assert g[["host_wait_us", "kernel_wait_us"]].values.tolist() == [[0.0, 0.05]]
    g = idle.split_gaps(np.array([0, 100]), np.array([50, 120]), np.array([-5, 10]), np.array([True, False]))
    assert g[["host_wait_us", "kernel_wait_us", "unattributed_us"]].values.tolist() == [[0.0, 0.0, 0.05]]


@needs_data
@pytest.mark.parametrize("name", TRACES)
def test_idle_split_adds_up_to_hta_idle_time(name: str) -> None:
    t = _trace(name)
    hta_idle = temporal.breakdown(t)["idle_time_us"]
    g = idle.gaps(t)
    assert np.allclose(g["host_wait_us"] + g["kernel_wait_us"] + g["unattributed_us"], g["gap_us"], atol=1e-9)
    assert (g[["host_wait_us", "kernel_wait_us"]] >= 0).all().all()
    s = idle.split(t)
    # Within 1 µs per gap (µs rounding); the split is exact in practice.
    assert abs(s["host_wait_us"] + s["kernel_wait_us"] - hta_idle) <= 1.0 * s["gaps"]
    assert s["host_wait_us"] + s["kernel_wait_us"] == pytest.approx(hta_idle)
    assert s["unattributed_us"] == 0 and s["idle_us"] == hta_idle
    assert s["host_wait_pct"] + s["kernel_wait_pct"] == pytest.approx(100.0)
    ps = idle.per_stream(t)
    assert tuple(ps.columns) == idle.STREAM_COLUMNS
    assert np.allclose(ps["host_wait_us"] + ps["kernel_wait_us"] + ps["unattributed_us"], ps["idle_us"])
    assert np.allclose(ps["busy_us"] + ps["idle_us"], ps["span_us"])


@needs_data
def test_idle_split_figures_of_the_nccl_traces() -> None:
    r0, r1 = idle.split(_trace(NCCL[0])), idle.split(_trace(NCCL[1]))
    assert (r0["host_wait_us"], r0["kernel_wait_us"]) == (115886.0, 205492.0)
    assert (r1["host_wait_us"], r1["kernel_wait_us"]) == (166668.0, 162003.0)


# --- straggler ------------------------------------------------------------------------------------


@functools.cache
def _nccl_leads() -> pd.DataFrame:
    traces = load_traces([DATA / n for n in NCCL])
    return straggler.leads(traces, [build(t) for t in traces])


@needs_data
def test_straggler_lead_between_the_two_nccl_ranks() -> None:
    lead = _nccl_leads()
    assert tuple(lead.columns) == straggler.LEAD_COLUMNS
    assert set(lead["rank"]) == {0, 1} and set(lead["iteration"]) == {551, 552}
    assert (lead["lead_us"] >= 0).all()
    # Exactly one rank is the reference (lead 0) of each operation; two ranks: the other leads.
    mins = lead.groupby(["iteration", "op"])["lead_us"].min()
    assert (mins == 0).all()
    top = lead.iloc[0]
    assert (top["iteration"], top["op"], top["rank"], top["lead_us"]) == (552, "nccl:all_to_all", 1, 252723.0)
    pr = straggler.per_rank(lead)
    assert tuple(pr.columns) == straggler.RANK_COLUMNS and pr["rank"].tolist() == [0, 1]
    assert pr["mean_lead_us"].tolist() == pytest.approx(
        [lead[lead["rank"] == r]["lead_us"].mean() for r in (0, 1)])
    assert pr.iloc[1]["slowest_ops"][0] == "nccl:all_to_all"


@needs_data
def test_straggler_lead_ignores_clock_offsets_between_ranks() -> None:
    # Ranks on different nodes disagree on the clock: shifting one rank's whole trace changes nothing.
    t0, t1 = (load_trace(DATA / n) for n in NCCL)
    shift = 3_600_000_000_000  # one hour, ns

    def shifted(frame: Columns) -> Columns:
        return frame.with_values(**{c: frame[c] + shift for c in ("ts_ns", "end_ns") if c in frame.columns})

    t1s = dataclasses.replace(
        t1, kernel_columns=shifted(t1.kernel_columns), runtime_columns=shifted(t1.runtime_columns),
        cpu_op_columns=shifted(t1.cpu_op_columns), flow_columns=shifted(t1.flow_columns),
        gpu_sync_columns=shifted(t1.gpu_sync_columns), gpu_annotation_columns=shifted(t1.gpu_annotation_columns))
    moved = straggler.leads([t0, t1s], [build(t0), build(t1s)])
    pd.testing.assert_frame_equal(moved, _nccl_leads())


def test_straggler_needs_two_ranks(tmp_path: Path) -> None:
    t = _two_kernels(tmp_path)
    assert straggler.leads([t], [build(t)]).empty
    assert straggler.per_rank(straggler.leads([t], [build(t)])).empty


# --- tables ---------------------------------------------------------------------------------------


@needs_data
@pytest.mark.parametrize("name", TRACES)
def test_iteration_and_phase_tables_add_up(name: str) -> None:
    k = _kernels(name)
    it = tables.per_iteration(k)
    assert tuple(it.columns) == tables.ITERATION_COLUMNS
    total_us = k["dur_ns"].sum() / 1000
    assert it["kernel_us"].sum() == pytest.approx(total_us)
    assert it["kernels"].sum() == len(k)
    assert np.allclose(it[["computation_us", "communication_us", "memory_us"]].sum(axis=1), it["kernel_us"])
    assert np.allclose(it["busy_us"] + it["idle_us"], it["span_us"]) and (it["idle_us"] >= 0).all()
    ph = tables.per_phase(k)
    assert tuple(ph.columns) == tables.PHASE_COLUMNS and ph["phase"].tolist() == list(PHASES)
    assert ph["kernel_us"].sum() == pytest.approx(total_us) and ph["share_pct"].sum() == pytest.approx(100.0)


@needs_data
def test_iteration_table_of_nccl_rank0_matches_hta_on_the_kept_step() -> None:
    # HTA drops the last ProfilerStep, so its span and idle are exactly iteration 551's.
    it = tables.per_iteration(_kernels(NCCL[0])).set_index("iteration")
    assert it.index.tolist() == [551, 552]
    assert (it.loc[551, "span_us"], it.loc[551, "idle_us"], it.loc[551, "computation_us"]) == (
        600058.0, 321378.0, 106252.0)
    ph = tables.per_phase(_kernels(NCCL[0])).set_index("phase")
    assert ph.loc["unknown", "kernels"] == 0 and ph.loc["optimizer", "kernels"] == 78


# --- host -----------------------------------------------------------------------------------------


@needs_data
@pytest.mark.parametrize(("name", "pct"), [
    ("a100_alexnet.json.gz", 83.9), ("rocm_mi250_toy_train.json.gz", 26.7),
    ("nccl_128ranks_rank0.json.gz", 0.2), ("nccl_128ranks_rank1.json.gz", 1.0),
])
def test_memory_transfer_share_is_hta_memory_share_of_kernel_time(name: str, pct: float) -> None:
    m = host.memory_transfer(_trace(name))
    assert round(m["memory_transfer_pct"], 1) == pct
    assert m["span_us"] == temporal.breakdown(_trace(name))["kernel_time_us"]
    assert m["memory_span_pct"] < m["memory_transfer_pct"]


@needs_data
def test_alexnet_memory_figures_equal_the_reference_ones() -> None:
    m = host.memory_transfer(_trace("a100_alexnet.json.gz"))
    assert (m["memory_us"], m["kernel_busy_us"]) == (55511.0, 55511.0 + 10637.0)


@needs_data
@pytest.mark.parametrize(("name", "labels"), [
    ("a100_alexnet.json.gz", ["main"]), ("nccl_128ranks_rank0.json.gz", ["main", "autograd"]),
    ("rocm_mi250_toy_train.json.gz", ["autograd", "main"]),
])
def test_host_threads(name: str, labels: list[str]) -> None:
    th = host.threads(_trace(name))
    assert tuple(th.columns) == host.THREAD_COLUMNS
    assert th["label"].tolist() == labels
    assert (th["cpu_op_us"] > 0).all()


@needs_data
def test_synchronize_calls() -> None:
    s = host.sync_calls(_trace("a100_alexnet.json.gz")).set_index("name")
    assert tuple(s.reset_index().columns) == host.SYNC_COLUMNS
    assert s.loc["cudaDeviceSynchronize", "calls"] == 5 and s.loc["cudaStreamSynchronize", "calls"] == 16
    assert s.loc["cudaDeviceSynchronize", "total_us"] == 938.0
    rocm = host.summary(_trace("rocm_mi250_toy_train.json.gz"))
    assert [r["name"] for r in rocm["sync_calls"]] == ["hipDeviceSynchronize"]
    assert rocm["sync_blocked_us"] == pytest.approx(67.818)
    assert host.sync_calls(_trace(NCCL[0])).empty


# --- report ---------------------------------------------------------------------------------------


@needs_data
def test_analyze_is_plain_json_with_every_section() -> None:
    result = analyze(load_traces([DATA / n for n in NCCL]), top=3)
    json.dumps(result, allow_nan=False)
    for r in result["ranks"]:
        assert len(r["top_kernels"]) == 3
        for key in ("idle_split", "phases", "host", "memory_transfer_pct", "straggler_lead_us", "iterations",
                    "launch", "kernel_types"):
            assert key in r
    assert len(result["stragglers"]) == 3


def test_analyze_handles_a_gzip_trace_without_steps(tmp_path: Path) -> None:
    path = tmp_path / "t.json.gz"
    raw = json.loads(_write(tmp_path / "two.json", []).read_text())
    raw["traceEvents"] = [_kernel("gemm", 0, 5, 1), _event("cuda_runtime", "cudaLaunchKernel", -3, 1, correlation=1),
                          _event("cpu_op", "aten::mm", -4, 3)]
    with gzip.open(path, "wt") as fh:
        json.dump(raw, fh)
    r = analyze([load_trace(path)])["ranks"][0]
    assert r["iterations"][0]["iteration"] == -1 and "straggler_lead_us" not in r
    assert r["launch"]["launch_delay_median_us"] == 2.0


def test_trace_without_cpu_ops(tmp_path: Path) -> None:
    t = load_trace(_write(tmp_path / "noops.json", [
        _kernel("gemm", 0, 5, 1), _event("cuda_runtime", "cudaLaunchKernel", -3, 1, correlation=1)]))
    assert analyze([t])["ranks"][0]["launch"]["kernels"] == 1
