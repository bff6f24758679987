"""TLS in front of a gRPC server: handshakes checked and counted here, plaintext to a private socket.

gRPC's own TLS refuses a bad client certificate inside its handshake, where the application never
hears of it, so a refusal could not be counted or logged. This front does the handshake itself
(OpenSSL through ``ssl``) and passes the decrypted HTTP/2 bytes to the gRPC server's private unix
socket. Algorithm, per accepted TCP connection:

1. Over ``max_connections`` open ones: close it, counted as ``too_many_connections``.
2. TLS handshake with the current ``ServerTLS`` context, within ``handshake_timeout_s``. A failure
   is counted by reason (``REFUSAL_REASONS``) and the connection closed; with mutual TLS that is
   every client without a valid certificate from ``tls_client_ca`` (missing, wrong CA, expired),
   and every plaintext client.
3. Connect to the upstream socket from a socket bound to a fresh path in the private directory.
   gRPC reports that path as the call's peer, so ``Peers.lookup(context.peer())`` gives the
   access checks the client's verified identity (certificate common name, else its address).
4. Copy bytes both ways until either side closes, then close both and forget the path.

The private directory is created 0700 by ``tempfile.mkdtemp``, so no other user can reach the
plaintext side. One event-loop thread serves every connection.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from chopper.tls import ServerTLS, handshake_refusal

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0
REFUSAL_REASONS = {
    "no_certificate": "mutual TLS: the client presented no certificate",
    "bad_certificate": "the client's certificate is not signed by tls_client_ca (or otherwise invalid)",
    "expired_certificate": "the client's certificate has expired (or is not valid yet)",
    "not_tls": "the client spoke plaintext to a TLS listener",
    "handshake_timeout": f"the TLS handshake did not finish within {HANDSHAKE_TIMEOUT_S:g} s",
    "handshake_failed": "the TLS handshake failed otherwise (e.g. the client did not trust our certificate)",
    "too_many_connections": "the listener already held its most open connections",
}
CHUNK = 256 * 1024


@dataclass(frozen=True)
class Peer:
    """A client the front let through: ``identity`` keys its rate limits, ``address`` is its TCP peer."""

    identity: str
    address: str


class Peers:
    """gRPC peer strings of the front's upstream connections, mapped to their clients."""

    def __init__(self) -> None:
        self._peers: dict[str, Peer] = {}
        self._lock = threading.Lock()

    def add(self, peer: str, info: Peer) -> None:
        with self._lock:
            self._peers[peer] = info

    def remove(self, peer: str) -> None:
        with self._lock:
            self._peers.pop(peer, None)

    def lookup(self, peer: str) -> Peer | None:
        with self._lock:
            return self._peers.get(peer)


def _common_name(cert: dict | None) -> str:
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


class TlsFront:
    """Terminates TLS on ``host:port`` for a gRPC server listening on ``upstream_path``.

    Args:
        host: Address to bind.
        port: Port to bind (0: any free one; ``start`` returns it).
        tls: Server certificate files.
        refused: Called with a ``REFUSAL_REASONS`` key for each refused connection.
        peers: Where upstream peers are registered for the access checks.
        max_connections: Most connections open at once.
        handshake_timeout_s: Longest a TLS handshake may take, seconds.
    """

    def __init__(self, host: str, port: int, tls: ServerTLS, refused: Callable[[str], None], peers: Peers,
                 max_connections: int = 1024, handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.refused = refused
        self.peers = peers
        self.max_connections = max_connections
        self.handshake_timeout_s = handshake_timeout_s
        self.directory = Path(tempfile.mkdtemp(prefix="chopper-tls-"))
        self.upstream_path = str(self.directory / "grpc.sock")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tls-front", daemon=True)
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._next = 0

    def start(self) -> int:
        """Bind and serve; returns the bound port.

        Raises:
            OSError: The address cannot be bound.
        """
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, self.host.strip("[]"), self.port, reuse_address=True), self._loop)
        try:
            self._server = future.result(10.0)
        except OSError:
            self.close()
            raise
        return int(self._server.sockets[0].getsockname()[1])

    def stop_accepting(self) -> None:
        """Close the listening socket; connections already open go on."""
        if self._server is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._server.close)

    def close(self) -> None:
        """Close every connection, stop the loop thread and remove the private directory."""
        if self._thread.is_alive():
            async def shut() -> None:
                if self._server is not None:
                    self._server.close()
                for writer in list(self._open):
                    writer.transport.abort()

            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(shut(), self._loop).result(5.0)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
        shutil.rmtree(self.directory, ignore_errors=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._open) >= self.max_connections:
            self._refuse("too_many_connections", writer)
            writer.transport.abort()
            return
        self._open.add(writer)
        upstream: asyncio.StreamWriter | None = None
        path = ""
        try:
            try:
                await writer.start_tls(self.tls.context(), ssl_handshake_timeout=self.handshake_timeout_s)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, EOFError) as exc:
                self._refuse(handshake_refusal(exc), writer, exc)
                return
            address = _address(writer.get_extra_info("peername"))
            name = _common_name(writer.get_extra_info("peercert"))
            self._next += 1
            path = str(self.directory / f"c{self._next}")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(path)
            sock.setblocking(False)
            await self._loop.sock_connect(sock, self.upstream_path)
            self.peers.add(f"unix:{path}", Peer(f"cn:{name}" if name else address.rsplit(":", 1)[0], address))
            up_reader, upstream = await asyncio.open_unix_connection(sock=sock)
            await asyncio.gather(_copy(reader, upstream), _copy(up_reader, writer))
        except OSError as exc:  # the upstream is gone (server stopping): drop this client
            log.debug("event=tls_front_upstream_failed error=%r", str(exc))
        finally:
            self._open.discard(writer)
            for w in (writer, upstream):
                if w is not None:
                    w.close()
            if path:
                self.peers.remove(f"unix:{path}")
                Path(path).unlink(missing_ok=True)

    def _refuse(self, reason: str, writer: asyncio.StreamWriter, exc: BaseException | None = None) -> None:
        self.refused(reason)
        log.info("event=connection_refused reason=%s client=%s error=%r", reason,
                 _address(writer.get_extra_info("peername")), str(exc) if exc else "")


def _address(peername: object) -> str:
    """``ipv4:host:port`` / ``ipv6:[host]:port``, as gRPC spells peers."""
    if isinstance(peername, tuple) and len(peername) >= 2:
        host, port = peername[0], peername[1]
        return f"ipv6:[{host}]:{port}" if ":" in str(host) else f"ipv4:{host}:{port}"
    return "unknown"


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF or an error, then close the writing side (which ends the other copy too).

    ``close`` flushes what is buffered first: the last bytes gRPC sends (trailers, GOAWAY) arrive.
    """
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()
