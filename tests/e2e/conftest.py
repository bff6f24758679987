"""Real processes for end-to-end tests: the agent daemon, the aggregator and the demo training job."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from chopper import consumer
from chopper.demo.run import free_port, metric_sum
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from chopper.proto.chopper.v1 import aggregator_pb2_grpc as apb_grpc


class AgentProcess:
    """``python -m agent`` with a simulated node on a private socket and metrics port."""

    def __init__(self, workdir: Path, *extra: str, nice: int = 0, module: str = "agent") -> None:
        self.workdir = workdir
        self.nice = nice  # e.g. 10, as deploy/systemd runs the agent
        self.module = module  # or a launcher that fakes a vendor library, then runs agent.main
        self.socket = workdir / "agent.sock"
        self.target = f"unix://{self.socket}"
        self.metrics_addr = f"127.0.0.1:{free_port()}"
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> AgentProcess:
        """Launch the agent and wait until it answers on its socket.

        free_port() releases the port it found, so under parallel tests another process can take it
        before the agent binds; the agent then exits (it binds /metrics before serving its socket)
        and is launched again on a new port, rather than the test reading someone else's /metrics.
        """
        for _ in range(3):
            self._launch()
            if self._answers(timeout_s=30.0):
                return self
            if "metrics_listen: cannot bind" not in self.log():
                break
            self.metrics_addr = f"127.0.0.1:{free_port()}"
        raise RuntimeError(f"the agent did not start; its log ends: {self.log()[-2000:]}")

    def _launch(self) -> None:
        self.starts += 1
        log = open(self.workdir / f"agent-{self.starts}.log", "wb")  # noqa: SIM115 (lives as long as the process)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, "--node", "e2e-node", "--backend", "simulated", "--sim-gpus", "4",
             "--sample-hz", "20", "--socket-path", str(self.socket), "--metrics-listen", self.metrics_addr,
             *self.extra],
            stderr=log, preexec_fn=(lambda: os.nice(self.nice)) if self.nice else None,
        )

    def _answers(self, timeout_s: float) -> bool:
        """True once GetInfo answers on the socket; False when the process exits or time runs out."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                consumer.wait_for_info(self.target, timeout_s=1.0)
                return True
            except consumer.AgentUnreachable:
                continue
        return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.metrics_addr}/metrics", timeout=5) as response:
            return str(response.read().decode())

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def terminate(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(15)

    def log(self) -> str:
        return (self.workdir / f"agent-{self.starts}.log").read_text()


class AggregatorProcess:
    """``chopper-aggregator`` on private ports; restartable on the same ports."""

    def __init__(self, workdir: Path, name: str = "agg", *extra: str, nice: int = 0) -> None:
        self.workdir = workdir
        self.nice = nice
        self.name = name
        self.extra = extra
        self.address = f"127.0.0.1:{free_port()}"
        self.metrics_addr = f"127.0.0.1:{free_port()}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> AggregatorProcess:
        self.starts += 1
        log = open(self.workdir / f"{self.name}-{self.starts}.log", "wb")  # noqa: SIM115 (lives with the process)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aggregator.main", "--listen", self.address, "--metrics-listen", self.metrics_addr,
             "--step-timeout-s", "10", *self.extra],
            stderr=log, preexec_fn=(lambda: os.nice(self.nice)) if self.nice else None,
        )
        assert wait_until(self._up, timeout_s=30), f"aggregator did not start:\n{self.log()}"
        return self

    def _up(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"aggregator exited {self.proc.returncode}:\n{self.log()}")
        try:
            self.metrics()
            return True
        except OSError:
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.metrics_addr}/metrics", timeout=5) as response:
            return str(response.read().decode())

    def value(self, name: str, **labels: str) -> float:
        return metric_sum(self.metrics(), name, **labels)

    def query(self, job: str, last: int = 0) -> list[apb.JobStep]:
        with grpc.insecure_channel(self.address) as channel:
            return list(apb_grpc.AggregatorStub(channel).QuerySteps(apb.QueryStepsRequest(job=job, last=last),
                                                                    timeout=10).steps)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(15)

    def log(self) -> str:
        return (self.workdir / f"{self.name}-{self.starts}.log").read_text()


class ServerProcess:
    """A Debian-packaged server (Prometheus, Alertmanager) on loopback, ready once ``/-/ready`` answers 200."""

    def __init__(self, workdir: Path, binary: str, address: str, *args: str) -> None:
        path = shutil.which(binary)
        if path is None:
            pytest.fail(f"{binary} is not installed; `make test` installs its Debian package (Makefile APT_PACKAGES)")
        self.workdir, self.name, self.address = workdir, binary, address
        self.argv = [path, *args]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30) -> ServerProcess:
        log = open(self.workdir / f"{self.name}.log", "wb")  # noqa: SIM115 (lives as long as the process)
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        assert wait_until(self._ready, timeout_s=timeout_s), f"{self.name} did not start:\n{self.log()[-3000:]}"
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited {self.proc.returncode}:\n{self.log()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(15)

    def log(self) -> str:
        return (self.workdir / f"{self.name}.log").read_text()


def prometheus_process(workdir: Path, targets: dict[str, list[str]], rule_files: tuple[Path, ...] = (),
                       alertmanager: str = "") -> ServerProcess:
    """A real Prometheus scraping ``{scrape job: [host:port]}`` every second, evaluating rules every second.

    ``honor_labels`` keeps the training job's ``job`` label on Chopper's series (else ``exported_job``).
    """
    address = f"127.0.0.1:{free_port()}"
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(f) for f in rule_files],
        "scrape_configs": [{"job_name": job, "honor_labels": True, "static_configs": [{"targets": hosts}]}
                           for job, hosts in targets.items()],
    }
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    return ServerProcess(workdir, "prometheus", address, f"--config.file={workdir / 'prometheus.yml'}",
                         f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address={address}")


def alertmanager_process(workdir: Path, webhook_url: str) -> ServerProcess:
    """A real Alertmanager sending every alert (and its resolution) to ``webhook_url`` within a second."""
    address = f"127.0.0.1:{free_port()}"
    config = {
        "route": {"receiver": "hook", "group_by": ["..."], "group_wait": "1s", "group_interval": "1s",
                  "repeat_interval": "1h"},
        "receivers": [{"name": "hook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
    }
    (workdir / "alertmanager.yml").write_text(json.dumps(config))
    # No cluster listener: it would bind 9094 on every interface.
    return ServerProcess(workdir, "prometheus-alertmanager", address,
                         f"--config.file={workdir / 'alertmanager.yml'}", f"--storage.path={workdir / 'am-data'}",
                         f"--web.listen-address={address}", "--cluster.listen-address=")


def prom_query(prom: str, expr: str) -> list[dict]:
    """Instant query; [] while Prometheus is unreachable or the expression has no result."""
    url = f"http://{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return list(json.load(response)["data"]["result"])
    except OSError:
        return []


@pytest.fixture
def agent_process(tmp_path: Path) -> Iterator[AgentProcess]:
    agent = AgentProcess(tmp_path).start()
    yield agent
    if agent.proc is not None and agent.proc.poll() is None:
        agent.terminate()


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


def wait_until(predicate, timeout_s: float = 10.0, interval_s: float = 0.1) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())
