"""The collective-source rule (chopper/attribution/collective_source.py) on hand-computed steps.

Times are whole milliseconds written as ns so every expected figure is exact arithmetic.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from chopper.attribution.collective_source import (
    SOURCE_INSPECTOR,
    SOURCE_LABELS,
    SOURCE_MARKERS,
    SOURCE_NONE,
    Intervals,
    clip_to_steps,
    step_collectives,
)
from chopper.proto.chopper.v1 import agent_pb2 as pb

MS = 1_000_000


def iv(rows: list[tuple[int, int, int, float]]) -> Intervals:
    """Intervals from (step, lo_ms, hi_ms, bytes) rows."""
    a = np.array(rows, dtype=np.float64).reshape(-1, 4)
    return Intervals(a[:, 0].astype(np.int64), (a[:, 1] * MS).astype(np.int64), (a[:, 2] * MS).astype(np.int64),
                     a[:, 3])


def test_the_source_values_are_the_protos() -> None:
    assert (SOURCE_NONE, SOURCE_MARKERS, SOURCE_INSPECTOR) == (
        pb.COLLECTIVE_SOURCE_NONE, pb.COLLECTIVE_SOURCE_MARKERS, pb.COLLECTIVE_SOURCE_INSPECTOR)
    assert set(SOURCE_LABELS) == {v for v in pb.CollectiveSource.values() if v != pb.COLLECTIVE_SOURCE_UNSPECIFIED}


def test_markers_win_else_inspector_else_none() -> None:
    # Step 0: marked [10, 30] and [20, 40] (union 30 ms), Inspector [15, 45] (30 ms), phase [0, 25].
    # Step 1: no marks; Inspector [110, 130] and [120, 150] (union 40 ms, 3 + 4 bytes), phase [100, 140].
    # Step 2: nothing.
    marked = iv([(0, 10, 30, 100.0), (0, 20, 40, math.nan)])
    inspector = iv([(0, 15, 45, 64.0), (1, 110, 130, 3.0), (1, 120, 150, 4.0)])
    phase = Intervals.spans(np.array([0, 1]), np.array([0, 100]) * MS, np.array([25, 140]) * MS)
    out = step_collectives(3, marked, inspector, phase, np.array([True, True, True]))
    assert out["source"].tolist() == [SOURCE_MARKERS, SOURCE_INSPECTOR, SOURCE_NONE]
    np.testing.assert_allclose(out["collective_s"], [0.030, 0.040, 0.0])
    # Step 0: marked union [10, 40] less the phase [0, 25] → [25, 40]; step 1: [110, 150] less [100, 140].
    np.testing.assert_allclose(out["exposed_s"], [0.015, 0.010, 0.0])
    # The marker without bytes counts 0; step 1 takes the Inspector's bytes.
    np.testing.assert_allclose(out["collective_bytes"], [100.0, 7.0, 0.0])
    np.testing.assert_allclose(out["inspector_collective_s"], [0.030, 0.040, 0.0])
    np.testing.assert_allclose(out["inspector_bytes"], [64.0, 7.0, 0.0])
    assert out["inspector_count"].tolist() == [1, 2, 0]
    # Only step 0 has both: |30 − 30| ms.
    np.testing.assert_allclose(out["disagreement_s"], [0.0, math.nan, math.nan])


def test_disagreement_and_a_feed_that_saw_nothing() -> None:
    # Step 0: marked [0, 50], Inspector [10, 30]: 30 ms apart. Step 1: marked [100, 120], nothing
    # from the Inspector although it covers the rank: it disagrees by all 20 ms.
    marked = iv([(0, 0, 50, 8.0), (1, 100, 120, 8.0)])
    inspector = iv([(0, 10, 30, 8.0)])
    out = step_collectives(2, marked, inspector, Intervals.empty(), np.array([True, True]))
    np.testing.assert_allclose(out["disagreement_s"], [0.030, 0.020])
    np.testing.assert_allclose(out["inspector_collective_s"], [0.020, 0.0])
    # No phase: everything is exposed, from the markers.
    np.testing.assert_allclose(out["exposed_s"], [0.050, 0.020])


def test_without_a_feed_the_inspector_view_is_unknown() -> None:
    out = step_collectives(2, iv([(0, 0, 10, 1.0)]), Intervals.empty(), Intervals.empty(), np.array([False, False]))
    assert out["source"].tolist() == [SOURCE_MARKERS, SOURCE_NONE]
    assert np.isnan(out["inspector_collective_s"]).all() and np.isnan(out["inspector_bytes"]).all()
    assert np.isnan(out["disagreement_s"]).all()
    assert out["inspector_count"].tolist() == [0, 0]
    np.testing.assert_allclose(out["collective_bytes"], [1.0, 0.0])


def test_no_steps() -> None:
    out = step_collectives(0, Intervals.empty(), Intervals.empty(), Intervals.empty(), np.zeros(0, bool))
    assert all(v.size == 0 for v in out.values())


def test_clip_to_steps_cuts_records_at_step_boundaries() -> None:
    begin = np.array([0, 100, 200], dtype=np.int64) * MS
    end = np.array([90, 190, 290], dtype=np.int64) * MS
    # A: inside step 0. B: from step 0 across the gap into step 1. C: between steps only. D: across
    # all three. E: no length, inside step 2. F: after the last step.
    lo = np.array([10, 80, 92, 50, 250, 300], dtype=np.int64) * MS
    hi = np.array([20, 120, 98, 250, 250, 310], dtype=np.int64) * MS
    nbytes = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
    got = clip_to_steps(begin, end, lo, hi, nbytes)
    rows = sorted(zip(got.row.tolist(), (got.lo_ns // MS).tolist(), (got.hi_ns // MS).tolist(),
                      got.bytes.tolist(), np.asarray(got.counted).tolist(), strict=True))
    assert rows == [
        (0, 10, 20, 1.0, True),
        (0, 50, 90, 0.0, False), (0, 80, 90, 0.0, False),
        (1, 100, 120, 2.0, True), (1, 100, 190, 0.0, False),
        (2, 200, 250, 8.0, True), (2, 250, 250, 16.0, True),
    ]
    out = step_collectives(3, Intervals.empty(), got, Intervals.empty(), np.ones(3, bool))
    assert out["inspector_count"].tolist() == [1, 1, 2]
    np.testing.assert_allclose(out["inspector_collective_s"], [0.050, 0.090, 0.050])
    np.testing.assert_allclose(out["inspector_bytes"], [1.0, 2.0, 24.0])


def test_clip_to_steps_without_records_or_steps() -> None:
    none = np.zeros(0, np.int64)
    assert clip_to_steps(none, none, np.array([5]), np.array([6]), np.array([1.0])).row.size == 0
    assert clip_to_steps(np.array([0]), np.array([9]), none, none, np.zeros(0)).row.size == 0


@pytest.mark.parametrize("n", [1, 1000])
def test_many_steps_in_one_call(n: int) -> None:
    # Every step: marked [0, 4] ms and Inspector [1, 2] ms of that step; 4 ms against 1 ms each, 3 ms apart.
    base = np.arange(n, dtype=np.int64) * 10 * MS
    idx = np.arange(n, dtype=np.int64)
    marked = Intervals(idx, base, base + 4 * MS, np.ones(n))
    insp = Intervals(idx, base + 1 * MS, base + 2 * MS, np.ones(n))
    out = step_collectives(n, marked, insp, Intervals.empty(), np.ones(n, bool))
    np.testing.assert_allclose(out["disagreement_s"], np.full(n, 0.003))
