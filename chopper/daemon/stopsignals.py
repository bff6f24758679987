"""What every signal does to a daemon: stop cleanly, re-check its files, or be logged and ignored; never a silent death.

A signal whose default action ends the process kills a Python program without a word and leaves
its socket behind, unless the program handles it. ``StopSignals`` handles each one a service
manager or an operator may send:

- ``STOP`` (SIGTERM, SIGINT, SIGQUIT, SIGXCPU): a clean stop. ``event`` is set and ``received``
  names the signal; the daemon logs it, stops serving, removes its socket and exits 0.
- SIGHUP: ``reload`` runs in the main thread and its outcome is logged; the daemon keeps serving.
  Each daemon re-checks there the files it takes up while running (token file, certificates), so
  that a bad replacement is reported at once rather than at its first use.
- ``IGNORED`` (SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO, SIGPWR, SIGSTKFLT and the
  real-time signals): logged as ``event=signal_ignored`` with a count, at most one line per signal
  every ``POLL_S`` however many arrive, and otherwise ignored.
- Faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, which systemd's watchdog sends, SIGTRAP,
  SIGSYS): ``faulthandler`` writes every thread's traceback to stderr before the process dies; a
  process in that state cannot be trusted to stop cleanly.

Apart from the stop signals, a signal that already has a handler (a C library's, a profiler's, a
test runner's SIGALRM) or is ignored (Python ignores SIGPIPE and SIGXFSZ) is left as it is. SIGHUP
with a ``reload`` is the exception to the second: a daemon started under ``nohup`` (or by anything
else that ignores SIGHUP for its children) inherits SIGHUP ignored, and the reload an operator
sends would then do nothing without a word. A reload never ends the process, so taking SIGHUP over
keeps what ``nohup`` asked for.

Linux hands a signal sent to a process to any one of its threads that does not block it. CPython's
C-level handler only notes it; the Python handler runs later, in the main thread, when that thread
next executes bytecode. A main thread parked in an untimed ``Event.wait()`` sleeps in ``sem_wait``,
which only a signal to *that* thread interrupts. So a SIGTERM that lands on a gRPC, sampler or
HTTP thread is never acted on: the daemon ignores ``systemctl stop`` until systemd kills it, and
loses what a clean stop would have flushed. ``StopSignals.wait`` therefore waits in slices of
``POLL_S`` seconds, so the main thread returns to bytecode, and a signal is acted on within
``POLL_S``. The handlers themselves only set the event or queue the signal: logging and reloading
happen in ``wait``, outside signal context.

A daemon blocks the signals it only logs or reloads on (SIGHUP and ``IGNORED``) in its main
thread before it starts any other, so every thread inherits the block, and the main thread takes
them with ``sigtimedwait`` in ``wait``: no handler runs for them. Handlers nest: a burst of
different signals runs one C handler inside another, and CPython installs its handlers with
``SA_ONSTACK``, so in the main thread they run on the small alternate stack ``faulthandler``
allocates; five nested handlers overflowed it and the daemon died of SIGSEGV without a word (on a
loaded machine, 9 of 30 bursts of the ten ``IGNORED`` signals the tests send; the core showed
``signal_handler`` frames for SIGUSR2, SIGSTKFLT, SIGVTALRM, SIGPROF and SIGIO). The stop signals
keep their handlers, so a SIGTERM that ``tgkill`` aims at any thread still stops the daemon; the
handlers of the others stay as a fallback for a thread started before the block.

The event is a ``SignalSafeEvent``. ``threading.Event`` guards its flag with a plain ``Lock``, and
the main thread holds that lock for a few bytecodes of every ``wait`` slice; a stop handler that
runs there and calls ``set()`` waits on a lock its own thread holds, forever: the daemon then
ignores every later signal too (seen as an agent that logged nothing after SIGTERM on a loaded
machine). A reentrant lock lets the handler's ``set()`` go through.
"""
from __future__ import annotations

import collections
import faulthandler
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from types import FrameType, TracebackType
from typing import Any

