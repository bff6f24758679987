from __future__ import annotations

import math

import numpy as np

from chopper import windows

S = 1_000_000_000


def test_overlap_takes_the_fraction_of_cut_intervals() -> None:
    ts = np.array([1, 2, 3, 4], dtype=np.int64) * S  # intervals (0,1], (1,2], (2,3], (3,4]
    w = windows.overlap_seconds(ts, int(1.5 * S), int(3.25 * S), S)
    assert np.allclose(w, [0.0, 0.5, 1.0, 0.25])


def test_weighted_mean_ignores_nan() -> None:
    assert windows.weighted_mean(np.array([100.0, np.nan, 300.0]), np.array([1.0, 5.0, 3.0])) == 250.0
    assert math.isnan(windows.weighted_mean(np.array([np.nan]), np.array([1.0])))


def test_counter_delta_interpolates() -> None:
    ts = np.array([0, 1, 2], dtype=np.int64) * S
    energy = np.array([0.0, 100.0, 300.0])
    assert windows.counter_delta(ts, energy, int(0.5 * S), int(1.5 * S)) == 150.0
    assert math.isnan(windows.counter_delta(ts, energy, int(0.5 * S), 3 * S))  # not covered yet


def test_window_extreme() -> None:
    values = np.array([90.0, 70.0, 95.0])
    weights = np.array([0.0, 1.0, 0.5])
    assert windows.window_extreme(values, weights, largest=True) == 95.0
    assert windows.window_extreme(values, weights, largest=False) == 70.0
