"""TLS material for Chopper's gRPC links: PEM files in, gRPC server and channel credentials out.

Server side (``ServerTLS``): certificate chain and key, plus, for mutual TLS, the CA bundle that
signs client certificates (then gRPC refuses, inside the handshake, every client without a valid
certificate from that CA). gRPC's own TLS does the handshakes; ``credentials()`` gives it a
certificate-configuration fetcher, which gRPC calls before each new connection's handshake.
Algorithm of the fetcher:

1. Compare the files' (inode, size, mtime) with those of the configuration in force; unchanged:
   keep it (return None).
2. Read the files' bytes, check that they load together (``ssl``: the key belongs to the chain,
   the CA bundle parses) and that the files did not change while being checked; then hand gRPC
   the new configuration, which new connections get (open ones keep theirs).
3. A set that does not load (half-written files) keeps the previous configuration and logs a
   warning; the next connection tries again.

Client side (``ClientTLS``): the CA bundle that signs the server's certificate (empty: the
system's roots), plus a client certificate and key for mutual TLS. Files are read each time a
channel is made, so a long-running agent picks up renewed client certificates on its next
reconnect.

Both check their files at start and raise ``TlsError`` naming the setting, the file and the fix.
"""
from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from chopper.settings import ConfigError

if TYPE_CHECKING:
    import grpc

log = logging.getLogger(__name__)


class TlsError(ConfigError):
    """A TLS file is missing or unusable; the message names the setting and the fix."""


def _readable(named: Sequence[tuple[str, str]]) -> None:
    for key, path in named:
        if not path:
            continue
        try:
            with open(path, "rb") as f:
                head = f.read(64)
        except OSError as exc:
            raise TlsError(f"{key}: {path} cannot be read ({exc.strerror}); check the path and that the daemon's "
                           "user may read it") from None
        if b"-----BEGIN" not in head:
            raise TlsError(f"{key}: {path} is not a PEM file (no -----BEGIN line at its start); give the PEM "
                           "encoding")


def _load(ctx: ssl.SSLContext, cert: tuple[str, str], key: tuple[str, str], ca: tuple[str, str]) -> None:
    """Load a chain and key and/or a CA bundle into ``ctx``, with errors that name the settings."""
    _readable((cert, key, ca))
    if cert[1]:
        try:
            ctx.load_cert_chain(cert[1], key[1])
        except ssl.SSLError as exc:
            raise TlsError(f"{cert[0]}/{key[0]}: {cert[1]} and {key[1]} are not a certificate chain and its private "
                           f"key ({exc.reason or exc}); pass the PEM chain and the key it was issued for") from None
    if ca[1]:
        try:
            ctx.load_verify_locations(cafile=ca[1])
        except ssl.SSLError as exc:
            raise TlsError(f"{ca[0]}: {ca[1]} holds no usable CA certificate ({exc.reason or exc}); pass the PEM "
                           "bundle of the issuing CA") from None


def _signature(paths: Sequence[str]) -> tuple[tuple[int, int, int], ...]:
    out = []
    for path in paths:
        try:
            st = os.stat(path)
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((0, 0, 0))
    return tuple(out)


def _read(paths: Sequence[str]) -> tuple[bytes, ...]:
    out = []
    for path in paths:
        with open(path, "rb") as f:
            out.append(f.read())
    return tuple(out)


class ServerTLS:
    """A TLS server's files and the gRPC credentials that serve them, renewed as the files change.

    Args:
        cert: PEM certificate chain (``tls_cert``).
        key: PEM private key (``tls_key``).
        client_ca: PEM CA bundle of client certificates (``tls_client_ca``); empty: no client
            certificate asked for.

    Raises:
        TlsError: A file is unreadable or the chain and key do not load.
    """

    def __init__(self, cert: str, key: str, client_ca: str = "") -> None:
        self.cert = cert
        self.key = key
        self.client_ca = client_ca
        self._lock = threading.Lock()
        self._signature, self._material = self._load()
        self._failed: tuple[tuple[int, int, int], ...] = ()

    @property
    def mutual(self) -> bool:
        """Whether clients must present a certificate signed by ``client_ca``."""
        return bool(self.client_ca)

    def _paths(self) -> list[str]:
        return [p for p in (self.cert, self.key, self.client_ca) if p]

    def _load(self) -> tuple[tuple[tuple[int, int, int], ...], tuple[bytes, ...]]:
        """The files' signature and bytes, checked to load together.

        Raises:
            TlsError: They do not, or they changed while being checked.
        """
        signature = _signature(self._paths())
        _load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), ("tls_cert", self.cert), ("tls_key", self.key),
              ("tls_client_ca", self.client_ca))
        try:
            material = _read(self._paths())
        except OSError as exc:
            raise TlsError(f"tls_cert: {exc.filename} cannot be read ({exc.strerror})") from None
        if _signature(self._paths()) != signature:
            raise TlsError("tls_cert: the files changed while they were checked (still being written?)")
        return signature, material

    def _configuration(self, material: tuple[bytes, ...]) -> grpc.ServerCertificateConfiguration:
        import grpc

        chain, key = material[0], material[1]
        return grpc.ssl_server_certificate_configuration([(key, chain)], material[2] if self.client_ca else None)

    def credentials(self) -> grpc.ServerCredentials:
        """gRPC server credentials that take renewed files at the next connection (module docstring)."""
        import grpc

        return grpc.dynamic_ssl_server_credentials(self._configuration(self._material), self.fetch,
                                                   require_client_authentication=self.mutual)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """The new configuration when a file changed and the set loads; None to keep the one in force.

        gRPC calls this before every handshake, from its own threads: it must never raise.
        """
        signature = _signature(self._paths())
        with self._lock:
            if signature in (self._signature, self._failed):
                return None  # unchanged, or the same broken set as at the last attempt (warned once)
            try:
                self._signature, self._material = self._load()
            except TlsError as exc:
                self._failed = signature
                log.warning("event=tls_reload_failed error=%r note='the previous certificate stays in use'", str(exc))
                return None
            log.info("event=tls_reloaded cert=%s", self.cert)
            return self._configuration(self._material)


class ClientTLS:
    """A TLS client's files.

    Args:
        ca: PEM CA bundle that signs the server's certificate; empty: the system's roots.
        cert: PEM client certificate chain, for mutual TLS (with ``key``).
        key: PEM private key of ``cert``.
        names: The setting names of ``ca``, ``cert`` and ``key``, for messages.

    Raises:
        TlsError: A file is unreadable, or only one of cert and key is given.
    """

    def __init__(self, ca: str = "", cert: str = "", key: str = "",
                 names: tuple[str, str, str] = ("--tls-ca", "--tls-cert", "--tls-key")) -> None:
        self.ca = ca
        self.cert = cert
        self.key = key
        if bool(cert) != bool(key):
            raise TlsError(f"{names[1]} and {names[2]} go together: give both the client certificate and its key, "
                           "or neither")
        _load(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), (names[1], cert), (names[2], key), (names[0], ca))

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials from the files as they are now."""
        import grpc

        def read(path: str) -> bytes | None:
            if not path:
                return None
            with open(path, "rb") as f:
                return f.read()

        return grpc.ssl_channel_credentials(read(self.ca), read(self.key), read(self.cert))
