"""The sampler: when to read the backend (``FixedRateTicker``), and the read with its health (``BackendSampler``).

Tick ``k`` is due at ``start + k × period`` on the monotonic clock, so a slow tick delays only
itself, never the schedule. When a tick starts more than one period late, the ticks whose time
has passed are skipped (not run in a burst) and counted as missed. Each tick is stamped with
CLOCK_REALTIME, the clock markers use. Clocks and the wait are injected so tests run without
sleeping.

A failing backend never stops the sampler: ``BackendSampler`` marks it down, counts the failure
by kind and reopens it with exponential backoff (its docstring has the rules), while the agent
keeps serving.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable

from agent.backends.base import Backend, BackendUnavailable, DeviceLost
from chopper.schema import DeviceInfo, Sample

log = logging.getLogger(__name__)

# Reopen a failed backend after this many seconds, doubling up to the maximum.
REOPEN_BACKOFF_S = (1.0, 30.0)
# Longest the ticker sleeps between two looks at stop(), seconds.
STOP_POLL_S = 0.1


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
            if delay_ns > 0:
                # time.sleep, not Event.wait: a wake-up from Event.wait costs about half as much CPU
                # again (a lock made and taken per wait), 100 times a second at 100 Hz. The sleep is cut
                # at STOP_POLL_S so that stop() still returns promptly at slow rates.
                time.sleep(min(delay_ns / 1e9, STOP_POLL_S))
                continue
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


@dataclasses.dataclass
class BackendHealth:
    """The backend's health as ``BackendSampler`` last saw it (written by the sampler thread only).

    Attributes:
        up: Whether the last read (or open) succeeded.
        errors: Failures by kind: ``open`` (open or reopen failed), ``device_lost`` (a device
            stopped answering), ``error`` (any other failed read).
        last_error: ``<kind>: <message>`` of the latest failure, '' before any.
        last_sample_s: Seconds the latest successful read took; NaN before one.
        needs_reopen: Whether the backend waits to be reopened.
        next_reopen_ns: CLOCK_REALTIME ns from which the reopen is tried.
        backoff_s: Seconds the next failure waits before its reopen.
    """

    up: bool = False
    errors: Counter[str] = dataclasses.field(default_factory=Counter)
    last_error: str = ""
    last_sample_s: float = math.nan
    needs_reopen: bool = False
    next_reopen_ns: int = 0
    backoff_s: float = REOPEN_BACKOFF_S[0]


class BackendSampler:
    """Reads the backend once per tick and owns its health and its reopen backoff.

    1. ``open()`` at start: the devices go to ``on_open`` and the backend is up.
       ``BackendUnavailable`` (it cannot run here) is raised; any other failure counts as
       ``open`` and leaves the backend down for a reopen (3).
    2. ``sample(now_ns)`` reads every GPU: up, and the read's duration is kept. ``DeviceLost``
       counts as ``device_lost`` and asks for a reopen (3); any other exception counts as
       ``error``, marks the backend down and the next tick reads again.
    3. A failure that asks for a reopen schedules it ``backoff_s`` after now, then doubles
       ``backoff_s`` up to ``REOPEN_BACKOFF_S[1]``. Ticks before that time read nothing; the first
       one at or after it closes and opens the backend again and gives the devices to ``on_open``
       (a failure there counts as ``open`` and waits the doubled backoff); a successful reopen
       resets the backoff to ``REOPEN_BACKOFF_S[0]`` and reads at once.

    Args:
        backend: An unopened backend.
        on_open: Given the devices of every successful open, the first and each reopen.
        realtime_ns: CLOCK_REALTIME source that reopens are scheduled on (the ticks' clock).
        elapsed_s: Clock in seconds that times a read.
    """

    def __init__(
        self,
        backend: Backend,
        on_open: Callable[[list[DeviceInfo]], None],
        realtime_ns: Callable[[], int] = time.time_ns,
        elapsed_s: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.backend = backend
        self.health = BackendHealth()
        self._on_open = on_open
        self._realtime_ns = realtime_ns
        self._elapsed_s = elapsed_s

    def open(self) -> None:
        """Open the backend (rule 1); raises ``BackendUnavailable`` when it cannot run here."""
        try:
            devices = self.backend.open()
        except BackendUnavailable:
            raise
        except Exception as exc:  # transient: serve with the backend down and retry with backoff
            self._failed("open", exc, reopen=True)
            return
        self._on_open(devices)
        self.health.up = True

    def sample(self, now_ns: int) -> list[Sample]:
        """This tick's samples (rule 2), after a reopen that is due (rule 3); [] while the backend is down."""
        health = self.health
        if health.needs_reopen and (now_ns < health.next_reopen_ns or not self._reopen()):
            return []
        started = self._elapsed_s()
        try:
            samples = self.backend.sample(now_ns)
        except DeviceLost as exc:
            self._failed("device_lost", exc, reopen=True)
            return []
        except Exception as exc:  # any backend failure: report it, keep the daemon serving
            self._failed("error", exc, reopen=False)
            return []
        health.last_sample_s = self._elapsed_s() - started
        health.up = True
        return samples

    def close(self) -> None:
        """Close the backend at stop; a failure is logged, never raised."""
        try:
            self.backend.close()
        except Exception as exc:  # closing must not turn a clean stop into a crash
            log.warning("event=backend_close_failed backend=%s error=%r", self.backend.name, str(exc))

    def _reopen(self) -> bool:
        try:
            self.backend.close()
            devices = self.backend.open()
            self._on_open(devices)
        except Exception as exc:
            self._failed("open", exc, reopen=True)
            return False
        self.health.needs_reopen = False
        self.health.backoff_s = REOPEN_BACKOFF_S[0]
        log.info("event=backend_reopened backend=%s devices=%d", self.backend.name, len(devices))
        return True

    def _failed(self, kind: str, exc: Exception, reopen: bool) -> None:
        health = self.health
        health.up = False
        health.errors[kind] += 1
        health.last_error = f"{kind}: {exc}"
        if not reopen:
            log.warning("event=backend_sample_failed backend=%s error=%r", self.backend.name, str(exc))
            return
        health.needs_reopen = True
        health.next_reopen_ns = self._realtime_ns() + int(health.backoff_s * 1e9)
        log.warning(
            "event=backend_down backend=%s kind=%s retry_in_s=%.0f error=%r",
            self.backend.name, kind, health.backoff_s, str(exc),
        )
        health.backoff_s = min(health.backoff_s * 2, REOPEN_BACKOFF_S[1])
