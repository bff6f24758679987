"""A step's link bytes offline: the growth of its GPU's summed link counters over the step window."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from chopper.attribution import attribute_run
from chopper.attribution.columns import LINK_COLUMNS
from chopper.runs.rundir import write_run
from chopper.schema import DeviceInfo, MarkerKind, Sample

MS = 1_000_000
T0 = 1_700_000_000_000_000_000


def _run(path: Path, read_links: bool = True) -> Path:
    """One GPU sampled every 100 ms for 1 s whose links send 1 GB and receive 0.5 GB per interval; two steps."""
    devices = [DeviceInfo("n", 0, "nvidia", "NVIDIA H100 80GB HBM3", "u0", 1980.0, 9.894e14, 80 * 2**30, 700.0)]
    nan = math.nan
    samples = [Sample(T0 + i * 100 * MS, "n", 0, gfx_clock_mhz=1980.0, busy_ratio=1.0, energy_j=70.0 * i,
                      link_tx_bytes=1e9 * i if read_links else nan, link_rx_bytes=0.5e9 * i if read_links else nan)
               for i in range(11)]
    # Step 1 covers intervals 1-3 whole; step 2 runs from the middle of interval 5 to the middle of interval 7.
    markers = [dict(ts_ns=T0 + ts * MS, job="j", node="n", rank=0, gpu=0, kind=kind, step=step, name="", flops=flops,
                    tokens=tokens, bytes=nan)
               for ts, kind, step, flops, tokens in ((0, MarkerKind.STEP_BEGIN, 1, nan, nan),
                                                     (300, MarkerKind.STEP_END, 1, 1e14, 8.0),
                                                     (450, MarkerKind.STEP_BEGIN, 2, nan, nan),
                                                     (650, MarkerKind.STEP_END, 2, 1e14, 8.0))]
    return write_run(path, devices, samples, markers)


def test_a_steps_link_bytes_are_the_counters_growth_over_its_window(tmp_path: Path) -> None:
    steps = attribute_run(_run(tmp_path / "run")).steps
    assert set(LINK_COLUMNS) <= set(steps.columns)
    # Whole intervals: 3 x 1 GB; half of interval 5, all of 6 and half of 7: 2 x 1 GB.
    assert np.allclose(steps["link_tx_bytes"], [3e9, 2e9], rtol=1e-12)
    assert np.allclose(steps["link_rx_bytes"], [1.5e9, 1e9], rtol=1e-12)


def test_unread_link_counters_leave_the_step_link_bytes_unknown(tmp_path: Path) -> None:
    steps = attribute_run(_run(tmp_path / "run", read_links=False)).steps
    assert steps["link_tx_bytes"].isna().all() and steps["link_rx_bytes"].isna().all()
