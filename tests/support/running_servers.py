"""The daemons' gRPC servers in process: a real agent on a unix socket, real aggregators on loopback TCP.

Each is built the way its ``main`` builds it (settings, core, ``build_server``) over real sockets,
with the simulated backend for the agent and an injected receive clock for the aggregator.
"""
from __future__ import annotations

from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

from agent.backends.simulated import SimulatedBackend
from agent.config import load_settings
from agent.control_socket import ControlSocket
from agent.daemon import Agent
from agent.marker_socket import MarkerSocket
from agent.marker_streams import MarkerStreams
from agent.metrics import AgentCollector
from agent.server import TelemetryHub
from agent.server import build_server as build_agent_server
from aggregator.config import AggregatorSettings
from aggregator.jobs import JobTable
from aggregator.ledger import Ledger
from aggregator.metrics import AggregatorCollector
from aggregator.server import build_server as build_aggregator_server
from aggregator.service import Aggregator
from aggregator.store import Store
from chopper.daemon.text_format import Registry
from chopper.daemon.tls import ClientTLS
from chopper.proto.chopper.v1 import agent_pb2_grpc, aggregator_pb2_grpc
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from tests.support.fake_clock import START_NS, FakeClock
from tests.support.summaries import NS

# One scrape's samples: (sample name, sorted (label, value) pairs) -> value.
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _samples(registry: Registry) -> Samples:
    text = registry.render().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


class RunningAgent:
    """An agent of node "n1" with 2 simulated GPUs at 50 Hz, serving ``tmp/a.sock`` with a 64 KiB message limit.

    With ``marker_socket`` it serves ``tmp/a.sock.markers`` as well (``agent.marker_socket``), with
    ``control_socket`` ``tmp/a.sock.control`` (``agent.control_socket``).
    ``overrides`` are more command-line flags, by their names with ``_`` for ``-``
    (``token_file="/path"`` is ``--token-file /path``).
    """

    def __init__(self, tmp: Path, marker_socket: bool = False, control_socket: bool = False, **overrides: str) -> None:
        argv = ["--node", "n1", "--backend", "simulated", "--sim-gpus", "2", "--sample-hz", "50",
                "--socket-path", str(tmp / "a.sock"), "--max-message-bytes", "65536"]
        for key, value in overrides.items():
            argv += ["--" + key.replace("_", "-"), value]
        self.settings = load_settings(argv, env={})
        self.hub = TelemetryHub()
        self.agent = Agent(self.settings, SimulatedBackend(self.settings.node, gpus=2), notify=self.hub.notify)
        self.agent.open_backend()
        self.markers = MarkerStreams(self.agent)
        self.server, _ = build_agent_server(self.agent, self.hub, self.settings, self.markers)
        # agent.main serves it too; a test that asks for it gets it.
        self.marker_socket = MarkerSocket(self.markers, self.settings).start() if marker_socket else None
        self.control_socket = ControlSocket(self.agent, self.settings).start() if control_socket else None
        self.agent.start()
        self.target = f"unix://{self.settings.socket_path}"
        self.channel = grpc.insecure_channel(self.target)
        self.stub = agent_pb2_grpc.AgentStub(self.channel)
        self.registry = Registry()
        self.registry.register(AgentCollector(self.agent.view))

    def scrape(self) -> Samples:
        """The agent's ``/metrics`` now."""
        return _samples(self.registry)

    def stop(self) -> None:
        self.channel.close()
        for served in (self.marker_socket, self.control_socket):
            if served is not None:
                served.stop()
        self.server.stop(0)
        self.agent.stop()


class RunningAggregator:
    """An aggregator storing under ``tmp/steps`` (flushed only at close), keeping 3 recent steps per job.

    Its receive clock is ``clock`` (a ``FakeClock``), so jobs pass their 5 s join period only when
    the test says (``settle``). ``settings`` supplies TLS and the rate limits (None: the defaults).
    """

    def __init__(self, tmp: Path, top_k: int = 0, settings: AggregatorSettings | None = None) -> None:
        self.clock = FakeClock(START_NS)
        self.store = Store(tmp / "steps", flush_rows=1_000_000)
        self.core = Aggregator(Ledger(), JobTable(30.0, join_s=5.0), self.store, recent_steps_per_job=3,
                               clock=self.clock)
        self.server, port = build_aggregator_server(self.core, "127.0.0.1:0", settings=settings)
        self.address = f"127.0.0.1:{port}"
        self.channel = grpc.insecure_channel(self.address)
        self.stub = aggregator_pb2_grpc.AggregatorStub(self.channel)
        self.registry = Registry()
        self.registry.register(AggregatorCollector(self.core, top_k))

    def scrape(self) -> Samples:
        """The aggregator's ``/metrics`` now."""
        return _samples(self.registry)

    def settle(self) -> None:
        """Let the jobs' join period pass, so that steps with every rank complete."""
        self.clock.now += 5 * NS
        self.core.tick()

    def stop(self) -> None:
        self.channel.close()
        self.server.stop(0)


class ServedAggregator:
    """An aggregator on 127.0.0.1 with the given settings (TLS, rate limits), without a store; clients bring TLS."""

    def __init__(self, settings: AggregatorSettings) -> None:
        self.core = Aggregator(Ledger(), JobTable(30.0), None, recent_steps_per_job=3)
        self.server, port = build_aggregator_server(self.core, "127.0.0.1:0", settings=settings)
        self.address = f"127.0.0.1:{port}"

    def query(self, tls: ClientTLS | None) -> grpc.StatusCode:
        """One QuerySteps call over a fresh connection (plaintext when ``tls`` is None); its status code."""
        if tls is None:
            channel = grpc.insecure_channel(self.address)
        else:
            channel = grpc.secure_channel(self.address, tls.credentials())
        try:
            aggregator_pb2_grpc.AggregatorStub(channel).QuerySteps(apb.QueryStepsRequest(job="j"), timeout=5)
            return grpc.StatusCode.OK
        except grpc.RpcError as exc:
            return exc.code()
        finally:
            channel.close()

    def scrape(self) -> str:
        """The aggregator's ``/metrics`` text now."""
        registry = Registry()
        registry.register(AggregatorCollector(self.core))
        return registry.render().decode()

    def stop(self) -> None:
        self.server.stop(0).wait(5)
