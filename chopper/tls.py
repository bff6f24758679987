"""TLS material for Chopper's gRPC links: PEM files in, server ``SSLContext`` / client credentials out.

Server side (``ServerTLS``): certificate chain and key, plus, for mutual TLS, the CA bundle that
signs client certificates (then a client without a certificate from that CA is refused). The
context is rebuilt when any of the files changes, so a renewed certificate is served to new
connections without a restart; a renewal that does not load (half-written files) keeps the
previous context in force and logs a warning. TLS 1.2 is the oldest version offered, and ALPN
offers ``h2`` only, as gRPC clients require.

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

# OpenSSL's X509_V_ERR_CERT_HAS_EXPIRED.
_EXPIRED = 10
# What OpenSSL says when the first bytes are not a TLS record: a plaintext client.
_NOT_TLS = {"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "HTTPS_PROXY_REQUEST", "UNKNOWN_PROTOCOL",
            "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE", "UNEXPECTED_RECORD"}


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


class ServerTLS:
    """A TLS server's files and its current ``ssl.SSLContext``.

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
        self._signature = _signature(self._paths())
        self._context = self._build()

    @property
    def mutual(self) -> bool:
        """Whether clients must present a certificate signed by ``client_ca``."""
        return bool(self.client_ca)

    def _paths(self) -> list[str]:
        return [p for p in (self.cert, self.key, self.client_ca) if p]

    def _build(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["h2"])
        _load(ctx, ("tls_cert", self.cert), ("tls_key", self.key), ("tls_client_ca", self.client_ca))
        if self.client_ca:
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def context(self) -> ssl.SSLContext:
        """The context for a new connection, rebuilt first if a file changed."""
        signature = _signature(self._paths())
        with self._lock:
            if signature != self._signature:
                self._signature = signature
                try:
                    self._context = self._build()
                    log.info("event=tls_reloaded cert=%s", self.cert)
                except TlsError as exc:
                    log.warning("event=tls_reload_failed error=%r note='the previous certificate stays in use'",
                                str(exc))
            return self._context


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


def handshake_refusal(exc: BaseException) -> str:
    """The reason a failed server-side handshake is counted under (``REFUSAL_REASONS`` in tls_front)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return "expired_certificate" if exc.verify_code == _EXPIRED else "bad_certificate"
    if isinstance(exc, ssl.SSLError):
        if exc.reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
            return "no_certificate"
        if exc.reason in _NOT_TLS:
            return "not_tls"
    if isinstance(exc, TimeoutError):
        return "handshake_timeout"
    return "handshake_failed"
