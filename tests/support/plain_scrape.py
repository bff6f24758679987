"""The shipped plain scrape config (deploy/prometheus/prometheus.yml) over two simulated nodes and an aggregator.

The nodes give every dashboard panel something to show: an H100 node whose power cap makes the two
GPUs a real gloo job trains on throttle, and which schedules an XID 79 and corrected ECC errors
(the health row and the health alerts), and an MI300X node (AMD's counters: bad pages, PCIe NAKs,
XGMI). ``FAST`` renders the shipped rules for 1 s scrapes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import grpc
import yaml

from chopper.demo.run import free_port
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import agent_pb2_grpc as pb_grpc
from dashboards import render
from dashboards.names import C
from dashboards.params import RuleParams
from tests.support.daemons import AgentProcess, AggregatorProcess
from tests.support.prometheus import ServerProcess

CONFIG = render.ROOT / "deploy/prometheus/prometheus.yml"
FAST = RuleParams(rate_window="4s")
NVIDIA = ("--sim-model", "H100", "--sim-power-cap-w", "300",
          "--sim-health-events", "0:xid:1:1:79,1:ecc_corrected:1:3")
AMD = ("--node", "amd-node", "--sim-model", "MI300X", "--sim-health-events", "0:bad_pages:1:2")
# The simulated backend reads no memory or voltage-regulator sensor (amdsmi and NVML do).
MAY_BE_EMPTY = frozenset({C.gpu_memory_temperature_celsius, C.gpu_vr_temperature_celsius})


def plain_prometheus(workdir: Path, targets: dict[str, list[str]], rules: Path,
                     extra: dict | None = None) -> ServerProcess:
    """The shipped config with ``targets`` by scrape job, 1 s intervals and ``rules``; nothing else changed.

    Args:
        extra: Top-level keys added to the config (e.g. ``remote_write``); a ``global`` here is merged
            into the shipped one (e.g. ``external_labels``).
    """
    config = yaml.safe_load(CONFIG.read_text())
    assert all("honor_labels" not in job for job in config["scrape_configs"]), "the plain config honors labels"
    assert {job["job_name"] for job in config["scrape_configs"]} == set(targets)
    extra = dict(extra or {})
    config["global"] = {**config["global"], **extra.pop("global", {}), "scrape_interval": "1s",
                        "evaluation_interval": "1s"}
    config.update(extra)
    config["rule_files"] = [str(rules)]
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": targets[job["job_name"]]}]
    (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    address = f"127.0.0.1:{free_port()}"
    return ServerProcess(workdir, "prometheus", address, f"--config.file={workdir / 'prometheus.yml'}",
                         f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address={address}")


def reject_one_batch(agent: AgentProcess) -> None:
    """A batch without a job: the agent rejects it, so the rejection counter the health panel reads exists."""
    with grpc.insecure_channel(agent.target) as channel:
        reply = pb_grpc.AgentStub(channel).PushMarkers(iter([pb.MarkerBatch(job="", rank=0, gpu=0, seq=1)]), timeout=10)
    assert reply.accepted == 0


@dataclass
class Nodes:
    """The aggregator and the two agents delivering to it, each already appended to the caller's ``started``."""

    agg: AggregatorProcess
    nvidia: AgentProcess
    amd: AgentProcess

    @property
    def targets(self) -> dict[str, list[str]]:
        """The scrape targets by the shipped config's job names."""
        return {"chopper-agent": [self.nvidia.metrics_addr, self.amd.metrics_addr],
                "chopper-aggregator": [self.agg.metrics_addr]}


def start_nodes(workdir: Path, started: list) -> Nodes:
    """Start the aggregator, then the NVIDIA and AMD agents delivering to it; each goes into ``started`` once up."""
    agg = AggregatorProcess(workdir, "agg", "--store-dir", str(workdir / "store")).start()
    started.append(agg)
    agents = []
    for name, args in (("nvidia", NVIDIA), ("amd", AMD)):
        (workdir / name).mkdir()
        agents.append(AgentProcess(workdir / name, *args, "--aggregators", agg.address).start())
        started.append(agents[-1])
    return Nodes(agg, *agents)
