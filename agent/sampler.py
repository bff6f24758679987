"""A fixed-cadence ticker that never drifts and counts the ticks it had to skip.

Tick ``k`` is due at ``start + k × period`` on the monotonic clock, so a slow tick delays only
itself, never the schedule. When a tick starts more than one period late, the ticks whose time
has passed are skipped (not run in a burst) and counted as missed. Each tick is stamped with
CLOCK_REALTIME, the clock markers use. Clocks and the wait are injected so tests run without
sleeping.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class FixedRateTicker:
    """Calls ``on_tick(realtime_ns)`` at ``hz`` on its own thread.

    Args:
        hz: Ticks per second.
        on_tick: Work of one tick; an exception is logged and counted, never stops the ticker.
        monotonic_ns: Schedule clock.
        realtime_ns: Timestamp clock handed to ``on_tick``.
    """

    def __init__(
        self,
        hz: float,
        on_tick: Callable[[int], None],
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
        realtime_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.period_ns = round(1e9 / hz)
        self._on_tick = on_tick
        self._monotonic_ns = monotonic_ns
        self._realtime_ns = realtime_ns
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ticks_total = 0
        self.missed_ticks_total = 0
        self.tick_errors_total = 0
        self.last_lag_s = 0.0

    @property
    def hz(self) -> float:
        """The current rate, ticks per second."""
        return 1e9 / self.period_ns

    def set_hz(self, hz: float) -> None:
        """Change the rate from any thread; it applies from the tick after the next one.

        One int assignment is atomic in CPython, and the loop reads ``period_ns`` once per tick,
        so no lock is needed; the tick already waited for keeps its old due time.
        """
        if not hz > 0:
            raise ValueError(f"sample rate must be positive, got {hz}")
        self.period_ns = round(1e9 / hz)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="chopper-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        """The loop; runs until ``stop()``."""
        next_due = self._monotonic_ns()
        while not self._stop.is_set():
            delay_ns = next_due - self._monotonic_ns()
            if delay_ns > 0 and self._stop.wait(delay_ns / 1e9):
                return
            next_due = self.run_due_tick(next_due)

    def run_due_tick(self, due_ns: int) -> int:
        """Run the tick due at ``due_ns`` (or skip late ones) and return when the next is due."""
        late_ns = self._monotonic_ns() - due_ns
        if late_ns >= self.period_ns:
            skipped = late_ns // self.period_ns
            self.missed_ticks_total += skipped
            due_ns += skipped * self.period_ns
            late_ns -= skipped * self.period_ns
        self.last_lag_s = max(0, late_ns) / 1e9
        self.ticks_total += 1
        try:
            self._on_tick(self._realtime_ns())
        except Exception:  # a tick must never kill the sampler
            self.tick_errors_total += 1
            log.exception("event=tick_failed")
        return due_ns + self.period_ns
