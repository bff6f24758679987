"""A daemon's Prometheus ``/metrics`` over HTTP, on the address of its ``metrics_listen`` setting.

A small HTTP/1.1 server (``socketserver``, a thread per connection): ``GET`` or ``HEAD`` of
``/metrics`` (a query string is ignored) answers the registry's text exposition
(``chopper.daemon.text_format``), gzip-compressed when the request accepts gzip, as Prometheus's
does; every other path is 404 and every other method 405. Each response closes its connection.
A request whose head is not complete within ``REQUEST_TIMEOUT_S`` or ``MAX_HEAD_BYTES`` is
answered 408 or 431 and closed, so a client that stalls or floods holds one thread for at most
that long and never delays the next scrape.
"""
from __future__ import annotations

import contextlib
import gzip
import logging
import socket
import socketserver
import threading
from http import HTTPStatus  # the package alone: not http.server or http.client

from chopper.daemon.listen_check import check_listen, log_bound
from chopper.daemon.text_format import CONTENT_TYPE, Registry

log = logging.getLogger(__name__)

# Seconds a client has to send its request head, and the most bytes that head may take.
REQUEST_TIMEOUT_S = 10.0
MAX_HEAD_BYTES = 16 * 1024
# Connections waiting to be accepted.
BACKLOG = 64
# Compression level of gzipped scrapes: 1 takes most of the bytes out for a fraction of level 9's CPU.
GZIP_LEVEL = 1

class MetricsServer(socketserver.ThreadingTCPServer):
    """The ``/metrics`` server of one registry; ``shutdown()`` stops ``serve_forever``."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = BACKLOG

    def __init__(self, address: tuple[str, int], registry: Registry) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.registry = registry
        super().__init__(address, _Handler)


class _Handler(socketserver.BaseRequestHandler):
    server: MetricsServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(REQUEST_TIMEOUT_S)
        try:
            head = _read_head(sock)
        except TimeoutError:
            self._send(408, b"request head not complete in time\n")
            return
        except OSError:
            return  # the client went away
        if head is None:
            self._send(431, b"request head too large\n")
            return
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        method, path = (parts[0], parts[1].split("?", 1)[0]) if len(parts) == 3 else ("", "")
        if method not in ("GET", "HEAD"):
            self._send(405, b"only GET and HEAD\n", extra="Allow: GET, HEAD\r\n")
            return
        if path != "/metrics":
            self._send(404, b"the metrics are at /metrics\n")
            return
        try:
            body = self.server.registry.render()
        except Exception:  # a collector's bug must not kill the server: say so, serve the next scrape
            log.exception("event=metrics_render_failed")
            self._send(500, b"rendering the metrics failed; see the daemon's log\n")
            return
        extra = ""
        if _accepts_gzip(lines[1:]):
            body = gzip.compress(body, GZIP_LEVEL)
            extra = "Content-Encoding: gzip\r\n"
        self._send(200, body, content_type=CONTENT_TYPE, extra=extra, head_only=method == "HEAD")

    def _send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8", extra: str = "",
              head_only: bool = False) -> None:
        head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n").encode()
        with contextlib.suppress(OSError):  # the client went away: nothing to tell it
            self.request.sendall(head if head_only else head + body)


def _read_head(sock: socket.socket) -> bytes | None:
    """The request head up to its blank line; None when it exceeds ``MAX_HEAD_BYTES``.

    Raises:
        TimeoutError: The head did not complete within the socket's timeout.
        OSError: The connection failed or closed first.
    """
    data = b""
    while b"\r\n\r\n" not in data and len(data) <= MAX_HEAD_BYTES:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionResetError("closed before the request head ended")
        data += chunk
    head = data.split(b"\r\n\r\n", 1)[0]
    return head if len(head) <= MAX_HEAD_BYTES else None


def _accepts_gzip(header_lines: list[str]) -> bool:
    for line in header_lines:
        name, _, value = line.partition(":")
        if name.strip().lower() == "accept-encoding":
            return any(c.split(";", 1)[0].strip().lower() == "gzip" for c in value.split(","))
    return False


def serve_metrics(address: str, registry: Registry, key: str = "metrics_listen"
                  ) -> tuple[MetricsServer, threading.Thread, str]:
    """Serve ``registry`` at ``http://<address>/metrics`` from a daemon thread.

    ``address`` is ``host:port`` (``[v6]:port``); port 0 takes a free port. The address bound is
    logged as ``event=listening metrics_listen=<host>:<port>`` (``listen_check.log_bound``).

    Returns:
        The HTTP server (``shutdown()`` stops it), its thread, and the ``host:port`` it bound.

    Raises:
        OSError: The address cannot be bound; the message names ``key``, the cause and the fix.
    """
    check_listen(key, address)
    host, _, port = address.rpartition(":")
    httpd = MetricsServer((host.strip("[]"), int(port)), registry)
    thread = threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return httpd, thread, log_bound(key, address, httpd.server_address[1])
