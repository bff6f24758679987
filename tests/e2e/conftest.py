"""Real processes for end-to-end tests: the agent daemon, the aggregator and the demo training job."""
from __future__ import annotations

import contextlib
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
from typing import Any

import grpc
import psutil
import pytest

from chopper.demo.run import free_port, metric_sum
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from chopper.proto.chopper.v1 import aggregator_pb2_grpc as apb_grpc
from chopper.runs import consumer


class Daemon:
    """A daemon on ports picked by free_port(), started and restarted by its test; ``{name}-{start}.log`` per start."""

    # What the daemon prints when it cannot bind a port that the class picked.
    bind_failure = ""

    def __init__(self, workdir: Path, name: str, nice: int) -> None:
        self.workdir = workdir
        self.name = name
        self.nice = nice  # e.g. 10, as deploy/systemd runs the daemons
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.metrics_addr = ""  # host:port of its /metrics, set by pick_ports()

    def argv(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        """Whether the daemon answers; called while it runs."""
        raise NotImplementedError

    def pick_ports(self) -> None:
        """New ports from free_port() for the ones the class picked."""
        raise NotImplementedError

    def launch(self, may_move: bool) -> None:
        """Launch the daemon and wait until it answers.

        free_port() releases the port it found, so under parallel tests another process can take it
        before the daemon binds; the daemon then exits, and where ``may_move`` it is launched again on
        new ports, rather than failing the test or the test reading someone else's /metrics.
        """
        for _ in range(3):
            self.starts += 1
            log = open(self.workdir / f"{self.name}-{self.starts}.log", "wb")  # noqa: SIM115 (lives with the process)
            self.proc = subprocess.Popen(self.argv(), stderr=log,
                                         preexec_fn=(lambda: os.nice(self.nice)) if self.nice else None)
            if self._answers(timeout_s=30.0):
                return
            if not may_move or self.bind_failure not in self.log():
                break
            self.pick_ports()
        assert self.proc is not None
        if self.proc.poll() is None:
            self.kill()
        raise RuntimeError(f"{self.name} did not start; its log ends: {self.log()[-2000:]}")

    def _answers(self, timeout_s: float) -> bool:
        """True once ready() does; False when the process exits or time runs out."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.ready():
                return True
            time.sleep(0.1)
        return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.metrics_addr}/metrics", timeout=5) as response:
            return str(response.read().decode())

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def log(self) -> str:
        return (self.workdir / f"{self.name}-{self.starts}.log").read_text()


class AgentProcess(Daemon):
    """``python -m agent`` with a simulated node on a private socket and metrics port."""

    # It binds /metrics before serving its socket; other listeners are the test's to pick.
    bind_failure = "metrics_listen: cannot bind"

    def __init__(self, workdir: Path, *extra: str, nice: int = 0, module: str = "agent") -> None:
        super().__init__(workdir, "agent", nice)
        self.module = module  # or a launcher that fakes a vendor library, then runs agent.main
        self.socket = workdir / "agent.sock"
        self.target = f"unix://{self.socket}"
        self.extra = extra
        self.pick_ports()

    def pick_ports(self) -> None:
        self.metrics_addr = f"127.0.0.1:{free_port()}"

    def start(self) -> AgentProcess:
        """Launch the agent and wait until it answers on its socket; any start may move its /metrics."""
        self.launch(may_move=True)
        return self

    def argv(self) -> list[str]:
        return [sys.executable, "-m", self.module, "--node", "e2e-node", "--backend", "simulated", "--sim-gpus", "4",
                "--sample-hz", "20", "--socket-path", str(self.socket), "--metrics-listen", self.metrics_addr,
                *self.extra]

    def ready(self) -> bool:
        try:
            consumer.wait_for_info(self.target, timeout_s=1.0)
            return True
        except consumer.AgentUnreachable:
            return False

    def terminate(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(15)


class AggregatorProcess(Daemon):
    """``chopper-aggregator`` on private ports; restartable on the same ports."""

    # "listen: cannot bind" or "metrics_listen: cannot bind": both ports are the class's.
    bind_failure = "listen: cannot bind"

    def __init__(self, workdir: Path, name: str = "agg", *extra: str, nice: int = 0) -> None:
        super().__init__(workdir, name, nice)
        self.extra = extra
        self.pick_ports()

    def pick_ports(self) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        self.metrics_addr = f"127.0.0.1:{free_port()}"

    def start(self) -> AggregatorProcess:
        """Launch and wait until it serves. Only a first start may move: a restart keeps the address agents know."""
        self.launch(may_move=self.starts == 0)
        return self

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "aggregator.main", "--listen", self.address, "--metrics-listen",
                self.metrics_addr, "--step-timeout-s", "10", *self.extra]

    def ready(self) -> bool:
        # It logs this once both ports are bound: /metrics answering might be whoever holds a taken port.
        return "event=started " in self.log()

    def value(self, name: str, **labels: str) -> float:
        return metric_sum(self.metrics(), name, **labels)

    def query(self, job: str, last: int = 0) -> list[apb.JobStep]:
        with grpc.insecure_channel(self.address) as channel:
            return list(apb_grpc.AggregatorStub(channel).QuerySteps(apb.QueryStepsRequest(job=job, last=last),
                                                                    timeout=10).steps)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(15)


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


def stop_training(proc: subprocess.Popen[str]) -> None:
    """Kill the training launcher and the rank processes it spawned (they hold its pipes open), then reap it."""
    if proc.poll() is None:
        parent = psutil.Process(proc.pid)
        for process in [*parent.children(recursive=True), parent]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
    proc.communicate(timeout=30)


class ObservedStream:
    """The recorder's Subscribe stream, passed through unchanged, noting what record() has taken from it."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.markers = 0
        self.last_sample_ns = 0

    def __iter__(self) -> Iterator[pb.TelemetryBatch]:
        for batch in self.stream:
            yield batch
            # Noted once record() has stored the batch and asks for the next one.
            self.markers += len(batch.markers)
            if batch.samples:
                self.last_sample_ns = max(self.last_sample_ns, batch.samples[-1].ts_ns)

    def cancel(self) -> bool:
        return bool(self.stream.cancel())


def observe_recorder_streams(monkeypatch: pytest.MonkeyPatch) -> list[ObservedStream]:
    """Wrap ``consumer.subscribe`` so the test sees what ``record()`` took from each stream it opens.

    A stop drops what is still in flight, and a recorder can lag the agent by seconds on a busy
    machine: tests wait on these counts before they stop it.
    """
    observed: list[ObservedStream] = []
    subscribe = consumer.subscribe

    def observed_subscribe(*args: Any) -> tuple[Any, ObservedStream]:
        channel, stream = subscribe(*args)
        observed.append(ObservedStream(stream))
        return channel, observed[-1]

    monkeypatch.setattr(consumer, "subscribe", observed_subscribe)
    return observed


def wait_until(predicate, timeout_s: float = 10.0, interval_s: float = 0.1) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())
