"""Pytest plugin of ``python -m tests.faults``: one row per bad-input test run outside ``tests/faults``.

Loaded with ``-p tests.faults.bad_inputs``; appends each test's outcome (its module, the
module's docstring, passed or not) to ``CHOPPER_RELIABILITY_JSON`` for the generator to group.
A test marked ``@pytest.mark.hazard(item=N, input=..., promise=...)`` gets a row of its own
(``type: hazard``) with what it measured (the ``hazard`` fixture's ``outcome``).
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.faults.records import ENV, append


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    path = os.environ.get(ENV)
    # One row per test: its call, or the setup that failed or skipped before it.
    if not path or not (report.when == "call" or (report.when == "setup" and not report.passed)):
        return
    marker = item.get_closest_marker("hazard")
    if marker is not None:
        measured = getattr(item, "funcargs", {}).get("hazard")
        append(path, {"type": "hazard", "test": item.nodeid, **marker.kwargs, "passed": report.passed,
                      "outcome": getattr(measured, "outcome", "") or ("skipped" if report.skipped else "")})
    elif not item.nodeid.startswith("tests/faults/"):
        module = getattr(item, "module", None)
        doc = (getattr(module, "__doc__", None) or "").strip().splitlines()
        append(path, {"type": "bad_input", "test": item.nodeid, "module": item.nodeid.split("::")[0],
                      "about": doc[0] if doc else "", "name": item.name, "passed": report.passed})
