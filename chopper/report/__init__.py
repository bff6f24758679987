"""``chopper report``: one self-contained HTML page with the figures of a recorded run and/or its traces.

``build_report(path, out)`` does, in order:

1. find the inputs (``find_inputs``): a recorded run (``devices``/``samples``/``markers`` tables),
   the aggregator's step store (``job=<job>/`` partitions), Kineto traces (found by
   ``chopper.trace.discover.trace_files``: a ``*.json``/``*.json.gz`` file, or such files at any
   depth under the directory, one per rank), or both (a capture directory: run tables plus a
   ``traces/`` folder or trace files beside them);
2. read and attribute the run (``chopper.attribution.attribute``), or read the store's rows,
   attributed already (``chopper.attribution.store_reader``); a store has no GPU samples, so
   the figures drawn from them are named in the summary instead;
3. read the traces, one progress stage per file, and run every trace analysis once, one stage per
   rank (``chopper.report.traces``); beside a run, CPU-only traces (a capture on a machine without
   GPU) are read too, for the capture section only;
4. draw every registered figure whose inputs are present (``figures.FIGURES``, in order);
5. add the summary tables (run: per job, per rank, slowest ranks, phase times per rank, problems; traces: per rank HTA
   figures, overlap, memory-transfer share, sync-blocked time, launch overhead, idle split,
   largest straggler leads; a capture, i.e. a run with traces: each profiled step's counters beside
   its kernels, ``chopper.runs.capture_join``) and write the page (``html.render``).

This package imports pandas and matplotlib only inside ``build_report``, so ``import
chopper.report`` (and the CLI's argument parsing) stays light.
"""
from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chopper.attribution import Attribution
    from chopper.report.html import Section
    from chopper.report.traces import TraceSet
    from chopper.runs.rundir import RecordedRun
    from chopper.trace import Trace

__all__ = ["Progress", "ReportError", "TextProgress", "build_report", "classify_input", "find_inputs",
           "terminal_progress"]

# (stage, done, total): called before each stage and once with done == total at the end.
Progress = Callable[[str, int, int], None]


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


def find_inputs(path: str | Path) -> tuple[str | None, list[Path]]:
    """What ``path`` holds: a recorded run, an aggregator's step store or neither, and its Kineto trace files.

    A directory laid out as the aggregator's store (``job=<job>/`` partitions,
    ``chopper.attribution.store_reader.is_step_store``) is a store; else a directory with any of
    the run's table files is a run (``read_run`` then names what is missing). Trace files are
    found by ``chopper.trace.discover.trace_files``, the rule of every command (``path`` itself
    when it is a ``.json``/``.json.gz`` file, else every such file at any depth under it).

    Returns:
        ``(source, trace_files)``: ``source`` is ``"run"``, ``"store"`` or None; at least one of
        them is set.

    Raises:
        ReportError: ``path`` does not exist, or holds neither a run, a store nor traces.
    """
    from chopper.attribution.store_reader import is_step_store
    from chopper.runs.rundir import TABLES, table_files
    from chopper.trace.discover import trace_files

    base = Path(path)
    if not base.exists():
        raise ReportError(f"{str(base)!r} does not exist; pass a recorded run directory (chopper record), an "
                          "aggregator's store_dir, a Kineto trace file or a directory of Kineto traces")
    files = trace_files(base)
    if base.is_file():
        if files:
            return None, files
        raise ReportError(f"{str(base)!r} is a file; pass a recorded run directory (devices/samples/markers "
                          "as .parquet or .csv), a Kineto trace (*.json, *.json.gz) or a directory of them")
    if is_step_store(base):
        return "store", files
    is_run = any(f.exists() for table in TABLES for f in table_files(base, table))
    if not is_run and not files:
        raise ReportError(f"{str(base)!r} is neither a recorded run (no devices/samples/markers .parquet or .csv), "
                          "an aggregator's step store (no job=* partitions) nor a trace directory (no *.json or "
                          "*.json.gz); record one with chopper record")
    return ("run" if is_run else None), files


def classify_input(path: str | Path) -> str:
    """``"run"``, ``"store"``, ``"traces"``, or ``"run+traces"``: what ``find_inputs`` finds at ``path``.

    Raises:
        ReportError: ``path`` does not exist, or is neither a run, a store nor traces.
    """
    source, files = find_inputs(path)
    if source is None:
        return "traces"
    return f"{source}+traces" if files else source