log = logging.getLogger(__name__)

# Longest delay between a signal and the main thread acting on it, seconds.
POLL_S = 0.25


def _present(*names: str) -> tuple[int, ...]:
    """The signals of ``names`` that this platform has."""
    return tuple(int(getattr(signal, name)) for name in names if hasattr(signal, name))


STOP = _present("SIGTERM", "SIGINT", "SIGQUIT", "SIGXCPU")
RELOAD = int(signal.SIGHUP)
IGNORED = _present("SIGUSR1", "SIGUSR2", "SIGALRM", "SIGVTALRM", "SIGPROF", "SIGIO", "SIGPWR", "SIGSTKFLT") + (
    tuple(range(signal.SIGRTMIN, signal.SIGRTMAX + 1)) if hasattr(signal, "SIGRTMIN") else ()
)
# Faults that faulthandler.enable() does not cover: registered to dump tracebacks, then die as before.
FAULTS = _present("SIGTRAP", "SIGSYS")

Handler = Callable[[int, FrameType | None], Any] | int | None


def signal_name(signum: int) -> str:
    """``SIGHUP``, ``SIGRTMIN+3``: the name an operator would give to ``kill -s``."""
    if hasattr(signal, "SIGRTMIN") and signal.SIGRTMIN < signum <= signal.SIGRTMAX:
        return f"SIGRTMIN+{signum - signal.SIGRTMIN}"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


class SignalSafeEvent(threading.Event):
    """A ``threading.Event`` whose ``set()`` may run in a signal handler of a thread inside ``wait()``.

    The same flag and condition as ``threading.Event``, on an ``RLock`` (module docstring).
    """

    def __init__(self) -> None:
        super().__init__()
        self._reentrant = threading.Condition(threading.RLock())
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with self._reentrant:
            self._set = True
            self._reentrant.notify_all()

    def clear(self) -> None:
        with self._reentrant:
            self._set = False

    def wait(self, timeout: float | None = None) -> bool:
        with self._reentrant:
            if not self._set:
                self._reentrant.wait(timeout)
            return self._set


