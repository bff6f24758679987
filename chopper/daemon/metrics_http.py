"""A daemon's Prometheus ``/metrics`` over HTTP, on the address of its ``metrics_listen`` setting."""
from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from chopper.daemon.listen_check import check_listen, log_bound


def serve_metrics(address: str, registry: CollectorRegistry, key: str = "metrics_listen"
                  ) -> tuple[WSGIServer, threading.Thread, str]:
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
    httpd, thread = start_http_server(int(port), addr=host.strip("[]"), registry=registry)
    return httpd, thread, log_bound(key, address, httpd.server_address[1])
