"""The demo's real gloo training job as a subprocess: start it, wait for its markers, or kill it."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import psutil

from chopper.demo.run import free_port


def start_training(target: str, ranks: int = 2, duration_s: float = 6.0, **env: str) -> subprocess.Popen[str]:
    """The demo's real gloo training job; its last stdout line is JSON of what each rank marked."""
    return subprocess.Popen(
        [sys.executable, "-m", "chopper.demo.train", "--agent", target, "--ranks", str(ranks),
         "--duration", str(duration_s), "--port", str(free_port()), "--job", "e2e"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env},
    )


def finish_training(proc: subprocess.Popen[str], timeout_s: float = 180) -> dict[str, dict]:
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, f"training failed:\n{err[-3000:]}"
    return dict(json.loads(out.strip().splitlines()[-1]))


def stop_training(proc: subprocess.Popen[str]) -> None:
    """Kill the training launcher and the rank processes it spawned (they hold its pipes open), then reap it."""
    if proc.poll() is None:
        parent = psutil.Process(proc.pid)
        for process in [*parent.children(recursive=True), parent]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
    proc.communicate(timeout=30)
