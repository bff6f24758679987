"""TCP listen addresses: why one cannot be served, in words naming the setting and the fix; what one bound.

gRPC's and ``http.server``'s own bind errors say only that the bind failed (gRPC: "Failed to bind
to address"), so every daemon listener (gRPC ``listen``/``grpc_listen``, ``metrics_listen``)
binds its address once with a plain socket first, the way the server will, and a failure is
turned into its cause: a port in use, an address of another machine, a name that does not
resolve, a privileged port. A listener given port 0 takes a free port, and ``log_bound`` names
it in the log, where a test or an operator reads which one.
"""
from __future__ import annotations

import errno
import logging
import socket

log = logging.getLogger(__name__)


def check_listen(key: str, address: str) -> None:
    """Bind the TCP ``address`` (``host:port``, ``[v6]:port``) once and let go, to name why it cannot be served.

    The name is resolved as gRPC resolves it (every address it gives, passive), and each address is
    bound with ``SO_REUSEADDR`` as gRPC binds it, so a port left in ``TIME_WAIT`` passes. One
    address that binds is enough (gRPC serves those that bind).

    Raises:
        OSError: No address binds; the message names the setting ``key``, the cause and the fix.
    """
    host, _, port_text = address.rpartition(":")
    name, port = host.strip("[]"), int(port_text)
    prefix = f"{key}: cannot bind {address}"
    try:
        found = socket.getaddrinfo(name or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"{prefix}: the host {name!r} does not resolve ({exc.strerror}); use a name this machine "
                      "resolves or one of its addresses: 127.0.0.1 (this node only), 0.0.0.0 (every interface)"
                      ) from None
    failure: OSError | None = None
    for family, kind, proto, _, sockaddr in found:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
                return
            except OSError as exc:
                failure = failure or exc
    assert failure is not None  # getaddrinfo returns at least one address or raises
    fixes = {
        errno.EADDRINUSE: f"port {port} is in use by another process; stop it (`ss -ltnp 'sport = :{port}'` names it) "
                          "or choose another port",
        errno.EADDRNOTAVAIL: f"{name} is not an address of this machine; use one of its addresses, 127.0.0.1 (this "
                             "node only) or 0.0.0.0 (every interface)",
        errno.EACCES: f"binding port {port} needs a privilege the daemon has not (ports below 1024 need "
                      "CAP_NET_BIND_SERVICE); use a port above 1024",
    }
    fix = fixes.get(failure.errno or 0, f"{failure.strerror or failure}; choose another address")
    raise OSError(f"{prefix}: {fix}")


def log_bound(key: str, address: str, port: int) -> str:
    """Log the address the listener of setting ``key`` (``address``, port 0 allowed) bound; returns it.

    One line, ``event=listening <key>=<host>:<port>``, with the host as written in the setting and
    the port the socket really has.
    """
    bound = f"{address.rpartition(':')[0]}:{port}"
    log.info("event=listening %s=%s", key, bound)
    return bound
