"""systemd's service notification protocol (``sd_notify(3)``) in pure Python, and a health-gated watchdog.

Under ``Type=notify``, systemd passes a datagram socket in ``$NOTIFY_SOCKET``: a filesystem path,
or an abstract address written with a leading ``@``. A message is one datagram of
``KEY=VALUE`` lines. The daemons send:

- ``READY=1`` (with a ``STATUS=`` line) once they serve: gRPC bound, ``/metrics`` answering,
  loops started. systemd holds ``systemctl start`` and ordered units until then.
- ``WATCHDOG=1`` every half of ``$WATCHDOG_USEC`` (``WatchdogSec=``), from a thread that pings
  only while every health check passes. A hung loop therefore stops the pings and systemd
  restarts the daemon after ``WatchdogSec``; a merely busy machine does not.
- ``RELOADING=1`` (with ``MONOTONIC_USEC=``) when a SIGHUP re-check begins, then ``READY=1`` once
  it is done, whatever it found: ``systemctl reload`` (``ExecReload=kill -HUP $MAINPID``, or
  ``Type=notify-reload``, which requires both messages) returns when the daemon is done.
- ``STOPPING=1`` when shutdown begins, so ``systemctl status`` says "deactivating" at once.
- ``STATUS=...`` whenever health changes, shown by ``systemctl status``.

Without ``$NOTIFY_SOCKET`` (a plain shell, a container, Kubernetes) every call is a no-op. Sending
never raises: a vanished socket is logged once and otherwise ignored, because telemetry must keep
serving even when its supervisor misbehaves. ``$WATCHDOG_PID``, when set, names the process the
watchdog is meant for; other processes ignore ``$WATCHDOG_USEC``, as ``sd_watchdog_enabled(3)``
specifies.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence

log = logging.getLogger(__name__)

# A health check returns None when healthy, else a short reason for STATUS= and the log.
Check = Callable[[], "str | None"]


class Notifier:
    """Sends notification datagrams to one socket address; a no-op without one.

    Args:
        address: ``$NOTIFY_SOCKET``: an absolute path, ``@name`` for the abstract namespace, or
            None / empty to disable.
        watchdog_usec: ``$WATCHDOG_USEC`` as an int, or None when the watchdog is off.
    """

    def __init__(self, address: str | None, watchdog_usec: int | None = None) -> None:
        self.address = address or ""
        self.watchdog_usec = watchdog_usec
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._failed = False
        if self.address and not self.address.startswith(("/", "@")):
            log.warning("event=sd_notify_disabled reason='NOTIFY_SOCKET=%s is neither an absolute path nor an "
                        "@abstract name; only unix datagram sockets are supported'", self.address)
            self.address = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, pid: int | None = None) -> Notifier:
        """A notifier for ``$NOTIFY_SOCKET`` and, when meant for ``pid``, ``$WATCHDOG_USEC``.

        A malformed ``$WATCHDOG_USEC`` or ``$WATCHDOG_PID`` is logged (naming the variable) and
        leaves the watchdog off; it never stops the daemon.
        """
        env = os.environ if environ is None else environ
        pid = os.getpid() if pid is None else pid
        usec: int | None = None
        raw_usec, raw_pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        if raw_usec:
            try:
                usec = int(raw_usec)
                if usec <= 0 or (raw_pid and int(raw_pid) != pid):
                    usec = None
            except ValueError:
                log.warning("event=sd_watchdog_disabled reason='WATCHDOG_USEC=%s WATCHDOG_PID=%s: not integers; "
                            "set WatchdogSec= in the unit and leave these to systemd'", raw_usec, raw_pid)
                usec = None
        return cls(env.get("NOTIFY_SOCKET"), usec)

    @property
    def enabled(self) -> bool:
        """Whether a supervisor listens."""
        return bool(self.address)

    @property
    def watchdog_interval_s(self) -> float | None:
        """Seconds between pings (half of ``WatchdogSec``, as systemd advises), None when off."""
        if not self.enabled or self.watchdog_usec is None:
            return None
        return self.watchdog_usec / 2e6

    def send(self, **fields: str | int) -> bool:
        """Send one datagram ``KEY=VALUE\\n...``; returns whether it was sent. Never raises."""
        if not self.enabled:
            return False
        message = "".join(f"{key}={value}\n" for key, value in fields.items()).encode()
        # An abstract address is a name whose first byte is NUL; systemd writes it with "@".
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.sendto(message, target)
            except OSError as exc:
                if not self._failed:  # once: a gone supervisor must not flood the log every ping
                    log.warning("event=sd_notify_failed socket=%s error=%r", self.address, str(exc))
                self._failed = True
                return False
        return True

    def ready(self, status: str) -> bool:
        """``READY=1``: the daemon serves."""
        return self.send(READY=1, STATUS=status)

    def stopping(self, status: str = "stopping") -> bool:
        """``STOPPING=1``: shutdown has begun."""
        return self.send(STOPPING=1, STATUS=status)

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


class ProgressCheck:
    """Healthy while a loop's counter keeps moving: stale after ``stale_after_s`` without change.

    Reads the counter at each check; the first read and every change restart the clock. A loop
    that is slow but moving stays healthy; one stuck inside an iteration (a hung vendor call, a
    deadlock) goes stale.

    Args:
        name: The loop, as the reason names it.
        counter: Iterations so far (any value that changes each iteration).
        stale_after_s: Seconds without change that make the loop unhealthy.
        monotonic: Clock in seconds (injected in tests).
    """

    def __init__(self, name: str, counter: Callable[[], int], stale_after_s: float,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.counter = counter
        self.stale_after_s = stale_after_s
        self.monotonic = monotonic
        self._last: int | None = None
        self._changed_at = 0.0

    def __call__(self) -> str | None:
        now, value = self.monotonic(), self.counter()
        if value != self._last:
            self._last, self._changed_at = value, now
            return None
        # The reason names the limit, not the growing idle time, so it changes (and is logged) once.
        stale = now - self._changed_at > self.stale_after_s
        return f"{self.name} made no progress for over {self.stale_after_s:g} s" if stale else None


def thread_check(name: str, thread: threading.Thread) -> Check:
    """Healthy while ``thread`` runs."""
    return lambda: None if thread.is_alive() else f"{name} thread died"


class Supervision:
    """The daemon's side of ``Type=notify``: READY=1 and a health-gated watchdog, then STOPPING=1.

    ``start`` sends ``READY=1`` with ``status`` and starts the watchdog thread (when systemd asked
    for one). Every ``notifier.watchdog_interval_s`` it runs the checks: when all pass it sends
    ``WATCHDOG=1``; when one fails the ping is withheld and ``STATUS=unhealthy: <reason>`` is sent
    and logged (once per change), and pings resume with ``STATUS=<status>`` once all pass again.
    ``stop`` sends ``STOPPING=1`` and ends the thread.

    Args:
        checks: Health checks, each returning None or a reason.
        status: The STATUS= text while healthy.
        notifier: Where messages go; from the environment when None.
    """

    def __init__(self, checks: Sequence[Check], status: str, notifier: Notifier | None = None) -> None:
        self.notifier = Notifier.from_env() if notifier is None else notifier
        self.checks = list(checks)
        self.status = status
        self.pings_total = 0
        self._problem: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check_once(self) -> str | None:
        """Run every check, ping when all pass; returns the first problem or None."""
        problem = None
        for check in self.checks:
            try:
                problem = check()
            except Exception as exc:  # a broken check is a finding, not a reason to stop watching
                problem = f"health check failed: {exc!r}"
            if problem:
                break
        if problem != self._problem:
            if problem:
                log.warning("event=unhealthy reason=%r watchdog=withheld", problem)
                self.notifier.send(STATUS=f"unhealthy: {problem}")
            else:
                log.info("event=healthy")
                self.notifier.send(STATUS=self.status)
            self._problem = problem
        if problem is None and self.notifier.send(WATCHDOG=1):
            self.pings_total += 1
        return problem

    def start(self) -> None:
        """Tell systemd the daemon serves, and start pinging if it wants a watchdog."""
        self.notifier.ready(self.status)
        interval = self.notifier.watchdog_interval_s
        if interval is None:
            return
        log.info("event=sd_watchdog_started interval_s=%g", interval)
        self._thread = threading.Thread(target=self._run, args=(interval,), name="sd-watchdog", daemon=True)
        self._thread.start()

    def reload(self, action: Callable[[], str]) -> str:
        """Run ``action`` (a SIGHUP re-check) between ``RELOADING=1`` and ``READY=1``; returns or raises what it does.

        ``MONOTONIC_USEC`` is ``CLOCK_MONOTONIC`` in microseconds, as systemd matches it against the
        time it sent the signal.
        """
        self.notifier.send(RELOADING=1, MONOTONIC_USEC=time.monotonic_ns() // 1000, STATUS="reloading")
        try:
            return action()
        finally:
            self.notifier.ready(f"unhealthy: {self._problem}" if self._problem else self.status)

    def stop(self) -> None:
        """Tell systemd shutdown has begun, and stop pinging."""
        self.notifier.stopping()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self.notifier.close()

    def _run(self, interval: float) -> None:
        self.check_once()
        while not self._stop.wait(interval):
            self.check_once()
