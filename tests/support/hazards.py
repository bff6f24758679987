"""The measured outcome of a hazard-marked test (the ``hazard`` fixture of tests/conftest.py)."""
from __future__ import annotations


class HazardOutcome:
    """What a ``hazard``-marked test measured, in words with numbers (``docs/RELIABILITY.md``'s last column).

    The test sets ``outcome`` as it measures; ``tests.faults.bad_inputs`` reads it after the test.
    """

    def __init__(self) -> None:
        self.outcome = ""
