"""SIGTERM and SIGINT as a stop request that the main thread sees, whichever thread the kernel signals.

Linux hands a signal sent to a process to any one of its threads that does not block it. CPython's
C-level handler only notes it; the Python handler runs later, in the main thread, when that thread
next executes bytecode. A main thread parked in an untimed ``Event.wait()`` sleeps in ``sem_wait``,
which only a signal to *that* thread interrupts. So a SIGTERM that lands on a gRPC, sampler or
HTTP thread is never acted on: the daemon ignores ``systemctl stop`` until systemd kills it, and
loses what a clean stop would have flushed. ``StopSignals.wait`` therefore waits in slices of
``POLL_S`` seconds, so the main thread returns to bytecode, and a stop is seen within ``POLL_S``.
"""
from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType, TracebackType
from typing import Any

# Longest delay between a stop signal and the main thread acting on it, seconds.
POLL_S = 0.25

Handler = Callable[[int, FrameType | None], Any] | int | None


class StopSignals:
    """Sets ``event`` on any of ``signals``; use as a context manager to restore the previous handlers.

    Handlers can only be installed from the main thread; elsewhere (a CLI run from a test's thread)
    nothing is installed and ``event`` is set only by its owner.
    """

    def __init__(self, signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self.event = threading.Event()
        self._previous: dict[int, Handler] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in signals:
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, _signum: int, _frame: FrameType | None) -> None:
        self.event.set()

    def wait(self, poll_s: float = POLL_S) -> None:
        """Block until a stop signal arrives or ``event`` is set, waking every ``poll_s`` s (see module doc)."""
        while not self.event.wait(poll_s):
            pass

    def restore(self) -> None:
        """Put the handlers that were there before back."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def __enter__(self) -> StopSignals:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.restore()