class _Stages:
    """Numbers the stages for the progress callback: each call reports the next stage, 0, 1, …"""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress = progress or (lambda stage, done, total: None)
        self.total = total
        self.done = 0

    def __call__(self, stage: str) -> None:
        self.progress(stage, self.done, self.total)
        self.done += 1

    def finish(self) -> None:
        self.progress("done", self.total, self.total)


def build_report(path: str | Path, out: str | Path, *, job: str | None = None,
                 progress: Progress | None = None) -> Path:
    """Write the HTML report of a recorded run or a step store, of a job's traces, or of both, to ``out``.

    Args:
        path: Recorded run directory, the aggregator's store_dir, Kineto trace file, directory of
            traces, or a directory with a run and its traces.
        out: HTML file to write; its parent directory must exist.
        job: Only this job of the run or store (all jobs when None); traces are one job already.
        progress: Called with ``(stage, done, total)`` before each stage (one per trace file and per
            rank among them) and once with ``done == total`` at the end; see ``terminal_progress``.

    Returns:
        ``out`` as a ``Path``.

    Raises:
        ReportError: ``path`` is neither a run, a store nor traces, or the run has no complete step.
        chopper.runs.rundir.RunDirError, chopper.attribution.AttributionError: The run is malformed,
            or the store cannot be read or has no rows (of ``job``).
        chopper.trace.TraceError: A trace is bad (the message names the file), or the traces mix jobs.
        OSError: ``out`` cannot be written.
    """
    source, files = find_inputs(path)
    target = Path(out)
    # Checked first so that a typo in -o does not cost the whole report.
    if not target.parent.is_dir():
        raise ReportError(f"cannot write {str(target)!r}: directory {str(target.parent)!r} does not exist")
    from chopper.report import figures, html

    specs = list(figures.FIGURES)
    # One stage per file read and per rank analysed (one rank per file), the straggler lead, figures, HTML.
    trace_stages = 2 * len(files) + (1 if len(files) >= 2 else 0)
    stage = _Stages(progress, {"run": 2, "store": 1, None: 0}[source] + trace_stages + len(specs) + 1)
    run = result = trace_set = None
    summaries: list[Section] = []
    if source == "run":
        from chopper.attribution import attribute
        from chopper.runs.rundir import read_run

        stage("reading run")
        run = read_run(path)
        stage("attributing steps")
        result = attribute(run.devices, run.samples, run.markers, job=job, collectives=run.collectives,
                           errors=run.errors)
        if result.steps.empty:
            problems = "".join(f"\n  {p}" for p in result.problems)
            raise ReportError(f"no complete step in {str(path)!r} (no step_begin/step_end pair); record while a "
                              f"job marks steps with chopper.step(){problems}")
    elif source == "store":
        from chopper.attribution.store_reader import read_step_store

        stage("reading step store")
        result = read_step_store(path, job=job)
    if result is not None:
        blocks = summary_blocks(result)
        if run is None:
            blocks.append(html.TextBlock(_WITHOUT_SAMPLES, [s.title for s in specs if s.needs == ("run",)]))
        summaries.append(html.Section("summary", "Summary", blocks))
    if files:
        from chopper.report import traces

        # Beside a run (a capture), CPU-only traces still place each profiled step on the run's clock.
        loaded = traces.load(files, stage, require_gpu=result is None)
        with_kernels = [t for t in loaded if len(t.kernel_columns)]
        if with_kernels:
            trace_set = traces.analyze_traces(with_kernels, stage)
            summaries.append(html.Section("trace-summary", "Trace summary", trace_summary_blocks(trace_set)))
        if result is not None:
            summaries.append(html.Section("capture", "Capture", capture_blocks(result, loaded)))
    data = figures.ReportData(run=run, attribution=result, traces=trace_set)
    sections: dict[str, Section] = {}
    for spec in specs:
        stage(f"figure: {spec.title}")
        if not spec.available(data):
            continue
        fig = spec.render(data)
        block = html.FigureBlock(spec.key, spec.title, spec.caption, html.figure_svg(fig, salt=spec.key))
        section = sections.setdefault(spec.section, html.Section(_anchor(spec.section), spec.section))
        section.blocks.append(block)
    stage("writing HTML")
    parts = []
    if result is not None:
        parts.append(_subtitle(run, result, job, Path(path)))
    if trace_set is not None:
        parts.append(_trace_subtitle(trace_set, Path(path)))
    page = html.render(f"Chopper report: {Path(path).resolve().name}", " — ".join(parts),
                       [*summaries, *sections.values()])
    target.write_text(page, encoding="utf-8")
    stage.finish()
    return target


