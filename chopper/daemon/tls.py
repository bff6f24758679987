"""TLS material for Chopper's gRPC links: PEM files in, gRPC server and channel credentials out.

Server side (``ServerTLS``): certificate chain and key, plus, for mutual TLS, the CA bundle that
signs client certificates (then gRPC refuses, inside the handshake, every client without a valid
certificate from that CA). gRPC's own TLS does the handshakes; ``credentials()`` gives it a
certificate-configuration fetcher, which gRPC calls before each new connection's handshake.

Client side (``ClientTLS``): the CA bundle that signs the server's certificate (empty: the
system's roots), plus a client certificate and key for mutual TLS. The files are looked at each
time a channel is made, so a long-running agent picks up renewed client certificates on its next
reconnect.

Whoever can write one of these files can let themselves in (their own CA in ``tls_client_ca``
passes mutual TLS) or stand in for the server (their CA in a client's CA bundle), so every file
is read as one that holds trust (``chopper.daemon.auth.TrustedReader``): a regular file of at most
``MAX_PEM_BYTES``, owned by this process's user or root, writable by nobody else; an inode once
seen writable by others is never trusted again. Both sides share one algorithm (``PemFiles``),
at start and on every later look:

1. Compare the files' (device, inode, size, mtime, mode, owner) with those of the set in force;
   unchanged: keep it. (Mode and owner too: a ``chmod`` alone is a change to check.)
2. Read each file through the trust check, check that the set loads together (``ssl``: the key
   belongs to the chain, the CA bundle parses) and that no file changed while being checked; then
   the new set is in force (new connections get it, open ones keep theirs).
3. At start a failure is a ``TlsError`` (a ``ConfigError``) naming the setting, the file and the
   fix. Later, a set that is refused (half-written, or no longer trusted) keeps the previous set
   in force, is counted in ``refused`` by reason (``REFUSAL_REASONS``) and logged as
   ``event=tls_reload_failed``, once per broken state; the next connection looks again.
"""
from __future__ import annotations

import logging
import os
import ssl
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from chopper.daemon.auth import REFUSAL_REASONS as TRUST_REASONS
from chopper.daemon.auth import TrustedReader, refusal_reason
from chopper.daemon.settings import ConfigError

if TYPE_CHECKING:
    import grpc

log = logging.getLogger(__name__)

# A PEM chain or CA bundle is kilobytes; the system's whole root store is ~200 KiB.
MAX_PEM_BYTES = 1 << 20
# Why a reload was refused: the keys of ``PemFiles.refused``.
REFUSAL_REASONS = {
    "unsafe": TRUST_REASONS["unsafe"],
    "tainted": TRUST_REASONS["tainted"],
    "unusable": "a file cannot be read or is not PEM, or the chain, its key and the CA bundle do not load together "
                "(still being written?)",
}

Signature = tuple[tuple[int, int, int, int, int, int], ...]


class TlsError(ConfigError):
    """A TLS file is missing or unusable; the message names the setting and the fix."""


def _signature(paths: Sequence[str]) -> Signature:
    out = []
    for path in paths:
        try:
            st = os.stat(path)
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode, st.st_uid))
        except OSError:
            out.append((0, 0, 0, 0, 0, 0))
    return tuple(out)


class PemFiles:
    """A set of PEM files, named by their settings, taken as one (module docstring).

    Attributes:
        reloads: Changed sets that took effect after the first.
        refused: Changed sets refused, by reason (``REFUSAL_REASONS``); the previous set stayed.
        problem: Why the set now at the paths is refused, or None when it is the set in force.

    Args:
        named: (setting, path) pairs in a fixed order; empty paths are left out.
        pairs: (chain setting, key setting) pairs among them that must load as a chain and its key.
        cas: Settings among them that are CA bundles.

    Raises:
        TlsError: The set does not load (the message names the setting and the fix).
        chopper.daemon.auth.TokenError: A file is not trusted or cannot be read.
    """

    def __init__(self, named: Sequence[tuple[str, str]], pairs: Sequence[tuple[str, str]] = (),
                 cas: Sequence[str] = ()) -> None:
        self.named = {key: path for key, path in named if path}
        self.pairs = [(chain, key) for chain, key in pairs if chain in self.named and key in self.named]
        self.cas = [ca for ca in cas if ca in self.named]
        self.reloads = 0
        self.refused: Counter[str] = Counter({reason: 0 for reason in REFUSAL_REASONS})
        self.problem: str | None = None
        self._reader = TrustedReader()
        self._lock = threading.Lock()
        self._failed: Signature = ()
        self._signature, self.material = self._load()

    def _paths(self) -> list[str]:
        return list(self.named.values())

    def _load(self) -> tuple[Signature, dict[str, bytes]]:
        """The files' signature and bytes, read through the trust check and checked to load together.

        Raises:
            TlsError, chopper.daemon.auth.TokenError: They do not, or they changed while being checked.
        """
        signature = _signature(self._paths())
        material = {}
        for key, path in self.named.items():
            data, _ = self._reader.read(Path(path), key, max_bytes=MAX_PEM_BYTES)
            if b"-----BEGIN" not in data:
                raise TlsError(f"{key}: {path} is not a PEM file (no -----BEGIN line); give the PEM encoding")
            material[key] = data
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        for chain, key in self.pairs:
            try:
                ctx.load_cert_chain(self.named[chain], self.named[key])
            except (ssl.SSLError, OSError) as exc:
                raise TlsError(f"{chain}/{key}: {self.named[chain]} and {self.named[key]} are not a certificate "
                               f"chain and its private key ({getattr(exc, 'reason', None) or exc}); pass the PEM "
                               "chain and the key it was issued for") from None
        for ca in self.cas:
            try:
                ctx.load_verify_locations(cadata=material[ca].decode("ascii", errors="replace"))
            except (ssl.SSLError, ValueError) as exc:
                why = getattr(exc, "reason", None) or exc
                raise TlsError(f"{ca}: {self.named[ca]} holds no usable CA certificate ({why}); pass the PEM bundle "
                               "of the issuing CA") from None
        # ssl read the chain and key by path: the same files only if nothing changed since the reads.
        if _signature(self._paths()) != signature:
            raise TlsError(f"{', '.join(self.named)}: the files changed while they were checked (still being written?)")
        return signature, material

    def refresh(self) -> bool:
        """Take the files again if they changed; whether a new set took effect (never raises).

        Safe from any thread (gRPC calls it from its own); ``reloads`` counts the sets taken.
        """
        signature = _signature(self._paths())
        with self._lock:
            if signature == self._signature:
                return False
            if signature == self._failed:
                return False  # the same broken set as at the last look: counted and warned once
            try:
                self._signature, self.material = self._load()
            except ConfigError as exc:
                reason = refusal_reason(exc)
                self._failed = signature
                self.refused[reason] += 1
                self.problem = str(exc)
                log.warning("event=tls_reload_failed reason=%s error=%r note='the previous certificates stay in use'",
                            reason, self.problem)
                return False
            self._failed = ()
            self.problem = None
            self.reloads += 1
            log.info("event=tls_reloaded files=%s", ",".join(self.named))
            return True

    def check(self) -> None:
        """Take the files again if they changed (as the next connection would), for SIGHUP.

        Raises:
            TlsError: The set now at the paths is refused (``problem``); the previous set stays in force.
        """
        self.refresh()
        if self.problem is not None:
            raise TlsError(f"{self.problem} (the previous certificates stay in use)")


