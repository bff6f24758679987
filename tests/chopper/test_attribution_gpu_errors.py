"""Steps whose GPU's health counters moved, offline: the flag gpu_errors, its kinds and the straggler's evidence."""
from __future__ import annotations

import math
from pathlib import Path

from chopper.attribution import attribute_run
from chopper.attribution.report import format_table, to_json
from chopper.runs.rundir import write_run
from chopper.schema import DeviceInfo, ErrorCount, MarkerKind, Sample

MS = 1_000_000
T0 = 1_700_000_000_000_000_000


def _run(path: Path) -> Path:
    """Two ranks on GPUs 0 and 1, sampled every 100 ms for 2 s; health read every 500 ms.

    GPU 1 corrects 40 ECC errors between its readings at 1000 and 1500 ms, during its step 2
    (900-1600 ms), and runs that step at a lower clock: it is the step's slowest rank.
    """
    devices = [DeviceInfo("n", g, "nvidia", "NVIDIA H100 80GB HBM3", f"u{g}", 1980.0, 9.894e14, 80 * 2**30, 700.0)
               for g in range(2)]
    samples = []
    for i in range(21):
        for g in range(2):
            slow = g == 1 and 9 <= i <= 16
            errors = (ErrorCount("ecc_corrected", "volatile", "total", 40.0 if g == 1 and i >= 15 else 0.0),
                      ErrorCount("remap_pending", "", "", 0.0)) if i % 5 == 0 else ()
            samples.append(Sample(T0 + i * 100 * MS, "n", g, gfx_clock_mhz=1500.0 if slow else 1980.0, busy_ratio=1.0,
                                  energy_j=70.0 * i, errors=errors))
    nan = math.nan
    markers = [dict(ts_ns=T0 + ts * MS, job="j", node="n", rank=g, gpu=g, kind=kind, step=step, name="", flops=1e14,
                    tokens=8.0, bytes=nan)
               for g in range(2)
               for ts, kind, step in ((100, MarkerKind.STEP_BEGIN, 1), (800, MarkerKind.STEP_END, 1),
                                      (900, MarkerKind.STEP_BEGIN, 2), (1600 + 100 * g, MarkerKind.STEP_END, 2))]
    return write_run(path, devices, samples, markers)


def test_the_step_during_which_a_gpu_corrected_errors_is_flagged_and_named_as_evidence(tmp_path: Path) -> None:
    result = attribute_run(_run(tmp_path / "run"))
    steps = result.steps.set_index(["rank", "step"])
    assert steps.loc[(1, 2), "gpu_errors"] == ("ecc_corrected",) and "gpu_errors" in steps.loc[(1, 2), "flags"]
    # The other GPU, and the same GPU's earlier step, saw no growth; the first reading is a baseline.
    for key in ((0, 1), (0, 2), (1, 1)):
        assert steps.loc[key, "gpu_errors"] == () and "gpu_errors" not in steps.loc[key, "flags"]
    slowest = result.stragglers.set_index("step").loc[2]
    assert slowest["rank"] == 1 and slowest["gpu_errors"] == ("ecc_corrected",)
    text = format_table(result)
    assert "GPU errors during 1 rank-steps (flag gpu_errors): ecc_corrected; ranks 1" in text
    assert "GPU errors ecc_corrected" in text
    rows = {(r["rank"], r["step"]): r for r in to_json(result)["steps"]}
    assert rows[(1, 2)]["gpu_errors"] == ["ecc_corrected"] and rows[(0, 2)]["gpu_errors"] == []
