"""A real single-node VictoriaMetrics (Debian package ``victoria-metrics``) on loopback, for remote-write tests.

It listens on a free port, keeps its data under the test's work directory, counts as started once
``/-/ready`` answers (at most ``timeout_s``), and ``stop()`` ends it and deletes its data.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from chopper.demo.run import free_port
from tests.support.prometheus import ServerProcess

BINARY = "victoria-metrics"
PACKAGE = "victoria-metrics"
# The default (30 s) hides the newest 30 s of samples from queries near now, as not yet complete:
# an instant query at now is answered as of 30 s ago. A test that waits for fresh data sets 1 s.
LATENCY_OFFSET = "1s"


def _installable() -> bool:
    """Whether apt knows a candidate for the package, so `make apt-deps` can install it."""
    if shutil.which("apt-cache") is None:
        return False
    policy = subprocess.run(["apt-cache", "policy", PACKAGE], capture_output=True, text=True, timeout=30)
    return "Candidate:" in policy.stdout and "Candidate: (none)" not in policy.stdout


def require_binary() -> None:
    """Skip where VictoriaMetrics is neither installed nor installable; fail where `make apt-deps` would install it."""
    if shutil.which(BINARY) is not None:
        return
    if not _installable():
        pytest.skip(f"{BINARY} is not installed and apt has no {PACKAGE} package on this machine")
    pytest.fail(f"{BINARY} is not installed; `make apt-deps` installs its Debian package {PACKAGE} "
                "(Makefile APT_PACKAGES)")


class VictoriaMetrics(ServerProcess):
    """``victoria-metrics`` on ``127.0.0.1:<free port>``, its storage in ``workdir/victoria-metrics-data``."""

    def __init__(self, workdir: Path, latency_offset: str = LATENCY_OFFSET) -> None:
        require_binary()
        self.storage = workdir / "victoria-metrics-data"
        address = f"127.0.0.1:{free_port()}"
        super().__init__(workdir, BINARY, address, f"-httpListenAddr={address}", f"-storageDataPath={self.storage}",
                         f"-search.latencyOffset={latency_offset}")

    @property
    def write_url(self) -> str:
        """Where Prometheus remote-writes: the single-node Prometheus remote-write endpoint."""
        return f"http://{self.address}/api/v1/write"

    def label_values(self, label: str) -> list[str]:
        """``/api/v1/label/<label>/values``: what Grafana's ``label_values(<label>)`` lists."""
        url = f"http://{self.address}/api/v1/label/{urllib.parse.quote(label)}/values"
        with urllib.request.urlopen(url, timeout=10) as response:
            return list(json.load(response)["data"])

    def stop(self) -> None:
        """End the process (SIGTERM, it flushes in well under a second) and delete its data."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        shutil.rmtree(self.storage, ignore_errors=True)
