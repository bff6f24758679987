"""The one rule for Kineto times: µs numbers → int64 ns, and the whole-µs rounding HTA applies.

Units. The Chrome trace format that Kineto writes puts ``ts`` and ``dur`` in **microseconds**,
whatever the trace's ``displayTimeUnit`` says: that key ("ms", or "ns" in builds with
``DISPLAY_TRACE_IN_NS``) only tells a viewer how to label its axis. Older PyTorch wrote whole µs as
JSON integers; newer Kineto writes every time as ``{µs}.{ns:03}`` (a JSON float carrying ns
resolution). Holistic Trace Analysis (HTA) 0.5.0 reads both as µs and ignores ``displayTimeUnit``;
so does Chopper.

HTA's rule, from its trace parser (``round_down_time_stamps`` in ``hta/common/trace_parser.py``):
after loading every event into one table, if the ``ts`` column is floating point (some event wrote
a float ``ts``, or some event has no ``ts``), every event's start is rounded **up** to a whole µs
and its end (``ts + dur``) **down** to a whole µs; otherwise times are used as written. An event
that lies inside one µs then ends before it starts; HTA keeps that negative duration, which takes
1 µs off the busy time of the intervals it is merged with. Chopper makes such an event empty at its
rounded start instead (it covers no whole µs), so busy time never shrinks because a kernel ran
(docs/TRACE.md, "Where we differ from HTA").
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

US_NS = 1000  # ns per µs
# Times and durations beyond ±2**62 ns (146 years) are garbage; the bound also keeps ts + dur in int64.
MAX_NS = 2**62
MAX_US = MAX_NS / US_NS  # the same bound in µs, the unit Kineto writes


def kineto_time_ns(value: Any) -> int | None:
    """A Kineto ``ts`` or ``dur`` (µs, JSON int or float) as int ns; None when it is no such number.

    Algorithm:
        1. Refuse booleans, non-numbers, NaN and magnitudes beyond ``MAX_NS`` ns.
        2. An int is whole µs: × 1000, exact at any size.
        3. A float is split into its whole µs (exact) and its fraction, which is rounded to the
           nearest ns. Kineto writes ns as three decimals, and a float64 keeps them exactly below
           2**52 / 1000 µs ≈ 52 days of trace clock (PyTorch ≥ 2.1 times count from
           ``baseTimeNanoseconds``); wall-clock µs since the epoch, as older traces wrote them,
           carry 0.25 µs steps in a float64 already when the JSON is parsed, for HTA as for us.

    Args:
        value: The JSON value of ``ts`` or ``dur``.

    Returns:
        Nanoseconds, or None.
    """
    # The two exact types first and alone: the reader calls this per event.
    if type(value) is int:  # whole µs, as most traces write ts
        return value * US_NS if -MAX_US < value < MAX_US else None
    if type(value) is float:  # ns as decimals, as newer Kineto writes every time
        if not -MAX_US < value < MAX_US:  # NaN fails too
            return None
        whole = math.floor(value)
        return whole * US_NS + round((value - whole) * US_NS)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return kineto_time_ns(int(value) if isinstance(value, int) else float(value))  # a subclass, as its base type


def hta_rounds(ts: Any) -> bool:
    """Whether one event's ``ts`` makes HTA round the whole trace (a float, or no ``ts`` at all).

    HTA tests the dtype of the ``ts`` column of all events: a float anywhere, or a missing value
    (NaN), makes it floating point. The reader ORs this over every event of the file.
    """
    return ts is None or isinstance(ts, float)


def ceil_us(ns: np.ndarray, rounding: bool) -> np.ndarray:
    """Start times (ns) rounded up to whole µs when ``rounding``, else unchanged (int64)."""
    v = np.asarray(ns, dtype=np.int64)
    return -((-v) // US_NS) * US_NS if rounding else v


def hta_interval(start_ns: np.ndarray, end_ns: np.ndarray, rounding: bool) -> tuple[np.ndarray, np.ndarray]:
    """Event intervals as HTA times them: inward to whole µs when ``rounding`` (see module docstring).

    Algorithm:
        1. Without rounding, the exact ns times are returned.
        2. With rounding: start = ceil(start / 1 µs) µs, end = floor(end / 1 µs) µs.
        3. An end that falls before its start (the event lies inside one µs) is set to the start:
           an empty interval, where HTA keeps a duration of −1 µs.

    Args:
        start_ns: Starts (ns).
        end_ns: Ends (ns), ``end >= start``.
        rounding: The trace's HTA rounding flag (``Trace.fractional_ts``).

    Returns:
        ``(start, end)`` in ns, int64.
    """
    start = ceil_us(start_ns, rounding)
    end = np.asarray(end_ns, dtype=np.int64)
    if rounding:
        end = np.maximum((end // US_NS) * US_NS, start)
    return start, end


__all__ = ["MAX_NS", "MAX_US", "US_NS", "ceil_us", "hta_interval", "hta_rounds", "kineto_time_ns"]
