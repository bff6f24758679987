"""``chopper report`` on Kineto traces: the real nccl pair and A100 alexnet traces, alone and beside a recorded run.

Figures' data is checked on the figure objects themselves (bar widths, heatmap cells, labels),
because matplotlib writes SVG text as glyph paths; the HTML tables are checked as text.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from chopper.cli import main
from chopper.report import build_report, classify_input, figures, trace_figures
from chopper.report.spec import ReportData
from chopper.report.traces import TraceSet, analyze_traces, comm_overlap_fractions, load
from chopper.trace import load_trace
from chopper.trace.analyses.top_kernels import top_kernels
from tests.support.attribution_scenarios import ALL_SCENARIOS
from tests.support.chromium_render import assert_filled, render_in_chromium
from tests.support.kineto_data import KINETO_DIR, requires_kineto
from tests.support.report_pages import RUN_FIGURE_KEYS, figure_keys, table_rows

# Every test here reads the real reference traces, including the bad-input ones built from them.
pytestmark = requires_kineto

KINETO = KINETO_DIR
NCCL = [KINETO / "nccl_128ranks_rank0.json.gz", KINETO / "nccl_128ranks_rank1.json.gz"]
ALEXNET = KINETO / "a100_alexnet.json.gz"
ROCM = KINETO / "rocm_mi250_toy_train.json.gz"

TRACE_KEYS = [s.key for s in figures.FIGURES if "traces" in s.needs or "cross_rank" in s.needs]
SINGLE_RANK_KEYS = [s.key for s in figures.FIGURES if s.needs == ("traces",)]


@pytest.fixture(scope="module")
def nccl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("nccl") / "traces"
    folder.mkdir()
    for f in NCCL:
        shutil.copy(f, folder)
    return folder


@pytest.fixture(scope="module")
def nccl_set() -> TraceSet:
    return analyze_traces(load(NCCL, lambda stage: None), lambda stage: None)


@pytest.fixture(scope="module")
def nccl_report(nccl_dir: Path) -> Path:
    return build_report(nccl_dir, nccl_dir.parent / "nccl.html")


@pytest.fixture(scope="module")
def alexnet_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_report(ALEXNET, tmp_path_factory.mktemp("alexnet") / "alexnet.html")


def test_registry_holds_the_eight_trace_figures() -> None:
    assert TRACE_KEYS == ["trace-temporal", "trace-kernel-types", "trace-top-kernels", "trace-overlap-cdf",
                          "trace-iterations", "trace-launch-overhead", "trace-idle-split", "trace-straggler-lead"]
    assert len({s.key for s in figures.FIGURES}) == len(figures.FIGURES)


def test_inputs_are_classified(nccl_dir: Path, tmp_path: Path) -> None:
    assert classify_input(nccl_dir) == "traces"
    assert classify_input(ALEXNET) == "traces"
    run = ALL_SCENARIOS["hot_straggler"]().write(tmp_path / "run")
    assert classify_input(run) == "run"
    shutil.copytree(nccl_dir, run / "traces")
    assert classify_input(run) == "run+traces"


@pytest.mark.parametrize("which", ["nccl", "alexnet"])
def test_trace_report_is_self_contained_with_every_figure(which: str, request: pytest.FixtureRequest) -> None:
    page = request.getfixturevalue(f"{which}_report").read_text(encoding="utf-8")
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page, re.IGNORECASE)
    assert "<script" not in page.lower() and "<link" not in page.lower() and "<?xml" not in page
    # Two ranks: every trace figure; one rank: all but the cross-rank straggler lead. No run figure.
    expected = TRACE_KEYS if which == "nccl" else SINGLE_RANK_KEYS
    assert len(expected) == (8 if which == "nccl" else 7)
    assert figure_keys(page) == expected
    assert page.count("<svg") == len(expected)
    for key in expected:
        assert f'href="#{key}"' in page
    assert "<caption>Per job</caption>" not in page


def test_hta_table_holds_the_reference_figures(nccl_report: Path, alexnet_report: Path) -> None:
    """REFERENCE.md (Holistic Trace Analysis 0.5.0): idle, compute, non-compute, span, overlap."""
    rows = table_rows(nccl_report.read_text(encoding="utf-8"), "Per rank, GPU")
    # rank, device, file, kernels, span, idle, idle %, compute, compute %, non-compute, non-compute %, overlap %
    assert [(r[0], r[4], r[5], r[7], r[9], r[11]) for r in rows] == [
        ("0", "600,058", "321,378", "106,252", "172,428", "11.8"),
        ("1", "600,674", "328,671", "135,548", "136,455", "20.1"),
    ]
    assert rows[0][2] == "nccl_128ranks_rank0.json.gz"
    alex = table_rows(alexnet_report.read_text(encoding="utf-8"), "Per rank, GPU")
    assert [(r[4], r[5], r[7], r[9], r[11]) for r in alex] == [("12,996,011", "12,929,684", "10,637", "55,690", "–")]
    host = table_rows(alexnet_report.read_text(encoding="utf-8"), "Per rank, host")
    assert host[0][1] == "83.9"  # memory transfer share of kernel time: REFERENCE.md's MEMORY 83.9 %


def test_host_table_and_straggler_table(nccl_report: Path, nccl_set: TraceSet) -> None:
    page = nccl_report.read_text(encoding="utf-8")
    host = table_rows(page, "Per rank, host")
    # rank, memory %, sync, GPU waited on launches µs and %, median and p95 launch delay, idle, host-wait,
    # kernel-wait, host-wait %, leads
    assert [(r[0], r[7], r[8], r[9]) for r in host] == [("0", "321,378", "115,886", "205,492"),
                                                        ("1", "328,671", "166,668", "162,003")]
    lead = nccl_set.stragglers
    assert host[1][-1] == f"{lead[lead['rank'] == 1]['lead_us'].max():,.0f}" == "252,723"
    leads = table_rows(page, "Largest straggler leads")
    assert leads[0] == ["552", "nccl:all_to_all", "layer", "1", "441,878", "252,723"]


def test_progress_counts_files_and_ranks(nccl_dir: Path, tmp_path: Path) -> None:
    seen: list[tuple[str, int, int]] = []
    build_report(nccl_dir, tmp_path / "r.html", progress=lambda s, d, t: seen.append((s, d, t)))
    total = seen[0][2]
    assert [d for _, d, _ in seen] == list(range(total + 1))
    assert total == 2 + 2 + 1 + len(figures.FIGURES) + 1  # files, ranks, straggler lead, figures, HTML
    stages = [s for s, _, _ in seen]
    assert stages[:5] == ["reading trace nccl_128ranks_rank0.json.gz", "reading trace nccl_128ranks_rank1.json.gz",
                          "analyzing rank 0", "analyzing rank 1", "straggler lead across ranks"]
    assert stages[-1] == "done"


@pytest.mark.slow
def test_combined_run_and_traces_show_both(tmp_path: Path, nccl_dir: Path) -> None:
    run = ALL_SCENARIOS["hot_straggler"]().write(tmp_path / "capture")
    shutil.copytree(nccl_dir, run / "traces")
    out = tmp_path / "both.html"
    assert main(["report", str(run), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert figure_keys(page) == [*RUN_FIGURE_KEYS, *TRACE_KEYS]
    assert page.count("<svg") == len(RUN_FIGURE_KEYS) + len(TRACE_KEYS) == 15
    assert '<section id="summary">' in page and '<section id="trace-summary">' in page
    assert "<caption>Per job</caption>" in page and table_rows(page, "Per rank, GPU")[0][5] == "321,378"


@pytest.mark.slow
def test_capture_with_cpu_only_traces_reports_the_run_and_the_join(tmp_path: Path) -> None:
    """What a CPU machine's capture holds: a run, and traces with ProfilerStep ranges but no kernels."""
    import gzip
    import json

    from chopper.runs.rundir import read_run

    run = ALL_SCENARIOS["hot_straggler"]().write(tmp_path / "capture")
    markers = read_run(run).markers
    mine = markers[(markers["rank"] == 0) & (markers["step"].isin([1, 2]))]
    base = int(mine["ts_ns"].min()) // 10**9 * 10**9  # Kineto's base: a whole second before the events
    events = []
    for step, kind_ts in mine.groupby("step"):
        begin, end = kind_ts["ts_ns"].min(), kind_ts["ts_ns"].max()
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                       "ts": (begin - base) / 1e3 + 2, "dur": (end - begin) / 1e3})
    (run / "traces").mkdir()
    with gzip.open(run / "traces" / "rank0.pt.trace.json.gz", "wt") as fh:
        json.dump({"traceEvents": events, "baseTimeNanoseconds": base}, fh)
    out = tmp_path / "r.html"
    assert main(["report", str(run), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert figure_keys(page) == RUN_FIGURE_KEYS and '<section id="trace-summary">' not in page
    rows = table_rows(page, "Per profiled step")
    assert [(r[1], r[2], r[4]) for r in rows] == [("0", "1", "2"), ("0", "2", "2")]  # rank, step, offset µs
    assert all(r[6] == "–" for r in rows) and "CPU-only trace" in page


@pytest.mark.slow
def test_trace_files_beside_the_run_tables_count(tmp_path: Path) -> None:
    run = ALL_SCENARIOS["hot_straggler"]().write(tmp_path / "capture")
    shutil.copy(ALEXNET, run)
    page = build_report(run, tmp_path / "r.html").read_text(encoding="utf-8")
    assert figure_keys(page) == [*RUN_FIGURE_KEYS, *SINGLE_RANK_KEYS]


def test_figure_data_matches_the_analyses(nccl_set: TraceSet) -> None:
    data = ReportData(traces=nccl_set)
    spec = {s.key: s for s in figures.FIGURES}

    def bars(key: str) -> list[float]:
        ax = spec[key].render(data).axes[0]
        return [round(p.get_width()) for p in ax.patches]

    # Stacked horizontal bars, segment by segment: compute, non-compute, idle for ranks 0 and 1.
    assert bars("trace-temporal") == [106252, 135548, 172428, 136455, 321378, 328671]
    assert bars("trace-idle-split") == [115886, 166668, 205492, 162003]
    kt = bars("trace-kernel-types")
    assert kt[:6] == [83182, 101841, 171780, 133804, 169, 2119]  # COMPUTATION, COMMUNICATION, MEMORY
    top = spec["trace-top-kernels"].render(data).axes[0]
    assert top.get_yticklabels()[0].get_text() == "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t"
    assert top.texts[0].get_text().strip() == "65.2% · 10×"
    launch = spec["trace-launch-overhead"].render(data).axes[0]
    by_op = nccl_set.launch_by_op.sort_values("launch_delay_p95_us", ascending=False).drop_duplicates("cpu_op")
    assert [t.get_text() for t in launch.get_yticklabels()[:2]] == by_op["cpu_op"].head(2).tolist()
    # Bars are per-kernel medians, whiskers p95: µs a kernel waits, bounded by the span unlike a sum.
    medians = [round(b.get_width(), 3) for b in launch.patches]
    assert medians == [round(v, 3) for v in by_op["launch_delay_median_us"].head(len(medians))]
    assert max(by_op["launch_delay_p95_us"]) < min(nccl_set.temporal["kernel_time_us"])
    heat = spec["trace-straggler-lead"].render(data).axes[0]
    grid = heat.images[0].get_array()
    assert heat.get_yticklabels()[0].get_text() == "nccl:all_to_all"
    assert round(float(grid[0, 1])) == 170206 and float(grid[0, 0]) == 0.0  # rank 1 late, mean of 2 iterations
    cdf = spec["trace-overlap-cdf"].render(data).axes[0]
    assert [line.get_label() for line in cdf.get_lines()] == ["rank 0: 5 kernels, HTA overlap 11.8%",
                                                              "rank 1: 5 kernels, HTA overlap 20.1%"]


def test_overlap_fractions_exact_and_consistent_with_hta(nccl_set: TraceSet) -> None:
    act = pd.DataFrame({
        "start_ns": [0, 10, 30, 5, 50, 100], "end_ns": [20, 25, 40, 35, 60, 100],
        "kernel_class": ["COMPUTATION"] * 3 + ["COMMUNICATION"] * 3, "name": list("abcdef")})
    f = comm_overlap_fractions(act)
    # [5, 35) meets computation on [5, 25) and [30, 35): 25 of 30 ns; [50, 60) meets none; zero length → 0.
    assert f["name"].tolist() == ["d", "e", "f"]
    np.testing.assert_allclose(f["fraction"], [25 / 30, 0.0, 0.0])
    assert f["overlapped_us"].tolist() == [0.025, 0.0, 0.0]
    # Weighted by duration, the fractions are HTA's overlap % (no two collectives overlap here).
    for rank, pct in nccl_set.overlap_pct.items():
        c = nccl_set.comm_overlap[nccl_set.comm_overlap["rank"] == rank]
        assert pct is not None
        assert 100 * c["overlapped_us"].sum() / c["dur_us"].sum() == pytest.approx(pct, abs=1e-9)
        assert c["fraction"].between(0, 1).all()


def test_kernel_labels_tell_kernels_apart() -> None:
    for path in (NCCL[0], ROCM, ALEXNET):
        names = top_kernels(load_trace(path).kernels, 15)["name"].tolist()
        labels = trace_figures.kernel_labels(names)
        assert len(set(labels)) == len(labels), labels
        assert all(len(label) <= trace_figures.NAME_CHARS for label in labels)
        assert not any(label.endswith("::") for label in labels), labels
    assert trace_figures.kernel_labels([
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x64_32x6_nt_align1>(X::Params)",
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x4_nt_align4>(X::Params)",
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 1>(float*)",
    ]) == ["cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x64_32x6_nt_align1>",
           "cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x4_nt_align4>",
           "at::native::CatArrayBatchedCopy"]


@pytest.mark.parametrize("case", ["corrupt", "duplicate_rank", "corrupt_beside_run"])
def test_bad_trace_exits_2_naming_the_file(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, out = tmp_path / "in", tmp_path / "out.html"
    if case == "corrupt_beside_run":
        path = ALL_SCENARIOS["hot_straggler"]().write(path)
    path.mkdir(exist_ok=True)
    bad = path / "rank3.json.gz"
    if case == "duplicate_rank":
        shutil.copy(ALEXNET, path / "a.json.gz")
        shutil.copy(ALEXNET, path / "b.json.gz")
    else:
        bad.write_bytes(ALEXNET.read_bytes()[:2000])  # cut short, as an interrupted copy leaves it
    assert main(["report", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("chopper report: "), err
    if case == "duplicate_rank":
        assert str(path / "a.json.gz") in err and str(path / "b.json.gz") in err and "rank 0" in err
    else:
        assert str(bad) in err and "truncated" in err, err
    assert not out.exists()


def test_cli_single_trace_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rocm.html"
    assert main(["report", str(ROCM), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    page = out.read_text(encoding="utf-8")
    assert figure_keys(page) == SINGLE_RANK_KEYS
    assert table_rows(page, "Per rank, GPU")[0][4:6] == ["8,911", "8,780"]  # REFERENCE.md: span 8911, idle 8780


@pytest.mark.slow
def test_chromium_renders_the_trace_report(nccl_report: Path, tmp_path: Path) -> None:
    dom, colours = render_in_chromium(nccl_report, tmp_path, 7000)
    assert dom.count("<svg") == len(TRACE_KEYS)
    assert "<caption>Per rank, GPU" in dom
    # Solid fills of compute, communication / non-compute, idle, CPU-late and the overlap combination.
    assert_filled(colours, ("#2e7d32", "#1565c0", "#90a4ae", "#c62828", "#00897b"))
