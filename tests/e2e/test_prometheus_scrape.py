"""A real Prometheus server scrapes a real agent while a real training job runs."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.daemons import AgentProcess
from tests.support.polling import wait_until
from tests.support.prometheus import prom_query, prometheus_process
from tests.support.training import finish_training, start_training


@pytest.mark.slow
def test_prometheus_sees_steps_and_gpus(agent_process: AgentProcess, tmp_path: Path) -> None:
    server = prometheus_process(tmp_path, {"chopper-agent": [agent_process.metrics_addr]}).start()
    prom = server.address
    try:
        sent = finish_training(start_training(agent_process.target, ranks=2, duration_s=5.0))
        expr = 'chopper_rank_steps_total{training_job="e2e"}'

        seen: dict[str, list[dict]] = {}

        def scraped_all() -> bool:
            # One predicate for every series: a scrape that times out on a loaded machine sets up to 0
            # and marks the target's series stale until the next one succeeds, a second later.
            for name, query in (("steps", expr), ("up", 'up{job="chopper-agent"}'),
                                ("clocks", "chopper_gpu_gfx_clock_hertz"),
                                ("backend_up", 'chopper_agent_backend_up{backend="simulated"} == 1')):
                seen[name] = prom_query(prom, query)
            return (sum(float(r["value"][1]) for r in seen["steps"]) == sent["0"]["steps"] + sent["1"]["steps"]
                    and bool(seen["up"]) and seen["up"][0]["value"][1] == "1"
                    and len(seen["clocks"]) == 4 and all(r["metric"]["vendor"] == "simulated" for r in seen["clocks"])
                    and bool(seen["backend_up"]))

        assert wait_until(scraped_all, timeout_s=30), f"{seen}\n{server.log()[-2000:]}"
    finally:
        server.stop()
