"""Hypothesis profiles of the fuzz suite (docs/FUZZING.md).

``fuzz`` (the default, what ``make test`` runs): derandomized, so CI sees the same examples every
run, and no example database, so nothing is written into the tree; each test's
``@fuzz(examples, timeout_s)`` (``tests/support/strategies.py``) bounds its examples so that the
whole suite stays within its share of the test budget.

``fuzz-long`` (``CHOPPER_FUZZ_EXAMPLES=N``): random examples, N per test (timeouts scaled to
match), and hypothesis's example database in ``.hypothesis/`` (gitignored), so a failure found
once is replayed first next time. No deadline in either: a hang is caught by each test's
timeout, because a per-example deadline fails spuriously on a shared, loaded CI machine.
"""
from __future__ import annotations

from hypothesis import HealthCheck, settings

from tests.support.strategies import LONG_EXAMPLES

_COMMON = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                              HealthCheck.function_scoped_fixture],
    "print_blob": True,
}
settings.register_profile("fuzz", derandomize=True, database=None, **_COMMON)
settings.register_profile("fuzz-long", derandomize=False, **_COMMON)
settings.load_profile("fuzz-long" if LONG_EXAMPLES else "fuzz")
