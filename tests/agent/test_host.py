"""Host metrics: real psutil values in range, and the counter arithmetic with a stand-in psutil."""
from __future__ import annotations

import math
import os
import time
from collections import namedtuple
from types import SimpleNamespace

import psutil
import pytest

from agent.host import HostSample, HostSampler

T0 = 1_700_000_000_000_000_000


def test_real_host_values_in_range() -> None:
    sampler = HostSampler()
    first = sampler.sample(T0)
    assert isinstance(first, HostSample) and first.ts_ns == T0
    assert math.isnan(first.cpu_ratio)  # first call only primes
    end = time.monotonic() + 0.2
    while time.monotonic() < end:  # burn a little CPU so the interval is not empty
        sum(range(1000))
    second = sampler.sample(T0 + 200_000_000)
    assert 0.0 < second.cpu_ratio <= 1.0
    assert second.mem_total_bytes == float(psutil.virtual_memory().total)
    assert 0.0 < second.mem_used_bytes < second.mem_total_bytes
    assert second.net_tx_bytes >= first.net_tx_bytes >= 0.0
    assert second.net_rx_bytes >= first.net_rx_bytes >= 0.0
    assert second.load1 == pytest.approx(os.getloadavg()[0], abs=5.0)
    assert second.load1 >= 0.0


Times = namedtuple("Times", "user nice system idle iowait irq softirq steal guest guest_nice")
Nic = namedtuple("Nic", "bytes_sent bytes_recv")


class FakePsutil:
    """Scripted psutil: each call pops the next reading."""

    def __init__(self) -> None:
        self.times = [Times(10, 0, 10, 80, 0, 0, 0, 0, 0, 0),
                      Times(40, 0, 20, 90, 10, 0, 0, 0, 5, 0),  # +30 user, +10 sys, +10 idle, +10 io
                      Times(40, 0, 20, 90, 10, 0, 0, 0, 5, 0)]
        self.nics = [{"lo": Nic(10**9, 10**9), "eth0": Nic(100, 200), "ib0": Nic(1000, 2000)},
                     {"lo": Nic(2 * 10**9, 10**9), "eth0": Nic(150, 260)},  # ib0 gone
                     {"eth0": Nic(10, 20), "ib0": Nic(1500, 2000)}]  # eth0 reset, ib0 back

    def cpu_times(self) -> Times:
        return self.times.pop(0)

    def net_io_counters(self, pernic: bool) -> dict[str, Nic]:
        assert pernic
        return self.nics.pop(0)

    def virtual_memory(self) -> SimpleNamespace:
        return SimpleNamespace(total=1000, available=250, used=1)

    def getloadavg(self) -> tuple[float, float, float]:
        return (1.5, 1.0, 0.5)


def test_counter_arithmetic_with_stand_in() -> None:
    sampler = HostSampler(FakePsutil())
    a, b, c = (sampler.sample(T0 + i) for i in range(3))
    assert math.isnan(a.cpu_ratio)
    # Δtotal = 60 (guest 5 excluded), busy = 40 (user+system; idle and iowait are not busy)
    assert b.cpu_ratio == pytest.approx(40 / 60)
    assert c.cpu_ratio == 0.0  # no time passed
    assert (a.mem_used_bytes, a.mem_total_bytes, a.load1) == (750.0, 1000.0, 1.5)
    assert (a.net_tx_bytes, a.net_rx_bytes) == (1100.0, 2200.0)  # loopback excluded
    assert (b.net_tx_bytes, b.net_rx_bytes) == (1150.0, 2260.0)  # vanished ib0 does not go backwards
    # eth0 restarted from 0 (counts 10/20 anew), ib0 came back and grew by 500/0.
    assert (c.net_tx_bytes, c.net_rx_bytes) == (1150.0 + 10 + 500, 2260.0 + 20)
