"""``make gpu-wheels`` carries every package the check and the agent import beyond the GPU machine's own.

The GPU machine's python has torch, nvidia-ml-py, grpcio, protobuf, numpy, pandas and pyarrow and
nothing else can be counted on. A fresh interpreter imports those first, then every module the
check and its agent load (the vendor backends and the lazily imported psutil included); each
distribution that only the second set brought in must be carried.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.gpu.wheels import CARRIED

REPO = Path(__file__).resolve().parents[2]
ON_THE_GPU_MACHINE = ("torch", "pynvml", "grpc", "google.protobuf", "numpy", "pandas", "pyarrow")
OURS = ("agent", "aggregator", "benchmarks", "chopper", "deploy", "tests")
PROBE = f"""
import importlib, importlib.metadata, json, sys
for name in {ON_THE_GPU_MACHINE!r}:
    importlib.import_module(name)
before = set(sys.modules)
import agent.main, agent.backends.nvidia, agent.backends.amd, agent.backends.simulated, agent.host
import benchmarks.gpu.check, benchmarks.gpu.figures, benchmarks.gpu.workload
import chopper.attribution, chopper.runs.record, chopper.pytorch, chopper.demo.run, deploy.stack.services
agent.host.HostSampler()
tops = {{m.split(".")[0] for m in set(sys.modules) - before}} - set(sys.stdlib_module_names) - set({OURS!r})
dists = importlib.metadata.packages_distributions()
print(json.dumps(sorted({{d for t in tops for d in dists.get(t, [t])}})))
"""


def test_every_package_the_device_lacks_is_carried() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    brought_in = set(json.loads(done.stdout))
    carried = {name.lower().replace("-", "_") for name in CARRIED}
    missing = {d for d in brought_in if d.lower().replace("-", "_") not in carried}
    assert not missing, f"the GPU machine lacks {sorted(missing)}: add them to benchmarks.gpu.wheels.CARRIED"
    assert brought_in, "the probe saw no package beyond the GPU machine's own"
