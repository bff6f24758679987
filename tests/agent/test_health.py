"""Per-GPU health tracking: what grew between readings, the status it gives, and the steps it flags."""
from __future__ import annotations

from agent.health import CRITICAL, HEALTHY, MAX_XID_CODES, STATUS_WINDOW_NS, WARNING, HealthTracker
from chopper.schema import ErrorCount

S = 10**9


def _ecc(corrected: float, uncorrected: float = 0.0) -> tuple[ErrorCount, ...]:
    return (ErrorCount("ecc_corrected", "volatile", "total", corrected),
            ErrorCount("ecc_uncorrected", "volatile", "total", uncorrected))


def test_the_first_reading_is_a_baseline_and_growth_is_an_event() -> None:
    h = HealthTracker()
    h.update(0, 1 * S, _ecc(7.0))  # errors from before the agent started: not this run's
    assert h.status(0, 1 * S) == HEALTHY and h.moved_between(0, 0, 2 * S) == ()
    h.update(0, 2 * S, _ecc(7.0))
    h.update(0, 3 * S, _ecc(57.0))
    assert h.status(0, 3 * S) == WARNING
    assert h.moved_between(0, int(2.5 * S), int(2.6 * S)) == ("ecc_corrected",)  # inside (2 s, 3 s]
    assert h.moved_between(0, 0, 2 * S) == ()  # ended before the interval in which it grew
    assert h.moved_between(0, int(3.1 * S), 4 * S) == ()
    assert h.status(0, 3 * S + STATUS_WINDOW_NS + 1) == HEALTHY  # the window passed
    assert dict((e.kind, e.value) for e in h.counters(0)) == {"ecc_corrected": 57.0, "ecc_uncorrected": 0.0}


def test_uncorrectable_errors_and_failed_remaps_are_critical_and_pending_repairs_warn() -> None:
    h = HealthTracker()
    h.update(1, 1 * S, _ecc(0.0))
    h.update(1, 2 * S, _ecc(0.0, 1.0))
    assert h.status(1, 2 * S) == CRITICAL
    pending = HealthTracker()
    pending.update(0, 1 * S, (ErrorCount("remap_pending", "", "", 1.0),))
    assert pending.status(0, 1 * S) == WARNING  # a state counts from the first reading on
    pending.update(0, 2 * S, (ErrorCount("remap_pending", "", "", 0.0), ErrorCount("remap_failed", "", "", 1.0)))
    assert pending.status(0, 2 * S) == CRITICAL
    assert pending.status(7, 2 * S) is None  # no reading of that GPU


def test_xids_by_severity_and_new_codes_count_from_zero() -> None:
    h = HealthTracker()
    h.update(0, 1 * S, ())
    h.update(0, 2 * S, (ErrorCount("xid", "", "13", 4.0),))  # the application's own fault
    assert h.status(0, 2 * S) == HEALTHY and h.moved_between(0, S, 2 * S) == ("xid",)
    h.update(0, 3 * S, (ErrorCount("xid", "", "13", 4.0), ErrorCount("xid", "", "79", 1.0)))
    assert h.status(0, 3 * S) == CRITICAL


def test_xid_codes_beyond_the_bound_are_summed_as_other() -> None:
    h = HealthTracker()
    h.update(0, 1 * S, ())
    many = tuple(ErrorCount("xid", "", str(100 + i), 1.0) for i in range(MAX_XID_CODES + 3))
    h.update(0, 2 * S, many)
    codes = {e.detail: e.value for e in h.counters(0) if e.kind == "xid"}
    assert len(codes) == MAX_XID_CODES + 1 and codes["other"] == 3.0
