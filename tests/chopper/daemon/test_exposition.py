"""The exposition both daemons share: families of one scrape, guarded sections, the docs' tables."""
from __future__ import annotations

import logging
import math
from collections.abc import Iterator

import pytest

from chopper.daemon.exposition import Families, MetricSpec, Sections, catalog_doc, reason_table
from chopper.daemon.text_format import Family, Registry

CATALOG = {m.name: m for m in (
    MetricSpec("x_up", "gauge", "Up.", ("node",)),
    MetricSpec("x_events_total", "counter", "Events.", ("node", "kind")),
    MetricSpec("x_section_errors_total", "counter", "Failed sections.", ("section",)),
)}
LOG = logging.getLogger("tests.exposition")


def text(fam: Families) -> str:
    class Once:
        def collect(self) -> Iterator[Family]:
            return iter(fam)

    registry = Registry()
    registry.register(Once())
    return registry.render().decode()


def test_unknown_values_are_left_out_and_the_kind_comes_from_the_catalog() -> None:
    fam = Families(CATALOG)
    fam.add("x_up", ("a",), 1.0)
    fam.add("x_up", ("b",), math.nan)
    fam.add("x_up", ("c",), None)
    fam.add("x_events_total", ("a", "k"), 3.0)
    out = text(fam)
    assert 'x_up{node="a"} 1.0' in out and 'node="b"' not in out and 'node="c"' not in out
    assert "# TYPE x_events_total counter" in out and 'x_events_total{kind="k",node="a"} 3.0' in out
    with pytest.raises(KeyError):
        fam.add("x_not_in_the_catalog", (), 1.0)


def test_a_part_merges_after_what_the_scrape_holds() -> None:
    fam = Families(CATALOG)
    fam.add("x_up", ("a",), 1.0)
    part = fam.part()
    part.add("x_up", ("b",), 0.0)
    part.add("x_events_total", ("b", "k"), 1.0)
    fam.merge(part)
    out = text(fam)
    assert out.index('x_up{node="a"}') < out.index('x_up{node="b"}') and out.count("# TYPE x_up gauge") == 1
    assert 'x_events_total{kind="k",node="b"} 1.0' in out


def test_a_section_that_raises_leaves_none_of_its_series_and_is_counted(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    sections = Sections(("good", "bad"), LOG, clock=lambda: now[0], log_period_s=60.0)

    def good(fam: Families) -> int:
        fam.add("x_up", ("a",), 1.0)
        return 7

    def bad(fam: Families) -> int:
        fam.add("x_up", ("half",), 1.0)  # added before the failure: must not reach the scrape
        raise ZeroDivisionError("a bug in one section")

    def scrape() -> str:
        fam = Families(CATALOG)
        assert sections.run(fam, "bad", bad) is None
        assert sections.run(fam, "good", good) == 7
        sections.export(fam, "x_section_errors_total")
        return text(fam)

    with caplog.at_level(logging.WARNING, logger=LOG.name):
        out = scrape()
        assert 'x_up{node="a"} 1.0' in out and "half" not in out
        assert 'x_section_errors_total{section="bad"} 1.0' in out and 'section="good"} 0.0' in out
        now[0] = 59.0
        assert 'x_section_errors_total{section="bad"} 2.0' in scrape()
        assert len(caplog.records) == 1  # once per period, not once per scrape
        assert caplog.records[0].exc_info is not None and "section=bad" in caplog.records[0].getMessage()
        now[0] = 60.0
        scrape()
    assert [r.getMessage() for r in caplog.records][1:] == [
        "event=metrics_section_failed section=bad failures_not_logged=1 total=3"]


def test_a_catalog_doc_has_its_table_its_own_sections_then_the_shared_ones() -> None:
    own = reason_table("R", {"a": "why a"}, intro=("Intro.",))
    assert own == ["", "## R", "", "Intro.", "", "| reason | meaning |", "|---|---|", "| `a` | why a |"]
    doc = catalog_doc("T", "aggregator.catalog", "Notes.", CATALOG.values(), own, {"s": "`x_up`"}, token_file=False)
    assert doc.startswith("# T\n") and "`python -m aggregator.catalog > docs/AGGREGATOR_METRICS.md`" in doc
    order = ["| `x_section_errors_total` | counter | section | Failed sections. |", "## R",
             "## Refusal reasons (`chopper_aggregator_rpc_refused_total{reason}`)",
             "## Refused reloads (`chopper_aggregator_tls_reloads_refused_total`, `reason`)",
             "## Collector sections (`chopper_aggregator_metrics_section_errors_total{section}`)", "| `s` | `x_up` |"]
    assert [doc.index(part) for part in order] == sorted(doc.index(part) for part in order)
    assert "token_file_reloads" not in doc and "token file:" not in doc
