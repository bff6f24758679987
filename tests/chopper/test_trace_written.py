"""The temporal breakdown on traces written with known kernel layouts (tests/fixtures/traces/).

Expected figures are worked out by hand from each layout (write_traces.py), not by our code. The
same figures came out of Holistic Trace Analysis 0.5.0 on the same files
(benchmarks/bench_trace_vs_hta.py), except where docs/TRACE.md says we differ: there HTA's figure
is stated beside ours.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from chopper.trace import load_trace
from chopper.trace.analyses import overlap, temporal
from chopper.trace.timestamps import ceil_us, hta_interval, hta_rounds, kineto_time_ns

TRACES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"


def _figures(name: str, **options: bool) -> tuple[float, float, float, float]:
    b = temporal.breakdown(load_trace(TRACES / name), **options)
    return b["idle_time_us"], b["compute_time_us"], b["non_compute_time_us"], b["kernel_time_us"]


def test_integer_microsecond_layout() -> None:
    # Kept (the last ProfilerStep's kernel at 1300 µs is dropped): GEMM [1000, 1040) and NCCL [1030, 1100)
    # overlap; memcpy [1120, 1130), elementwise [1150, 1170), Stream Sync [1175, 1180).
    # span 1180 - 1000 = 180; busy 100 + 10 + 20 + 5 = 135 -> idle 45; compute 40 + 20 = 60;
    # non-compute 180 - 45 - 60 = 75; overlap 10 of 70 µs of communication.
    assert _figures("int_us.json") == (45.0, 60.0, 75.0, 180.0)
    assert overlap.comm_comp_overlap_pct(load_trace(TRACES / "int_us.json")) == pytest.approx(100 * 10 / 70)


def test_nanosecond_layout_rounds_inward_to_whole_microseconds() -> None:
    # HTA's rule: starts up, ends down. GEMM [1001, 1040], NCCL [1031, 1100], memcpy [1121, 1130],
    # elementwise [1150, 1170], Stream Sync [1176, 1180]; the Context Sync on stream -1 is no stream's.
    # span 1180 - 1001 = 179; busy 99 + 9 + 20 + 4 = 132 -> idle 47; compute 39 + 20 = 59; non-compute 73.
    trace = load_trace(TRACES / "ns.json")
    assert trace.fractional_ts and trace.metadata["displayTimeUnit"] == "ns"
    assert _figures("ns.json") == (47.0, 59.0, 73.0, 179.0)
    assert overlap.comm_comp_overlap_pct(trace) == pytest.approx(100 * 9 / 69)
    # Exact ns, without the rounding: span 1180.600 - 1000.250; compute 40.5 + 20.
    idle, compute, _, span = _figures("ns.json", hta_rounding=False)
    assert (span, compute) == (pytest.approx(180.35), pytest.approx(60.5))
    assert idle == pytest.approx(180.35 - (100.65 + 9.9 + 20 + 5.3))


def test_display_time_unit_does_not_change_the_unit(tmp_path: Path) -> None:
    # ts and dur are µs whatever displayTimeUnit says: the same events with "ms" give the same figures.
    doc = json.loads((TRACES / "ns.json").read_text())
    doc["displayTimeUnit"] = "ms"
    (tmp_path / "ms.json").write_text(json.dumps(doc))
    assert temporal.breakdown(load_trace(tmp_path / "ms.json")) == temporal.breakdown(load_trace(TRACES / "ns.json"))


def test_a_kernel_inside_one_microsecond_adds_nothing() -> None:
    # [10, 20), [25.2, 25.9), [30, 40): the middle kernel covers no whole µs, so it is empty at 26.
    # span 30, busy 20, idle 10, compute 20. HTA 0.5.0 gives it a duration of -1 µs: idle 11, compute 19.
    assert _figures("ns_sub_us.json") == (10.0, 20.0, 0.0, 30.0)


def test_a_cpu_op_with_a_stream_argument_is_not_gpu_time() -> None:
    # One Triton kernel [160.000, 161.800) launched inside a 94 µs CPU op that carries "stream": 0.
    # Compute is the kernel's whole µs [160, 161]: 1 µs (1.8 µs exact). HTA 0.5.0 counts the CPU op as a
    # kernel: 94 µs of compute over a 94 µs span.
    trace = load_trace(TRACES / "triton_stream_op.json")
    assert _figures("triton_stream_op.json") == (0.0, 1.0, 0.0, 1.0)
    assert _figures("triton_stream_op.json", hta_rounding=False)[1] == pytest.approx(1.8)
    assert trace.cpu_stream_events == 1
    assert "carry a 'stream' argument" in trace.warnings[0] and "Holistic Trace Analysis" in trace.warnings[0]


# --- the rule itself ------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "ns"), [
    (0, 0), (1695835542481129, 1695835542481129000), (4203669603454.206, 4203669603454206),
    (22.441, 22441), (1150.0, 1150000), (-0.5, -500), (0.0005, 0),
])
def test_kineto_time_ns(value: float, ns: int) -> None:
    assert kineto_time_ns(value) == ns


@pytest.mark.parametrize("value", [True, None, "12", float("nan"), float("inf"), 2.0**62])
def test_kineto_time_ns_refuses_what_is_no_time(value: object) -> None:
    assert kineto_time_ns(value) is None


def test_hta_rounds_floats_and_missing_times_only() -> None:
    assert hta_rounds(1.0) and hta_rounds(None)
    assert not hta_rounds(1) and not hta_rounds(1695835542481129)


def test_hta_interval() -> None:
    start = np.array([1_000_250, 25_200, 5_000], dtype=np.int64)
    end = np.array([1_040_750, 25_900, 6_000], dtype=np.int64)
    s, e = hta_interval(start, end, True)
    assert s.tolist() == [1_001_000, 26_000, 5_000] and e.tolist() == [1_040_000, 26_000, 6_000]
    s, e = hta_interval(start, end, False)
    assert s.tolist() == start.tolist() and e.tolist() == end.tolist()
    assert ceil_us(np.array([-1_500, 1]), True).tolist() == [-1_000, 1_000]
