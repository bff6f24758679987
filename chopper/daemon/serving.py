"""One way both daemons serve gRPC: access checks on every RPC, health, and TCP listeners with TLS.

``SecureServer`` builds the ``grpc.Server`` with ``chopper.daemon.access.AccessControl`` as its
interceptor, registers the health service, and adds listeners: a unix socket, plaintext TCP, or
TCP with gRPC's own TLS (``chopper.daemon.tls.ServerTLS``: renewed certificates are taken at the next
connection). Every plaintext TCP listener is logged as a warning at start: on loopback every
local user can reach it (no file mode or group guards a port), elsewhere the network can.

Streams hold a worker thread each for their whole life, so the pool has ``max_workers`` threads
for streams (``chopper.daemon.ratelimit.StreamSlots``: one client may hold ``STREAM_SHARE`` of them)
plus ``reserve_workers(max_workers)`` that only calls which are not streams, and the refusals of
streams over their slots, can use: a client holding every stream it may still leaves GetInfo,
health and the other clients' streams served.

gRPC's own receive limit is set to twice ``max_message_bytes`` so that messages between the two
reach the access check and are counted as ``too_large``.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
from collections.abc import Sequence
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from chopper.daemon.access import AccessControl, Refusals
from chopper.daemon.auth import TokenFile
from chopper.daemon.listen_check import check_listen, log_bound
from chopper.daemon.ratelimit import StreamSlots
from chopper.daemon.settings import ConfigError, is_loopback
from chopper.daemon.tls import ServerTLS

log = logging.getLogger(__name__)
# Seconds a retired spare server (serve_unix_again) lets its open streams run before it cuts them.
SPARE_GRACE_S = 30.0
# Share of the stream slots one client may hold: the others always keep a quarter.
STREAM_SHARE = 0.75


def reserve_workers(max_workers: int) -> int:
    """Worker threads kept beyond the stream slots for unary calls and refusals: 1/8, at least 8."""
    return max(8, max_workers // 8)


# The access settings both daemons share: (default, help); {listen} is the daemon's TCP listener setting.
ACCESS_SETTINGS: dict[str, tuple[Any, str]] = {
    "tls_cert": ("", "PEM certificate chain: {listen} speaks TLS only (empty: plaintext)"),
    "tls_key": ("", "PEM private key of tls_cert"),
    "tls_client_ca": ("", "PEM CA bundle: {listen} requires a client certificate it signed (mutual TLS)"),
    "rate_limit_calls_per_s": (100.0, "calls per second per client and RPC, bursts of 2 s (0: no limit)"),
    "rate_limit_messages_per_s": (1000.0, "messages per second per client stream, bursts of 2 s (0: no limit)"),
}


def access_field(name: str, listen: str) -> Any:
    """The dataclass field of the shared access setting ``name`` for a daemon whose TCP listener is ``listen``."""
    default, help_text = ACCESS_SETTINGS[name]
    return dataclasses.field(default=default, metadata={"help": help_text.format(listen=listen)})


def server_tls(s: Any) -> ServerTLS | None:
    """The ``ServerTLS`` of a daemon's ``tls_cert``/``tls_key``/``tls_client_ca`` settings, or None."""
    return ServerTLS(s.tls_cert, s.tls_key, s.tls_client_ca) if s.tls_cert else None


def check_server_access(s: Any, listen_key: str) -> None:
    """Validate a daemon's TLS and rate-limit settings (``listen_key``: the TCP listener TLS applies to).

    Raises:
        ConfigError: A value is inconsistent, or a file is unreadable or does not load.
    """
    if s.tls_cert or s.tls_key or s.tls_client_ca:
        if not getattr(s, listen_key):
            raise ConfigError(f"tls_cert: TLS applies to {listen_key}, which is empty; set {listen_key} to host:port "
                              "or leave the tls_* settings empty")
        if not (s.tls_cert and s.tls_key):
            raise ConfigError("tls_cert and tls_key go together: give the server's certificate chain and its key "
                              "(tls_client_ca needs them too)")
        server_tls(s)
    for key in ("rate_limit_calls_per_s", "rate_limit_messages_per_s"):
        value = getattr(s, key)
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"{key}: {value!r} is not a rate; use 0 (no limit) or a positive number per second")


