"""``python -m benchmarks``: run every benchmark, print the figures against their goals.

``--write docs/PERFORMANCE.md`` regenerates that file (the whole file is generated). ``--only``
runs a subset by name; with ``--write``, the other benchmarks' rows and sections are kept from the
existing file (each section says when and at which commit it was measured), so one long benchmark
can be rerun alone, e.g. ``--only load_held --load-held-duration 600``. One benchmark failing is
reported in the table and the exit code; the others still run. Every goal is judged within one
run (a ratio or a CPU-time share), never against a wall-clock figure from another machine or
another day.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import platform
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import (
    bench_agent_cpu,
    bench_agent_kill,
    bench_aggregator,
    bench_attribution,
    bench_client_cpu,
    bench_exposed_truth,
    bench_fleet,
    bench_instrument_overhead,
    bench_load_held,
    bench_marker_cost,
    bench_marker_ingest,
    bench_metric_cost,
    bench_predict_validation,
    bench_tls,
    bench_trace_vs_hta,
)


@dataclass(frozen=True)
class Bench:
    """One benchmark: how to run it and how to state its headline figure and goal."""

    name: str
    run: Callable[..., dict[str, Any]]  # called with no argument; load_held takes its duration
    what: str
    figure: Callable[[dict[str, Any]], str]
    goal: str
    method: str


# The profile tops under load (py-spy, ``benchmarks/profile_top.py``), written into PERFORMANCE.md.
PROFILES = Path(__file__).with_name("profiles.md")

BENCHES = (
    Bench(
        "marker_cost", bench_marker_cost.run, "job-side cost per marker",
        lambda r: f"{r['ns_per_marker_added']:.0f} ns/marker",
        f"< {bench_marker_cost.GOAL_NS_PER_MARKER:.0f} ns",
        "`with chopper.step(i), chopper.phase(...)` vs two `nullcontext()`s, `timeit` minimum of "
        "interleaved repeats, agent absent (`benchmarks/bench_marker_cost.py`).",
    ),
    Bench(
        "metric_cost", bench_metric_cost.run,
        f"what /metrics costs per profile, {bench_metric_cost.GPUS} H100s and {bench_metric_cost.GPUS} ranks",
        lambda r: ("; ".join(f"{name} {p['series']} series, {p['bytes'] / 1024:.0f} KiB, {p['ratio_to_full']:g}x "
                             "full's scrape CPU" for name, p in r["profiles"].items())
                   + f"; selection filter {r['ratio_filter_vs_none']:g}x no filter"),
        f"filter <= {bench_metric_cost.GOAL_FILTER_RATIO:g}x a scrape without one",
        "in-process agent over the simulated backend with 8 ranks' steps summarised and a health reading per "
        "GPU; per family its series and bytes in one full scrape (the section's table), per profile the CPU "
        "time of `Registry.render`, minimum of interleaved rounds (`benchmarks/bench_metric_cost.py`, "
        "`agent/fields.py`).",
    ),
    Bench(
        "agent_cpu", bench_agent_cpu.run,
        f"agent CPU, {bench_agent_cpu.GPUS} GPUs at {bench_agent_cpu.SAMPLE_HZ:g} Hz, excluding the backend",
        lambda r: (f"{r['agent_core_pct']:.2f}% of a core ({r['us_per_gpu_sample']:.0f} µs/GPU-sample); at "
                   f"{bench_agent_cpu.DEFAULT_HZ:g} Hz {r['at_default_hz']['agent_core_pct']:.2f}%; one scrape "
                   f"{r['scrape_cpu_ms']:.1f} ms"),
        f"<= {100 * bench_agent_cpu.GOAL_CORE_RATIO:g}% of a core; <= "
        f"{100 * bench_agent_cpu.GOAL_DEFAULT_HZ_CORE_RATIO:g}% at {bench_agent_cpu.DEFAULT_HZ:g} Hz",
        "in-process agent (real gRPC server, /metrics, host sampler) with a subscriber, a scrape every 15 s "
        "(as deployed) and a 10 steps/s marker feed in another process; process CPU time minus the CPU time "
        "measured inside the simulated backend (`benchmarks/bench_agent_cpu.py`).",
    ),
    Bench(
        "marker_ingest", bench_marker_ingest.run,
        f"agent CPU per marker with step summaries, {bench_marker_ingest.RANKS} DDP-shaped ranks "
        f"({bench_marker_ingest.BUCKETS} bucket all-reduces a step)",
        lambda r: (f"{r['large']['us_per_marker']:g} µs/marker in batches of {r['large']['batch']} "
                   f"({r['large']['markers_per_core_s']:,}/core-s), {r['small']['us_per_marker']:g} µs in batches of "
                   f"{r['small']['batch']}; {bench_marker_ingest.PACED_RATE:,}/s cost "
                   f"{100 * r['paced_core_ratio']:.1f}% of a core"),
        f">= {bench_marker_ingest.GOAL_MARKERS_PER_CORE_S:,} markers per core-second in both batch sizes; "
        f"{bench_marker_ingest.PACED_RATE:,}/s <= {100 * bench_marker_ingest.GOAL_PACED_CORE:g}% of a core",
        "in-process agent (real gRPC server and marker socket, /metrics, default buffers, simulated backend at "
        "10 Hz) fed over its marker socket, a connection a rank, by a load process with batches encoded before the "
        "run; process CPU time minus the "
        "simulated backend's, over markers accepted (`benchmarks/bench_marker_ingest.py`).",
    ),
    Bench(
        "client_cpu", bench_client_cpu.run,
        f"training-process CPU per marker, sender and gRPC threads included, "
        f"{bench_client_cpu.STEPS_PER_S * bench_client_cpu.MARKERS_PER_STEP:,} markers/s",
        lambda r: f"{r['us_per_marker']:g} µs/marker (median of {len(r['us_per_marker_rounds'])} rounds, "
                  f"{r['us_per_marker_least']:g}-{r['us_per_marker_most']:g}; {100 * r['core_ratio']:.1f}% of a core), "
                  f"{'all' if r['all_delivered'] else 'NOT all'} delivered",
        f"<= {bench_client_cpu.GOAL_US_PER_MARKER:g} µs/marker",
        "a DDP-shaped loop marking with `chopper.Client` against a real agent process vs the same loop with "
        f"`nullcontext()`s, interleaved windows, `time.process_time` of the whole process, the median of "
        f"{bench_client_cpu.ROUNDS} rounds (`benchmarks/bench_client_cpu.py`).",
    ),
    Bench(
        "agent_kill", bench_agent_kill.run, "step time with the agent killed vs alive",
        lambda r: f"ratio {r['ratio_absent_vs_alive']:.3f}",
        f"within ±{bench_agent_kill.GOAL_REL_CHANGE:.0%}, markers reach the restarted agent",
        "real agent process killed with SIGKILL and restarted under a real 2-rank gloo training job; "
        "medians of per-step wall time over interleaved alive / killed / markers-off segments "
        "(`benchmarks/bench_agent_kill.py`).",
    ),
    Bench(
        "instrument_overhead", bench_instrument_overhead.run,
        "training step time with `chopper.pytorch.instrument` vs without (CPU, one rank)",
        lambda r: (f"ratio {r['ratio_instrumented_vs_plain']:.4f} ({r['steps_per_s']['instrumented']:g} vs "
                   f"{r['steps_per_s']['plain']:g} steps/s), {r['markers_per_step']:g} markers/step, "
                   f"flops {r['flops_source']}"),
        f"< {bench_instrument_overhead.GOAL_RATIO:g}x the plain step time",
        "demo `TinyDecoder` trained in one process on one CPU thread, markers to a real agent process; "
        f"{bench_instrument_overhead.CYCLES} ABBA cycles of {bench_instrument_overhead.SEGMENT_STEPS}-step "
        "instrumented (`instrument` ... `.remove()`) and plain segments, medians of per-step wall time "
        "(`benchmarks/bench_instrument_overhead.py`).",
    ),
    Bench(
        "aggregator", bench_aggregator.run,
        f"aggregator ingest from {bench_aggregator.STREAMS} Deliver streams, a {bench_aggregator.RANKS:,}-rank job; "
        "step end to /metrics latency",
        lambda r: (f"{r['summaries_per_s']:,} summaries/s ({r['ratio_to_transport']:g}x a decode-and-ack floor), "
                   f"{r['durable_summaries_per_s']:,}/s with --store-dir (acks after WAL fsync), "
                   f"latency p99 {r['latency']['p99_s']:g} s, {r['rss_per_rank_kib']:g} KiB/rank"),
        f">= {bench_aggregator.GOAL_SUMMARIES_PER_S:,} summaries/s, p99 < {bench_aggregator.GOAL_P99_S:g} s",
        "real `chopper-aggregator` process; 64 concurrent streams of pre-serialized batches (512 summaries) of a "
        "10,000-rank job, rate to the last ack, against a Ledger-only decode-and-ack server in the same run; RSS "
        "growth per rank; the agent's Forwarder delivering 64 ranks at 10 steps/s while /metrics is scraped every "
        "20 ms (`benchmarks/bench_aggregator.py`).",
    ),
    Bench(
        "tls", bench_tls.run, "mutual TLS vs plaintext `Deliver` ingest, 1 and 8 streams",
        lambda r: (f"ratio {r['streams_1']['ratio_tls_to_plaintext']:g} on 1 stream "
                   f"({r['streams_1']['tls_summaries_per_s']:,} vs {r['streams_1']['plaintext_summaries_per_s']:,}/s), "
                   f"{r['streams_8']['ratio_tls_to_plaintext']:g} on 8 "
                   f"({r['streams_8']['tls_summaries_per_s']:,} vs {r['streams_8']['plaintext_summaries_per_s']:,}/s)"),
        f">= {bench_tls.GOAL_RATIO:g}x plaintext",
        "two real `chopper-aggregator` processes, plaintext and mutual TLS (gRPC's own), pre-serialized batches of "
        f"{bench_tls.SUMMARIES:,} summaries per run over 1 and 8 concurrent streams, {bench_tls.REPEATS} ABBA rounds, "
        "medians; rate to the last ack (`benchmarks/bench_tls.py`).",
    ),
    Bench(
        "fleet", bench_fleet.run,
        "aggregator replicas, CPU, memory and series for "
        + " and ".join(f"{sc.gpus:,} GPUs in jobs of {sc.job_ranks:,} at one step per {sc.step_period_s:g} s"
                       for sc in bench_fleet.SCENARIOS) + ", scaled from a measured slice",
        lambda r: "; ".join(
            f"{name}: {s['aggregator_cores']:g} cores, replicas {s['replicas']} "
            f"(largest job {s['largest_job_cores']:g} cores, "
            f"{s['largest_job_transport_floor_cores']:g} of them gRPC's), "
            f"busiest {s['busiest_replica_mib']:,} MiB, "
            f"at most {s['streams_per_replica_max']:,} streams a replica ({s['stream_slots_per_replica']:,} slots), "
            f"{s['series_per_node']:,} series/node, {s['series_per_job']:,}/job, {s['series_total']:,} in all"
            for name, s in r["scenarios"].items()),
        f"each scenario served: busiest replica <= {bench_fleet.TARGET_CORES_PER_REPLICA:g} core (derived) and its "
        "agents within a replica's stream slots",
        f"real durable `chopper-aggregator` per scenario, {bench_fleet.SLICE_NODES} simulated agents on streams of "
        "their own in the scenario's job layout, a batch of 8 ranks' positions per agent per second and the 8 "
        f"summaries at each step end, {bench_fleet.PACED_S:g} s paced after a {bench_fleet.WARM_STEPS}-step warm-up; "
        "aggregator CPU (psutil) and RSS growth per stream and rank, /metrics series per job and rank, scrape CPU per "
        "series; a real agent with 8 simulated GPUs and 8 ranks for series per node; the job slice again against a "
        "ledger-only gRPC server for the transport floor; scenarios derived by scaling "
        "nodes, crc32 job routing over K replicas (`benchmarks/bench_fleet.py` states every assumption).",
    ),
    Bench(
        "load_held", bench_load_held.run,
        f"agent held at {bench_load_held.GPUS} GPUs x {bench_load_held.SAMPLE_HZ:g} Hz and {bench_load_held.RANKS} "
        "trainers' marker streams",
        lambda r: (f"{r['duration_s']} s: {r['agent_core_pct']:g}% of a core, RSS {r['rss_mib']['start']:g} / "
                   f"{r['rss_mib']['middle']:g} / {r['rss_mib']['end']:g} MiB (start/middle/end, slope "
                   f"{r['rss_slope_mib_per_min']:g} MiB/min), {r['markers']['received']:,} of "
                   f"{r['markers']['marked']:,} markers received, {r['markers']['client_dropped']} dropped, "
                   f"{r['sampler']['missed_ratio']:.2%} ticks missed"),
        f"RSS <= {bench_load_held.GOAL_RSS_MIB:g} MiB and slope < {bench_load_held.GOAL_RSS_SLOPE_MIB_PER_MIN:g} "
        "MiB/min after warm-up, default buffers, no marker lost, "
        f"< {bench_load_held.GOAL_MISSED_TICK_RATIO:.0%} ticks missed",
        "real agent process at nice 10 (simulated backend, default settings), 64 `chopper.client` "
        f"ranks in {bench_load_held.LOAD_PROCESSES} processes marking {bench_load_held.STEPS_PER_S:g} steps/s of 10 "
        "markers each, /metrics scraped every 5 s; agent CPU and VmRSS from /proc every 5 s, least-squares RSS "
        "slope after the warm-up (`benchmarks/bench_load_held.py`; `make bench` runs "
        f"{bench_load_held.DEFAULT_DURATION_S:g} s, the recorded figure `--only load_held --load-held-duration 600`).",
    ),
    Bench(
        "attribution", bench_attribution.run,
        f"offline attribution, {bench_attribution.RANKS} ranks x {bench_attribution.STEPS} steps at "
        f"{bench_attribution.SAMPLE_HZ:g} Hz",
        lambda r: f"{r['rank_steps_per_s']:,} rank-steps/s ({r['ratio_to_groupby']:g}x a pandas groupby)",
        f">= {bench_attribution.GOAL_RANK_STEPS_PER_S:,} rank-steps/s on one core",
        "CPU time of `attribute()` on a synthetic 1 M-sample run vs a plain pandas groupby-mean of the "
        "same samples, minimum of interleaved repeats (`benchmarks/bench_attribution.py`).",
    ),
    Bench(
        "exposed_truth", bench_exposed_truth.run,
        "exposed communication vs the training thread's wait added by gradient sync (kernel scheduler's "
        "account), bounded by step time with − without sync, 2 gloo ranks over a "
        f"rate-limited link ({', '.join(f'{r / 1e6:g}' for r in bench_exposed_truth.RATES)} Mbit/s)",
        lambda r: (f"{r['within']}/{r['cases']} rank-rates within goal ("
                   + ", ".join(f"{k} {v}" for k, v in r["within_by_config"].items()) + ")"),
        "within max(5 ms, 20 %) of the truth, and not above the bound by more, on every rank at both rates",
        "real agent process; per configuration (DDP one bucket, DDP default buckets, FSDP2, HF Trainer) one "
        "2-rank gloo job whose ranks run in their own network namespaces joined by a `tc`-limited veth pair; "
        "blocks of interleaved synchronised / `no_sync` steps alternate between the two rates (ABBA); truth = "
        "median over paired steps (sync − no sync) of the training thread's off-CPU time: the job's own "
        "`perf_counter` step time minus its running and run-queue time from `/proc/thread-self/schedstat`; "
        "bound = the same pairs of the step time; ours = the same pairs of `exposed_comm_s + straggler_wait_s` "
        "from the recorded run's attribution "
        "(`benchmarks/bench_exposed_truth.py`, `tests/e2e/exposed_truth_harness.py`).",
    ),
    Bench(
        "predict_validation", bench_predict_validation.run,
        "`chopper predict` step time vs the measured one, each of 4 real gloo configurations (2 and 4 ranks at "
        f"{', '.join(f'{r / 1e6:g}' for r in bench_predict_validation.RATES)} Mbit/s) held back and predicted from "
        "the other 3",
        lambda r: (f"{r['within']}/{r['cases']} within goal, largest error {r['max_abs_error']:.1%} ("
                   + ", ".join(f"{k} {v}" for k, v in r["table"].items()) + ")"),
        f"within {bench_predict_validation.GOAL_REL_ERROR:.0%} of the measured step time on every held-back "
        "configuration",
        "real agent process; per world size one gloo DDP job launched by `torchrun` in two network namespaces "
        "joined by a `tc`-limited veth pair, blocks of steps alternating between the link rates (ABBA), the job "
        "recorded and each rate's timed steps put into a run directory of their own; truth = median "
        "`perf_counter` step time the job timed; predicted = `chopper predict` from the other three runs with "
        "their bandwidths (`benchmarks/bench_predict_validation.py`, `tests/support/scaling_runs.py`; the table "
        "is in docs/PREDICT.md).",
    ),
    Bench(
        "trace_vs_hta", bench_trace_vs_hta.run,
        f"trace parse + temporal, overlap and kernel-type analyses vs Holistic Trace Analysis "
        f"{bench_trace_vs_hta.HTA_VERSION}",
        lambda r: (f"{r['large_mb']:g} MB trace: {r['large_speedup']:g}x faster, {r['large_memory_ratio']:g}x the "
                   f"memory; 4 real traces (start-up bound): {r['real_speedup_min']:g}-{r['real_speedup_max']:g}x "
                   f"faster, {r['real_memory_ratio_min']:g}-{r['real_memory_ratio_max']:g}x the memory; "
                   f"figures {'equal' if r['figures_agree'] else 'DIFFER'} (max rel. diff {r['max_rel_diff']:.1g})"),
        f">= {bench_trace_vs_hta.GOAL_SPEEDUP:g}x faster and <= {bench_trace_vs_hta.GOAL_MEMORY_RATIO:g}x the peak "
        "memory of HTA on every trace, same figures",
        "each of the four reference traces and a synthetic ~150 MB trace (nccl rank 0 repeated, shifted in time and "
        "ids) analyzed by HTA (`.venv-hta`, `CHOPPER_HTA_PYTHON`) and by ours, each in a fresh process: wall time "
        "Popen to wait4 (start-up included; `work_s` excludes imports), peak RSS as the child's VmHWM, medians of "
        "7 interleaved rounds (the large trace: 3); both tools' children cache bytecode into one temporary prefix; "
        "figures compared (`benchmarks/bench_trace_vs_hta.py`).",
    ),
)


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value


def _run_one(bench: Bench) -> tuple[dict[str, Any] | None, str, float]:
    started = time.monotonic()
    try:
        return bench.run(), "", time.monotonic() - started
    except Exception:  # one broken benchmark must not hide the others' figures
        return None, traceback.format_exc(limit=5), time.monotonic() - started


def _table(rows: list[tuple[str, str, str, str]]) -> str:
    header = ("benchmark", "figure", "goal", "met")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(header, widths, strict=True))]
    lines.append("-+-".join("-" * w for w in widths))
    lines += [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _kept(previous: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Summary rows and sections by benchmark name from an earlier ``_markdown`` output."""
    rows: dict[str, str] = {}
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    in_summary = False
    # Files from before per-section dates: their sections were all measured when the header says.
    found = re.search(r"^Measured (.+?) at commit `(\w+)` on ", previous, re.MULTILINE)
    for line in previous.splitlines():
        if line.startswith("### "):
            current = sections.setdefault(line[4:].strip(), [])
            if found:
                current += [line, "", f"Measured {found.group(1)} at commit `{found.group(2)}`."]
                continue
        elif line.startswith("## "):
            current = None
            in_summary = line == "## Summary"
        elif in_summary and line.startswith("| ") and not line.startswith("| benchmark "):
            rows[line.split("|")[1].strip()] = line
        if current is not None:
            current.append(line)
    return rows, sections


