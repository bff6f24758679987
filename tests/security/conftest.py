"""Certificates and tokens for the security tests, generated fresh for each session."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.security.pki import Authority, Issued


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


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
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
