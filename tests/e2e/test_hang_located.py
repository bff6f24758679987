"""A real hung gloo job located: /metrics, the aggregator, `chopper steps` and a real Prometheus alert say where.

Two ranks of ``tests/e2e/hang_train.py`` step normally, then at step 3 rank 1 sleeps inside
``backward`` while rank 0 waits inside ``all_reduce`` for it. One real agent (which delivers to a
real aggregator) holds their markers; a real Prometheus scrapes the agent and evaluates the
committed rules, rendered with a 5 s stall window. Every surface must say where each rank is:

- the agent's ``/metrics``: ``chopper_rank_open_step`` 3 for both ranks, and
  ``chopper_rank_position_seconds`` with kind collective / name all_reduce for rank 0 and kind
  phase / name backward for rank 1, growing with the hang;
- the aggregator's ``QuerySteps``, and ``chopper where`` asking it: both positions, no summary needed;
- ``chopper steps --stalled-after 2``: the "where" line, e.g. ``job hang: no step for 3 s; rank 0
  inside collective all_reduce of step 3 for 3 s; rank 1 inside phase backward of step 3 for 3 s``;
- the ``ChopperJobStalled`` alert firing in Prometheus, its description naming both places.
"""
from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chopper.demo.run import free_port
from chopper.positions import describe
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from chopper.proto.chopper.v1 import aggregator_pb2_grpc as apb_grpc
from dashboards.params import RuleParams
from dashboards.rulefile import rules_yaml
from tests.support.daemons import AgentProcess, AggregatorProcess, stop_all
from tests.support.polling import wait_until
from tests.support.prometheus import ServerProcess, prometheus_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
HANG_STEP = 3
FAST = RuleParams(stall_window="5s", stall_for="0s")


class Lines:
    """A process's stdout lines, read on a thread of their own so that no wait blocks on the pipe."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.lines, self.lock = proc, [], threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.lock:
                self.lines.append(line.rstrip("\n"))

    def matching(self, pattern: str) -> list[str]:
        with self.lock:
            return [line for line in self.lines if re.search(pattern, line)]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[AgentProcess, AggregatorProcess, ServerProcess]]:
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_yaml(FAST))
    started: list = []
    try:
        agg = AggregatorProcess(tmp_path, "agg").start()
        started.append(agg)
        agent = AgentProcess(tmp_path, "--aggregators", agg.address).start()
        started.append(agent)
        prom = prometheus_process(tmp_path, {"chopper-agent": [agent.metrics_addr]}, rule_files=(rules,)).start()
        started.append(prom)
        yield agent, agg, prom
    finally:
        stop_all(started)


def _spawn(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _positions(agent: AgentProcess) -> dict[str, tuple[str, str, float]]:
    """rank -> (kind, name, seconds) from the agent's chopper_rank_position_seconds, job hang."""
    out = {}
    for family in text_string_to_metric_families(agent.metrics()):
        for s in family.samples:
            if s.name == "chopper_rank_position_seconds" and s.labels["training_job"] == "hang":
                out[s.labels["rank"]] = (s.labels["kind"], s.labels["name"], s.value)
    return out


def _open_steps(agent: AgentProcess) -> dict[str, float]:
    return {s.labels["rank"]: s.value for f in text_string_to_metric_families(agent.metrics()) for s in f.samples
            if s.name == "chopper_rank_open_step" and s.labels["training_job"] == "hang"}


def _stalled_alerts(prom: str) -> list[dict]:
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{prom}/api/v1/alerts", timeout=5) as response:
            alerts = json.load(response)["data"]["alerts"]
    except OSError:
        return []
    return [a for a in alerts if a["labels"]["alertname"] == "ChopperJobStalled"
            and a["labels"].get("training_job") == "hang" and a["state"] == "firing"]


