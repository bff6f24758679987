"""Host metrics sampled next to the GPUs: CPU, memory, network and load, via psutil.

Host stalls (data loading, CPU-bound preprocessing, a saturated NIC) show up as GPU idle time;
these series let an engineer tell them apart from launch overhead.

Algorithm, per ``HostSampler.sample`` call:

1. ``cpu_ratio``: from ``psutil.cpu_times()`` (all cores summed), busy = total − idle − iowait,
   over the time since the previous call: ``Δbusy / Δtotal``. The first call only primes the
   reference and reports NaN. State is per sampler, unlike ``psutil.cpu_percent(None)`` whose
   reference is shared by every caller in the process.
2. Memory: ``mem_used_bytes = total − available`` (what applications can not get back without
   swapping; psutil's ``used`` leaves out reclaimable caches differently per platform).
3. Network: bytes sent/received summed over all interfaces except loopback, accumulated from
   per-interface deltas, so the totals never go backwards when an interface disappears or its
   counters reset (a negative delta counts the new value from zero).
4. ``load1``: the 1-minute load average.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any


@dataclass(slots=True)
class HostSample:
    """The host over the interval since the previous sample.

    Attributes:
        ts_ns: When it was taken, CLOCK_REALTIME nanoseconds (the caller's ``now_ns``).
        cpu_ratio: CPU busy fraction over all cores since the previous call, 0–1 (NaN on the first).
        mem_used_bytes: Memory in use (total − available), bytes.
        mem_total_bytes: Physical memory, bytes.
        net_tx_bytes: Cumulative bytes sent on non-loopback interfaces since the sampler started
            (starting at the interfaces' own counters).
        net_rx_bytes: Cumulative bytes received, likewise.
        load1: 1-minute load average (runnable tasks; not normalised by core count).
    """

    ts_ns: int
    cpu_ratio: float
    mem_used_bytes: float
    mem_total_bytes: float
    net_tx_bytes: float
    net_rx_bytes: float
    load1: float


def _is_loopback(name: str) -> bool:
    # Linux names it "lo", macOS/BSD "lo0"; no physical interface uses the prefix.
    return name == "lo" or name.startswith("lo0") or name.lower().startswith("loopback")


class HostSampler:
    """Samples host CPU, memory, network and load.

    Args:
        psutil_module: The psutil module, or a stand-in with the same functions (tests).
    """

    def __init__(self, psutil_module: ModuleType | Any | None = None) -> None:
        if psutil_module is None:
            import psutil

            psutil_module = psutil
        self._ps: Any = psutil_module
        self._cpu_prev: tuple[float, float] | None = None
        self._nic_prev: dict[str, tuple[int, int]] = {}
        self._tx = 0.0
        self._rx = 0.0

    def _cpu_ratio(self) -> float:
        t = self._ps.cpu_times()
        total = sum(t)
        # Linux counts guest time inside user/nice as well; do not count it twice.
        total -= getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
        busy = total - t.idle - getattr(t, "iowait", 0.0)
        prev, self._cpu_prev = self._cpu_prev, (busy, total)
        if prev is None:
            return math.nan
        d_total = total - prev[1]
        if d_total <= 0:
            return 0.0
        return min(1.0, max(0.0, (busy - prev[0]) / d_total))

    def _net(self) -> tuple[float, float]:
        counters = self._ps.net_io_counters(pernic=True) or {}
        for name, c in counters.items():
            if _is_loopback(name):
                continue
            prev = self._nic_prev.get(name)
            if prev is None:
                self._tx += c.bytes_sent
                self._rx += c.bytes_recv
            else:
                self._tx += c.bytes_sent - prev[0] if c.bytes_sent >= prev[0] else c.bytes_sent
                self._rx += c.bytes_recv - prev[1] if c.bytes_recv >= prev[1] else c.bytes_recv
            # Interfaces that vanish keep their last values, so a flapping NIC is not counted twice.
            self._nic_prev[name] = (c.bytes_sent, c.bytes_recv)
        return self._tx, self._rx

    def sample(self, now_ns: int) -> HostSample:
        """Read the host once; ``now_ns`` becomes the sample's ``ts_ns``."""
        mem = self._ps.virtual_memory()
        tx, rx = self._net()
        try:
            load1 = float(self._ps.getloadavg()[0])
        except (AttributeError, OSError):  # platforms without a load average
            load1 = math.nan
        return HostSample(
            ts_ns=int(now_ns),
            cpu_ratio=self._cpu_ratio(),
            mem_used_bytes=float(mem.total - mem.available),
            mem_total_bytes=float(mem.total),
            net_tx_bytes=float(tx),
            net_rx_bytes=float(rx),
            load1=load1,
        )
