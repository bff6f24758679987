"""``chopper report``: one self-contained HTML page with the figures of a recorded run.

``build_report(path, out)`` does, in order:

1. classify ``path`` (``classify_input``): a recorded run (``devices``/``samples``/``markers``
   tables), a directory of Kineto traces (``*.json``/``*.json.gz``), or neither;
2. read and attribute the run (``chopper.attribution.attribute_run``);
3. draw every registered figure whose inputs are present (``figures.FIGURES``, in order);
4. add the summary tables (per job, per rank, slowest ranks with evidence, problems) and write
   the page (``html.render``).

Trace reports are not built yet: a trace directory is refused with ``ReportError`` until the
trace analyzer (``chopper.trace``) lands; its figures then join ``figures.FIGURES`` with
``needs=("traces",)`` and ``ReportData.traces`` is filled here.

This package imports pandas and matplotlib only inside ``build_report``, so ``import
chopper.report`` (and the CLI's argument parsing) stays light.
"""
from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chopper.attribution import Attribution
    from chopper.report.html import Section
    from chopper.rundir import RecordedRun

__all__ = ["Progress", "ReportError", "TextProgress", "build_report", "classify_input", "terminal_progress"]

# (stage, done, total): called before each stage and once with done == total at the end.
Progress = Callable[[str, int, int], None]

TRACE_SUFFIXES = (".json", ".json.gz")


class ReportError(ValueError):
    """The input cannot be reported on; the message names the problem and the fix."""


class TextProgress:
    """A one-line text progress bar, redrawn in place with a carriage return.

    Args:
        stream: Where to draw (a terminal).
        width: Bar width in characters.
    """

    def __init__(self, stream: IO[str], width: int = 30) -> None:
        self.stream = stream
        self.width = width

    def __call__(self, stage: str, done: int, total: int) -> None:
        filled = self.width * done // max(total, 1)
        line = f"\r[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} {stage}"
        # Pad so a shorter stage name overwrites the tail of the previous one.
        self.stream.write(f"{line:<{self.width + 60}}")
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


def terminal_progress(stream: IO[str] | None = None) -> Progress | None:
    """A ``TextProgress`` on ``stream`` (default stderr) when it is a terminal, else None.

    Logs and CI output must not fill with carriage-return redraws, so nothing is drawn there.
    """
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return TextProgress(stream) if isatty is not None and isatty() else None


def _trace_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES))


def classify_input(path: str | Path) -> str:
    """``"run"`` for a recorded run directory, ``"traces"`` for Kineto traces.

    A directory with any of the run's table files counts as a run (``read_run`` then names what
    is missing); otherwise one with ``*.json``/``*.json.gz`` files (at any depth) counts as traces.

    Raises:
        ReportError: ``path`` does not exist, or is neither a run nor traces.
    """
    from chopper.rundir import TABLES, table_files

    base = Path(path)
    if not base.exists():
        raise ReportError(f"{str(base)!r} does not exist; pass a recorded run directory (chopper record) or a "
                          "directory of Kineto traces")
    if base.is_file():
        if base.name.endswith(TRACE_SUFFIXES):
            return "traces"
        raise ReportError(f"{str(base)!r} is a file; pass a recorded run directory (devices/samples/markers "
                          "as .parquet or .csv) or a directory of Kineto traces (*.json, *.json.gz)")
    if any(f.exists() for table in TABLES for f in table_files(base, table)):
        return "run"
    if _trace_files(base):
        return "traces"
    raise ReportError(f"{str(base)!r} is neither a recorded run (no devices/samples/markers .parquet or .csv) "
                      "nor a trace directory (no *.json or *.json.gz); record one with chopper record")


def build_report(path: str | Path, out: str | Path, *, job: str | None = None,
                 progress: Progress | None = None) -> Path:
    """Write the HTML report of a recorded run to ``out``.

    Args:
        path: Recorded run directory (or, later, a trace directory).
        out: HTML file to write; its parent directory must exist.
        job: Only this job (all jobs when None).
        progress: Called with ``(stage, done, total)`` as the report is built; see ``terminal_progress``.

    Returns:
        ``out`` as a ``Path``.

    Raises:
        ReportError: ``path`` is not a run, holds only traces, or has no complete step.
        chopper.rundir.RunDirError, chopper.attribution.AttributionError: The run is malformed.
        OSError: ``out`` cannot be written.
    """
    kind = classify_input(path)
    target = Path(out)
    # Checked first so that a typo in -o does not cost the whole report.
    if not target.parent.is_dir():
        raise ReportError(f"cannot write {str(target)!r}: directory {str(target.parent)!r} does not exist")
    if kind == "traces":
        raise ReportError(f"{str(path)!r} holds Kineto traces; trace reports arrive with the trace analyzer "
                          "(chopper.trace). For now, report on a recorded run directory (chopper record)")
    from chopper.report import figures, html

    report = progress or (lambda stage, done, total: None)
    specs = list(figures.FIGURES)
    total = 3 + len(specs)
    report("reading run", 0, total)
    from chopper.attribution import attribute
    from chopper.rundir import read_run

    run = read_run(path)
    report("attributing steps", 1, total)
    result = attribute(run.devices, run.samples, run.markers, job=job)
    if result.steps.empty:
        problems = "".join(f"\n  {p}" for p in result.problems)
        raise ReportError(f"no complete step in {str(path)!r} (no step_begin/step_end pair); record while a job "
                          f"marks steps with chopper.step(){problems}")
    data = figures.ReportData(run=run, attribution=result)
    sections: dict[str, Section] = {}
    summary = html.Section("summary", "Summary", summary_blocks(result))
    for i, spec in enumerate(specs):
        report(f"figure: {spec.title}", 2 + i, total)
        if not spec.available(data):
            continue
        fig = spec.render(data)
        block = html.FigureBlock(spec.key, spec.title, spec.caption, html.figure_svg(fig, salt=spec.key))
        section = sections.setdefault(spec.section, html.Section(_anchor(spec.section), spec.section))
        section.blocks.append(block)
    report("writing HTML", total - 1, total)
    page = html.render(f"Chopper report: {Path(path).resolve().name}", _subtitle(run, result, job),
                       [summary, *sections.values()])
    target.write_text(page, encoding="utf-8")
    report("done", total, total)
    return target