class ServerTLS:
    """A TLS server's files and the gRPC credentials that serve them, renewed as the files change.

    Args:
        cert: PEM certificate chain (``tls_cert``).
        key: PEM private key (``tls_key``).
        client_ca: PEM CA bundle of client certificates (``tls_client_ca``); empty: no client
            certificate asked for.

    Raises:
        ConfigError: A file is unreadable, not trusted, or the chain and key do not load.
    """

    def __init__(self, cert: str, key: str, client_ca: str = "") -> None:
        self.cert = cert
        self.key = key
        self.client_ca = client_ca
        if not (cert and key):
            raise TlsError("tls_cert and tls_key go together: give the server's certificate chain and its key")
        self.files = PemFiles((("tls_cert", cert), ("tls_key", key), ("tls_client_ca", client_ca)),
                              pairs=(("tls_cert", "tls_key"),), cas=("tls_client_ca",))
        self._lock = threading.Lock()
        self._served = 0  # the files' reload count when gRPC was last given their configuration

    @property
    def mutual(self) -> bool:
        """Whether clients must present a certificate signed by ``client_ca``."""
        return bool(self.client_ca)

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        import grpc

        material = self.files.material
        return grpc.ssl_server_certificate_configuration([(material["tls_key"], material["tls_cert"])],
                                                         material.get("tls_client_ca"))

    def credentials(self) -> grpc.ServerCredentials:
        """gRPC server credentials that take renewed files at the next connection (module docstring)."""
        import grpc

        return grpc.dynamic_ssl_server_credentials(self._configuration(), self.fetch,
                                                   require_client_authentication=self.mutual)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """The new configuration when a file changed and the set is taken; None to keep the one in force.

        gRPC calls this before every handshake, from its own threads: it never raises. A set taken
        by ``files.check`` (SIGHUP) in between is handed over here too.
        """
        self.files.refresh()
        with self._lock:
            if self.files.reloads == self._served:
                return None
            self._served = self.files.reloads
            return self._configuration()


class ClientTLS:
    """A TLS client's files.

    Args:
        ca: PEM CA bundle that signs the server's certificate; empty: the system's roots.
        cert: PEM client certificate chain, for mutual TLS (with ``key``).
        key: PEM private key of ``cert``.
        names: The setting names of ``ca``, ``cert`` and ``key``, for messages.

    Raises:
        ConfigError: A file is unreadable or not trusted, or only one of cert and key is given.
    """

    def __init__(self, ca: str = "", cert: str = "", key: str = "",
                 names: tuple[str, str, str] = ("--tls-ca", "--tls-cert", "--tls-key")) -> None:
        self.ca = ca
        self.cert = cert
        self.key = key
        self.names = names
        if bool(cert) != bool(key):
            raise TlsError(f"{names[1]} and {names[2]} go together: give both the client certificate and its key, "
                           "or neither")
        self.files = PemFiles(tuple(zip(names, (ca, cert, key), strict=True)), pairs=((names[1], names[2]),),
                              cas=(names[0],))

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials from the files as they are now, or the last set taken when those are refused."""
        import grpc

        self.files.refresh()
        material = self.files.material
        ca, cert, key = (material.get(name) for name in self.names)
        return grpc.ssl_channel_credentials(ca, key, cert)
