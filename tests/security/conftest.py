"""Certificates and tokens for the security tests, generated fresh for each session (tests/support/pki.py)."""
from __future__ import annotations

import pytest

from tests.support.pki import Pki, make_pki


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))
