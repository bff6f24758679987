"""`make stack` for real: every part up and answering, an alert through to Alertmanager, a clean stop."""
from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest

from chopper.demo.run import metric_sum
from deploy.stack import cli
from tests.support.polling import wait_until
from tests.support.prometheus import prom_query

ALWAYS_FIRING = """groups:
- name: stack-test
  rules:
  - alert: StackTestAlwaysFiring
    expr: vector(1)
    labels: {severity: info}
"""


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())


def answers(addr: str) -> bool:
    host, _, port = addr.rpartition(":")
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, int(port))) == 0


@pytest.mark.slow
def test_stack_comes_up_answers_and_stops_cleanly(tmp_path: Path) -> None:
    workdir = tmp_path / "stack"
    rules = tmp_path / "always.yaml"
    rules.write_text(ALWAYS_FIRING)
    shipped = [["--rules", str(cli.DEFAULT_RULES)]] if cli.DEFAULT_RULES.exists() else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "deploy.stack", "--free-ports", "--ranks", "1", "--scrape-interval", "1",
         "--workdir", str(workdir), "--rules", str(rules), *(arg for pair in shipped for arg in pair)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = ""
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            out += line
            if line.startswith("Ctrl-C stops everything") or line.startswith("stack: stopping"):
                break
        assert "chopper stack is up" in out, out
        urls = dict(re.findall(r"^\s+(agent|aggregator|prometheus|alertmanager)\s+(http://\S+)", out, re.M))
        assert set(urls) == {"agent", "aggregator", "prometheus", "alertmanager"}, out
        assert b"chopper_agent_backend_up" in get(urls["agent"])
        assert b"chopper_aggregator_info" in get(urls["aggregator"])
        prom, alertmanager = urls["prometheus"].removeprefix("http://"), urls["alertmanager"]
        assert get(f"{urls['prometheus']}/-/ready") and get(f"{alertmanager}/-/ready")

        # Prometheus scrapes both daemons, and the demo job's steps reach the agent and the aggregator.
        def scraped() -> bool:
            return {r["metric"]["job"] for r in prom_query(prom, "up == 1")} == {"chopper-agent", "chopper-aggregator"}

        # Generous limits: each wait ends as soon as its condition holds, and CI machines can be loaded.
        assert wait_until(scraped, timeout_s=30), prom_query(prom, "up")
        def finalized() -> float:
            return metric_sum(get(urls["aggregator"]).decode(), "chopper_job_steps_finalized_total",
                              training_job="demo")

        assert wait_until(lambda: finalized() > 0, timeout_s=60), (workdir / "training.log").read_text()[-3000:]
        # The training job's own label, training_job, as the shipped rules expect (no honor_labels needed).
        assert wait_until(lambda: bool(prom_query(prom, 'chopper_rank_steps_total{training_job="demo"} > 0')),
                          timeout_s=30)
        groups = {g["name"] for g in json.loads(get(f"{urls['prometheus']}/api/v1/rules"))["data"]["groups"]}
        assert "stack-test" in groups and (not shipped or len(groups) > 1), groups

        # A rule that always fires goes through Prometheus to Alertmanager.
        def alerted() -> bool:
            alerts = json.loads(get(f"{alertmanager}/api/v2/alerts"))
            return any(a["labels"]["alertname"] == "StackTestAlwaysFiring" for a in alerts)

        assert wait_until(alerted, timeout_s=30)
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
        out += rest
    assert proc.returncode == 0, out
    for name in ("training", "alertmanager", "prometheus", "agent", "aggregator"):
        assert re.search(rf"^stack: {name}: exit ", out, re.M), out
    for addr in re.findall(r"http://(127\.0\.0\.1:\d+)", out):
        assert not answers(addr), f"{addr} still answers after the stack stopped"
    leftovers = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
                 if str(workdir) in " ".join(p.info["cmdline"] or [])]
    assert not leftovers, leftovers


def test_missing_rules_file_and_busy_port_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--rules", str(tmp_path / "nope.yaml"), "--workdir", str(tmp_path)]) == 2
    assert f"--rules {tmp_path / 'nope.yaml'}: no such file" in capsys.readouterr().err
    with socket.socket() as busy:
        try:
            busy.bind(("127.0.0.1", cli.PORTS["prometheus"]))
            busy.listen()
        except OSError:
            pass  # something on this machine holds it already: the same situation
        assert cli.main(["--workdir", str(tmp_path), "--ranks", "0"]) == 2
    err = capsys.readouterr().err
    assert "is in use; stop what listens there or pass --free-ports" in err, err
