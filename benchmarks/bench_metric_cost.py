"""What each exported metric family costs on a busy node: series, bytes and CPU per scrape.

A platform engineer choosing ``metrics_profile`` / ``metrics_exclude`` (``agent/fields.py``) needs
the price of each field. Measured in one process and one run:

* the node: an in-process agent over the simulated backend, 8 H100s (18 NVLinks each), 8 ranks
  (one per GPU) that have each run 20 steps of three phases and one all-reduce, and a health
  reading per GPU of the counters NVML gives an H100 (ECC volatile and aggregate, remapped rows
  and their states, PCIe replays, NVLink CRC/replay/recovery);
* per family: its series and its bytes in the text exposition of one full scrape;
* per profile (``agent.fields.PROFILES``): series, bytes and the CPU time of a scrape
  (``chopper.daemon.text_format.Registry.render`` of a registry holding one ``AgentCollector``), the
  minimum over ``repeat`` rounds of ``number`` scrapes each, the variants interleaved and every
  other round in reverse order (ABBA), as a ratio to the full profile.

Goal: the field selection filter itself is nearly free: a full scrape through a selection that
keeps every family costs at most 1.10x one without a selection. The filter is one set lookup per
series (well under 1% of a scrape); the bound is the measurement's noise on a shared 2-core
machine, where repeated runs put this ratio anywhere from 0.95 to 1.05.

Run: ``python benchmarks/bench_metric_cost.py``; ``run()`` returns the figures as a dict.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agent import fields
from agent.backends.simulated import SimulatedBackend
from agent.config import load_settings
from agent.daemon import Agent
from agent.metrics import AgentCollector
from chopper.daemon.text_format import Registry
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.schema import ErrorCount

GPUS = 8
STEPS = 20
GOAL_FILTER_RATIO = 1.10
MS = 1_000_000
# The health counters NVML reads on an H100 (agent/backends/nvidia.py), all 0: a healthy GPU.
H100_HEALTH = (
    *(ErrorCount(kind, window, "total", 0.0) for kind in ("ecc_corrected", "ecc_uncorrected")
      for window in ("volatile", "aggregate")),
    ErrorCount("remapped_rows", "", "correctable", 0.0), ErrorCount("remapped_rows", "", "uncorrectable", 0.0),
    ErrorCount("remap_pending", "", "", 0.0), ErrorCount("remap_failed", "", "", 0.0),
    ErrorCount("pcie_replay", "", "", 0.0), ErrorCount("link_crc", "", "flit", 0.0),
    ErrorCount("link_crc", "", "data", 0.0), ErrorCount("link_replay", "", "", 0.0),
    ErrorCount("link_recovery", "", "", 0.0),
)


def busy_node() -> Agent:
    """The node of the module docstring, its steps summarised."""
    settings = load_settings(["--node", "bench", "--backend", "simulated", "--sim-model", "H100", "--sim-gpus",
                              str(GPUS), "--sample-hz", "10"], env={})
    agent = Agent(settings, SimulatedBackend("bench", model="H100", gpus=GPUS), host=None)
    agent.open_backend()
    t0 = time.time_ns() - (STEPS + 5) * 100 * MS
    agent.tick(t0)
    for gpu in range(GPUS):
        agent.health.update(gpu, t0, H100_HEALTH)
        markers = []
        for step in range(STEPS):
            b = t0 + step * 100 * MS
            markers += [pb.Marker(kind=pb.MARKER_KIND_STEP_BEGIN, step=step, ts_ns=b)]
            for i, phase in enumerate(("forward", "backward", "optimizer")):
                markers += [pb.Marker(kind=pb.MARKER_KIND_PHASE_BEGIN, step=step, ts_ns=b + (1 + 30 * i) * MS,
                                      name=phase),
                            pb.Marker(kind=pb.MARKER_KIND_PHASE_END, step=step, ts_ns=b + (30 + 30 * i) * MS,
                                      name=phase)]
            markers += [pb.Marker(kind=pb.MARKER_KIND_COLLECTIVE_BEGIN, step=step, ts_ns=b + 92 * MS,
                                  name="all_reduce", bytes=10**8),
                        pb.Marker(kind=pb.MARKER_KIND_COLLECTIVE_END, step=step, ts_ns=b + 97 * MS,
                                  name="all_reduce", bytes=10**8),
                        pb.Marker(kind=pb.MARKER_KIND_STEP_END, step=step, ts_ns=b + 99 * MS, flops=1e14, tokens=4096)]
        agent.push_markers(pb.MarkerBatch(job="bench", rank=gpu, gpu=gpu, seq=1, pid=os.getpid(), markers=markers))
    for i in range(1, STEPS + 5):
        agent.tick(t0 + i * 100 * MS)
    return agent


def _registry(agent: Agent, exported: frozenset[str] | None) -> Registry:
    registry = Registry()
    registry.register(AgentCollector(agent.view, exported=exported))
    return registry


def _families(text: str) -> dict[str, tuple[int, int]]:
    """Catalog name -> (series, bytes of its lines, HELP and TYPE included) in one text exposition."""
    out: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        comment = line.startswith("#")
        name = line.split()[2] if comment else re.split(r"[{ ]", line, maxsplit=1)[0]
        series, size = out.get(name, (0, 0))
        out[name] = (series + (not comment), size + len(line) + 1)
    return out


def _scrape_cpu_s(registry: Registry, number: int) -> float:
    start = time.process_time()
    for _ in range(number):
        registry.render()
    return (time.process_time() - start) / number


def run(number: int = 40, repeat: int = 10) -> dict[str, Any]:
    """Measure the module docstring's figures; returns per-family and per-profile costs and the goal."""
    agent = busy_node()
    selections: dict[str, frozenset[str] | None] = {
        "none": None, **{name: fields.selected(name) for name in fields.PROFILES}}
    registries = {name: _registry(agent, exported) for name, exported in selections.items()}
    texts = {name: registry.render().decode() for name, registry in registries.items()}
    best = {name: float("inf") for name in registries}
    order = list(registries)
    for round_ in range(repeat):  # interleaved, every other round reversed (ABBA): drift moves every variant alike
        for name in order if round_ % 2 == 0 else order[::-1]:
            best[name] = min(best[name], _scrape_cpu_s(registries[name], number))
    per_family = _families(texts["full"])
    ratio_filter = best["full"] / best["none"]
    return {
        "gpus": GPUS, "ranks": GPUS, "number": number, "repeat": repeat,
        "families": {name: {"series": s, "bytes": b} for name, (s, b) in sorted(
            per_family.items(), key=lambda kv: -kv[1][1])},
        "profiles": {name: {"series": sum(s for s, _ in _families(texts[name]).values()),
                            "bytes": len(texts[name]), "scrape_cpu_ms": round(1e3 * best[name], 3),
                            "ratio_to_full": round(best[name] / best["full"], 3)}
                     for name in fields.PROFILES},
        "ratio_filter_vs_none": round(ratio_filter, 3), "goal_ratio": GOAL_FILTER_RATIO,
        "meets_goal": ratio_filter <= GOAL_FILTER_RATIO,
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
