"""The daemons' ``/metrics`` (chopper.daemon.metrics_http, text_format): real HTTP over loopback, read back
with prometheus_client's parser, and the requests it refuses."""
from __future__ import annotations

import gzip
import math
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from chopper.daemon import metrics_http
from chopper.daemon.metrics_http import MetricsServer, serve_metrics
from chopper.daemon.text_format import Family, Registry, render


class _Fixed:
    """A collector of two families: a labelled counter whose values need escaping, and a gauge."""

    def collect(self) -> Iterator[Family]:
        events = Family("x_events_total", "counter", "Events, with a \\ and a\nnewline.", ("node", "kind"))
        events.add_metric(["n1", 'say "hi"\\\n'], 3.0)
        events.add_metric(["n1", "plain"], 1e16)
        up = Family("x_up", "gauge", "Up.")
        up.add_metric([], math.inf)
        return iter((events, up))


@pytest.fixture
def server() -> Iterator[tuple[MetricsServer, str]]:
    registry = Registry()
    registry.register(_Fixed())
    httpd, thread, address = serve_metrics("127.0.0.1:0", registry)
    yield httpd, address
    httpd.shutdown()
    thread.join(5)


def _raw(address: str, request: bytes, timeout_s: float = 5.0) -> bytes:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_the_scrape_parses_as_prometheus_reads_it(server: tuple[MetricsServer, str]) -> None:
    _, address = server
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        text = response.read().decode()
    # Labels in the order of their names, as prometheus_client wrote them.
    assert 'x_events_total{kind="plain",node="n1"} 1e+16' in text and "x_up +Inf" in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["x_events"].type == "counter" and families["x_events"].documentation == (
        "Events, with a \\ and a\nnewline.")
    values = {s.labels["kind"]: s.value for s in families["x_events"].samples}
    assert values == {'say "hi"\\\n': 3.0, "plain": 1e16}
    assert families["x_up"].samples[0].value == math.inf


def test_gzip_when_accepted_and_head_without_a_body(server: tuple[MetricsServer, str]) -> None:
    _, address = server
    plain = _raw(address, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    zipped = _raw(address, b"GET /metrics?x=1 HTTP/1.1\r\nAccept-Encoding: identity, gzip;q=1\r\n\r\n")
    head, _, body = zipped.partition(b"\r\n\r\n")
    assert b"Content-Encoding: gzip" in head and gzip.decompress(body) == plain.partition(b"\r\n\r\n")[2]
    only_head = _raw(address, b"HEAD /metrics HTTP/1.0\r\n\r\n")
    assert only_head.startswith(b"HTTP/1.1 200 OK") and only_head.endswith(b"\r\n\r\n")


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GET / HTTP/1.1\r\n\r\n", b"404"),
    (b"GET /metricsx HTTP/1.1\r\n\r\n", b"404"),
    (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"405"),
    (b"garbage\r\n\r\n", b"405"),
    (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (metrics_http.MAX_HEAD_BYTES + 10) + b"\r\n\r\n", b"431"),
], ids=["root", "other-path", "post", "not-http", "head-too-large"])
def test_other_requests_are_refused_with_their_status(server: tuple[MetricsServer, str], request_bytes: bytes,
                                                      status: bytes) -> None:
    _, address = server
    assert _raw(address, request_bytes).split(b" ")[1] == status


def test_a_stalled_client_is_cut_and_the_next_scrape_is_served(server: tuple[MetricsServer, str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _, address = server
    monkeypatch.setattr(metrics_http, "REQUEST_TIMEOUT_S", 0.3)
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as stalled:
        stalled.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the blank line
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
            assert response.status == 200  # served while the stalled one waits
        began = time.monotonic()
        assert stalled.recv(65536).startswith(b"HTTP/1.1 408")
        assert time.monotonic() - began < 5


def test_a_collector_that_raises_answers_500_and_the_server_goes_on() -> None:
    class Broken:
        def collect(self) -> Iterator[Family]:
            raise RuntimeError("bug")

    registry = Registry()
    registry.register(Broken())
    httpd, thread, address = serve_metrics("127.0.0.1:0", registry)
    try:
        for _ in range(2):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(f"http://{address}/metrics", timeout=5)
            assert err.value.code == 500
    finally:
        httpd.shutdown()
        thread.join(5)


def test_families_refuse_what_the_format_cannot_say() -> None:
    with pytest.raises(ValueError, match="kind must be counter or gauge"):
        Family("x", "summary", "X.")
    family = Family("x", "gauge", "X.", ("a", "b"))
    with pytest.raises(ValueError, match="1 label values for labels"):
        family.add_metric(["only one"], 1.0)
    family.add_metric(["1", "2"], math.nan)
    assert render([family]).endswith('x{a="1",b="2"} NaN\n')
