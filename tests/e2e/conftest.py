"""Fixtures of the end-to-end tests; the helpers they share with other folders are in tests/support."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemons import AgentProcess


@pytest.fixture
def agent_process(tmp_path: Path) -> Iterator[AgentProcess]:
    agent = AgentProcess(tmp_path).start()
    yield agent
    if agent.proc is not None and agent.proc.poll() is None:
        agent.terminate()
