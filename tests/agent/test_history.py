from __future__ import annotations

import math

import numpy as np
import pytest

from agent.history import HISTORY_COLUMNS, SampleHistory, SampleWindow
from chopper.schema import Sample


def sample(gpu: int, t: int) -> Sample:
    return Sample(ts_ns=t, node="n", gpu=gpu, busy_ratio=t / 100, energy_j=float(t), gfx_clock_mhz=1000.0 + t)


def window_of_list(samples: list[Sample], begin_ns: int) -> list[Sample]:
    """What the window must hold: from the last sample before begin_ns to the newest."""
    before = [i for i, s in enumerate(samples) if s.ts_ns < begin_ns]
    return samples[before[-1] if before else 0:]


@pytest.mark.parametrize("appended", [3, 8, 9, 20, 37])
@pytest.mark.parametrize("begin", [0, 5, 10, 11, 19, 30, 1000])
def test_window_is_the_samples_from_the_one_before_begin_in_time_order(appended: int, begin: int) -> None:
    history = SampleHistory(rows=8)
    kept = [sample(0, 10 * t) for t in range(appended)]
    history.extend(kept)
    window = history.window(0, begin * 10)
    expected = window_of_list(kept[-8:], begin * 10)
    assert window is not None
    assert window.ts_ns.tolist() == [s.ts_ns for s in expected]
    assert window.columns["busy_ratio"].tolist() == [s.busy_ratio for s in expected]
    assert window.columns["energy_j"].tolist() == [s.energy_j for s in expected]


def test_window_equals_the_window_of_the_same_sample_objects() -> None:
    history = SampleHistory(rows=5)
    kept = [sample(1, 10 * t) for t in range(12)]
    history.extend(kept)
    got, want = history.window(1, 95), SampleWindow.of(window_of_list(kept[-5:], 95))
    assert got.ts_ns.tolist() == want.ts_ns.tolist()
    for c in HISTORY_COLUMNS:
        np.testing.assert_array_equal(got.columns[c], want.columns[c])
    # A value the backend could not read stays NaN.
    assert all(math.isnan(v) for v in got.columns["temp_c"])


def test_gpus_have_rings_of_their_own_and_a_gpu_without_samples_has_no_window() -> None:
    history = SampleHistory(rows=4)
    history.extend([sample(0, 1), sample(3, 2), sample(0, 3)])
    assert history.window(0, 0).ts_ns.tolist() == [1, 3]
    assert history.window(3, 0).ts_ns.tolist() == [2]
    assert history.window(1, 0) is None


def test_a_window_is_a_copy_the_ring_does_not_change_under() -> None:
    history = SampleHistory(rows=3)
    history.extend([sample(0, t) for t in (1, 2, 3)])
    window = history.window(0, 0)
    history.extend([sample(0, t) for t in (4, 5, 6)])
    assert window.ts_ns.tolist() == [1, 2, 3] and window.columns["energy_j"].tolist() == [1.0, 2.0, 3.0]


def test_memory_is_fixed_per_gpu_whatever_was_appended() -> None:
    history = SampleHistory(rows=1200)
    history.extend([sample(0, 1)])
    first = history.nbytes
    history.extend([sample(0, t) for t in range(2, 5000)])
    assert history.nbytes == first == 1200 * 8 * (1 + len(HISTORY_COLUMNS))


def test_a_history_needs_two_rows() -> None:
    with pytest.raises(ValueError, match="at least 2 rows"):
        SampleHistory(rows=1)
