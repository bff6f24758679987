"""A real Prometheus server scrapes a real agent while a real training job runs."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import (
    AgentProcess,
    finish_training,
    prom_query,
    prometheus_process,
    start_training,
    wait_until,
)


@pytest.mark.slow
def test_prometheus_sees_steps_and_gpus(agent_process: AgentProcess, tmp_path: Path) -> None:
    server = prometheus_process(tmp_path, {"chopper-agent": [agent_process.metrics_addr]}).start()
    prom = server.address
    try:
        sent = finish_training(start_training(agent_process.target, ranks=2, duration_s=5.0))
        expr = 'chopper_rank_steps_total{job="e2e"}'

        def scraped_all() -> bool:
            return sum(float(r["value"][1]) for r in prom_query(prom, expr)) == sent["0"]["steps"] + sent["1"]["steps"]

        assert wait_until(scraped_all, timeout_s=30), server.log()[-2000:]
        up = prom_query(prom, 'up{job="chopper-agent"}')
        assert up and up[0]["value"][1] == "1"
        clocks = prom_query(prom, "chopper_gpu_gfx_clock_hertz")
        assert len(clocks) == 4 and all(r["metric"]["vendor"] == "simulated" for r in clocks)
        assert prom_query(prom, 'chopper_agent_backend_up{backend="simulated"} == 1')
    finally:
        server.stop()