def _anchor(title: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in title.lower()).strip("-")


# What a report of the aggregator's step store says in place of the figures drawn from samples.
_WITHOUT_SAMPLES = ("Not drawn: the aggregator's step store keeps one row per rank and step, not the GPU samples "
                    "(devices and samples tables of a recorded run) these figures are drawn from; record a run "
                    "with chopper record to see them:")


def _subtitle(run: RecordedRun | None, result: Attribution, job: str | None, path: Path) -> str:
    steps = result.steps
    jobs = ", ".join(sorted(steps["job"].astype(str).unique()))
    head = (f"{run.path if run is not None else f'{path} (aggregator step store)'} · "
            f"job{'s' if steps['job'].nunique() > 1 else ''} {jobs}{' (--job)' if job else ''} · "
            f"{steps.groupby(['job', 'rank']).ngroups} ranks · ")
    if run is None:
        return head + f"{steps[['node', 'gpu']].drop_duplicates().shape[0]} GPUs · {steps['step'].nunique()} steps"
    span_s = (run.samples["ts_ns"].max() - run.samples["ts_ns"].min()) / 1e9 if len(run.samples) else 0.0
    return head + f"{len(run.devices)} GPUs · {steps['step'].nunique()} steps · {span_s:.1f} s of samples"


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
    blocks += phase_blocks(steps)
    # Catalogued flags in their order, then any a newer agent raised, by name.
    order = {f: i for i, f in enumerate(FLAGS)}
    seen = sorted({f for flags in steps["flags"] for f in flags}, key=lambda f: (order.get(f, len(order)), f))
    if seen:
        counts = {f: int(steps["flags"].map(lambda fl, f=f: f in fl).sum()) for f in seen}
        blocks.append(TableBlock("Step flags", ["flag", "rank-steps", "meaning"],
                                 [[f, str(counts[f]), FLAGS.get(f, "raised by a newer agent")] for f in seen],
                                 frozenset({"rank-steps"})))
    if result.problems:
        blocks.append(TextBlock("Markers not used:", list(result.problems)))
    else:
        blocks.append(TextBlock("Problems: none; every marker was paired."))
    return blocks


def phase_blocks(steps: Any) -> list[Any]:
    """The per-rank phase table (``figures.phase_change``): median ms per step and its change across the run."""
    from chopper.report.figures import MAX_PHASES, phase_change
    from chopper.report.html import TableBlock

    change = phase_change(steps)
    if change.empty:
        return []
    cols = ["job", "rank", "phase", "steps", "median ms", "first quarter ms", "last quarter ms", "change ms"]
    rows = [[str(c.job), str(c.rank), str(c.phase), str(c.steps), _ms(c.median_s), _ms(c.early_s), _ms(c.late_s),
             f"{1e3 * (c.late_s - c.early_s):+.1f}"] for c in change.itertuples(index=False)]
    return [TableBlock(
        f"Phase time per rank: median per step, and the median of the first and last quarter of the steps (the "
        f"{MAX_PHASES} phases with most time); a phase that grew when steps got slower has a large change",
        cols, rows, frozenset(cols[3:]))]


def capture_blocks(result: Attribution, loaded: Sequence[Trace]) -> list[Any]:
    """The capture section: each profiled step's counters beside its kernels (``chopper.runs.capture_join``)."""
    from chopper.report.html import TableBlock, TextBlock
    from chopper.runs.capture_join import CPU_ONLY_NOTE, DISPLAY_COLUMNS, display_rows, join

    joined = join(result.steps, loaded)
    if joined.empty:
        return [TextBlock("No profiled step of the traces (ProfilerStep#N) matches a step of the run: the traces "
                          "come from another job or window.")]
    blocks: list[Any] = [TableBlock("Per profiled step: counters and kernels on one clock", DISPLAY_COLUMNS,
                                    display_rows(joined), frozenset(DISPLAY_COLUMNS[1:]))]
    if joined["cpu_only_trace"].any():
        blocks.append(TextBlock(CPU_ONLY_NOTE))
    return blocks


def _us(value: Any) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.0f}"


def _pct1(value: Any) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.1f}"


