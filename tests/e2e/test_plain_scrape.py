"""deploy/prometheus/prometheus.yml, a plain scrape config, against real daemons: every dashboard query answers.

A real Prometheus runs the shipped file (only its targets, intervals and rule file replaced) with
no honor_labels, scraping two simulated nodes and an aggregator: an H100 node whose power cap makes
the two GPUs a real gloo job trains on throttle, and which schedules an XID 79 and corrected ECC
errors (the health row and the health alerts have something to show), and an MI300X node (AMD's
counters: bad pages, PCIe NAKs, XGMI). It evaluates a fast variant of the shipped rules. With no
``cluster`` label anywhere, every query of every committed dashboard must return data, with the
dashboards' variables as a freshly opened dashboard sets them (All for cluster, node and gpu).
Series keep the training job in ``training_job`` and the scrape job in ``job``: nothing is renamed
to ``exported_job``.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from dashboards.names import C
from dashboards.rulefile import rules_yaml
from tests.dashboards.panel_queries import empty_panel_queries
from tests.support.daemons import AgentProcess, AggregatorProcess, stop_all
from tests.support.plain_scrape import AMD, FAST, MAY_BE_EMPTY, NVIDIA, plain_prometheus, reject_one_batch
from tests.support.polling import wait_until
from tests.support.prometheus import prom_query
from tests.support.training import start_training, stop_training

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_every_dashboard_query_answers_over_the_plain_scrape_config(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_yaml(FAST))
    started: list = []
    training = None
    try:
        agg = AggregatorProcess(tmp_path, "agg", "--store-dir", str(tmp_path / "store")).start()
        started.append(agg)
        for name in ("nvidia", "amd"):
            (tmp_path / name).mkdir()
        nvidia = AgentProcess(tmp_path / "nvidia", *NVIDIA, "--aggregators", agg.address).start()
        started.append(nvidia)
        amd = AgentProcess(tmp_path / "amd", *AMD, "--aggregators", agg.address).start()
        started.append(amd)
        prom_server = plain_prometheus(tmp_path, {"chopper-agent": [nvidia.metrics_addr, amd.metrics_addr],
                                                  "chopper-aggregator": [agg.metrics_addr]}, rules).start()
        started.append(prom_server)
        prom = prom_server.address
        reject_one_batch(nvidia)
        training = start_training(nvidia.target, ranks=2, duration_s=300)

        assert wait_until(lambda: not empty_panel_queries(prom, MAY_BE_EMPTY), timeout_s=120, interval_s=2), (
            "panel queries without data:\n" + "\n".join(empty_panel_queries(prom, MAY_BE_EMPTY))
            + f"\n{prom_server.log()[-2000:]}")
        assert training.poll() is None, "training ended before every panel answered"

        steps = prom_query(prom, f'{C.rank_steps_total}{{training_job="e2e"}}')
        assert steps and {r["metric"]["job"] for r in steps} == {"chopper-agent"}
        assert prom_query(prom, f'{C.job_steps_finalized_total}{{training_job="e2e", job="chopper-aggregator"}}')
        assert prom_query(prom, '{exported_job!=""}') == []
        firing = {r["metric"]["alertname"] for r in prom_query(prom, 'ALERTS{alertstate="firing"}')}
        assert "ChopperGPUXidCritical" in firing, firing
    finally:
        if training is not None:
            stop_training(training)
        stop_all(started)
