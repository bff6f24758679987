"""``chopper report`` on the aggregator's step store, written by a real aggregator process."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from chopper.cli import main
from chopper.report import classify_input, figures
from tests.support.daemons import AggregatorProcess
from tests.support.grpc_delivery import deliver
from tests.support.polling import wait_until
from tests.support.summaries import summary

HOT = 5
# What a store cannot draw: the figures made from GPU samples.
SAMPLE_FIGURES = [spec for spec in figures.FIGURES if spec.needs == ("run",)]
STEP_FIGURES = [spec.key for spec in figures.FIGURES if spec.needs == ("attribution",)]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two jobs' steps delivered over gRPC to ``chopper-aggregator --store-dir``: 8 ranks of llm/a with
    rank 5 throttled, 2 ranks of b; the aggregator finalizes each step and writes its rows to Parquet."""
    workdir = tmp_path_factory.mktemp("store")
    root = workdir / "steps"
    agg = AggregatorProcess(workdir, "agg", "--store-dir", str(root), "--flush-interval-s", "0.2").start()
    try:
        batches = [[summary("llm/a", r, step, hot=(r == HOT)) for r in range(8)] + [summary("b", r, step)
                                                                                   for r in range(2)]
                   for step in range(6)]
        deliver(agg.address, "node0", "life-1", batches)
        assert wait_until(lambda: agg.value("chopper_aggregator_store_rows_written_total") >= 6 * 10, timeout_s=60)
    finally:
        agg.stop()
    return root


@pytest.mark.slow
def test_the_report_of_a_store_draws_the_step_figures_and_names_those_it_cannot(
        store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert classify_input(store) == "store"
    out = tmp_path / "store.html"
    assert main(["report", str(store), "-o", str(out), "--quiet"]) == 0, capsys.readouterr().err
    page = out.read_text(encoding="utf-8")
    assert re.findall(r'<figure id="([^"]+)">', page) == STEP_FIGURES
    assert "(aggregator step store)" in page and "jobs b, llm/a" in page and "10 ranks" in page
    note = page.split("Not drawn:", 1)[1].split("</ul>", 1)[0]
    assert "devices and samples tables" in note and "chopper record" in note
    assert all(spec.title in note for spec in SAMPLE_FIGURES) and len(SAMPLE_FIGURES) == 2
    slowest = page.split("<caption>Slowest ranks", 1)[1].split("</table>", 1)[0]
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", slowest)[1:]]
    # job, step, rank, ..., cause: the throttled rank is the slowest of every step of its job, as the aggregator said.
    assert [(r[1], r[2], r[-1]) for r in rows if r[0] == "llm/a"] == [(str(step), str(HOT), "thermal")
                                                                      for step in range(6)]


@pytest.mark.slow
def test_the_job_filter_reads_one_job_and_an_unknown_job_is_refused(
        store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "b.html"
    assert main(["report", str(store), "-o", str(out), "--job", "b", "--quiet"]) == 0
    assert "job b (--job) · 2 ranks" in out.read_text(encoding="utf-8")
    assert main(["report", str(store), "-o", str(tmp_path / "none.html"), "--job", "nope", "--quiet"]) == 2
    assert "no rows of job 'nope'" in capsys.readouterr().err and not (tmp_path / "none.html").exists()
