"""``python -m tests.faults --write docs/RELIABILITY.md``: run the fault suite and the bad-input tests, write the table.

1. Run pytest on ``tests/faults`` (one row per fault scenario, measured by the scenario itself
   into a ``FaultRecord``) and on the bad-input modules (``BAD_INPUT_MODULES``: the fuzz suite,
   settings, marker validation, garbled gRPC messages, recorded runs), with
   ``CHOPPER_RELIABILITY_JSON`` pointing at a fresh file and ``tests.faults.bad_inputs`` loaded.
   Then, in a second pytest run over ``tests``, every test marked ``hazard`` (regression tests
   for hazards found by hand, wherever they live), one row each.
2. Read the rows back: fault rows as they were measured; bad-input tests grouped by module, one
   row each with how many of its tests passed; hazard rows by item number.
3. Print the tables and, with ``--write``, write them as the whole of ``docs/RELIABILITY.md``.

Every figure comes from this run; nothing in the tables is typed by hand. Exits with pytest's
status, so a failing row fails the command (the file is written anyway, saying so).
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.faults.records import ENV, load

ROOT = Path(__file__).resolve().parents[2]
BAD_INPUT_MODULES = (
    "tests/fuzz",
    "tests/agent/test_config.py",
    "tests/aggregator/test_config.py",
    "tests/agent/test_markers.py",
    "tests/agent/test_server.py",
    "tests/agent/test_unix_socket.py",
    "tests/aggregator/test_server.py",
    "tests/chopper/runs/test_rundir.py",
    "tests/chopper/test_trace_reader.py",
)
BAD_INPUT_PROMISE = "a clear error naming the problem and the fix; nothing already collected is lost"

METHOD = """\
How each column is measured (the scenarios' module docstrings say more):

- **Training unaffected**: a trainer process (`tests/support/fault_trainer.py`) runs fixed steps, each
  ~1 ms of pure-Python compute (it holds the GIL, so a client thread hogging the interpreter would
  show) and 40 ms of sleep (the host thread of a GPU-bound step mostly waits), with the demo's 10
  markers per step through a real `chopper.client.Client`. *Step-time ratio* = median step time of
  the steps that ran entirely inside the fault window (from the fault to recovery) / median of
  the steps entirely outside it, after a 1 s warm-up, all in the same run. The bound is 2 %. This
  measures what telemetry can take from a training step (blocking, GIL, CPU); the steps are
  sleep-dominated so that this 2-core machine, shared with other work, does not drown a 2 % bound
  in scheduler noise, and `make test` runs the scenarios after the rest of the suite, one at a
  time. The agent runs at nice 10, as `deploy/systemd/chopper-agent.service` runs it.
- **Lost**: items gone without being counted anywhere: markers the trainer made that the client
  neither sent nor counted as dropped, or that a well-behaved rank sent and the agent never
  received; (job, rank, step) rows missing from the aggregator's Parquet store (read back with
  pandas after a graceful stop); samples a recording had collected that its rerun did not get.
- **Duplicated**: store rows or samples present twice. **Counted losses**: losses the design
  allows and counts (client drops, ring-buffer overwrites, rejected markers, missed items).
- **Recovery**: seconds from the end of the fault (restart, space freed, GPU back) to normal
  service (markers counted again, acknowledgements resumed, backend up).
