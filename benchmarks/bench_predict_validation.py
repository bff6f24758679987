"""``chopper predict`` against real runs: each of four gloo configurations predicted from the other three.

Goal: on every held-back configuration, the predicted step time within 15 % of the step time the
job measured itself (median of ``time.perf_counter`` per step over every rank, nothing of
Chopper's).

Method (``tests/support/scaling_runs.py`` in full): one real agent process (simulated backend,
four GPUs) receives every rank's markers over its unix socket. Per world size (2, then 4) one
gloo DDP job (``tests/support/scaling_train.py``: 6 ``Linear(384, 384)`` layers, 0.89 M parameters,
3.5 MB of fp32 gradients in one bucket, 160 rows per rank per step, one intra-op thread, two ranks
per core, instrumented with ``chopper.pytorch.instrument``) is launched by ``torchrun`` in two
network namespaces joined by a ``tc``-limited veth pair; its blocks of steps alternate between
the link rates (``RATES``, ABBA), it is recorded from launch to exit, and each rate's timed
steps are put into a run directory of their own. Then, for each configuration, ``chopper
predict`` (its functions, the figures ``--json`` prints) is given the other three recorded runs
with their link bandwidths (``--run-bandwidth``) and the held-back configuration's world size and
bandwidth; its step time is compared with the measured one. The bottleneck is each direction of
the veth pair, which one edge of gloo's ring crosses: ``2 (n − 1) / n × 3.5 MB`` per step (3.5 MB
at 2 ranks, 5.3 MB at 4), ``wire_ms`` at the link's rate.

Needs root, ``ip`` and ``tc`` (network namespaces); raises naming what is missing otherwise.

Run: ``python benchmarks/bench_predict_validation.py [--write-section docs/PREDICT.md]
[--write-performance docs/PERFORMANCE.md]``: the first flag replaces the "Validation" section of
that file with this run's table, the second this benchmark's row and section of the generated
performance page (as ``python -m benchmarks --only predict_validation --write`` does), both from
the same run. ``run()`` returns the figures as a dict.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.support.daemons import AgentProcess
from tests.support.netns import unavailable
from tests.support.scaling_runs import GOAL_REL_ERROR, Workload, held_back, run_all

RATES = (1e9, 500e6)  # bit/s each way
WORLD_SIZES = (2, 4)
WORKLOAD = Workload(warmup=5, blocks=8, block_steps=6)  # 24 timed steps per rate and rank
JOB_TIMEOUT_S = 240.0
SECTION = "## Validation"
# Per configuration, the figures of ``held_back`` that the table shows.
CONFIG_FIGURES = ("from", "predicted_step_ms", "uncertainty_ms", "measured_step_ms", "error", "within_goal", "refused",
                  "noncomm_ms", "own_noncomm_ms", "predicted_tokens_per_s", "tokens_per_s", "wire_ms", "wire_share")


def run() -> dict[str, Any]:
    """Record the four configurations, predict each from the others.

    Returns:
        ``configs`` (``CONFIG_FIGURES`` of ``held_back``'s row, by configuration), ``within`` and
        ``cases``, ``max_abs_error``, ``table`` (``configuration: predicted / measured ms (error)``),
        ``meets_goal``.
    """
    reason = unavailable()
    if reason is not None:
        raise RuntimeError(f"bench_predict_validation needs rate-limited network namespaces: {reason}")
    with tempfile.TemporaryDirectory(prefix="chopper-bench-predict") as tmpdir:
        workdir = Path(tmpdir)
        agent = AgentProcess(workdir, "--node", "bench", "--sim-gpus", str(max(WORLD_SIZES)))
        try:
            agent.start()
            measured = run_all(agent, workdir, WORLD_SIZES, RATES, WORKLOAD, JOB_TIMEOUT_S, prefix="bench-predict")
            rows = held_back(measured)
        finally:
            if agent.proc is not None and agent.proc.poll() is None:
                agent.terminate()
    errors = [abs(r["error"]) for r in rows if "error" in r]
    return {
        "rates_mbit_s": [r / 1e6 for r in RATES], "goal_rel_error": GOAL_REL_ERROR,
        "table": {r["config"]: (f"{r['predicted_step_ms']:g} / {r['measured_step_ms']:g} ms ({r['error']:+.1%})"
                                if "error" in r else f"refused / {r['measured_step_ms']:g} ms") for r in rows},
        "within": sum(r["within_goal"] for r in rows), "cases": len(rows),
        "max_abs_error": round(max(errors), 4) if errors else None,
        "meets_goal": all(r["within_goal"] for r in rows),
        "configs": {r["config"]: {k: r[k] for k in CONFIG_FIGURES if k in r} for r in rows},
    }


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def section(result: dict[str, Any]) -> str:
    """The "Validation" section of docs/PREDICT.md for one ``run()``."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        SECTION, "",
        "<!-- Generated by `python benchmarks/bench_predict_validation.py --write-section docs/PREDICT.md`; "
        "do not edit by hand. -->", "",
        "Real runs on one machine: gloo DDP (6 `Linear(384, 384)` layers, 3.5 MB of fp32 gradients in one bucket, "
        f"{WORKLOAD.batch} rows per rank per step, one intra-op thread per rank, two ranks per core at every world "
        "size) "
        "at 2 and 4 ranks, launched by `torchrun` in two network namespaces (\"nodes\") joined by a veth pair "
        f"limited by `tc` to {' and '.join(f'{r / 1e6:g}' for r in RATES)} Mbit/s each way. In one job per world "
        f"size, blocks of {WORKLOAD.block_steps} timed steps alternate between the rates (ABBA), so that load that "
        "drifts during the job moves both alike; a real agent records the job, and each configuration's "
        f"{WORKLOAD.blocks * WORKLOAD.block_steps // len(RATES)} timed steps per rank are put into a run directory "
        "of their own. Each configuration is then predicted by `chopper predict` (its functions, the figures "
        "`--json` prints) from the other three runs, given every run's bandwidth (`--run-bandwidth`), and "
        "compared with the median step time its job timed itself with `time.perf_counter` (every rank's steps).",
        "",
        "The bottleneck is the veth pair: gloo's all-reduce is a ring whose two edges between the nodes cross it, "
        "one each way, each carrying `2 (n − 1) / n` of the gradients per step (3.5 MB at 2 ranks, 5.3 MB at 4); "
        "the edges inside a node run over loopback. That is the ring all-reduce's bus-bandwidth model with the "
        "link rate as the bus bandwidth. `wire` is those bytes at the link's rate, its share of the measured step "
        "in parentheses.",
        "",
        f"Goal: predicted step time within {GOAL_REL_ERROR:.0%} of the measured one on every held-back "
        f"configuration: **{'met' if result['meets_goal'] else 'not met'}** ({result['within']}/{result['cases']}, "
        f"largest error {result['max_abs_error']:.1%}).",
        "",
        "`non-comm` is the time of a step that is not communication (compute and idle, the slowest rank's, median "
        "over steps): the one predict kept, from the run of the same world size at the other rate, beside this "
        "configuration's own, which the prediction did not see. Their difference is the part of the error that "
        "comes from compute that differed between the two rates of one job, which the model assumes equal: "
        "across runs it moves by a few ms either way, from the load of the shared machine and from the "
        "emulated link's work (both TCP stacks, veth, `tc`), which runs on the cores the ranks compute on.",
        "",
        "| held-back configuration | predicted from | predicted step (± 1 sd) | measured step | error | "
        "non-comm: kept / own | predicted / measured tokens/s | wire (share) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in result["configs"].items():
        wire = f"{r['wire_ms']:g} ms ({r['wire_share']:.0%})"
        if "error" not in r:
            lines.append(f"| {name} | {', '.join(r['from'])} | refused: {r['refused']} | "
                         f"{r['measured_step_ms']:g} ms | | | | {wire} |")
            continue
        lines.append(
            f"| {name} | {', '.join(r['from'])} | {r['predicted_step_ms']:g} ± {r['uncertainty_ms']:g} ms | "
            f"{r['measured_step_ms']:g} ms | {r['error']:+.1%} | {r['noncomm_ms']:g} / {r['own_noncomm_ms']:g} ms | "
            f"{r['predicted_tokens_per_s']:,.0f} / "
            f"{r['tokens_per_s']:,.0f} | {wire} |")
    lines += [
        "",
        f"Measured {now} at commit `{_commit()}` on {platform.machine()} with {os.cpu_count()} logical CPUs "
        f"(`benchmarks/bench_predict_validation.py`; `tests/e2e/test_predict_validation.py` asserts the goal at a "
        "smaller size).",
        "",
    ]
    return "\n".join(lines)


def write_section(path: Path, text: str) -> None:
    """Replace the ``SECTION`` of ``path`` (up to the next ``## `` heading) with ``text``, or append it."""
    old = path.read_text() if path.exists() else ""
    lines = old.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.rstrip() == SECTION]
    if not starts:
        path.write_text(old.rstrip("\n") + ("\n\n" if old else "") + text)
        return
    start = starts[0]
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    path.write_text("".join(lines[:start]) + text + ("\n" if end < len(lines) else "") + "".join(lines[end:]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-section", type=Path, metavar="PATH",
                        help="replace the Validation section of this file (docs/PREDICT.md)")
    parser.add_argument("--write-performance", type=Path, metavar="PATH",
                        help="update this benchmark's row and section of the performance page (docs/PERFORMANCE.md)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = run()
    seconds = time.monotonic() - started
    for name, line in result["table"].items():
        print(f"{name}: predicted / measured {line}")
    print(f"{result['within']}/{result['cases']} held-back configurations within {GOAL_REL_ERROR:.0%}")
    print(json.dumps(result, sort_keys=True))
    if args.write_section:
        write_section(args.write_section, section(result))
        print(f"wrote the Validation section of {args.write_section}", file=sys.stderr)
    if args.write_performance:
        from benchmarks import __main__ as suite

        bench = next(b for b in suite.BENCHES if b.name == "predict_validation")
        previous = args.write_performance.read_text() if args.write_performance.exists() else ""
        args.write_performance.write_text(suite._markdown([(bench, result, "", seconds)], previous) + "\n")
        print(f"wrote {args.write_performance}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
