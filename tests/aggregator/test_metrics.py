"""The aggregator's /metrics: a job or section that cannot be exported costs its own series, never the scrape."""
from __future__ import annotations

import logging

import pytest

from aggregator import catalog
from aggregator.jobs import JobTable
from aggregator.ledger import Ledger
from aggregator.metrics import AggregatorCollector
from aggregator.service import Aggregator
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from tests.support.hazards import HazardOutcome
from tests.support.scrape import Series, scrape, section_errors
from tests.support.summaries import NS, summary

# The per-rank series (chopper_job_rank_set_changes_total is a job's).
RANK_LEVEL = {m.name for m in catalog.METRICS if m.name.startswith("chopper_job_rank_") and "rank" in m.labels}
JOB_LEVEL = {m.name for m in catalog.METRICS if m.name.startswith("chopper_job_")} - RANK_LEVEL


def two_jobs() -> Aggregator:
    """Jobs ``a`` and ``b``, two ranks each, with one finalized step."""
    core = Aggregator(Ledger(), JobTable(30.0, join_s=5.0))
    batch = apb.SummaryBatch(agent="n0", incarnation="i0", seq=[1, 2, 3, 4, 5, 6, 7, 8])
    batch.summaries.extend(summary(job, r, s) for job in ("a", "b") for s in (0, 1) for r in (0, 1))
    core.deliver(batch)
    core.tick()
    return core


def hot_rank_moves(hot: list[int], ranks: int = 4) -> Aggregator:
    """Job ``h`` of ``ranks`` ranks whose step ``i`` has rank ``hot[i]`` thermally throttled (no join period)."""
    core = Aggregator(Ledger(), JobTable(30.0, join_s=0.0), clock=lambda: 1_700_000_000 * NS)
    for step, slow in enumerate(hot):
        batch = apb.SummaryBatch(agent="n0", incarnation="i0", seq=[step * ranks + r + 1 for r in range(ranks)])
        batch.summaries.extend(summary("h", r, step, hot=r == slow) for r in range(ranks))
        core.deliver(batch)
        core.tick()
    return core


def slowest_series(m: Series) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    return {name: m[name] for name in ("chopper_job_slowest_rank", "chopper_job_slowest_rank_cause",
                                       "chopper_job_rank_slowest")}


def test_the_slowest_rank_moves_in_values_never_in_labels() -> None:
    """A slowest rank that moves changes values of the same series: no series starts or ends."""
    core = hot_rank_moves([1])
    collector = AggregatorCollector(core)
    first = slowest_series(scrape(collector))
    batch = apb.SummaryBatch(agent="n0", incarnation="i0", seq=[5, 6, 7, 8])
    batch.summaries.extend(summary("h", r, 1, hot=r == 3) for r in range(4))
    core.deliver(batch)
    core.tick()
    second = slowest_series(scrape(collector))
    assert {n: set(s) for n, s in first.items()} == {n: set(s) for n, s in second.items()}
    h = (("training_job", "h"),)
    assert (first["chopper_job_slowest_rank"][h], second["chopper_job_slowest_rank"][h]) == (1.0, 3.0)
    causes = {dict(k)["cause"]: v for k, v in second["chopper_job_slowest_rank_cause"].items()}
    assert causes == {**dict.fromkeys(catalog.SLOWEST_CAUSES, 0.0), "thermal": 1.0}
    flagged = {dict(k)["rank"]: (dict(k)["node"], dict(k)["gpu"]) for k, v in
               second["chopper_job_rank_slowest"].items() if v == 1.0}
    assert flagged == {"3": ("node0", "3")} and len(second["chopper_job_rank_slowest"]) == 4


