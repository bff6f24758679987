"""StopSignals: a signal sets the event, the wait sees it, and the previous handlers come back."""
from __future__ import annotations

import os
import signal
import threading
import time

from chopper.daemon.stopsignals import StopSignals


def test_signal_sets_the_event_and_previous_handlers_return() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as stop:
        assert signal.getsignal(signal.SIGTERM) != before
        os.kill(os.getpid(), signal.SIGTERM)
        stop.wait()
        assert stop.event.is_set()
    assert signal.getsignal(signal.SIGTERM) == before


def test_wait_returns_when_another_thread_sets_the_event() -> None:
    with StopSignals(signals=()) as stop:
        threading.Timer(0.1, stop.event.set).start()
        started = time.monotonic()
        stop.wait(poll_s=5.0)
        assert time.monotonic() - started < 4.0


def test_off_the_main_thread_nothing_is_installed() -> None:
    before = signal.getsignal(signal.SIGINT)
    made: list[StopSignals] = []
    worker = threading.Thread(target=lambda: made.append(StopSignals()))
    worker.start()
    worker.join()
    assert signal.getsignal(signal.SIGINT) == before
    made[0].restore()  # nothing to restore; must not touch the main thread's handlers
    assert signal.getsignal(signal.SIGINT) == before
