"""A daemon's stderr read line by line while it runs, to wait for the line that names what it bound."""
from __future__ import annotations

import contextlib
import queue
import re
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from typing import IO


class LogLines:
    """Every line of ``stream`` (a process's text stderr) as it comes, read by a thread so the pipe never fills."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self.ended = False  # the process closed stderr (it exited)
        self._fresh: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(stream,), name="log-lines", daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._fresh.put(line)
        self._fresh.put(None)  # end of the stream

    def wait_for(self, pattern: str, timeout_s: float = 30.0) -> re.Match[str]:
        """The first match of ``pattern`` in a line, waiting up to ``timeout_s``; else AssertionError with the log."""
        compiled = re.compile(pattern)
        for seen in self.lines:
            if found := compiled.search(seen):
                return found
        deadline = time.monotonic() + timeout_s
        while not self.ended and (left := deadline - time.monotonic()) > 0:
            try:
                line = self._take(timeout_s=left)
            except queue.Empty:
                break
            if line is not None and (found := compiled.search(line)):
                return found
        raise AssertionError(f"no line matches {pattern!r}; the log so far:\n{self.text()}")

    def bound(self, key: str, timeout_s: float = 30.0) -> str:
        """``host:port`` that the listener of setting ``key`` bound (its ``event=listening <key>=`` line), not :0."""
        found = self.wait_for(rf"event=listening {key}=(\S+:(\d+))$", timeout_s)
        assert int(found[2]) != 0, found[0]
        return found[1]

    def text(self) -> str:
        """The lines read so far."""
        while not self.ended and not self._fresh.empty():
            self._take(timeout_s=0)
        return "".join(self.lines)

    def _take(self, timeout_s: float) -> str | None:
        """The next line (kept in ``lines``), None at the end of the stream; queue.Empty after ``timeout_s``."""
        line = self._fresh.get(timeout=timeout_s) if timeout_s > 0 else self._fresh.get_nowait()
        if line is None:
            self.ended = True
        else:
            self.lines.append(line)
        return line


@contextlib.contextmanager
def daemon_log(argv: Sequence[str], stop_timeout_s: float = 30.0) -> Iterator[LogLines]:
    """Run the daemon ``argv`` while the block runs, yielding its stderr; then SIGTERM it and expect exit 0."""
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    log = LogLines(proc.stderr)
    try:
        yield log
    finally:
        proc.terminate()
        proc.wait(timeout=stop_timeout_s)
    assert proc.returncode == 0, log.text()
