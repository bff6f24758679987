"""``chopper``: the command line. Subcommands: ``demo``, ``info``, ``steps``."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

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
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run an agent and a real 2-rank PyTorch training job, with a live step table")
    demo.add_argument("--duration", type=_positive(float), default=60.0, help="seconds of training (default 60)")
    demo.add_argument("--ranks", type=_positive(int), default=2, help="CPU training ranks (default 2)")
    demo.add_argument("--model", default="MI300X", help="simulated GPU model when no GPU is found")
    demo.add_argument("--sample-hz", type=_positive(float), default=10.0, help="agent sampling rate")
    demo.add_argument("--backend", default="auto", help="agent backend (default auto)")
    info = sub.add_parser("info", help="print an agent's node, backend and devices")
    info.add_argument("--agent", default=DEFAULT_AGENT, help=f"agent gRPC target (default {DEFAULT_AGENT})")
    steps = sub.add_parser("steps", help="print step summaries from an agent as they happen")
    steps.add_argument("--agent", default=DEFAULT_AGENT, help=f"agent gRPC target (default {DEFAULT_AGENT})")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from chopper.demo.run import DemoOptions, run_demo

        return run_demo(DemoOptions(args.duration, args.ranks, args.model, sample_hz=args.sample_hz,
                                    backend=args.backend))
    from chopper import consumer

    try:
        if args.command == "info":
            info = consumer.wait_for_info(args.agent, timeout_s=5.0)
            print(f"node {info.node}  backend {info.backend}  version {info.version}  sample_hz {info.sample_hz:g}")
            for d in info.devices:
                print(f"  gpu {d.gpu}: {d.vendor} {d.model} uuid={d.uuid} max_clock={d.max_gfx_clock_mhz:g} MHz "
                      f"peak={d.peak_flops / 1e12:.1f} TFLOP/s memory={d.memory_bytes / 2**30:.0f} GiB "
                      f"cap={d.power_cap_w:g} W")
            return 0
        return _follow_steps(args.agent)
    except consumer.AgentUnreachable as exc:
        print(f"chopper: {exc}", file=sys.stderr)
        return 1


def _follow_steps(target: str) -> int:
    import grpc

    from chopper import consumer, steptable
    from chopper.proto.chopper.v1 import agent_pb2 as pb

    consumer.wait_for_info(target, timeout_s=5.0)
    channel, stream = consumer.subscribe(target, pb.SubscribeRequest(step_summaries=True))
    print(steptable.header(), flush=True)
    try:
        for batch in stream:
            for summary in batch.step_summaries:
                print(steptable.row(summary), flush=True)
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
