"""Real daemons over mutual TLS: agents deliver to an aggregator, a stranger is refused, the CLI reaches the agent.

One ``chopper-aggregator`` and two ``chopper-agent`` processes. The trusted agent holds a client
certificate of the cluster's CA and serves its own TCP listener over mutual TLS with a bearer
token for captures; the stranger's certificate comes from another CA. Markers come from the real
job-side client over each agent's unix socket; ``chopper info`` runs once as its own process.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import chopper
from chopper import cli
from chopper.demo.run import free_port, metric_sum
from tests.support.daemons import AgentProcess, AggregatorProcess
from tests.support.pki import Pki, write_token
from tests.support.polling import wait_until

STEPS = 5


def mark_steps(target: str) -> None:
    client = chopper.Client("secure", 0, 0, target, control=False)
    for i in range(STEPS):
        with client.step(i, flops=1e12, tokens=64):
            time.sleep(0.02)
    client.shutdown(timeout=5.0)
    assert client.stats()["sent"] == 2 * STEPS


def chopper_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chopper.cli", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_mutual_tls_between_real_daemons_and_the_cli(tmp_path: Path, pki: Pki,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    agg = AggregatorProcess(tmp_path, "agg", "--tls-cert", pki.server.cert, "--tls-key", pki.server.key,
                            "--tls-client-ca", pki.ca).start()
    listen = f"127.0.0.1:{free_port()}"
    token = write_token(tmp_path / "agent.token", "capture-token")
    agents: list[AgentProcess] = []
    try:
        for name, cert in (("trusted", pki.client_a), ("stranger", pki.stranger)):
            (tmp_path / name).mkdir()
            own_listener = ["--grpc-listen", listen, "--tls-cert", pki.server.cert, "--tls-key", pki.server.key,
                            "--tls-client-ca", pki.ca, "--token-file", token] if name == "trusted" else []
            agents.append(AgentProcess(
                tmp_path / name, "--node", name, "--aggregators", agg.address, "--aggregator-tls-ca", pki.ca,
                "--aggregator-tls-cert", cert.cert, "--aggregator-tls-key", cert.key, *own_listener,
            ).start())
        trusted, stranger = agents
        for agent in agents:
            mark_steps(agent.target)
        assert wait_until(lambda: agg.value("chopper_aggregator_summaries_received_total") >= STEPS, timeout_s=30)
        # Only the trusted agent's steps arrived; the stranger keeps its summaries and says it is cut off.
        assert agg.value("chopper_aggregator_summaries_received_total") == STEPS
        # The aggregator counts a summary before it acknowledges it; the agent counts the ack once it has read it.
        assert wait_until(lambda: metric_sum(trusted.metrics(), "chopper_agent_delivery_acked_total") == STEPS,
                          timeout_s=30), "the trusted agent did not read the acknowledgements of its steps"
        assert metric_sum(stranger.metrics(), "chopper_agent_delivery_acked_total") == 0
        assert metric_sum(stranger.metrics(), "chopper_agent_delivery_connected") == 0

        # The CLI over the trusted agent's mutual-TLS listener: with a client certificate it is served.
        tls = ["--tls-ca", pki.ca, "--tls-cert", pki.client_b.cert, "--tls-key", pki.client_b.key]
        info = chopper_cli("info", "--agent", listen, *tls)
        assert info.returncode == 0 and "node trusted" in info.stdout, info.stderr
        # Without one it is refused (exit 1, the agent unreachable) and the agent counts it.
        assert cli.main(["info", "--agent", listen, "--tls-ca", pki.ca]) == 1
        assert "no Chopper agent answered" in capsys.readouterr().err
        # A capture with a wrong token is refused before the agent acts (exit 2), and counted.
        guess = write_token(tmp_path / "guess.token", "not-the-token")
        assert cli.main(["capture", "--agent", listen, *tls, "--token-file", guess, "--job", "secure", "--steps", "1",
                         "--out", str(tmp_path / "cap")]) == 2
        assert "bearer token is not accepted" in capsys.readouterr().err
        assert metric_sum(trusted.metrics(), "chopper_agent_rpc_refused_total", rpc="RequestCapture",
                          reason="wrong_token") == 1
    finally:
        for agent in agents:
            agent.terminate()
        agg.stop()
