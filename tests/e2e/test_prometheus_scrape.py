"""A real Prometheus server scrapes a real agent while a real training job runs."""
from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.conftest import AgentProcess, finish_training, free_port, start_training, wait_until


def query(prom: str, expr: str) -> list[dict]:
    url = f"http://{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return list(json.load(response)["data"]["result"])
    except OSError:
        return []


@pytest.mark.slow
def test_prometheus_sees_steps_and_gpus(agent_process: AgentProcess, tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("the Debian package prometheus is not installed; `make test` installs it")
    prom = f"127.0.0.1:{free_port()}"
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: chopper-agent\n    static_configs: [{{targets: ['{agent_process.metrics_addr}']}}]\n"
    )
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address={prom}"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        sent = finish_training(start_training(agent_process.target, ranks=2, duration_s=5.0))
        expr = 'chopper_rank_steps_total{job="chopper-agent"}'

        def scraped_all() -> bool:
            return sum(float(r["value"][1]) for r in query(prom, expr)) == sent["0"]["steps"] + sent["1"]["steps"]

        assert wait_until(scraped_all, timeout_s=30), (tmp_path / "prometheus.log").read_text()[-2000:]
        up = query(prom, 'up{job="chopper-agent"}')
        assert up and up[0]["value"][1] == "1"
        clocks = query(prom, "chopper_gpu_gfx_clock_hertz")
        assert len(clocks) == 4 and all(r["metric"]["vendor"] == "simulated" for r in clocks)
        assert query(prom, 'chopper_agent_backend_up{backend="simulated"} == 1')
    finally:
        server.terminate()
        server.wait(15)
