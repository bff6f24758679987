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
    now = [1_700_000_000 * NS]
    core = Aggregator(Ledger(), JobTable(30.0, join_s=5.0))
    batch = apb.SummaryBatch(agent="n0", incarnation="i0", seq=[1, 2, 3, 4, 5, 6, 7, 8])
    batch.summaries.extend(summary(job, r, s) for job in ("a", "b") for s in (0, 1) for r in (0, 1))
    core.deliver(batch)
    now[0] += 5 * NS
    core.tick()
    return core


def jobs_of(m: Series, names: set[str]) -> set[str]:
    """The jobs that have series of ``names``."""
    return {dict(labels)["job"] for name, series in m.items() if name in names for labels in series}


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