def _markdown(results: list[tuple[Bench, dict[str, Any] | None, str, float]], previous: str = "") -> str:
    """The whole PERFORMANCE.md; benchmarks not in ``results`` keep their row and section from ``previous``."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    commit = _git_commit()
    kept_rows, kept_sections = _kept(previous)
    ran = {bench.name: (bench, result, error, seconds) for bench, result, error, seconds in results}
    out = [
        "# Performance",
        "",
        "<!-- Generated by `python -m benchmarks --write docs/PERFORMANCE.md`; do not edit by hand. -->",
        "",
        "What telemetry costs the training job and the node, measured by the benchmarks in `benchmarks/`.",
        "Regenerate with `make bench` (or `python -m benchmarks --write docs/PERFORMANCE.md`).",
        "",
        "Each goal is judged within one run: a ratio against a baseline measured in the same run "
        "(interleaved where possible, medians or minima against noise) or a share of CPU time, "
        "never an absolute wall-clock figure, because the figures below come from a small shared "
        "machine whose speed varies with other load. Each benchmark's module docstring states its "
        "method in full.",
        "",
        f"Last run {now} at commit `{commit}` on {platform.machine()} with {os.cpu_count()} "
        f"logical CPUs, {platform.system()} {platform.release()}, Python {platform.python_version()}; each "
        "section below says when it was measured.",
        "",
        "## Summary",
        "",
        "| benchmark | what | figure | goal | met |",
        "|---|---|---|---|---|",
    ]
    for bench in BENCHES:
        if bench.name not in ran:
            if bench.name in kept_rows:
                out.append(kept_rows[bench.name])
            continue
        _, result, error, _ = ran[bench.name]
        if result is None:
            out.append(f"| {bench.name} | {bench.what} | error: {error.strip().splitlines()[-1]} | {bench.goal} | no |")
        else:
            met = "yes" if result.get("meets_goal") else "**no**"
            out.append(f"| {bench.name} | {bench.what} | {bench.figure(result)} | {bench.goal} | {met} |")
    if PROFILES.exists():  # kept by hand beside the benchmarks: what the profiles showed, before and after
        out += ["", "## Profiles", "", *PROFILES.read_text().rstrip().splitlines()]
    out += ["", "## Figures", ""]
    for bench in BENCHES:
        if bench.name not in ran:
            if bench.name in kept_sections:
                out += kept_sections[bench.name]
            continue
        _, result, error, seconds = ran[bench.name]
        out += [f"### {bench.name}", "", f"Measured {now} at commit `{commit}`.", "",
                f"Method: {bench.method} Took {seconds:.0f} s.", ""]
        if result is None:
            out += ["```", error.rstrip(), "```", ""]
            continue
        flat: dict[str, Any] = {}
        _flatten("", result, flat)
        out += ["| figure | value |", "|---|---|"]
        out += [f"| `{k}` | {json.dumps(v) if isinstance(v, (list, bool)) else v} |" for k, v in flat.items()]
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmarks; 0 when all ran (goals missed or not), 1 when one failed to run."""
    names = [b.name for b in BENCHES]
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=names, metavar="NAME", help=f"run only these: {', '.join(names)}")
    parser.add_argument("--write", type=Path, metavar="PATH",
                        help="write the figures as Markdown, e.g. docs/PERFORMANCE.md")
    parser.add_argument("--json", action="store_true", help="also print every figure as JSON")
    parser.add_argument("--load-held-duration", type=float, metavar="S",
                        help=f"seconds of load_held (default {bench_load_held.DEFAULT_DURATION_S:g}; recorded: 600)")
    args = parser.parse_args(argv)
    results = []
    for bench in BENCHES:
        if args.only and bench.name not in args.only:
            continue
        if bench.name == "load_held" and args.load_held_duration:
            bench = dataclasses.replace(bench, run=functools.partial(bench.run, args.load_held_duration))
        print(f"running {bench.name} ...", file=sys.stderr, flush=True)
        result, error, seconds = _run_one(bench)
        if error:
            print(f"{bench.name} failed:\n{error}", file=sys.stderr)
        results.append((bench, result, error, seconds))
    rows = [
        (b.name, b.figure(r) if r is not None else "error", b.goal,
         "error" if r is None else ("yes" if r.get("meets_goal") else "NO"))
        for b, r, _, _ in results
    ]
    print(_table(rows))
    if args.json:
        print(json.dumps({b.name: r for b, r, _, _ in results}, indent=1, sort_keys=True, default=str))
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        previous = args.write.read_text() if args.only and args.write.exists() else ""
        args.write.write_text(_markdown(results, previous) + "\n")
        print(f"wrote {args.write}", file=sys.stderr)
    return 1 if any(r is None for _, r, _, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())
