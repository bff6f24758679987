"""Child processes of the local stack: start each in its own session, probe it, stop it cleanly.

Each service runs in a new session (process group) so that Ctrl-C at the terminal reaches only the
launcher, which then stops the services in reverse start order, and so that a stop reaches every
process of a service (the training job's rank processes included): SIGTERM to the group, SIGKILL
after ``stop_timeout_s``.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


class StackError(Exception):
    """A service could not start or stopped on its own; the message names it and quotes its log."""


@dataclass
class Service:
    """One process of the stack.

    Args:
        name: Shown in messages, and the log's file name (``<workdir>/<name>.log``).
        argv: The command.
        log: Its stdout and stderr.
        ready_url: An HTTP URL that answers 200 once the service serves; None: ready once started.
        env: Extra environment variables.
    """

    name: str
    argv: list[str]
    log: Path
    ready_url: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "wb") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env={**os.environ, **self.env})

    def exit_code(self) -> int | None:
        """None while it runs."""
        return None if self.proc is None else self.proc.poll()

    def is_ready(self) -> bool:
        if self.ready_url is None:
            return self.proc is not None
        try:
            with urllib.request.urlopen(self.ready_url, timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stop(self, stop_timeout_s: float = 15.0) -> str:
        """SIGTERM to its process group, SIGKILL after ``stop_timeout_s``; returns how it ended."""
        if self.proc is None:
            return "not started"
        if self.proc.poll() is not None:
            return f"had exited with {self.proc.returncode}"
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            code = self.proc.wait(stop_timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
            return f"killed: still running {stop_timeout_s:g} s after SIGTERM"
        with contextlib.suppress(ProcessLookupError):  # the group's other processes (a job's ranks) go too
            os.killpg(self.proc.pid, signal.SIGKILL)
        return f"exit {code}"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"


def wait_ready(services: list[Service], timeout_s: float) -> None:
    """Poll until every service is ready.

    Raises:
        StackError: One exited, or not all were ready within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    pending = list(services)
    while pending:
        for service in list(pending):
            code = service.exit_code()
            if code is not None:
                raise StackError(f"{service.name} exited with {code} while starting; its log "
                                 f"({service.log}) ends:\n{service.log_tail()}")
            if service.is_ready():
                pending.remove(service)
        if pending and time.monotonic() > deadline:
            names = ", ".join(f"{s.name} ({s.ready_url})" for s in pending)
            raise StackError(f"not ready within {timeout_s:g} s: {names}; logs are in {pending[0].log.parent}")
        time.sleep(0.2)