def _trace_subtitle(ts: TraceSet, path: Path) -> str:
    devices = ", ".join(sorted({t.device_type for t in ts.traces}))
    worlds = {t.world_size for t in ts.traces if t.world_size is not None}
    world = f" of world size {worlds.pop()}" if len(worlds) == 1 else ""
    return (f"traces in {path}: {len(ts.ranks)} rank{'s' if len(ts.ranks) != 1 else ''}{world} ({devices}) · "
            f"{sum(ts.kernels.values()):,} kernels")


def trace_summary_blocks(ts: TraceSet, top: int = 10) -> list[Any]:
    """The trace summary: per-rank HTA figures and host view, the largest straggler leads, reader warnings.

    Times are µs, shares % (HTA's temporal breakdown over the rank's kernel span; overlap as HTA
    defines it; memory transfer as % of kernel time; sync-blocked summed over host threads).
    """
    from chopper.report.html import TableBlock, TextBlock

    cols = ["rank", "device", "file", "kernels", "span µs", "idle µs", "idle %", "compute µs", "compute %",
            "non-compute µs", "non-compute %", "comm–comp overlap %"]
    host_cols = ["rank", "memory transfer %", "sync blocked µs", "GPU waited on launches µs",
                 "GPU waited on launches % of span", "median launch delay µs", "p95 launch delay µs", "idle µs",
                 "host-wait µs", "kernel-wait µs", "host-wait %"]
    cross = len(ts.ranks) >= 2
    if cross:
        host_cols += ["mean straggler lead µs", "max straggler lead µs"]
        leads = ts.stragglers.groupby("rank")["lead_us"].agg(["mean", "max"])
    temporal = ts.temporal.set_index("rank")
    host = ts.host.set_index("rank")
    launch = ts.launch_totals.set_index("rank")
    split = ts.idle_split.set_index("rank")
    rows, host_rows = [], []
    for t in ts.traces:
        r = t.rank
        tm = temporal.loc[r]
        rows.append([str(r), t.device_type, t.path.name, f"{ts.kernels[r]:,}", _us(tm["kernel_time_us"]),
                     _us(tm["idle_time_us"]), _pct1(tm["idle_pct"]), _us(tm["compute_time_us"]),
                     _pct1(tm["compute_pct"]), _us(tm["non_compute_time_us"]), _pct1(tm["non_compute_pct"]),
                     _pct1(ts.overlap_pct.get(r))])
        row = [str(r), _pct1(host.loc[r, "memory_transfer_pct"]), _us(host.loc[r, "sync_blocked_us"]),
               _us(launch.loc[r, "gpu_wait_on_launch_us"]), _pct1(launch.loc[r, "gpu_wait_on_launch_pct"]),
               _us(launch.loc[r, "launch_delay_median_us"]), _us(launch.loc[r, "launch_delay_p95_us"]),
               _us(split.loc[r, "idle_us"]),
               _us(split.loc[r, "host_wait_us"]), _us(split.loc[r, "kernel_wait_us"]),
               _pct1(split.loc[r, "host_wait_pct"])]
        if cross:
            row += [_us(leads["mean"].get(r)), _us(leads["max"].get(r))]
        host_rows.append(row)
    blocks: list[Any] = [
        TableBlock("Per rank, GPU (Holistic Trace Analysis's temporal breakdown over the kernel span, µs and % of "
                   "the span; comm–comp overlap as % of communication time)", cols, rows, frozenset(cols[3:])),
        TableBlock("Per rank, host (memory transfer as % of kernel time; sync blocked summed over host threads; "
                   "GPU waited on launches = idle time before the host called the next launch, all streams merged; "
                   "launch delay per kernel = its start − end of its launch call; idle split at each next kernel's "
                   "launch)",
                   host_cols, host_rows, frozenset(host_cols[1:])),
    ]
    if cross and len(ts.stragglers):
        lead_cols = ["iteration", "operation", "kind", "rank", "end after iteration start µs", "lead µs"]
        lead_rows = [[str(x.iteration), str(x.op), str(x.op_kind), str(x.rank), _us(x.end_us), _us(x.lead_us)]
                     for x in ts.stragglers.head(top).itertuples(index=False)]
        blocks.append(TableBlock(
            "Largest straggler leads: end of the operation's last kernel after the rank's own iteration start, "
            "minus the fastest rank's", lead_cols, lead_rows, frozenset({"iteration", "rank", *lead_cols[4:]})))
    warnings = ts.warnings
    blocks.append(TextBlock("Trace reader warnings:", warnings) if warnings
                  else TextBlock("Trace reader warnings: none."))
    return blocks
