"""Logging for Chopper's programs: stderr only, one ``key=value`` line per event, no log files."""
from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Hashable


def configure(level: str = "info") -> None:
    """Send the root logger to stderr as ``ts=... level=... logger=... event=...`` lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s", "%Y-%m-%dT%H:%M:%S")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class LogGate:
    """At most one log line per ``interval_s`` for each key (a refusal reason, a kind of problem).

    The counters on ``/metrics`` keep the totals; the log only says that it happens, so a flood of
    one problem writes one line every ``interval_s``, not one per occurrence. Safe from any thread.
    """

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last: dict[Hashable, float] = {}
        self._lock = threading.Lock()

    def due(self, key: Hashable) -> bool:
        """Whether a line for ``key`` may be written now (and, if so, the interval starts again)."""
        now = self._clock()
        with self._lock:
            if now - self._last.get(key, -self.interval_s) < self.interval_s:
                return False
            self._last[key] = now
            return True