class StopSignals:
    """Sets ``event`` on any of ``signals``; use as a context manager to restore the previous handlers.

    Handlers can only be installed from the main thread; elsewhere (a CLI run from a test's thread)
    nothing is installed and ``event`` is set only by its owner. ``for_daemon`` handles every
    signal as the module docstring says; the plain constructor, for short-lived commands, only the
    ones it is given.

    Args:
        signals: Signals that request a clean stop.
        reload: Run on SIGHUP in the main thread (from ``wait``); returns what it did, for the log.
            An exception is logged as ``event=reload_failed`` and the process keeps running. None:
            SIGHUP is logged and ignored, if ``ignored`` is not empty.
        ignored: Signals that are logged and ignored when nothing else handles them.
        faults: Whether faults dump every thread's traceback before the process dies.
        block: Block SIGHUP and ``ignored`` in this thread (and so in the threads it starts from now on)
            and take them in ``wait`` with ``sigtimedwait`` instead of running handlers.
    """

    def __init__(self, signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT), *,
                 reload: Callable[[], str] | None = None, ignored: Iterable[int] = (), faults: bool = False,
                 block: bool = False) -> None:
        self.event: threading.Event = SignalSafeEvent()
        self.received = ""  # the name of the stop signal that set ``event``
        self.reload = reload
        self._queued: collections.deque[int] = collections.deque()  # appended in handlers: atomic
        self._previous: dict[int, Handler] = {}
        self._faults: list[int] = []
        self._faulthandler = False
        self._taken: tuple[int, ...] = ()  # blocked in every thread and taken with sigtimedwait (``block``)
        self._mask: set[int] = set()  # the main thread's mask before, to restore
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._stop)
        queued = (*((RELOAD,) if reload is not None or ignored else ()), *ignored)
        for sig in queued:
            # Only what would otherwise kill: another handler (or SIG_IGN) is someone's choice, but an
            # inherited SIG_IGN of SIGHUP is nohup's, which a reload honours too (module docstring).
            current = signal.getsignal(sig)
            if current == signal.SIG_DFL or (current == signal.SIG_IGN and sig == RELOAD and reload is not None):
                self._previous[sig] = signal.signal(sig, self._queue)
        if faults:
            self._enable_faulthandler()
        if block:
            self._taken = tuple(sig for sig in queued if sig in self._previous)
            self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, self._taken)

    @classmethod
    def for_daemon(cls, reload: Callable[[], str] | None = None) -> StopSignals:
        """Every signal handled as the module docstring says: ``STOP``, SIGHUP, ``IGNORED``, faults.

        Create it before the daemon starts a thread: the block of SIGHUP and ``IGNORED`` is inherited.
        """
        return cls(STOP, reload=reload, ignored=IGNORED, faults=True, block=True)

    def _enable_faulthandler(self) -> None:
        stderr = sys.__stderr__
        if faulthandler.is_enabled() or stderr is None:
            return  # already on (PYTHONFAULTHANDLER, a test runner): theirs stays
        faulthandler.enable(file=stderr, all_threads=True)
        self._faulthandler = True
        for sig in FAULTS:
            if signal.getsignal(sig) == signal.SIG_DFL:
                faulthandler.register(sig, file=stderr, all_threads=True, chain=True)
                self._faults.append(sig)

    def _stop(self, signum: int, _frame: FrameType | None) -> None:
        self.received = self.received or signal_name(signum)
        self.event.set()

    def _queue(self, signum: int, _frame: FrameType | None) -> None:
        self._queued.append(signum)

    def wait(self, poll_s: float = POLL_S) -> None:
        """Block until a stop signal arrives or ``event`` is set, acting on queued signals every ``poll_s`` s."""
        while not self.event.is_set():
            if self._taken:
                self._take(poll_s)
            elif self.event.wait(poll_s):
                return
            self.act()

    def _take(self, timeout_s: float) -> None:
        """Queue the blocked signals pending now, waiting up to ``timeout_s`` for the first."""
        info = signal.sigtimedwait(self._taken, timeout_s)
        while info is not None:
            self._queued.append(info.si_signo)
            info = signal.sigtimedwait(self._taken, 0)

    def act(self) -> None:
        """Log the signals queued since the last call, and run ``reload`` once if SIGHUP was among them."""
        counts: collections.Counter[int] = collections.Counter()
        while self._queued:
            counts[self._queued.popleft()] += 1
        for signum, count in sorted(counts.items()):
            name = signal_name(signum)
            if signum == RELOAD and self.reload is not None:
                self._reload(name, count)
            else:
                log.warning("event=signal_ignored signal=%s count=%d note='%s has no meaning here; SIGTERM stops "
                            "cleanly%s'", name, count, name, ", SIGHUP re-checks files" if self.reload else "")

    def _reload(self, name: str, count: int) -> None:
        assert self.reload is not None
        try:
            done = self.reload()
        except Exception as exc:  # a bad file must not stop a serving daemon; what is in use stays
            log.warning("event=reload_failed signal=%s count=%d error=%r note='what is in use stays in force; "
                        "fix the file and send SIGHUP again'", name, count, str(exc))
        else:
            log.info("event=reloaded signal=%s count=%d note=%r", name, count, done)

    def restore(self) -> None:
        """Put the handlers and the signal mask that were there before back."""
        if self._taken:
            while signal.sigtimedwait(self._taken, 0) is not None:
                pass  # taken now: unblocked, they would reach the handlers restored below
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)
            self._taken = ()
        for sig, handler in self._previous.items():
            # None: a handler set outside Python, which cannot be put back from here; the default is nearest.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self._previous.clear()
        for sig in self._faults:
            faulthandler.unregister(sig)
        self._faults.clear()
        if self._faulthandler:
            faulthandler.disable()
            self._faulthandler = False

    def __enter__(self) -> StopSignals:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.restore()
