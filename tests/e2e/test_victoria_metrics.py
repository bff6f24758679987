"""Long-term storage on a real engine: every dashboard query answers from VictoriaMetrics, fed by remote write.

The stack of test_plain_scrape (an H100 node, an MI300X node, an aggregator, a real gloo job, the
shipped plain scrape config and the fast rules) runs a real Prometheus that also remote-writes what
it stores, as ``deploy/prometheus/remote-write.yml`` has it, into a real single-node VictoriaMetrics
(the Debian package, 1.79 on Debian 12). Grafana's queries (``/api/v1/query`` for instant panels,
``/api/v1/query_range`` for the rest, ``/api/v1/series`` for the variables) then go to VictoriaMetrics
alone, and every one must return data: MetricsQL answers them all, with the example's ``cluster``
external label on every series (a division whose sides keep different labels would come back
empty on any engine; "Time by phase" once did). Every series in VictoriaMetrics carries that
label, which the dashboards' ``cluster`` variable lists, and a counter of each daemon and a gauge
hold the same values as in Prometheus at the same instant.

VictoriaMetrics runs with ``-search.latencyOffset=1s``: by default it answers queries near now as of
30 s ago, and this test waits for fresh data.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import yaml

from dashboards import render
from dashboards.names import C
from dashboards.rulefile import rules_yaml
from tests.dashboards.panel_queries import empty_panel_queries, fetch
from tests.support.daemons import stop_all
from tests.support.plain_scrape import FAST, MAY_BE_EMPTY, plain_prometheus, reject_one_batch, start_nodes
from tests.support.polling import wait_until
from tests.support.training import start_training, stop_training
from tests.support.victoria import VictoriaMetrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

EXAMPLE = render.ROOT / "deploy/prometheus/remote-write.yml"
# A counter of the agent, one of the aggregator, and a gauge that holds still.
SAME_VALUES = (f'{C.rank_steps_total}{{training_job="e2e"}}', f'{C.job_steps_finalized_total}{{training_job="e2e"}}',
               C.gpu_power_cap_watts)


def remote_write_to(vm: VictoriaMetrics) -> dict:
    """The example's ``global`` and ``remote_write``, its one active URL pointed at ``vm``, batches sent each second."""
    example = yaml.safe_load(EXAMPLE.read_text())
    assert set(example) == {"global", "remote_write"}, "the example holds only what is merged into prometheus.yml"
    [target] = example["remote_write"]
    assert target["url"].endswith("/api/v1/write"), "the active example is VictoriaMetrics single-node"
    # Prometheus batches for up to 5 s by default; the waits below would spend that many times over.
    return {**example, "remote_write": [{**target, "url": vm.write_url, "queue_config": {"batch_send_deadline": "1s"}}]}


def without_data(address: str) -> dict[str, str]:
    """The dashboard queries without data at ``address``: expression by "board / panel / refId"."""
    return {key: expr for key, expr in (entry.split(": ", 1) for entry in empty_panel_queries(address, MAY_BE_EMPTY))}


def values_at(address: str, expr: str, at: float) -> dict[tuple, float]:
    """Instant ``expr`` at ``at`` (Unix seconds): value by label set, the ``cluster`` label left out."""
    return {tuple(sorted((k, v) for k, v in r["metric"].items() if k != "cluster")): float(r["value"][1])
            for r in fetch(address, "query", {"query": expr, "time": str(at)})}


def test_every_dashboard_query_answers_from_victoria_metrics(tmp_path: Path) -> None:
    vm = VictoriaMetrics(tmp_path)
    config = remote_write_to(vm)
    cluster = config["global"]["external_labels"]["cluster"]
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_yaml(FAST))
    started: list = []
    training = None
    try:
        started.append(vm)  # stopped even if it never gets ready
        vm.start()
        nodes = start_nodes(tmp_path, started)
        prom_server = plain_prometheus(tmp_path, nodes.targets, rules, config).start()
        started.append(prom_server)
        reject_one_batch(nodes.nvidia)
        training = start_training(nodes.nvidia.target, ranks=2, duration_s=300)

        assert wait_until(lambda: not without_data(vm.address), timeout_s=120, interval_s=2), (
            "panel queries without data from VictoriaMetrics:\n"
            + "\n".join(f"{k}: {v}" for k, v in without_data(vm.address).items())
            + f"\nPrometheus:\n{prom_server.log()[-2000:]}\nVictoriaMetrics:\n{vm.log()[-2000:]}")
        assert training.poll() is None, "training ended before every panel answered"

        assert vm.label_values("cluster") == [cluster]
        unlabelled = f'count({{__name__=~".+", cluster!="{cluster}"}})'
        assert fetch(vm.address, "query", {"query": unlabelled}) == [], "series without the cluster label"
        assert fetch(vm.address, "query", {"query": '{exported_job!=""}'}) == []
        # A past instant that both hold: samples reach VictoriaMetrics within a batch deadline or two.
        # A series may first have been scraped within those 5 s (the aggregator finalizes a job's
        # steps once its ranks joined), so the instant is the first one at which Prometheus has all.
        instants: list[int] = []

        def prometheus_holds_an_instant() -> bool:
            instants.append(math.floor(time.time()) - 5)
            return all(values_at(prom_server.address, expr, instants[-1]) for expr in SAME_VALUES)

        wait_until(prometheus_holds_an_instant, timeout_s=30, interval_s=1)
        at = instants[-1]
        for expr in SAME_VALUES:
            in_prometheus = values_at(prom_server.address, expr, at)
            assert in_prometheus, f"{expr}: no data in Prometheus"
            assert values_at(vm.address, expr, at) == in_prometheus, expr
    finally:
        if training is not None:
            stop_training(training)
        stop_all(started)
