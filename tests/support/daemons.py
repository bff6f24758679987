"""The agent and aggregator daemons as real processes on free ports, started, restarted and stopped by a test."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import grpc

from chopper.demo.run import free_port, metric_sum
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


def stop_all(started: list) -> None:
    """Stop what a test started, the last started first: agents with SIGTERM, anything else by its ``stop()``."""
    for process in reversed(started):
        if isinstance(process, AgentProcess):
            if process.proc is not None and process.proc.poll() is None:
                process.terminate()
        else:
            process.stop()