class SecureServer:
    """A started-on-demand gRPC server with Chopper's access checks, health and listeners.

    Args:
        handlers: The services' generic handlers.
        services: Their full names, marked SERVING in health once started.
        refusals: Where refused calls and connections are counted (read by the metrics).
        max_workers: Most streams open at once (each holds a worker thread); the pool has
            ``reserve_workers(max_workers)`` more for the other calls.
        max_message_bytes: Largest request message accepted.
        max_send_bytes: Largest response message.
        calls_per_s: Calls per second per client and RPC (0: unlimited).
        messages_per_s: Messages per second per client stream (0: unlimited).
        token_file: Bearer tokens for ``token_rpcs`` (empty: none needed).
        token_rpcs: Method names that need a token when ``token_file`` is set.

    Raises:
        chopper.daemon.auth.TokenError: The token file is unusable.
    """

    def __init__(self, handlers: Sequence[grpc.GenericRpcHandler], services: Sequence[str], refusals: Refusals, *,
                 max_workers: int, max_message_bytes: int, max_send_bytes: int, calls_per_s: float,
                 messages_per_s: float, token_file: str = "", token_rpcs: frozenset[str] = frozenset()) -> None:
        self.refusals = refusals
        self.tls: ServerTLS | None = None  # the TCP listener's TLS files, which it re-reads (add_tcp)
        self.streams = StreamSlots(max_workers, max(1, int(max_workers * STREAM_SHARE)))
        self.access = AccessControl(
            refusals, max_message_bytes=max_message_bytes, calls_per_s=calls_per_s, messages_per_s=messages_per_s,
            tokens=TokenFile(token_file) if token_file else None, token_rpcs=token_rpcs, streams=self.streams,
        )
        self._options = [
            ("grpc.max_receive_message_length", 2 * max_message_bytes),
            ("grpc.max_send_message_length", max_send_bytes),
            ("grpc.so_reuseport", 0),
            # No bandwidth-delay probing: it grows a stream's HTTP/2 receive window to whatever a flooding
            # client pushes, so the daemon buffers far more than it parses (RSS 127 → 528 MiB in the
            # marker-flood fault test); the default 64 KiB window paces a sender to the daemon.
            ("grpc.http2.bdp_probe", 0),
        ]
        self._handlers = tuple(handlers)
        self._max_workers = max_workers
        self.health_servicer = health.HealthServicer()
        self.server = self._grpc_server()
        self.services = tuple(services)
        # Servers that took over a unix socket path after its file was removed (serve_unix_again).
        self.spares: list[grpc.Server] = []
        self._spare_count = 0

    def _grpc_server(self) -> grpc.Server:
        workers = self._max_workers + reserve_workers(self._max_workers)
        pool = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpc")
        server = grpc.server(pool, options=self._options, interceptors=[self.access])
        server.add_generic_rpc_handlers(self._handlers)
        health_pb2_grpc.add_HealthServicer_to_server(self.health_servicer, server)
        return server

    def add_unix(self, path: str) -> None:
        """Listen on the unix socket ``path`` (the caller sets its mode and group)."""
        self.server.add_insecure_port(f"unix:{path}")

    def serve_unix_again(self, path: str) -> None:
        """Listen on ``path`` anew, from a second gRPC server with the same services and checks.

        For a unix socket whose file was removed while the server ran: the first server keeps its
        open streams (their connections do not need the file), and new clients reach the second.
        gRPC cannot add a port to a started server, hence a spare server rather than a new port.
        A previous spare, whose file is gone too, is retired: its streams get ``SPARE_GRACE_S`` to
        end (clients then reconnect to the new socket), so repeated removals hold one spare at most.

        gRPC unlinks a unix socket by the name it was bound to when its server stops, so a spare is
        bound to a name of its own and renamed onto ``path``: retiring it later unlinks a name that
        no longer exists, never the socket that replaced it.
        """
        self._spare_count += 1
        bound = f"{path}.spare-{self._spare_count}"
        spare = self._grpc_server()
        spare.add_insecure_port(f"unix:{bound}")
        spare.start()
        os.rename(bound, path)
        if self.spares:
            self.spares.pop().stop(SPARE_GRACE_S)
        self.spares.append(spare)

    def add_tcp(self, address: str, tls: ServerTLS | None, key: str = "listen") -> int:
        """Listen on ``host:port`` (port 0: any free one), over TLS when ``tls`` is given; returns the port.

        The address bound is logged as ``event=listening <key>=<host>:<port>``.

        Raises:
            OSError: The address cannot be bound; the message names the setting ``key``.
        """
        check_listen(key, address)
        host = address.rpartition(":")[0]
        if tls is None:
            if is_loopback(host):
                log.warning("event=plaintext_listen %s=%s note='plaintext gRPC on loopback: every local user can "
                            "connect (no file mode or group guards a port) and send data in any job's or node's "
                            "name; set tls_cert, tls_key and tls_client_ca, or leave %s empty (docs/SECURITY.md)'",
                            key, address, key)
            else:
                log.warning("event=plaintext_listen %s=%s note='gRPC without TLS is reachable from the network: set "
                            "tls_cert and tls_key (and tls_client_ca), or bind 127.0.0.1'", key, address)
        try:
            port = (self.server.add_insecure_port(address) if tls is None
                    else self.server.add_secure_port(address, tls.credentials()))
        except RuntimeError:
            port = 0
        if port == 0:  # the address bound a moment ago (check_listen): something took it since
            raise OSError(f"{key}: cannot bind {address}; is the port in use?")
        if tls is not None:
            self.tls = tls
            log.info("event=tls_listen %s=%s port=%d mutual=%s", key, address, port, tls.mutual)
        log_bound(key, address, port)
        return int(port)

    def start(self) -> None:
        self.server.start()
        for name in ("", *self.services):
            self.health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace: float | None) -> threading.Event:
        """Stop accepting, let calls finish for ``grace`` s; set when every server (spares too) stopped."""
        stopped = [server.stop(grace) for server in (self.server, *self.spares)]
        done = threading.Event()

        def finish() -> None:
            for event in stopped:
                event.wait()
            done.set()

        threading.Thread(target=finish, name="grpc-stop", daemon=True).start()
        return done

    def __getattr__(self, name: str) -> Any:
        return getattr(self.server, name)
