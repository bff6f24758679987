"""GPU-side marker timestamps from device events, converted to CLOCK_REALTIME lazily.

DESIGN asks for GPU-side timestamps without a synchronize on the hot path. The algorithm:

1. At construction (once, in ``chopper.init``): record a reference event ``ref`` on the current
   stream, synchronize the device, and read ``ref_cpu_ns = time.time_ns()`` right after. The
   reference completed no later than that instant; the error is the synchronize's return latency
   (microseconds).
2. Hot path (training thread), ``record()``: take an event from a free pool (or create one),
   ``record()`` it on the current stream and return it. No query, no synchronize.
3. Sender thread, ``resolve(ev)``: if ``ev.query()`` is false the GPU has not reached it yet and
   ``None`` is returned (the caller keeps it, in order, and asks again later). Otherwise
   ``ts_ns = ref_cpu_ns + round(ref.elapsed_time(ev) * 1e6)`` (``elapsed_time`` is in ms).
4. ``elapsed_time`` is a float32 millisecond count in CUDA/HIP, so its resolution degrades with
   distance from ``ref`` (about 60 ns at 1 s, 0.25 ms at an hour), and the GPU timer drifts
   from CLOCK_REALTIME by some ppm (milliseconds an hour). So every ``reanchor_every_s`` the
   sender takes a fresh reference from ``anchor()``: with torch, an event recorded on a private,
   idle stream of the same device (it completes microseconds later, whatever the training
   stream has queued), waited for with ``event.synchronize()`` in the sender thread only (the
   GIL is released; the training thread and its streams are untouched), and ``time.time_ns()``
   read right after. Events already completed before the new reference get a negative
   ``elapsed_time``, which is still their correct offset.
5. Resolved events go back to the pool so steady state creates no new events.

The event factory, the synchronize, the anchor and the clocks are arguments so the logic is
testable without a GPU.
"""
from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol


class DeviceEvent(Protocol):
    """The part of ``torch.cuda.Event`` this module uses."""

    def record(self, stream: Any = None) -> None:
        """Enqueue the event on ``stream`` (the current stream when ``None``)."""

    def query(self) -> bool:
        """True once the device has passed the event."""

    def elapsed_time(self, end: Any) -> float:
        """Milliseconds from this event to ``end``; both must have completed."""


class DeviceClock:
    """Records device events on the hot path and turns completed ones into CLOCK_REALTIME ns.

    Args:
        event_factory: Makes a new timing-enabled event (``torch.cuda.Event(enable_timing=True)``).
        synchronize: Blocks until the device is idle (``torch.cuda.synchronize``); called once.
        cpu_clock: CLOCK_REALTIME in ns, read right after the synchronize.
        anchor: Returns a fresh completed reference event and the CLOCK_REALTIME ns at which it
            completed; ``None`` keeps the init reference forever.
        reanchor_every_s: Seconds between ``anchor`` calls (monotonic time).
        monotonic: Monotonic seconds, for the re-anchor cadence.
        pool_size: Most idle events kept for reuse.
    """

    __slots__ = (
        "_anchor", "_every_s", "_factory", "_free", "_last_anchor", "_monotonic", "_pool_size",
        "_ref", "_ref_cpu_ns",
    )

    def __init__(
        self,
        event_factory: Callable[[], DeviceEvent],
        synchronize: Callable[[], None],
        cpu_clock: Callable[[], int] = time.time_ns,
        anchor: Callable[[], tuple[DeviceEvent, int]] | None = None,
        reanchor_every_s: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
        pool_size: int = 4096,
    ) -> None:
        self._factory = event_factory
        self._free: deque[DeviceEvent] = deque()
        self._pool_size = pool_size
        self._anchor = anchor
        self._every_s = reanchor_every_s
        self._monotonic = monotonic
        self._last_anchor = monotonic()
        ref = event_factory()
        ref.record()
        synchronize()
        self._ref_cpu_ns = int(cpu_clock())
        self._ref = ref

    def record(self) -> DeviceEvent:
        """Record an event on the current stream and return it (hot path: no query, no sync)."""
        try:
            ev = self._free.pop()
        except IndexError:
            ev = self._factory()
        ev.record()
        return ev

    def resolve(self, ev: DeviceEvent) -> int | None:
        """CLOCK_REALTIME ns of a completed event, or ``None`` while the device has not reached it.

        Call from one thread (the sender), in recording order, so the reference only moves forward.
        """
        if not ev.query():
            return None
        if self._anchor is not None and self._monotonic() - self._last_anchor >= self._every_s:
            self._reanchor()
        ts = self._ref_cpu_ns + round(self._ref.elapsed_time(ev) * 1e6)
        self._recycle(ev)
        return ts

    def _reanchor(self) -> None:
        self._last_anchor = self._monotonic()
        anchor = self._anchor
        if anchor is None:
            return
        try:
            ref, cpu_ns = anchor()
        except Exception:  # keep the old reference: less precise, still correct
            return
        self._ref, self._ref_cpu_ns = ref, int(cpu_ns)

    def _recycle(self, ev: DeviceEvent) -> None:
        if len(self._free) < self._pool_size:
            self._free.append(ev)


def from_torch(modules: dict[str, Any] | None = None) -> DeviceClock | None:
    """A ``DeviceClock`` on torch's current device, or ``None`` to fall back to the CPU clock.

    Only when the training code already imported torch (never imported here), the build has a
    CUDA or ROCm device and CUDA is initialised: initialising it here would pick a device behind
    the trainer's back.
    """
    modules = sys.modules if modules is None else modules
    torch = modules.get("torch")
    if torch is None:
        return None
    try:
        cuda = torch.cuda
        if not (cuda.is_available() and cuda.is_initialized()):
            return None
        event_cls = cuda.Event
        device = cuda.current_device()
        # A private stream: an event on it completes as soon as the device sees it, whatever the
        # training streams have queued, so the sender's wait is microseconds.
        side = cuda.Stream(device=device)

        def anchor() -> tuple[DeviceEvent, int]:
            ev = event_cls(enable_timing=True)
            ev.record(side)
            ev.synchronize()
            return ev, time.time_ns()

        return DeviceClock(lambda: event_cls(enable_timing=True), cuda.synchronize, anchor=anchor)
    except Exception:  # any torch/driver oddity: CPU timestamps are the documented fallback
        return None
