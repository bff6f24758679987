"""Phase times per step: the union of each name's windows, checked against a plain merge of sorted windows."""
from __future__ import annotations

import random

import numpy as np
import pytest

from chopper.attribution.phases import OTHER, phase_seconds


def merged_length(windows: list[tuple[int, int]]) -> int:
    """Length of a union of windows by the textbook sort-and-merge, ns."""
    total, end = 0, None
    start = 0
    for b, e in sorted(windows):
        if end is None or b > end:
            if end is not None:
                total += end - start
            start, end = b, e
        else:
            end = max(end, e)
    return total + (end - start if end is not None else 0)


def test_random_windows_match_sort_and_merge() -> None:
    rng = random.Random(7)
    n_steps = 40
    rows = []
    for _ in range(2000):
        step = rng.randrange(n_steps)
        b = step * 10**9 + rng.randrange(10**9 - 10**6)
        rows.append((step, rng.choice(("forward", "backward", "optimizer", "data")), b, b + rng.randrange(1, 10**6)))
    got = phase_seconds(n_steps, np.array([r[0] for r in rows]), [r[1] for r in rows],
                        np.array([r[2] for r in rows]), np.array([r[3] for r in rows]))
    for step in range(n_steps):
        names = {r[1] for r in rows if r[0] == step}
        expected = {name: merged_length([(r[2], r[3]) for r in rows if r[0] == step and r[1] == name]) / 1e9
                    for name in names}
        assert got[step].keys() == expected.keys()
        for name, seconds in expected.items():
            assert got[step][name] == pytest.approx(seconds, abs=1e-12)


def test_nested_repeated_and_overlapping_windows() -> None:
    # Step 0: "train" 0-10 holds "forward" 1-3 and 5-6; two "forward" windows overlap 2-3.
    # Step 2: one zero-length window, which has no time. Step 1 has none.
    rows = [(0, "train", 0, 10), (0, "forward", 1, 3), (0, "forward", 2, 3), (0, "forward", 5, 6), (2, "x", 4, 4)]
    got = phase_seconds(3, np.array([r[0] for r in rows]), [r[1] for r in rows],
                        np.array([r[2] for r in rows]) * 10**9, np.array([r[3] for r in rows]) * 10**9)
    assert got == [{"forward": 3.0, "train": 10.0}, {}, {}]


def test_names_beyond_the_bound_are_summed_under_other() -> None:
    names = [f"p{i}" for i in range(10)]
    # p<i> lasts i+1 ms; keep the 3 longest.
    got = phase_seconds(1, np.zeros(10, np.int64), names, np.zeros(10, np.int64),
                        (np.arange(10, dtype=np.int64) + 1) * 10**6, max_names=3)
    assert set(got[0]) == {"p9", "p8", "p7", OTHER}
    assert got[0][OTHER] == pytest.approx(sum(range(1, 8)) / 1e3)


def test_no_windows() -> None:
    assert phase_seconds(2, np.zeros(0, np.int64), [], np.zeros(0, np.int64), np.zeros(0, np.int64)) == [{}, {}]
