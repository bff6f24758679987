"""A throwaway PKI for the security tests, made with ``cryptography``: CAs, server and client certificates.

EC P-256 keys (generated in microseconds, unlike RSA). Every certificate is written as PEM files
into a directory, so the daemons and the CLI read them exactly as they would in production.
"""
from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NOW = dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class Issued:
    """PEM files of one certificate and its key (``ca`` only for a CA)."""

    cert: str
    key: str


class Authority:
    """A CA that issues server and client certificates into ``directory``."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self._cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(NOW - dt.timedelta(days=1)).not_valid_after(NOW + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.ca = str(directory / f"{name}.ca.pem")
        Path(self.ca).write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, *, server: bool = False, expired: bool = False) -> Issued:
        """A certificate for ``name`` (a server's also for localhost and 127.0.0.1)."""
        key = ec.generate_private_key(ec.SECP256R1())
        if expired:
            before, after = NOW - dt.timedelta(days=10), NOW - dt.timedelta(days=1)
        else:
            before, after = NOW - dt.timedelta(days=1), NOW + dt.timedelta(days=30)
        names: list[x509.GeneralName] = [x509.DNSName(name)]
        if server:
            names += [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(before).not_valid_after(after)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        stem = self.directory / f"{self.name}.{name}{'.expired' if expired else ''}"
        issued = Issued(str(stem) + ".pem", str(stem) + ".key")
        Path(issued.cert).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        Path(issued.key).write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
        return issued


@dataclass(frozen=True)
class Pki:
    """The trusted CA with a server and two client certificates, plus what must be refused."""

    ca: str
    server: Issued
    client_a: Issued
    client_b: Issued
    expired: Issued
    other_ca: str
    stranger: Issued  # a client certificate from other_ca


def make_pki(directory: Path) -> Pki:
    """A trusted CA with its server and client certificates, an expired one and a stranger's, in ``directory``."""
    trusted = Authority(directory, "chopper-ca")
    other = Authority(directory, "other-ca")
    return Pki(
        ca=trusted.ca, server=trusted.issue("chopper-server", server=True), client_a=trusted.issue("agent-a"),
        client_b=trusted.issue("agent-b"), expired=trusted.issue("agent-old", expired=True), other_ca=other.ca,
        stranger=other.issue("agent-x"),
    )


def write_token(path: Path, *tokens: str) -> str:
    """A token file holding ``tokens``, one per line, mode 0600 as the docs say."""
    path.write_text("".join(f"{t}\n" for t in tokens))
    path.chmod(0o600)
    return str(path)
