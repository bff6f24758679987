"""TLS and mutual TLS on a real aggregator gRPC server in process, over real TCP: who gets in, renewal.

The handshakes are gRPC's own (``chopper.daemon.tls.ServerTLS.credentials``): one test per way a client
fails TLS, each refused before any RPC while good clients go on being served.
"""
from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from aggregator.config import AggregatorSettings
from chopper.daemon.tls import ClientTLS
from tests.support.hazards import HazardOutcome
from tests.support.pki import Authority, Pki
from tests.support.running_servers import ServedAggregator


@pytest.fixture
def mutual(pki: Pki) -> Iterator[ServedAggregator]:
    settings = AggregatorSettings(tls_cert=pki.server.cert, tls_key=pki.server.key, tls_client_ca=pki.ca)
    served = ServedAggregator(settings)
    yield served
    served.stop()


def refused_calls(served: ServedAggregator) -> int:
    return sum(served.core.refusals.snapshot().values())


@pytest.mark.parametrize("client", ["wrong_ca", "expired", "no_certificate", "plaintext", "distrusts_server"])
def test_each_tls_failure_is_refused_before_any_rpc_while_good_clients_are_served(mutual: ServedAggregator, pki: Pki,
                                                                                  client: str) -> None:
    tls = {
        "wrong_ca": ClientTLS(pki.ca, pki.stranger.cert, pki.stranger.key),  # signed by another CA
        "expired": ClientTLS(pki.ca, pki.expired.cert, pki.expired.key),
        "no_certificate": ClientTLS(pki.ca),
        "plaintext": None,
        "distrusts_server": ClientTLS(pki.other_ca, pki.client_a.cert, pki.client_a.key),
    }[client]
    assert mutual.query(tls) == grpc.StatusCode.UNAVAILABLE
    assert mutual.query(ClientTLS(pki.ca, pki.client_a.cert, pki.client_a.key)) == grpc.StatusCode.OK
    assert refused_calls(mutual) == 0  # refused in the handshake: no RPC reached the access checks


@pytest.mark.hazard(item=16, input="mutual-TLS listener: clients with a wrong-CA, expired or no certificate, "
                    "plaintext, or distrusting the server; certificate renewed and half-written at run time",
                    promise="gRPC's own TLS refuses each before any RPC, good clients are served, a renewal is "
                    "taken without a restart and a broken one keeps the old certificate; no TLS byte passes "
                    "through Python")
def test_grpc_tls_refuses_every_bad_client_and_no_python_thread_carries_tls(mutual: ServedAggregator, pki: Pki,
                                                                           hazard: HazardOutcome) -> None:
    good = ClientTLS(pki.ca, pki.client_a.cert, pki.client_a.key)
    bad = [ClientTLS(pki.ca, pki.stranger.cert, pki.stranger.key), ClientTLS(pki.ca, pki.expired.cert, pki.expired.key),
           ClientTLS(pki.ca), None, ClientTLS(pki.other_ca, pki.client_a.cert, pki.client_a.key)]
    codes = [mutual.query(tls) for tls in bad]
    served = sum(mutual.query(good) == grpc.StatusCode.OK for _ in range(5))
    assert codes == [grpc.StatusCode.UNAVAILABLE] * len(bad) and served == 5, (codes, served)
    threads = sorted(t.name for t in threading.enumerate() if "tls" in t.name.lower())
    assert threads == [], threads  # the handshakes and the bytes are gRPC core's, in C
    hazard.outcome = (f"{len(bad)} of {len(bad)} bad clients refused UNAVAILABLE before any RPC "
                      f"({refused_calls(mutual)} reached the access checks), 5 of 5 good calls served, 0 Python "
                      "TLS threads; renewal and a broken renewal: tests below, mTLS cost: benchmarks/bench_tls.py")


def test_server_tls_without_client_certificates_refuses_only_plaintext(pki: Pki) -> None:
    served = ServedAggregator(AggregatorSettings(tls_cert=pki.server.cert, tls_key=pki.server.key))
    try:
        assert served.query(ClientTLS(pki.ca)) == grpc.StatusCode.OK
        assert served.query(None) == grpc.StatusCode.UNAVAILABLE
    finally:
        served.stop()


def test_rate_limits_key_a_mutual_tls_client_by_its_certificate(pki: Pki) -> None:
    served = ServedAggregator(AggregatorSettings(tls_cert=pki.server.cert, tls_key=pki.server.key,
                                                 tls_client_ca=pki.ca, rate_limit_calls_per_s=1.0))
    try:
        a = ClientTLS(pki.ca, pki.client_a.cert, pki.client_a.key)
        codes = [served.query(a) for _ in range(4)]  # a full bucket holds 2 s of calls: 2
        assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 2, codes
        # Another certificate from the same address has its own bucket.
        assert served.query(ClientTLS(pki.ca, pki.client_b.cert, pki.client_b.key)) == grpc.StatusCode.OK
    finally:
        served.stop()


def test_renewed_server_certificate_is_served_without_a_restart(tmp_path: Path, pki: Pki) -> None:
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    shutil.copy(pki.server.cert, cert)
    shutil.copy(pki.server.key, key)
    served = ServedAggregator(AggregatorSettings(tls_cert=str(cert), tls_key=str(key)))
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


def test_a_half_written_renewal_keeps_the_certificate_in_force(tmp_path: Path, pki: Pki,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    shutil.copy(pki.server.cert, cert)
    shutil.copy(pki.server.key, key)
    served = ServedAggregator(AggregatorSettings(tls_cert=str(cert), tls_key=str(key)))
    try:
        renewed = Authority(tmp_path, "renewed-ca").issue("chopper-server", server=True)
        shutil.copy(renewed.cert, cert)  # the new chain is in place, its key not yet
        with caplog.at_level(logging.WARNING, logger="chopper.daemon.tls"):
            assert served.query(ClientTLS(pki.ca)) == grpc.StatusCode.OK
            assert served.query(ClientTLS(pki.ca)) == grpc.StatusCode.OK
        assert caplog.text.count("event=tls_reload_failed") == 1, caplog.text  # once, not once per connection
    finally:
        served.stop()
