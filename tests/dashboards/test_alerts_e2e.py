"""The rules against real processes: agent, aggregator, gloo training, Prometheus, Alertmanager.

A simulated node whose power cap (300 W on a 750 W MI300X) makes its busy GPUs throttle for power
is scraped by a real Prometheus that evaluates a fast variant of the rules (seconds-long windows,
rendered by the same code as ``dashboards/rules/rules.yaml``) and sends alerts to a real
Alertmanager, which posts them to a webhook served by this test. The DVFS alert must arrive for
exactly the two GPUs the training ranks drive, labelled ``cause="power"``. The node also simulates
uncorrected ECC errors on GPU 1 (``sim_health_events``, one every 15 s from 20 s after the agent's
first sample): the ECC and health-status alerts must arrive for GPU 1 alone, the agent must flag
a step of rank 1 ``gpu_errors`` live and none of rank 0, and the job recorded from the agent's
buffers (``chopper record --since-buffer``) must show the same through ``chopper attribute``. Then the agent restarts
with the cap lifted above what the chips draw, on the same ports, while training continues: the
alert must resolve and stay resolved with the GPUs busy at full clock. That every query of every
committed dashboard answers is tests/e2e/test_plain_scrape.py, over a plain scrape config.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from chopper.demo.run import free_port, metric_sum
from dashboards.params import RuleParams
from dashboards.recording import GPU_BUSY, GPU_CLOCK
from dashboards.rulefile import rules_yaml
from tests.support.daemons import AgentProcess, AggregatorProcess, stop_all
from tests.support.polling import wait_until
from tests.support.prometheus import ServerProcess, alertmanager_process, prom_query, prometheus_process
from tests.support.training import start_training, stop_training

# A hang catcher only: the waits below may add up to about three minutes on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FAST = RuleParams(rate_window="4s", dvfs_for="3s")
CAP = ("--sim-power-cap-w", "300")
# One uncorrected ECC error on GPU 1 every 15 s from 20 s after the agent's first sample: some land in
# training steps however late the job starts on a loaded machine.
BURSTS = ("--sim-health-events", ",".join(f"1:ecc_uncorrected:{t}:1" for t in range(20, 300, 15)))
HEALTH_ALERTS = ("ChopperGPUEccUncorrected", "ChopperGPUHealthCritical")
# The lifted cap: above what any simulated MI300X draws busy at full clock (up to 1.2 × its 750 W TDP
# for its best silicon). At the default cap, the TDP, such a chip throttles for power as real ones do,
# and on a loaded machine, whose starved ranks spend more of each step computing, enough to alert.
LIFTED = ("--sim-power-cap-w", "1000")
ALERT = "ChopperGPUThrottling"


class Webhook:
    """Alertmanager's webhook receiver: keeps every alert it is sent, in order."""

    def __init__(self) -> None:
        received: list[dict] = []
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    received.extend(body["alerts"])
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:  # keep pytest output clean
                pass

        self.received, self.lock = received, lock
        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def gpus(self, status: str) -> dict[str, str]:
        """``{gpu: cause}`` of the DVFS alerts received with ``status`` (firing or resolved)."""
        with self.lock:
            return {a["labels"]["gpu"]: a["labels"]["cause"] for a in self.received
                    if a["labels"]["alertname"] == ALERT and a["status"] == status}

    def firing(self, alert: str) -> set[str]:
        """The GPUs ``alert`` was received firing for."""
        with self.lock:
            return {a["labels"]["gpu"] for a in self.received
                    if a["labels"]["alertname"] == alert and a["status"] == "firing"}

    def labels(self) -> list[tuple[str, dict[str, str]]]:
        with self.lock:
            return [(a["status"], a["labels"]) for a in self.received]

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Webhook, ServerProcess, AgentProcess, AggregatorProcess]]:
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_yaml(FAST))
    hook = Webhook()
    started: list = []
    try:
        am = alertmanager_process(tmp_path, hook.url).start()
        started.append(am)
        agg = AggregatorProcess(tmp_path, "agg", "--store-dir", str(tmp_path / "store")).start()
        started.append(agg)
        agent = AgentProcess(tmp_path, *CAP, *BURSTS, "--aggregators", agg.address).start()
        started.append(agent)
        prom = prometheus_process(tmp_path, {"chopper-agent": [agent.metrics_addr],
                                             "chopper-aggregator": [agg.metrics_addr]},
                                  rule_files=(rules,), alertmanager=am.address).start()
        started.append(prom)
        yield hook, prom, agent, agg
    finally:
        stop_all(started)
        hook.close()


