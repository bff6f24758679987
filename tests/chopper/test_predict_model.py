"""Predictions of scenario runs: the report's scaling figure, drawn for a run whose collectives support
a fit and left out otherwise, and a run's fit pooled with the compute of an aggregator's store."""
from __future__ import annotations

from pathlib import Path

import pytest

from chopper.attribution import attribute_run
from chopper.predict import PredictionRefused, load_inputs, predict
from chopper.predict.curve import run_curve
from chopper.report import build_report
from chopper.runs.rundir import read_run, write_run
from tests.support.attribution_scenarios import ALL_SCENARIOS
from tests.support.daemons import AggregatorProcess
from tests.support.grpc_delivery import deliver
from tests.support.polling import wait_until
from tests.support.report_pages import figure_keys
from tests.support.summaries import summary

HOT = 5


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


@pytest.mark.slow  # two reports: 40 s on a loaded machine
def test_the_report_draws_it_only_where_a_fit_exists(runs: dict[str, Path]) -> None:
    drawn = build_report(runs["two_sizes"], runs["two_sizes"].parent / "two.html").read_text(encoding="utf-8")
    assert "scaling-prediction" in figure_keys(drawn) and "Scaling prediction" in drawn
    same = build_report(runs["same"], runs["same"].parent / "same.html").read_text(encoding="utf-8")
    assert "scaling-prediction" not in figure_keys(same)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """6 steps of 8 ranks of job llm/a, rank 5 throttled, delivered to a real ``chopper-aggregator --store-dir``.

    Healthy ranks compute 0.80 s and wait 0.15 s in collectives; rank 5 computes 0.90 s and waits 0.05 s
    (``tests.support.summaries``); every rank idles 0.05 s of its 1 s step.
    """
    workdir = tmp_path_factory.mktemp("store")
    root = workdir / "steps"
    agg = AggregatorProcess(workdir, "agg", "--store-dir", str(root), "--flush-interval-s", "0.2").start()
    try:
        deliver(agg.address, "node0", "life-1", [[summary("llm/a", r, step, hot=(r == HOT)) for r in range(8)]
                                                 for step in range(6)])
        assert wait_until(lambda: agg.value("chopper_aggregator_store_rows_written_total") >= 6 * 8, timeout_s=60)
    finally:
        agg.stop()
    return root


@pytest.mark.slow
def test_a_store_gives_the_compute_and_a_run_the_fit(store: Path, runs: dict[str, Path]) -> None:
    stored = load_inputs(store, job="llm/a")
    assert stored.kind == "store" and stored.world_size == 8 and len(stored.steps) == 6
    # The critical path: rank 5's 0.90 s compute and 0.05 s idle, and its 0.05 s wait in collectives,
    # which the other ranks spent waiting for it (straggler wait) on top.
    assert stored.steps["compute_s"].to_numpy() == pytest.approx(0.90)
    assert stored.steps["noncomm_s"].to_numpy() == pytest.approx(0.95)
    assert stored.steps["exposed_comm_s"].to_numpy() == pytest.approx(0.05)
    with pytest.raises(PredictionRefused, match=r"no input has timed collectives.*step totals"):
        predict([stored], 8)
    run = load_inputs(runs["two_sizes"])
    pooled = predict([stored, run], 8)
    # At the store's size its compute is kept; the collectives are the run's, timed by the run's fit.
    assert pooled.noncomm_s == pytest.approx(0.95)
    assert pooled.comm_s == pytest.approx(predict([run], 8).comm_s)
