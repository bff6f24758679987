"""What every GPU-check run must satisfy, whether just made (dry run, real GPU) or kept as a fixture.

The figures written by the check are re-derived from the recorded tables here and held against
the loop's own timing (the check's independent measurement), not against themselves.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from agent.backends.replay import ReplayBackend
from benchmarks.gpu import provenance
from benchmarks.gpu.check import JOB, timed_steps
from chopper.attribution import attribute
from chopper.runs.rundir import read_run

SECTIONS = ("## What was run", "## Device", "## Software", "## Figures", "## What the check did not change")
# Marker windows against the loop's timer: the gaps between steps (zero_grad, the loop's own test)
# are outside every step window, and they are a few µs per step on a GPU, more on a loaded CPU.
MFU_TOLERANCE = 0.05


def check_run(run_dir: Path, vendors: tuple[str, ...]) -> dict[str, Any]:
    """Assert that ``run_dir`` is a complete, self-consistent check run of one of ``vendors``; its record."""
    text = (run_dir / "PROVENANCE.md").read_text()
    for section in SECTIONS:
        assert section in text, f"{run_dir}/PROVENANCE.md lacks {section!r}"
    assert provenance.NOT_CHANGED in text
    rec = provenance.read(run_dir)
    assert rec["device"]["vendor"] in vendors, rec["device"]
    assert rec["date"] and rec["command"].split()[1:3] == ["-m", "benchmarks.gpu"], rec["command"]
    assert rec["environment"]["torch"]["version"] and rec["environment"]["python"]
    assert rec["identity_ok"], rec["identity"]

    run = read_run(run_dir)  # well-formed tables, or RunDirError naming what is wrong
    steps = timed_steps(attribute(run.devices, run.samples, run.markers, job=JOB).steps, rec["since_ns"])
    loop, figs = rec["loop"], rec["figures"]
    assert len(steps) == loop["steps"] == figs["steps_attributed"] > 0, (len(steps), loop, figs["steps_attributed"])
    assert math.isclose(loop["flops_per_step"], loop["flops_analytic"], rel_tol=1e-9), loop

    # Chopper's MFU from the recorded markers against the FLOP-derived one from the loop's own timer.
    dev = run.devices[run.devices["gpu"] == int(steps["gpu"].iloc[0])].iloc[0]
    marker_mfu = steps["ideal_s"].sum() / steps["step_time_s"].sum()
    flop_mfu = loop["steps"] * loop["flops_per_step"] / (dev["peak_flops"] * loop["seconds"])
    assert abs(marker_mfu / flop_mfu - 1) <= MFU_TOLERANCE, (marker_mfu, flop_mfu)
    assert math.isclose(flop_mfu, figs["mfu_flops"], rel_tol=1e-9)
    assert rec["live"]["summaries"] == loop["steps"], rec["live"]
    assert abs(rec["live"]["mfu"] / flop_mfu - 1) <= MFU_TOLERANCE, (rec["live"], flop_mfu)

    # Timestamps: device events wherever there is a device, the CPU clock in the dry run.
    expected_clock = "cpu" if rec["device"]["vendor"] == "simulated" else "device"
    assert rec["live"]["clocks"] == {expected_clock: rec["live"]["summaries"]}, rec["live"]

    # Samples of the rank's GPU at the agent's cadence, covering every step.
    mine = run.samples[(run.samples["node"] == dev["node"]) & (run.samples["gpu"] == dev["gpu"])]
    ts = mine["ts_ns"].to_numpy()
    period_ns = 1e9 / rec["agent"]["sample_hz"]
    assert abs(np.median(np.diff(ts)) / period_ns - 1) < 0.2, np.median(np.diff(ts))
    assert ts[0] <= steps["begin_ns"].min() + period_ns and ts[-1] >= steps["end_ns"].max()

    for cause, seconds in figs["throttle_s"].items():
        assert seconds is None or 0 <= seconds <= loop["seconds"] + 1, (cause, seconds)
    counter = figs["mfu_counter"]
    assert counter is None or 0 <= counter <= 1, counter
    if rec["driver"].get("gpm") == "supported, readable":
        assert counter is not None, "GPM is readable, yet the backend recorded no tensor activity"
    _replays(run_dir, run)
    return rec


def _replays(run_dir: Path, run: Any) -> None:
    """The replay backend serves the run's devices and plays back every recorded sample unchanged."""
    backend = ReplayBackend("replay-node", run_dir)
    devices = backend.open()
    try:
        assert [(d.gpu, d.uuid, d.model) for d in devices] == list(
            zip(run.devices["gpu"], run.devices["uuid"], run.devices["model"], strict=True))
        start = time.time_ns()
        span = int(run.samples["ts_ns"].max() - run.samples["ts_ns"].min())
        played = backend.sample(start) + backend.sample(start + span)
    finally:
        backend.close()
    assert len(played) == len(run.samples)
    assert np.array_equal(np.array([s.energy_j for s in played]), run.samples["energy_j"].to_numpy(), equal_nan=True)