def _assert_flagged_steps(agent: AgentProcess, run: Path) -> None:
    """Record what the agent holds, attribute it: rank 1 (GPU 1) has steps flagged gpu_errors, rank 0 none."""
    def cli(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "chopper.cli", *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    # The live flag first: a burst has landed in one of rank 1's steps, so the recording holds one.
    assert wait_until(lambda: metric_sum(agent.metrics(), "chopper_rank_flagged_steps_total", rank="1",
                                         flag="gpu_errors") > 0, timeout_s=60), "no live step flagged gpu_errors"
    assert metric_sum(agent.metrics(), "chopper_rank_flagged_steps_total", rank="0", flag="gpu_errors") == 0
    cli("record", "--agent", agent.target, "--out", str(run), "--duration", "3", "--since-buffer")
    text = cli("attribute", str(run))
    assert re.search(r"GPU errors during \d+ rank-steps \(flag gpu_errors\): ecc_uncorrected; ranks 1$", text,
                     re.MULTILINE), text
    steps = json.loads(cli("attribute", str(run), "--json"))["steps"]
    flagged = {s["rank"] for s in steps if "gpu_errors" in s["flags"]}
    assert flagged == {1} and all(s["gpu_errors"] == ["ecc_uncorrected"] for s in steps if s["rank"] == 1
                                  and s["gpu_errors"])


def _value(prom: str, expr: str) -> dict[str, float]:
    return {r["metric"]["gpu"]: float(r["value"][1]) for r in prom_query(prom, expr)}


def test_dvfs_and_ecc_alerts_fire_for_their_gpus_and_the_ecc_steps_are_flagged(  # type: ignore[no-untyped-def]
        stack, tmp_path: Path) -> None:
    hook, prom_server, agent, _ = stack
    prom = prom_server.address
    # Far longer than the test: it must still run at step 4 however slow the waits before are; the
    # finally block kills it.
    training = start_training(agent.target, ranks=2, duration_s=300)
    try:
        # 1. Capped: the two GPUs the ranks drive throttle for power; the idle two do not alert.
        assert wait_until(lambda: set(hook.gpus("firing")) >= {"0", "1"}, timeout_s=50), (
            f"no DVFS alert for GPUs 0 and 1; received {hook.labels()}\n{prom_server.log()[-2000:]}")
        assert hook.gpus("firing") == {"0": "power", "1": "power"}
        assert training.poll() is None, "training ended before the alert fired"

        # 2. The ECC bursts on GPU 1: its ECC and health alerts, no other GPU's; its steps flagged.
        assert wait_until(lambda: all(hook.firing(a) for a in HEALTH_ALERTS), timeout_s=60), (
            f"no ECC alert; received {hook.labels()}")
        assert {a: hook.firing(a) for a in HEALTH_ALERTS} == {a: {"1"} for a in HEALTH_ALERTS}
        _assert_flagged_steps(agent, tmp_path / "run")
        assert training.poll() is None, "training ended before the run was recorded"

        # 3. Cap lifted (the agent restarts with LIFTED, same socket and ports): the alert resolves.
        agent.terminate()
        agent.extra = (*(a for a in agent.extra if a not in CAP), *LIFTED)
        agent.start()
        assert wait_until(lambda: set(hook.gpus("resolved")) >= {"0", "1"}, timeout_s=30), (
            f"DVFS alert did not resolve; received {hook.labels()}")
        assert training.poll() is None, "training ended before the alert resolved: it must resolve for the clock"

        # 4. And stays resolved for longer than its `for` (ALERTS also holds pending alerts), with
        # both GPUs busy at full clock. A scrape that times out on a loaded machine leaves the GPU
        # series stale for a second, so those are waited for rather than read once.
        time.sleep(4 + 2)
        assert not prom_query(prom, f'ALERTS{{alertname="{ALERT}"}}')
        seen: dict[str, dict[str, float]] = {}

        def busy_at_full_clock() -> bool:
            seen["busy"], seen["clock"] = _value(prom, GPU_BUSY), _value(prom, GPU_CLOCK)
            return (min(seen["busy"].get("0", 0.0), seen["busy"].get("1", 0.0)) > FAST.dvfs_busy_ratio
                    and min(seen["clock"].get("0", 0.0), seen["clock"].get("1", 0.0)) > FAST.dvfs_clock_ratio)

        assert wait_until(busy_at_full_clock, timeout_s=30, interval_s=0.5), seen
        assert not prom_query(prom, f'ALERTS{{alertname="{ALERT}"}}'), "the alert came back with the cap lifted"
        assert training.poll() is None
    finally:
        stop_training(training)
