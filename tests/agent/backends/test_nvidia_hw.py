"""The nvidia backend on a real GPU: a few ticks, every value in its physical range.

Skips itself where no GPU answers (tests/conftest.py). Loads no work on the GPU, so activity
may be anywhere in 0–1; what is checked is units and monotonic counters, which is where a wrong
conversion (mW read as W, KiB as bytes, ns as s) shows.
"""
from __future__ import annotations

import math
import time

import pytest

from agent.backends.nvidia import NvidiaBackend
from chopper.schema import Sample

pytestmark = pytest.mark.gpu

TICKS = 4
PERIOD_S = 0.25  # above GPM's 100 ms refresh, so every tick gets fresh GPM ratios
CUMULATIVE = ("energy_j", "link_tx_bytes", "link_rx_bytes", "pcie_tx_bytes", "pcie_rx_bytes",
              "throttle_power_s", "throttle_thermal_s", "throttle_current_s", "throttle_other_s")


def in_range(value: float, low: float, high: float) -> bool:
    return math.isnan(value) or low <= value <= high


def test_real_gpus_report_physical_values() -> None:
    backend = NvidiaBackend("hw-node")
    try:
        devices = backend.open()
        ticks: list[list[Sample]] = []
        for _ in range(TICKS):
            time.sleep(PERIOD_S)
            ticks.append(backend.sample(time.time_ns()))
    finally:
        backend.close()
        backend.close()

    assert devices and [d.gpu for d in devices] == list(range(len(devices)))
    for d in devices:
        assert d.vendor == "nvidia" and d.model and d.uuid.startswith(("GPU-", "MIG-"))
        assert 300 <= d.max_gfx_clock_mhz <= 4000
        assert 1 * 1024**3 <= d.memory_bytes <= 1024 * 1024**3
        assert 20 <= d.power_cap_w <= 2000  # watts, not milliwatts
    for samples in ticks:
        assert [s.gpu for s in samples] == [d.gpu for d in devices]
        for s, d in zip(samples, devices, strict=True):
            assert 0 < s.gfx_clock_mhz <= d.max_gfx_clock_mhz * 1.05
            assert in_range(s.mem_clock_mhz, 1, 20000)
            for ratio in (s.busy_ratio, s.matrix_ratio, s.mem_busy_ratio):
                assert in_range(ratio, 0.0, 1.0)
            assert in_range(s.power_w, 1, 2000)
            assert in_range(s.temp_c, 5, 120)
            assert 0 <= s.mem_used_bytes <= d.memory_bytes
            assert in_range(s.energy_j, 0, 1e13)  # joules, not millijoules
            for name in CUMULATIVE:
                assert in_range(getattr(s, name), 0, math.inf), name
    # Cumulative counters never go backwards; energy advances at a plausible board power.
    first, last = ticks[0], ticks[-1]
    elapsed_s = (last[0].ts_ns - first[0].ts_ns) / 1e9
    for a, b in zip(first, last, strict=True):
        for name in CUMULATIVE:
            before, after = getattr(a, name), getattr(b, name)
            if not (math.isnan(before) or math.isnan(after)):
                assert after >= before, name
                if name.startswith("throttle_"):
                    assert after - before <= elapsed_s + 0.5, name  # seconds, not nanoseconds
        if not (math.isnan(a.energy_j) or math.isnan(b.energy_j)):
            mean_w = (b.energy_j - a.energy_j) / elapsed_s
            assert 1 <= mean_w <= 2000, mean_w
    # Each NVLink's counters (none on a PCIe card) never go backwards and add up to the all-links aggregate
    # that the same field read returned; link indices are NVML's and below NVML_NVLINK_MAX_LINKS.
    for a, b in zip(first, last, strict=True):
        assert [k.link for k in a.links] == [k.link for k in b.links] == sorted({k.link for k in a.links})
        for before, after in zip(a.links, b.links, strict=True):
            assert 0 <= before.link < 64
            for x, y in ((before.tx_bytes, after.tx_bytes), (before.rx_bytes, after.rx_bytes)):
                assert math.isnan(x) or math.isnan(y) or 0 <= x <= y
        if b.links and not math.isnan(b.link_tx_bytes):
            assert sum(k.tx_bytes for k in b.links) == pytest.approx(b.link_tx_bytes, rel=1e-3, abs=1024 * len(b.links))
            assert sum(k.rx_bytes for k in b.links) == pytest.approx(b.link_rx_bytes, rel=1e-3, abs=1024 * len(b.links))
