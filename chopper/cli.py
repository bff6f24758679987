"""``chopper``: the command line.

Subcommands: ``demo``, ``info``, ``steps``, ``record``, ``capture``, ``attribute``, ``report``, ``trace``,
``predict``, ``where``.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from chopper import __version__
from chopper.daemon.settings import ConfigError
from chopper.runs import connect

if TYPE_CHECKING:
    import pandas as pd

    from chopper.proto.chopper.v1 import agent_pb2 as pb

DEFAULT_AGENT = "unix:///run/chopper/agent.sock"


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chopper", description="Step-aligned GPU efficiency telemetry.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run an agent and a real 2-rank PyTorch training job, with a live step table")
    demo.add_argument("--duration", type=_positive(float), default=60.0, help="seconds of training (default 60)")
    demo.add_argument("--ranks", type=_positive(int), default=2, help="CPU training ranks (default 2)")
    demo.add_argument("--model", default="MI300X", help="simulated GPU model when no GPU is found")
    demo.add_argument("--sample-hz", type=_positive(float), default=10.0, help="agent sampling rate")
    demo.add_argument("--backend", default="auto", help="agent backend (default auto)")
    info = sub.add_parser("info", help="print an agent's node, backend and devices")
    info.add_argument("--agent", default=DEFAULT_AGENT, help=f"agent gRPC target (default {DEFAULT_AGENT})")
    connect.add_arguments(info)
    steps = sub.add_parser("steps", help="print step summaries from an agent as they happen, and where the ranks "
                                         "of a job that stopped stepping wait (docs/HANGS.md)")
    steps.add_argument("--agent", default=DEFAULT_AGENT, help=f"agent gRPC target (default {DEFAULT_AGENT})")
    steps.add_argument("--stalled-after", type=_positive(float), default=10.0, metavar="SECONDS",
                       help="say where each rank is once a job has not stepped for this long, and again every "
                            "SECONDS while it lasts (default 10)")
    connect.add_arguments(steps)
    record = sub.add_parser("record", help="record an agent's devices, samples, markers and Inspector collectives "
                            "into a run directory")
    record.add_argument("--agent", default=DEFAULT_AGENT, help=f"agent gRPC target (default {DEFAULT_AGENT})")
    connect.add_arguments(record)
    record.add_argument("--out", required=True, help="run directory to write (Parquet devices/samples/markers)")
    record.add_argument("--duration", type=_positive(float), default=None,
                        help="seconds to record (default: until Ctrl-C, SIGTERM or the agent stops)")
    record.add_argument("--since-buffer", action="store_true",
                        help="start with what the agent's buffers still hold instead of from now on")
    record.add_argument("--force", action="store_true", help="write into a non-empty --out directory")
    capture = sub.add_parser("capture", help="profile the next N steps of a job with torch.profiler and record "
                                             "the same window at a raised sample rate (docs/CAPTURE.md)")
    capture.add_argument("--agent", default=DEFAULT_AGENT, help=f"agent gRPC target (default {DEFAULT_AGENT})")
    connect.add_arguments(capture)
    capture.add_argument("--job", required=True, help="job to profile (as its processes passed to chopper.init)")
    capture.add_argument("--steps", type=_positive(int), required=True, help="steps to profile")
    capture.add_argument("--ranks", default=None, help="comma-separated ranks (default: every rank on this node)")
    capture.add_argument("--out", default=None, help="directory to write (default capture-JOB-TIME)")
    capture.add_argument("--sample-hz", type=_positive(float), default=None,
                         help="agent sample rate during the capture (default 100)")
    capture.add_argument("--timeout", type=_positive(float), default=600.0,
                         help="seconds to wait for the ranks to finish (default 600)")
    attribute = sub.add_parser("attribute", help="per-step time attribution of a recorded run")
    attribute.add_argument("run_dir", metavar="RUN_DIR",
                           help="recorded run directory (chopper record or capture), or the aggregator's store_dir")
    attribute.add_argument("--json", action="store_true", help="print JSON instead of a table")
    attribute.add_argument("--job", default=None, help="only this job")
    report = sub.add_parser("report", help="write a self-contained HTML report with plots of a recorded run "
                                           "and/or its Kineto traces")
    report.add_argument("path", metavar="RUN_OR_TRACE_DIR",
                        help="recorded run directory (chopper record), the aggregator's store_dir, Kineto trace "
                             "file, directory of traces (*.json, *.json.gz at any depth, one per rank), or a "
                             "directory holding a run and its traces (chopper capture)")
    report.add_argument("-o", "--output", required=True, help="HTML file to write")
    report.add_argument("--job", default=None, help="only this job of the recorded run")
    report.add_argument("--quiet", action="store_true", help="no progress bar (drawn only on a terminal anyway)")
    trace = sub.add_parser("trace", help="kernel-level analysis of PyTorch-profiler (Kineto) traces, one per rank")
    trace.add_argument("paths", metavar="PATH", nargs="+",
                       help="trace files (.json / .json.gz) and/or directories holding them at any depth, one job")
    trace.add_argument("--json", action="store_true", help="print JSON instead of tables")
    trace.add_argument("--top", type=_positive(int), default=10, help="rows of each top-N table (default 10)")
    predict = sub.add_parser("predict", help="predict step time, tokens/s, MFU and exposed communication at another "
                                             "world size and bandwidth (docs/PREDICT.md)")
    predict.add_argument("paths", metavar="RUN_OR_STORE", nargs="+",
                         help="recorded run directories and/or aggregator store_dirs of the job; several are pooled")
    predict.add_argument("--world-size", type=int, required=True, help="ranks to predict for")
    predict.add_argument("--bandwidth", type=float, default=None, help="link bandwidth to predict for, GB/s")
    predict.add_argument("--run-bandwidth", type=float, action="append", default=None, metavar="GB/s",
                         help="the bandwidth each input ran at, once per input in order")
    predict.add_argument("--parallelism", choices=("ddp", "zero1", "zero2", "zero3", "fsdp"), default=None,
                         help="predict this strategy's collectives instead of those that ran")
    predict.add_argument("--algorithm", choices=("ring", "tree"), default="ring", help="collective algorithm")
    predict.add_argument("--latency-us", type=float, default=None, help="fix α (µs per latency step), not fit it")
    predict.add_argument("--job", default=None, help="only this job")
    predict.add_argument("--json", action="store_true", help="print JSON instead of text")
    where = sub.add_parser("where", help="where each rank of a job is, as the aggregator last heard from its agents "
                                         "(docs/HANGS.md)")
    where.add_argument("--aggregator", required=True, help="aggregator gRPC address (host:port), the job's replica")
    where.add_argument("--job", required=True, help="the job (as its processes passed to chopper.init)")
    where.add_argument("--json", action="store_true", help="print every rank's position as JSON instead of one line")
    connect.add_arguments(where)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("info", "steps", "record", "capture"):
        try:
            security = connect.from_args(args)
            security.check(args.agent)
        except ConfigError as exc:
            print(f"chopper: {exc}", file=sys.stderr)
            return 2
    if args.command == "record":
        return _record(args, security)
    if args.command == "attribute":
        return _attribute(args)
    if args.command == "capture":
        from chopper.runs.capture import main_capture

        return main_capture(args.agent, args.job, int(args.steps), args.ranks, args.out, args.sample_hz or 0.0,
                            args.timeout, security)
    if args.command == "report":
        return _report(args)
    if args.command == "trace":
        return _trace(args)
    if args.command == "predict":
        return _predict(args)
    if args.command == "where":
        return _where(args)
    if args.command == "demo":
        from chopper.demo.run import DemoOptions, run_demo

        return run_demo(DemoOptions(args.duration, args.ranks, args.model, sample_hz=args.sample_hz,
                                    backend=args.backend))
    from chopper.runs import consumer

    try:
        if args.command == "info":
            info = consumer.wait_for_info(args.agent, timeout_s=5.0, security=security)
            print(f"node {info.node}  backend {info.backend}  version {info.version}  sample_hz {info.sample_hz:g}")
            for d in info.devices:
                print(_device_line(d))
            return 0
        return _follow_steps(args.agent, security, args.stalled_after)
    except consumer.AgentUnreachable as exc:
        print(f"chopper: {exc}", file=sys.stderr)
        return 1


def _device_line(d: pb.DeviceInfo) -> str:
    """One ``chopper info`` line of a ``chopper.v1.DeviceInfo``: identity, and for a partition its chip."""
    line = (f"  gpu {d.gpu}: {d.vendor} {d.model} uuid={d.uuid} max_clock={d.max_gfx_clock_mhz:g} MHz "
            f"peak={d.peak_flops / 1e12:.1f} TFLOP/s memory={d.memory_bytes / 2**30:.0f} GiB cap={d.power_cap_w:g} W")
    if d.pci_bus_id:
        line += f" pci={d.pci_bus_id}"
    if d.partition:
        share = d.compute_share or 1.0  # 0: unset by an agent older than partitions
        line += f" partition={d.partition} ({share:.3g} of chip {d.chip_uuid or '?'})"
    if d.memory_partition:
        line += f" memory_partition={d.memory_partition}"
    return line


def _attribute(args: argparse.Namespace) -> int:
    import json

    from chopper.attribution import AttributionError, attribute_run
    from chopper.attribution.report import format_table, to_json
    from chopper.attribution.store_reader import is_step_store, read_step_store
    from chopper.runs.rundir import RunDirError

    try:
        reader = read_step_store if is_step_store(args.run_dir) else attribute_run  # aggregator store or run
        result = reader(args.run_dir, job=args.job)
    except (RunDirError, AttributionError) as exc:
        print(f"chopper attribute: {exc}", file=sys.stderr)
        return 2
    if result.steps.empty:
        print(f"chopper attribute: no complete step in {args.run_dir} (no step_begin/step_end pair); "
              "record while a job marks steps with chopper.step()", file=sys.stderr)
        for problem in result.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    joined = _capture_join(args.run_dir, result.steps)
    if args.json:
        out = to_json(result)
        if joined is not None:
            from chopper.runs.capture_join import to_records
            out["capture"] = to_records(joined)
        print(json.dumps(out, indent=1))
    else:
        print(format_table(result))
        if joined is not None:
            from chopper.runs.capture_join import format_join
            print("\n" + format_join(joined))
    return 0


def _capture_join(run_dir: str, steps: pd.DataFrame) -> pd.DataFrame | None:
    """A capture directory's per-step join of counters and kernels, or None; a bad trace is warned
    about on stderr and skipped, so the counter-level account is still printed."""
    from chopper.runs.capture_join import join_capture
    from chopper.trace import TraceError

    try:
        return join_capture(run_dir, steps)
    except TraceError as exc:
        print(f"chopper attribute: warning: traces not joined: {exc}", file=sys.stderr)
        return None


def _report(args: argparse.Namespace) -> int:
    from chopper.attribution import AttributionError
    from chopper.report import ReportError, build_report, terminal_progress
    from chopper.runs.rundir import RunDirError
    from chopper.trace import TraceError

    try:
        out = build_report(args.path, args.output, job=args.job,
                           progress=None if args.quiet else terminal_progress(sys.stderr))
    except (ReportError, RunDirError, AttributionError, TraceError) as exc:
        print(f"chopper report: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"chopper report: cannot write {args.output}: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


def _trace(args: argparse.Namespace) -> int:
    import json

    from chopper.trace import TraceError, load_traces
    from chopper.trace.report import analyze, format_text

    try:
        traces = load_traces(args.paths)
    except TraceError as exc:
        print(f"chopper trace: {exc}", file=sys.stderr)
        return 2
    # What the reader could not link is said, and the analyses still run on the rest.
    for t in traces:
        for warning in t.warnings:
            print(f"chopper trace: warning: {warning}", file=sys.stderr)
    result = analyze(traces, top=args.top)
    print(json.dumps(result, indent=1, allow_nan=False) if args.json else format_text(result), end="\n")
    return 0


def _where(args: argparse.Namespace) -> int:
    """``chopper where``: 0 with positions, 1 when the aggregator has none of the job or fails, 2: bad flags."""
    import json

    import grpc
    from google.protobuf.json_format import MessageToDict

    from chopper.positions import describe
    from chopper.proto.chopper.v1 import aggregator_pb2 as apb
    from chopper.proto.chopper.v1 import aggregator_pb2_grpc as apb_grpc

    try:
        channel = connect.from_args(args).channel(args.aggregator)
    except ConfigError as exc:
        print(f"chopper where: {exc}", file=sys.stderr)
        return 2
    try:
        reply = apb_grpc.AggregatorStub(channel).QuerySteps(apb.QueryStepsRequest(job=args.job, last=1), timeout=10)
    except grpc.RpcError as exc:
        print(f"chopper where: {args.aggregator} did not answer: {exc.code().name} {exc.details()}", file=sys.stderr)
        return 1
    finally:
        channel.close()
    if not reply.positions:
        print(f"chopper where: the aggregator at {args.aggregator} holds no position of job {args.job!r}: no agent "
              "delivering to it tracks a rank of that job (agents need --aggregators; with several replicas, ask the "
              "one the job routes to)", file=sys.stderr)
        return 1
    if args.json:
        rows = [MessageToDict(p, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
                for p in reply.positions]  # every field, rank 0 and "" included
        print(json.dumps(rows, indent=1))
    else:
        print(f"job {args.job}: {describe(reply.positions)}")
    return 0


def _predict(args: argparse.Namespace) -> int:
    """``chopper predict``: 2 for bad input, 3 when the data cannot support the prediction."""
    import json

    from chopper.predict import FitRefused, PredictInputError, PredictionRefused, load_inputs, predict
    from chopper.predict.report import format_text, to_json

    bandwidths = args.run_bandwidth or [None] * len(args.paths)
    if len(bandwidths) != len(args.paths):
        print(f"chopper predict: {len(bandwidths)} --run-bandwidth for {len(args.paths)} inputs; give one per input, "
              "in order, or none", file=sys.stderr)
        return 2
    try:
        inputs = [load_inputs(p, job=args.job, bandwidth_gbs=b) for p, b in zip(args.paths, bandwidths, strict=True)]
        alpha = None if args.latency_us is None else args.latency_us * 1e-6
        result = predict(inputs, args.world_size, args.bandwidth, args.parallelism, args.algorithm, alpha)
    except PredictInputError as exc:
        print(f"chopper predict: {exc}", file=sys.stderr)
        return 2
    except (PredictionRefused, FitRefused) as exc:
        print(f"chopper predict: refused: {exc}", file=sys.stderr)
        return 3
    print(json.dumps(to_json(result), indent=1, allow_nan=False) if args.json else format_text(result))
    return 0


def _record(args: argparse.Namespace, security: connect.ClientSecurity) -> int:
    import time
    from pathlib import Path

    from chopper.daemon.stopsignals import StopSignals
    from chopper.runs import consumer
    from chopper.runs.record import OutputNotEmpty, RecordError, check_output, record
    from chopper.runs.rundir import RunDirError

    def failed(exc: Exception) -> int:
        # A non-empty --out is the user's to fix (2); anything else failed on the way (1).
        print(f"chopper: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, OutputNotEmpty) else 1

    try:
        # Checked here as well as in record() so that the refusal comes before the banner.
        check_output(Path(args.out), args.force)
    except RecordError as exc:
        return failed(exc)
    # Ctrl-C and SIGTERM end the recording, and what was collected is still written.
    stop = StopSignals()
    since_ns = 1 if args.since_buffer else time.time_ns()
    print(f"chopper: recording from {args.agent} into {args.out}"
          f"{f' for {args.duration:g} s' if args.duration else '; Ctrl-C to stop'}", file=sys.stderr, flush=True)
    try:
        stats = record(
            args.agent, Path(args.out), args.duration, since_ns, stop.event, force=args.force, security=security,
        )
    except (RecordError, RunDirError, consumer.AgentUnreachable, OSError) as exc:
        return failed(exc)
    finally:
        stop.restore()
    if stats.agent_error is not None:
        print(f"chopper: the agent went away after {stats.duration_s:.1f} s ({stats.agent_error}); "
              f"wrote what was recorded until then", file=sys.stderr)
    if stats.missed:
        print(f"chopper: warning: the agent dropped {stats.missed} item(s) this recorder fell behind on; "
              "the run has gaps", file=sys.stderr)
    if stats.unknown_kinds:
        print(f"chopper: warning: left out {stats.unknown_kinds} marker(s) of a kind newer than this chopper; "
              "upgrade chopper-telemetry", file=sys.stderr)
    for count, what in ((stats.unfit_collectives, "Inspector collective record(s)"),
                        (stats.unfit_links, "per-link counter(s)")):
        if count:
            print(f"chopper: warning: left out {count} {what} whose values a recorded run cannot hold "
                  "(docs/DATA_MODEL.md)", file=sys.stderr)
    print(f"recorded {stats.samples} samples of {stats.gpus} GPUs and {stats.markers} markers over "
          f"{stats.duration_s:.1f} s into {stats.out}")
    if stats.collectives or stats.links:
        print(f"recorded {stats.collectives} Inspector collectives and {stats.links} per-link counter rows")
    if stats.errors:
        print(f"recorded {stats.errors} GPU health counter rows")
    return 0


def _follow_steps(target: str, security: connect.ClientSecurity, stalled_after_s: float) -> int:
    """Print each step summary as it comes, and a line saying where the ranks are for each job that stalled."""
    import grpc

    from chopper.positions import StallNotice
    from chopper.proto.chopper.v1 import agent_pb2 as pb
    from chopper.runs import consumer, steptable

    consumer.wait_for_info(target, timeout_s=5.0, security=security)
    channel, stream = consumer.subscribe(target, pb.SubscribeRequest(step_summaries=True), security)
    notice = StallNotice(stalled_after_s)
    print(steptable.header(), flush=True)
    try:
        for batch in stream:
            for summary in batch.step_summaries:
                notice.stepped(summary.job)
                print(steptable.row(summary), flush=True)
            for line in notice.lines(batch.positions):  # the agent sends positions about once a second
                print(line, flush=True)
    except KeyboardInterrupt:
        return 0
    except grpc.RpcError as exc:
        print(f"chopper: stream from {target} ended: {exc.code().name} {exc.details()}", file=sys.stderr)
        return 1
    finally:
        channel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
