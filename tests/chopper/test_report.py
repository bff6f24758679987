"""``chopper report``: the HTML report of a recorded run, checked as a file and as rendered by Chromium."""
from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from chopper.cli import main
from chopper.report import ReportError, TextProgress, build_report, figures, terminal_progress
from chopper.report.html import FigureBlock, Section, TableBlock, TextBlock, render
from chopper.runs.rundir import read_run
from tests.support.attribution_scenarios import ALL_SCENARIOS, HOT_RANK
from tests.support.chromium_render import assert_filled, render_in_chromium
from tests.support.report_pages import RUN_FIGURE_KEYS, table_rows


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ALL_SCENARIOS["hot_straggler"]().write(tmp_path_factory.mktemp("report") / "run")


@pytest.fixture(scope="module")
def report(run_dir: Path) -> Path:
    out = build_report(run_dir, run_dir.parent / "report.html")
    assert out.is_file()
    return out


def test_report_is_self_contained(report: Path) -> None:
    page = report.read_text(encoding="utf-8")
    # Nothing is fetched: no remote src/href, no script, no external stylesheet.
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page, re.IGNORECASE)
    assert "<script" not in page.lower()
    assert "<link" not in page.lower()
    assert "<?xml" not in page and "<!DOCTYPE svg" not in page


def test_report_has_every_figure_and_the_toc(report: Path) -> None:
    page = report.read_text(encoding="utf-8")
    assert page.count("<svg") + page.count("<img") == len(RUN_FIGURE_KEYS) == 7
    for key in RUN_FIGURE_KEYS:
        assert f'<figure id="{key}">' in page
        assert f'href="#{key}"' in page, f"{key} missing from the table of contents"
    # No trace in a run directory: no trace figure, no trace summary.
    assert 'id="trace-' not in page


def test_summary_names_the_hot_rank_with_evidence(report: Path) -> None:
    page = report.read_text(encoding="utf-8")
    assert "<caption>Per job</caption>" in page and "<caption>Per rank (ms are means per step)</caption>" in page
    rows = table_rows(page, "Slowest ranks")
    assert len(rows) == 10
    for cells in rows:
        # job, step, rank, node, gpu, excess, clock, median clock, temp, cause
        assert cells[2] == str(HOT_RANK) and cells[-1] == "thermal" and cells[6] == "1680" and cells[8] == "96"


def test_throttle_shading_comes_from_counter_increases(run_dir: Path) -> None:
    samples = read_run(run_dir).samples
    t0 = int(samples["ts_ns"].min())
    for (node, gpu), rows in samples.groupby(["node", "gpu"]):
        series = figures.gpu_series(rows, t0)
        thermal = figures.throttle_spans(series, "thermal")
        hot = node.endswith("node1") and gpu == 0  # rank 2 in the scenario
        assert bool(thermal) == hot, (node, gpu)
        assert not any(figures.throttle_spans(series, c) for c in ("power", "current", "other"))
        if hot:
            # Rank 2 throttles through all ten steps, i.e. nearly the whole recording.
            covered = sum(e - b for b, e in thermal)
            assert covered > 0.8 * (series["t1_s"].max() - series["t0_s"].min())


def test_binning_keeps_residency_and_means(run_dir: Path) -> None:
    samples = read_run(run_dir).samples
    rows = samples[(samples["node"].str.endswith("node1")) & (samples["gpu"] == 0)]
    full = figures.gpu_series(rows, int(rows["ts_ns"].min()))
    binned = figures.gpu_series(rows, int(rows["ts_ns"].min()), max_points=40)
    assert len(binned) <= 40
    duration = (full["t1_s"] - full["t0_s"]).to_numpy()
    for col in ("throttle_thermal", "gfx_clock_mhz"):
        whole = (full[col] * duration).sum()
        assert abs(whole - (binned[col] * (binned["t1_s"] - binned["t0_s"])).sum()) < 1e-6 * max(1.0, whole)