- **Peak RSS**: the faulted daemon's `VmHWM`, against the ceiling the scenario asserts.
"""


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(rows: list[dict[str, Any]], command: str, status: int) -> str:
    """The Markdown of ``docs/RELIABILITY.md`` from the rows of one run."""
    faults = [r for r in rows if r["type"] == "fault"]
    hazards = sorted((r for r in rows if r["type"] == "hazard"), key=lambda r: (int(r.get("item", 0)), r["test"]))
    modules: dict[str, dict[str, Any]] = {}
    for r in (r for r in rows if r["type"] == "bad_input"):
        m = modules.setdefault(r["module"], {"about": r["about"], "passed": 0, "tests": 0, "names": []})
        m["names"].append(r.get("name", ""))
        m["tests"] += 1
        m["passed"] += bool(r["passed"])
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    failed = (sum(not r["passed"] for r in faults + hazards)
              + sum(m["passed"] < m["tests"] for m in modules.values()))
    out = [
        "# Reliability",
        "",
        f"<!-- Generated by `{command}`; do not edit by hand. -->",
        "",
        "Every fault and bad input tried against real processes, what the design promises under it, and what",
        f"was measured. Regenerate with `make reliability` (or `{command}`).",
        "",
        f"Run {now} at commit `{_git_commit()}` on {platform.machine()} with {os.cpu_count()} logical CPUs, "
        f"Python {platform.python_version()}: {len(faults)} faults, {len(hazards)} hazards and "
        f"{len(modules)} groups of bad inputs, "
        f"{'all passing' if failed == 0 and status == 0 else f'{failed} row(s) FAILING (pytest exit {status})'}.",
        "",
        "## Faults",
        "",
        "| fault | promise | lost | duplicated | counted losses | recovery s | peak RSS MiB (ceiling) "
        "| step-time ratio | measured | passed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in faults:
        rss = "–" if r["peak_rss_mib"] is None else f"{r['peak_rss_mib']:.0f} ({r['rss_ceiling_mib']:.0f})"
        out.append(
            f"| {_cell(r['fault'])} | {_cell(r['promise'])} | {_fmt(r['lost'])} | {_fmt(r['duplicated'])} | "
            f"{_fmt(r['counted_losses'])} | {_fmt(r['recovery_s'])} | {rss} | {_fmt(r['step_time_ratio'], 4)} | "
            f"{_cell(r['outcome'])} (`{r['test'].split('::')[0]}`) | {'yes' if r['passed'] else '**NO**'} |")
    out += [
        "",
        "## Bad inputs",
        "",
        f"Promise for every one: {BAD_INPUT_PROMISE}. One row per test module, from its tests' outcomes in this run.",
        "",
        "| input | module | tests passed | passed |",
        "|---|---|---|---|",
    ]
    for name, m in sorted(modules.items()):
        # A module without a docstring is described by its first tests' names.
        about = m["about"] or "tests: " + ", ".join(n.removeprefix("test_").replace("_", " ") for n in m["names"][:3])
        out.append(f"| {_cell(about)} | `{name}` | {m['passed']} of {m['tests']} | "
                   f"{'yes' if m['passed'] == m['tests'] else '**NO**'} |")
    out += [
        "",
        "## Hazards",
        "",
        "What a hostile or clumsy user broke by hand, each held by a regression test that would have caught it "
        "(`@pytest.mark.hazard`); the item numbers are those of the reliability round that found them.",
        "",
        "| item | input | promise | measured | passed |",
        "|---|---|---|---|---|",
    ]
    for r in hazards:
        out.append(f"| {r.get('item', '')} | {_cell(str(r.get('input', '')))} | {_cell(str(r.get('promise', '')))} | "
                   f"{_cell(r['outcome'])} (`{r['test'].split('::')[0]}`) | {'yes' if r['passed'] else '**NO**'} |")
    out += ["", "## Method", "", METHOD]
    return "\n".join(out)


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                              timeout=10, cwd=ROOT).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, metavar="PATH", help="write the tables, e.g. docs/RELIABILITY.md")
    parser.add_argument("--faults-only", action="store_true", help="skip the bad-input modules")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="chopper-reliability") as tmp:
        rows_path = Path(tmp) / "rows.jsonl"
        targets = ["tests/faults"] + ([] if args.faults_only else [m for m in BAD_INPUT_MODULES
                                                                    if (ROOT / m).exists()])
        status = subprocess.run(
            [sys.executable, "-m", "pytest", *targets, "-p", "tests.faults.bad_inputs", "-q", "-p",
             "no:cacheprovider"],
            cwd=ROOT, env={**os.environ, ENV: str(rows_path)}, check=False,
        ).returncode
        if not args.faults_only:
            hazards = subprocess.run(
                [sys.executable, "-m", "pytest", "tests", "-m", "hazard", "-p", "tests.faults.bad_inputs", "-q",
                 "-p", "no:cacheprovider"],
                cwd=ROOT, env={**os.environ, ENV: str(rows_path)}, check=False,
            ).returncode
            status = status or (0 if hazards == 5 else hazards)  # 5: no test marked hazard yet
        rows = load(rows_path)
    command = "python -m tests.faults --write docs/RELIABILITY.md"
    text = render(rows, command, status)
    print(text)
    if args.write:
        args.write.write_text(text + "\n")
        print(f"wrote {args.write}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