def test_a_hung_job_is_located_on_every_surface(stack) -> None:  # type: ignore[no-untyped-def]
    agent, agg, prom = stack
    port = free_port()
    ranks = [_spawn([sys.executable, "-m", "tests.e2e.hang_train", "--agent", agent.target, "--rank", str(r),
                     "--world", "2", "--port", str(port), "--hang-step", str(HANG_STEP), "--hang-rank", "1"])
             for r in (0, 1)]
    follower = _spawn([sys.executable, "-m", "chopper.cli", "steps", "--agent", agent.target, "--stalled-after", "2"])
    steps = Lines(follower)
    try:
        # 1. /metrics: where each rank is, and the step both have open.
        want = {"0": ("collective", "all_reduce"), "1": ("phase", "backward")}
        assert wait_until(lambda: {r: p[:2] for r, p in _positions(agent).items()} == want, timeout_s=90), (
            f"positions {_positions(agent)}; ranks alive: {[p.poll() is None for p in ranks]}")
        assert _open_steps(agent) == {"0": float(HANG_STEP), "1": float(HANG_STEP)}
        first = _positions(agent)
        assert wait_until(lambda: _positions(agent)["0"][2] > first["0"][2] + 1.0, timeout_s=10)  # it grows
        assert all(p.poll() is None for p in ranks), "a rank exited instead of hanging"

        # 2. The aggregator: the positions arrive without any summary of the hung step.
        def queried() -> list:
            with grpc.insecure_channel(agg.address) as channel:
                return list(apb_grpc.AggregatorStub(channel).QuerySteps(apb.QueryStepsRequest(job="hang"),
                                                                        timeout=10).positions)

        assert wait_until(lambda: [p.rank for p in queried()] == [0, 1], timeout_s=20), queried()
        line = describe(queried())
        assert re.fullmatch(rf"rank 0 inside collective all_reduce of step {HANG_STEP} for \d+ s; "
                            rf"rank 1 inside phase backward of step {HANG_STEP} for \d+ s", line), line
        print(f"aggregator: {line}")
        where_cli = subprocess.run([sys.executable, "-m", "chopper.cli", "where", "--aggregator", agg.address, "--job",
                                    "hang"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert where_cli.returncode == 0 and re.fullmatch(
            rf"job hang: rank 0 inside collective all_reduce of step {HANG_STEP} for \d+ s; "
            rf"rank 1 inside phase backward of step {HANG_STEP} for \d+ s\n", where_cli.stdout), where_cli

        # 3. chopper steps: step rows, then the where line once the job has not stepped for 2 s.
        where = rf"^job hang: no step for \d+ s; rank 0 inside collective all_reduce of step {HANG_STEP} for \d+ s; " \
                rf"rank 1 inside phase backward of step {HANG_STEP} for \d+ s$"
        assert wait_until(lambda: steps.matching(where), timeout_s=20), steps.lines[-10:]
        # The steps before the hang were printed for both ranks, the hung one never.
        before = steps.matching(rf"^hang\s+\d+\s+{HANG_STEP - 1}\s")
        assert {line.split()[1] for line in before} == {"0", "1"}, steps.lines
        assert not steps.matching(rf"^hang\s+\d+\s+{HANG_STEP}\s"), steps.lines
        print(f"chopper steps: {steps.matching(where)[0]}")

        # 4. The stalled-job alert fires in Prometheus, its description naming where both ranks are.
        assert wait_until(lambda: len(_stalled_alerts(prom.address)) == 2, timeout_s=60), (
            f"alerts {_stalled_alerts(prom.address)}\n{prom.log()[-2000:]}")
        for alert in _stalled_alerts(prom.address):
            text = alert["annotations"]["description"]
            assert f"1 rank (0) inside collective all_reduce of step {HANG_STEP} for up to " in text, text
            assert f"1 rank (1) inside phase backward of step {HANG_STEP} for up to " in text, text
        print(f"alert: {_stalled_alerts(prom.address)[0]['annotations']['description']}")
    finally:
        for proc in (*ranks, follower):
            proc.kill()
            proc.communicate(timeout=30)