def _anchor(title: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in title.lower()).strip("-")


def _subtitle(run: RecordedRun, result: Attribution, job: str | None) -> str:
    steps = result.steps
    span_s = (run.samples["ts_ns"].max() - run.samples["ts_ns"].min()) / 1e9 if len(run.samples) else 0.0
    jobs = ", ".join(sorted(steps["job"].astype(str).unique()))
    return (f"{run.path} · job{'s' if steps['job'].nunique() > 1 else ''} {jobs}"
            f"{' (--job)' if job else ''} · {steps.groupby(['job', 'rank']).ngroups} ranks · "
            f"{len(run.devices)} GPUs · {steps['step'].nunique()} steps · {span_s:.1f} s of samples")


def _ms(value: Any) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{1e3 * value:.1f}"


def _pct(value: Any) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.1f}"


def summary_blocks(result: Attribution) -> list[Any]:
    """The summary section: per-job and per-rank totals, the slowest ranks with evidence, problems.

    Times are milliseconds per step (mean over the rank-steps), shares percent of step time.
    """
    from chopper.attribution.columns import FLAGS
    from chopper.attribution.report import summary
    from chopper.report.html import TableBlock, TextBlock

    info = summary(result)
    terms = (("ideal", "ideal_s"), ("matrix loss", "matrix_util_loss_s"), ("DVFS", "dvfs_loss_s"),
             ("exposed comm", "exposed_comm_s"), ("straggler wait", "straggler_wait_s"), ("idle", "idle_s"))
    job_cols = ["job", "rank-steps", "mean step ms", "MFU %", *(f"{n} %" for n, _ in terms), "flagged steps"]
    job_rows = []
    for j in info["jobs"]:
        t = j["step_time_s"] or 0.0
        job_rows.append([str(j["job"]), str(j["steps"]), _ms(j["mean_step_time_s"]), _pct(j["mfu"]),
                         *(_pct((j[k] or 0.0) / t) if t > 0 else "–" for _, k in terms), str(j["flagged_steps"])])
    steps = result.steps
    evidence = steps.groupby(["job", "rank"]).agg(
        node=("node", "first"), gpu=("gpu", "first"), clock=("mean_gfx_clock_mhz", "mean"),
        temp=("max_temp_c", "max"))
    slowest_counts = result.stragglers.groupby(["job", "rank"]).size() if len(result.stragglers) else None
    rank_cols = ["job", "rank", "node", "gpu", "steps", "mean step ms", "MFU %", *(f"{n} ms" for n, _ in terms),
                 "mean clock MHz", "max temp °C", "slowest in steps"]
    rank_rows = []
    for r in info["ranks"]:
        key = (r["job"], r["rank"])
        n = r["steps"] or 1
        ev = evidence.loc[key]
        slow = int(slowest_counts.get(key, 0)) if slowest_counts is not None else 0
        rank_rows.append([str(r["job"]), str(r["rank"]), str(ev["node"]), str(ev["gpu"]), str(r["steps"]),
                          _ms(r["mean_step_time_s"]), _pct(r["mfu"]),
                          *(_ms((r[k] or 0.0) / n) for _, k in terms),
                          "–" if math.isnan(ev["clock"]) else f"{ev['clock']:.0f}",
                          "–" if math.isnan(ev["temp"]) else f"{ev['temp']:.0f}", str(slow)])
    blocks: list[Any] = [
        TableBlock("Per job", job_cols, job_rows, frozenset(job_cols[1:])),
        TableBlock("Per rank (ms are means per step)", rank_cols, rank_rows, frozenset(rank_cols[4:])),
    ]
    slow = result.stragglers
    if len(slow):
        worst = slow.sort_values("compute_excess_s", ascending=False, kind="stable").head(10)
        cols = ["job", "step", "rank", "node", "gpu", "compute excess ms", "clock MHz", "job median clock MHz",
                "max temp °C", "cause"]
        rows = [[str(s.job), str(s.step), str(s.rank), str(s.node), str(s.gpu), _ms(s.compute_excess_s),
                 f"{s.mean_gfx_clock_mhz:.0f}", f"{s.job_median_gfx_clock_mhz:.0f}",
                 "–" if math.isnan(s.max_temp_c) else f"{s.max_temp_c:.0f}", str(s.cause)]
                for s in worst.itertuples(index=False)]
        blocks.append(TableBlock(
            "Slowest ranks: the largest compute excess over the job's median at a step, with the hardware evidence "
            "(cause none: the clock was not low, look at the host, data loader or kernels)",
            cols, rows, frozenset(cols[5:9])))
    seen = sorted({f for flags in steps["flags"] for f in flags}, key=list(FLAGS).index)
    if seen:
        counts = {f: int(steps["flags"].map(lambda fl, f=f: f in fl).sum()) for f in seen}
        blocks.append(TableBlock("Step flags", ["flag", "rank-steps", "meaning"],
                                 [[f, str(counts[f]), FLAGS[f]] for f in seen], frozenset({"rank-steps"})))
    if result.problems:
        blocks.append(TextBlock("Markers not used:", list(result.problems)))
    else:
        blocks.append(TextBlock("Problems: none; every marker was paired."))
    return blocks