def test_rank_series_top_k_always_shows_the_slowest_rank() -> None:
    """The slowest rank of the last step keeps its per-rank series, so GPU series can be joined to it."""
    core = hot_rank_moves([5, 5, 5, 2], ranks=8)  # rank 5's excess still decays above rank 2's
    m = scrape(AggregatorCollector(core, rank_series_top_k=1))
    shown = {dict(k)["rank"]: v for k, v in m["chopper_job_rank_slowest"].items()}
    assert shown == {"5": 0.0, "2": 1.0}
    assert m["chopper_aggregator_rank_series_omitted"][()] == 6


def test_legacy_job_label_shows_the_old_label_names() -> None:
    """job_label="job" exports every training_job label as job, as releases before it did."""
    legacy = scrape(AggregatorCollector(two_jobs(), job_label="job"))
    current = scrape(AggregatorCollector(two_jobs()))
    assert set(legacy) == set(current)
    for name, series in current.items():
        renamed = {tuple(sorted(("job" if k == "training_job" else k, v) for k, v in labels)) for labels in series}
        assert set(legacy[name]) == renamed, name
    labels = {k for series in legacy.values() for key in series for k, _ in key}
    assert "job" in labels and "training_job" not in labels
    assert {dict(k)["job"] for k in legacy["chopper_job_ranks"]} == {"a", "b"}


def jobs_of(m: Series, names: set[str]) -> set[str]:
    """The jobs that have series of ``names``."""
    return {dict(labels)["training_job"] for name, series in m.items() if name in names for labels in series}


def test_every_documented_section_is_counted_from_the_first_scrape() -> None:
    m = scrape(AggregatorCollector(two_jobs()))
    assert section_errors(m, "aggregator") == dict.fromkeys(catalog.SECTIONS, 0.0)
    assert jobs_of(m, JOB_LEVEL) == jobs_of(m, RANK_LEVEL) == {"a", "b"} and "chopper_aggregator_jobs" in m


@pytest.mark.hazard(item=5, input="one job whose slowest-rank record is malformed, one rank whose seconds are gone, "
                                  "a ledger whose stats() raises",
                    promise="the scrape answers with the other jobs and sections; each failure is counted by section "
                            "and logged once per period")
def test_a_failing_job_or_section_costs_its_own_series_only(caplog: pytest.LogCaptureFixture,
                                                            hazard: HazardOutcome) -> None:
    core = two_jobs()
    collector = AggregatorCollector(core)
    healthy = scrape(collector)
    core.jobs.jobs["a"].last_slowest = ("0",)  # type: ignore[assignment]  # fails after a's first series
    core.jobs.jobs["b"].ranks[1].seconds = None  # type: ignore[assignment]  # rank 0 of b is exported first

    def broken() -> dict[str, int]:
        raise RuntimeError("ledger unreadable")

    core.ledger.stats = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="aggregator.metrics"):
        scrape(collector)
        m = scrape(collector)
    assert jobs_of(healthy, JOB_LEVEL) == jobs_of(healthy, RANK_LEVEL) == {"a", "b"}
    assert jobs_of(m, JOB_LEVEL) == {"b"}  # none of a's job-level series, not the half before the failure
    assert jobs_of(m, RANK_LEVEL) == {"a"}  # b's rank 0 went with its section
    assert "chopper_aggregator_info" not in m and "chopper_aggregator_summaries_received_total" not in m
    kept = {name for name in healthy if not name.startswith("chopper_job_") and name in m}
    assert {"chopper_aggregator_store_rows_written_total", "chopper_aggregator_metrics_section_errors_total"} <= kept
    failed = {"job": 2.0, "ranks": 2.0, "self": 2.0}
    assert section_errors(m, "aggregator") == {**dict.fromkeys(catalog.SECTIONS, 0.0), **failed}
    lines = [r.getMessage() for r in caplog.records if r.name == "aggregator.metrics"]
    assert sorted(line.split()[1] for line in lines) == ["section=job", "section=ranks", "section=self"]
    hazard.outcome = (f"2 scrapes with job a, b's ranks and self broken: job b and a's ranks kept, "
                      f"{len(kept)} aggregator families kept, 3 sections counted 2 each, {len(lines)} log lines")
