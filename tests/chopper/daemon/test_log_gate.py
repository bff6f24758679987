"""LogGate (chopper.daemon.logs): one line per interval for each key, whatever the rate of the problem."""
from __future__ import annotations

from chopper.daemon.logs import LogGate


def test_one_line_per_interval_for_each_key() -> None:
    now = [100.0]
    gate = LogGate(10.0, clock=lambda: now[0])
    assert gate.due("a") and gate.due("b")  # the first of each key is written
    assert not gate.due("a") and not gate.due("b")
    now[0] = 109.9
    assert not gate.due("a")
    now[0] = 110.0
    assert gate.due("a") and not gate.due("a")
    assert gate.due("b")  # each key keeps its own interval