def test_registered_figures_need_their_inputs(run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace figure is skipped for a run; an extra attribution figure is drawn in its own section."""
    calls: list[str] = []

    def extra(data: figures.ReportData) -> figures.Figure:
        calls.append("extra")
        fig = figures.new_figure(4, 3)
        fig.add_subplot().plot([0, 1], [0, 1])
        return fig

    def trace_only(data: figures.ReportData) -> figures.Figure:
        raise AssertionError("needs traces, must not be drawn for a recorded run")

    monkeypatch.setattr(figures, "FIGURES", [
        *figures.FIGURES,
        figures.FigureSpec("kernel-types", "Kernels", "Kernel types", "c", ("traces",), trace_only),
        figures.FigureSpec("extra", "Extra <section>", "Extra", "caption & more", ("attribution",), extra),
    ])
    page = build_report(run_dir, tmp_path / "r.html").read_text(encoding="utf-8")
    assert calls == ["extra"]
    assert page.count("<svg") == len(RUN_FIGURE_KEYS) + 1
    assert "kernel-types" not in page
    assert "Extra &lt;section&gt;" in page and "caption &amp; more" in page


def test_text_is_escaped() -> None:
    page = render("t <script>", "s & s", [Section("a", "A <b>", [
        TableBlock("cap <i>", ["col"], [["<img src=x onerror=alert(1)>"]]),
        TextBlock("problems", ["job '<x>' rank 0: step_end without step_begin"]),
        FigureBlock("f", "F <u>", "c <u>", "<svg></svg>"),
    ])])
    assert "<script>" not in page and "<img" not in page and "<b>" not in page and "<u>" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "&lt;x&gt;" in page


def test_progress_only_on_a_terminal(run_dir: Path, tmp_path: Path) -> None:
    assert terminal_progress(io.StringIO()) is None

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    bar = terminal_progress(stream)
    assert isinstance(bar, TextProgress)
    seen: list[tuple[str, int, int]] = []

    def both(stage: str, done: int, total: int) -> None:
        seen.append((stage, done, total))
        bar(stage, done, total)

    build_report(run_dir, tmp_path / "r.html", progress=both)
    total = seen[0][2]
    assert [d for _, d, _ in seen] == list(range(total + 1))
    assert stream.getvalue().startswith("\r[") and stream.getvalue().endswith("\n")
    assert f"] {total}/{total} done" in stream.getvalue()


def test_cli_writes_the_report(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.html"
    assert main(["report", str(run_dir), "-o", str(out), "--job", "hot_straggler"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == f"wrote {out}"
    assert captured.err == ""  # not a terminal: no progress bar
    assert out.read_text(encoding="utf-8").count("<svg") == len(RUN_FIGURE_KEYS)


@pytest.mark.parametrize("case, message", [
    ("missing", "does not exist"),
    ("empty", "is neither a recorded run"),
    ("traces", "trace.json.gz"),
    ("partial", "has no samples table"),
    ("no_output_dir", "directory"),
    ("unknown_job", "job 'nope' has no markers"),
])
def test_bad_input_exits_2_with_a_message(case: str, message: str, run_dir: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path, out, extra = tmp_path / "in", tmp_path / "out.html", []
    if case == "empty":
        path.mkdir()
    elif case == "traces":
        (path / "rank0").mkdir(parents=True)
        (path / "rank0" / "trace.json.gz").write_bytes(b"")
    elif case == "partial":
        path.mkdir()
        shutil.copy(run_dir / "devices.parquet", path)
    elif case == "no_output_dir":
        path, out = run_dir, tmp_path / "absent" / "out.html"
    elif case == "unknown_job":
        path, extra = run_dir, ["--job", "nope"]
    assert main(["report", str(path), "-o", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("chopper report: ") and message in err, err
    assert not out.exists()


def test_build_report_raises_report_error(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="does not exist"):
        build_report(tmp_path / "missing", tmp_path / "r.html")


def test_import_stays_light() -> None:
    code = "import sys, chopper.report, chopper.cli; print(sorted({'matplotlib', 'pandas'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_chromium_renders_the_report(report: Path, tmp_path: Path) -> None:
    dom, colours = render_in_chromium(report, tmp_path, 4000)
    # The parsed DOM holds every inline SVG and the summary: the page parsed as HTML, not as text.
    assert dom.count("<svg") == len(RUN_FIGURE_KEYS)
    assert "<caption>Per job</caption>" in dom
    # The stacked bars drew: solid fills of the ideal, thermal DVFS and straggler-wait colours.
    assert_filled(colours, ("#2e7d32", "#c62828", "#fbc02d"))


def test_phase_table_shows_the_phase_that_grew(report: Path) -> None:
    import pandas as pd

    # 8 steps of one rank: backward steady at 20 ms, forward 10 ms that grows to 40 ms in the last quarter.
    steps = pd.DataFrame({"job": "j", "rank": 0, "step": range(8),
                          "phase_s": [{"forward": 0.04 if i >= 6 else 0.01, "backward": 0.02} for i in range(8)]})
    change = figures.phase_change(steps).set_index("phase")
    assert change.loc["forward", ["median_s", "early_s", "late_s"]].tolist() == pytest.approx([0.01, 0.01, 0.04])
    assert change.loc["backward", "late_s"] - change.loc["backward", "early_s"] == 0
    # The recorded run's phases appear in the report's table, one row per rank and phase.
    page = report.read_text(encoding="utf-8")
    rows = table_rows(page, "Phase time per rank")
    ranks = read_run(report.parent / "run").markers["rank"].nunique()
    assert len(rows) == 3 * ranks and {r[2] for r in rows} == {"forward", "backward", "optimizer"}


def test_flags_raised_live_or_by_a_newer_agent_are_tabled(run_dir: Path) -> None:
    """Steps may carry flags the offline model never raises (live ones, or a newer agent's): listed, not a crash."""
    from chopper.attribution import attribute_run
    from chopper.report import summary_blocks

    result = attribute_run(run_dir)
    raised = ("unknown_device", "bad_flops", "flag_of_a_newer_agent")
    result.steps["flags"] = [tuple(raised) if i % 3 == 0 else tuple(f) for i, f in enumerate(result.steps["flags"])]
    table = next(b for b in summary_blocks(result) if isinstance(b, TableBlock) and b.caption == "Step flags")
    rows = {row[0]: row for row in table.rows}
    assert set(raised) <= set(rows)
    assert [r[0] for r in table.rows].index("flag_of_a_newer_agent") == len(table.rows) - 1
    assert rows["bad_flops"][1] == str(len(range(0, len(result.steps), 3)))
    assert "newer agent" in rows["flag_of_a_newer_agent"][2] and "GPU" in rows["unknown_device"][2]
