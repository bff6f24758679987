"""TLS and mutual TLS on a real aggregator gRPC server in process, over real TCP: who gets in, who is counted."""
from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from aggregator.config import AggregatorSettings
from aggregator.jobs import JobTable
from aggregator.ledger import Ledger
from aggregator.metrics import AggregatorCollector
from aggregator.server import build_server
from aggregator.service import Aggregator
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from chopper.proto.chopper.v1 import aggregator_pb2_grpc
from chopper.tls import ClientTLS
from tests.e2e.conftest import wait_until
from tests.security.conftest import Pki
from tests.security.pki import Authority


class Served:
    """An in-process aggregator on 127.0.0.1 with the given settings."""

    def __init__(self, settings: AggregatorSettings) -> None:
        self.core = Aggregator(Ledger(), JobTable(30.0), None, recent_steps_per_job=3)
        self.server, port = build_server(self.core, "127.0.0.1:0", settings=settings)
        self.address = f"127.0.0.1:{port}"

    def query(self, tls: ClientTLS | None) -> grpc.StatusCode:
        """One QuerySteps call over a fresh connection; its status code."""
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
        registry = CollectorRegistry(auto_describe=False)
        registry.register(AggregatorCollector(self.core))
        return generate_latest(registry).decode()

    def stop(self) -> None:
        self.server.stop(0).wait(5)


@pytest.fixture
def mutual(pki: Pki) -> Iterator[Served]:
    served = Served(AggregatorSettings(tls_cert=pki.server.cert, tls_key=pki.server.key, tls_client_ca=pki.ca))
    yield served
    served.stop()


def test_mutual_tls_admits_a_good_certificate_and_counts_every_refusal(mutual: Served, pki: Pki) -> None:
    assert mutual.query(ClientTLS(pki.ca, pki.client_a.cert, pki.client_a.key)) == grpc.StatusCode.OK
    refused = {
        "bad_certificate": ClientTLS(pki.ca, pki.stranger.cert, pki.stranger.key),  # signed by another CA
        "expired_certificate": ClientTLS(pki.ca, pki.expired.cert, pki.expired.key),
        "no_certificate": ClientTLS(pki.ca),
        "not_tls": None,  # plaintext to the TLS port
        "handshake_failed": ClientTLS(pki.other_ca, pki.client_a.cert, pki.client_a.key),  # client distrusts us
    }
    for reason, tls in refused.items():
        assert mutual.query(tls) == grpc.StatusCode.UNAVAILABLE, reason
    # The client may see its failure before the server's side of the handshake is over.
    assert wait_until(lambda: len(mutual.core.refusals.snapshot()[1]) == len(refused), timeout_s=5)
    # gRPC may retry a refused connection within the call's deadline: each attempt is one refusal.
    _, connections = mutual.core.refusals.snapshot()
    assert set(connections) == set(refused) and all(n >= 1 for n in connections.values()), connections
    text = mutual.scrape()
    assert 'chopper_aggregator_connections_refused_total{reason="expired_certificate"}' in text
    assert mutual.query(ClientTLS(pki.ca, pki.client_b.cert, pki.client_b.key)) == grpc.StatusCode.OK  # still serving


def test_server_tls_without_client_certificates_refuses_only_plaintext(pki: Pki) -> None:
    served = Served(AggregatorSettings(tls_cert=pki.server.cert, tls_key=pki.server.key))
    try:
        assert served.query(ClientTLS(pki.ca)) == grpc.StatusCode.OK
        assert served.query(None) == grpc.StatusCode.UNAVAILABLE
        assert wait_until(lambda: served.core.refusals.snapshot()[1].keys() == {"not_tls"}, timeout_s=5)
    finally:
        served.stop()


def test_renewed_server_certificate_is_served_without_a_restart(tmp_path: Path, pki: Pki) -> None:
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    shutil.copy(pki.server.cert, cert)
    shutil.copy(pki.server.key, key)
    served = Served(AggregatorSettings(tls_cert=str(cert), tls_key=str(key)))
    try:
        renewed_ca = Authority(tmp_path, "renewed-ca")
        trusts_renewed = ClientTLS(renewed_ca.ca)
        assert served.query(trusts_renewed) == grpc.StatusCode.UNAVAILABLE
        renewed = renewed_ca.issue("chopper-server", server=True)
        shutil.copy(renewed.key, key)
        shutil.copy(renewed.cert, cert)
        assert served.query(trusts_renewed) == grpc.StatusCode.OK
        assert served.query(ClientTLS(pki.ca)) == grpc.StatusCode.UNAVAILABLE  # the old chain is gone
    finally:
        served.stop()
