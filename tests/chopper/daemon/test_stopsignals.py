"""StopSignals: a signal sets the event, the wait sees it, and the previous handlers come back."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from chopper.daemon.stopsignals import StopSignals
from tests.support.hazards import HazardOutcome


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


# A SIGTERM whose handler runs while the main thread holds the event's lock, as it does for a few
# bytecodes of each wait slice: the handler's set() must not wait on its own thread.
_HANDLER_UNDER_THE_LOCK = """
import os, signal, time
from chopper.daemon.stopsignals import StopSignals
with StopSignals() as stop:
    with stop.event._reentrant:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)  # the handler runs here, in this thread, under the lock
    stop.wait()
    print(stop.received)
"""


@pytest.mark.hazard(item=15, input="SIGTERM whose handler runs while the main thread holds the stop event's lock "
                    "(inside a wait slice)", promise="the daemon stops cleanly; never a stop handler that deadlocks")
def test_a_stop_handler_under_the_event_lock_does_not_deadlock(hazard: HazardOutcome) -> None:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _HANDLER_UNDER_THE_LOCK], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "SIGTERM", done.stderr
    hazard.outcome = f"stopped on SIGTERM in {time.monotonic() - started:.1f} s (a threading.Event deadlocks here)"


# A daemon started under nohup: SIGHUP is ignored when it starts, and must still reload it.
_RELOAD_UNDER_NOHUP = """
import os, signal
from chopper.daemon.stopsignals import StopSignals
assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
done = []
with StopSignals.for_daemon(reload=lambda: done.append(1) or "re-checked") as stop:
    os.kill(os.getpid(), signal.SIGHUP)
    stop._take(5.0)
    stop.act()
    print(len(done))
print(signal.getsignal(signal.SIGHUP) == signal.SIG_IGN)
"""


def test_sighup_ignored_by_nohup_still_reloads_and_is_ignored_again_after() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _RELOAD_UNDER_NOHUP], capture_output=True, text=True, timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),  # what nohup does before exec
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "True"], out.stdout + out.stderr


def test_sighup_ignored_without_a_reload_stays_ignored() -> None:
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with StopSignals(signals=(), ignored=(int(signal.SIGUSR2),)):
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)
