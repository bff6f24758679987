"""Fixtures of the fault-injection suite: a FaultRecord per scenario, marked passed from the test's outcome."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.faults.records import FaultRecord, save

_CALL_PASSED = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_CALL_PASSED] = report.passed


@pytest.fixture
def fault_record(request: pytest.FixtureRequest) -> Iterator[FaultRecord]:
    """The scenario's row; saved after the test with ``passed`` taken from its outcome."""
    record = FaultRecord(test=request.node.nodeid)
    yield record
    record.passed = request.node.stash.get(_CALL_PASSED, False)
    save(record)
