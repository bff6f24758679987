"""The report's scaling figure: drawn for a run whose collectives support a fit, left out otherwise."""
from __future__ import annotations

from pathlib import Path

import pytest

from chopper.attribution import attribute_run
from chopper.predict.curve import run_curve
from chopper.report import build_report
from chopper.runs.rundir import read_run, write_run
from tests.support.attribution_scenarios import ALL_SCENARIOS
from tests.support.report_pages import figure_keys


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The exposed-collectives scenario as written (its all-reduce and all-gather move the same bytes per
    latency step), and with all-gathers of a seventh of that: two points of the α–β line."""
    base = tmp_path_factory.mktemp("scaling")
    same = ALL_SCENARIOS["exposed_collectives"]().write(base / "same")
    run = read_run(same)
    markers = run.markers.copy()
    gather = markers["name"] == "all_gather"
    markers.loc[gather, "bytes"] = markers.loc[gather, "bytes"] / 7
    return {"same": same, "two_sizes": write_run(base / "two_sizes", run.devices, run.samples, markers)}


def test_the_curve_passes_through_the_measured_step(runs: dict[str, Path]) -> None:
    run = read_run(runs["two_sizes"])
    curve = run_curve(run, attribute_run(runs["two_sizes"]).steps)
    assert curve is not None and curve.world_size == 2
    sizes = [n for n, _ in curve.points]
    assert sizes == list(range(1, 9))
    at = dict(curve.points)
    # At the size that ran, the prediction is the measured step (the fit is in-sample).
    assert at[2].step_time_s == pytest.approx(curve.measured_step_s, rel=0.05)
    assert at[1].comm_s == 0.0 and at[8].comm_s > at[2].comm_s


def test_the_report_draws_it_only_where_a_fit_exists(runs: dict[str, Path]) -> None:
    drawn = build_report(runs["two_sizes"], runs["two_sizes"].parent / "two.html").read_text(encoding="utf-8")
    assert "scaling-prediction" in figure_keys(drawn) and "Scaling prediction" in drawn
    same = build_report(runs["same"], runs["same"].parent / "same.html").read_text(encoding="utf-8")
    assert "scaling-prediction" not in figure_keys(same)
