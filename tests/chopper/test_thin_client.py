"""The thin client distribution, chopper-client: built, installed into a fresh venv, and marking steps to a real agent.

The wheel is built by packaging/client/build_wheel.py from this tree's sources and installed with pip
into a venv made by ``python -m venv``; grpcio and protobuf come from the configured index (the pip
cache where it has them). The thin venv's Python runs isolated (``-I``), so it sees its own
site-packages only, never this checkout.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import chopper
from chopper.demo.run import metric_sum
from tests.support.daemons import AgentProcess
from tests.support.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "packaging" / "client"

# What training code imports; each must be in the wheel.
REQUIRED = {
    "chopper", "chopper.client", "chopper.schema", "chopper.profiler", "chopper._device_clock",
    "chopper.identity", "chopper.identity.device", "chopper.identity.jobname", "chopper.identity.launcher",
    "chopper.identity.process", "chopper.proto.chopper.v1.agent_pb2", "chopper.proto.chopper.v1.agent_pb2_grpc",
    "chopper.pytorch", "chopper.torch", "chopper.hf", "chopper.lightning",
}
# The daemons and analysis tools, with their heavy dependencies: none of it in the wheel.
FULL_ONLY = ("agent", "aggregator", "chopper.attribution", "chopper.cli", "chopper.daemon", "chopper.demo",
             "chopper.inspector", "chopper.predict", "chopper.report", "chopper.runs", "chopper.trace")
# A fresh venv may hold these beside chopper-client: its two dependencies, what grpcio pulls in
# (typing-extensions), and what venv seeds (pip; setuptools too up to Python 3.11).
ALLOWED = {"chopper-client", "grpcio", "protobuf", "typing-extensions", "pip", "setuptools"}
HEAVY = {"numpy", "pandas", "pyarrow", "matplotlib", "psutil", "prometheus-client", "pyyaml", "ijson",
         "grpcio-health-checking", "torch", "chopper-telemetry"}
STEPS = 5


def requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match, requirement
    return match.group(0).lower().replace("_", "-")


def test_client_requirements_are_the_full_distributions() -> None:
    full = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    thin = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    assert sorted(requirement_name(r) for r in thin["dependencies"]) == ["grpcio", "protobuf"]
    for requirement in thin["dependencies"]:
        assert requirement in full["dependencies"], \
            f"{requirement!r} in {CLIENT / 'pyproject.toml'} differs from pyproject.toml's: {full['dependencies']}"
    for extra, requirements in thin["optional-dependencies"].items():
        assert requirements == full["optional-dependencies"][extra], f"extra {extra!r} differs from pyproject.toml's"
    assert "scripts" not in thin, "chopper-client has no console scripts: `chopper` runs the analysis tools"


@dataclass(frozen=True)
class ThinVenv:
    wheel: Path
    python: Path
    workdir: Path

    def run(self, code: str, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ``code`` in the thin venv's Python, isolated from this checkout and PYTHON* variables."""
        return subprocess.run([str(self.python), "-I", "-c", textwrap.dedent(code), *args], cwd=self.workdir,
                              capture_output=True, text=True, timeout=timeout_s)


@pytest.fixture(scope="module")
def thin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThinVenv]:
    workdir = tmp_path_factory.mktemp("thin")
    built = subprocess.run([sys.executable, str(CLIENT / "build_wheel.py"), "--out", str(workdir / "dist")],
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    wheel = Path(built.stdout.strip())
    venv = workdir / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=120)
    if made.returncode != 0:
        pytest.skip(f"cannot create a venv ({sys.executable} -m venv exited {made.returncode}: "
                    f"{made.stderr.strip()[-500:]}); on Debian: apt-get install python3-venv")
    python = venv / "bin" / "python"
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, f"pip install {wheel.name} failed: {installed.stdout}{installed.stderr}"
    yield ThinVenv(wheel, python, workdir)


@pytest.mark.slow
def test_wheel_holds_the_client_and_no_daemon_or_analysis_tool(thin: ThinVenv) -> None:
    with zipfile.ZipFile(thin.wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    modules = {n.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for n in names if n.endswith(".py")}
    assert modules >= REQUIRED, f"missing {sorted(REQUIRED - modules)}"
    assert not {m for m in modules if any(m == p or m.startswith(p + ".") for p in FULL_ONLY)}
    assert "chopper/proto/chopper/v1/agent.proto" in names
    assert not [n for n in names if n.endswith("entry_points.txt")], "no console scripts"
    assert f"Version: {chopper.__version__}\n" in metadata
    requires = [line.removeprefix("Requires-Dist: ") for line in metadata.splitlines()
                if line.startswith("Requires-Dist: ") and "extra ==" not in line]
    assert sorted(requirement_name(r) for r in requires) == ["grpcio", "protobuf"]


@pytest.mark.slow
def test_fresh_venv_holds_only_the_client_and_its_dependencies(thin: ThinVenv) -> None:
    listed = subprocess.run([str(thin.python), "-m", "pip", "list", "--format", "json"],
                            capture_output=True, text=True, timeout=60, check=True)
    installed = {requirement_name(d["name"]) for d in json.loads(listed.stdout)}
    assert installed >= {"chopper-client", "grpcio", "protobuf"}
    assert installed <= ALLOWED, f"came with the thin client: {sorted(installed - ALLOWED)}"
    assert not installed & HEAVY


@pytest.mark.slow
def test_import_chopper_loads_no_heavy_module_and_hooks_ask_for_their_framework(thin: ThinVenv) -> None:
    done = thin.run("""
        import json, sys
        import chopper
        light = sorted(m for m in ("grpc", "google.protobuf", "numpy", "pandas", "torch") if m in sys.modules)
        from chopper.proto.chopper.v1 import agent_pb2_grpc, aggregator_pb2_grpc  # protobuf accepts the stubs
        missing = {}
        for hook in ("chopper.pytorch", "chopper.lightning", "chopper.hf"):
            try:
                __import__(hook)
            except ImportError as e:
                missing[hook] = str(e)
        print(json.dumps({"file": chopper.__file__, "version": chopper.__version__, "loaded": light,
                          "missing": missing}))
    """)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert Path(got["file"]).is_relative_to(thin.workdir / "venv"), got["file"]
    assert got["version"] == chopper.__version__
    assert got["loaded"] == []
    # Each hook is there and wants only the framework that the training image brings.
    assert got["missing"]["chopper.pytorch"] == "No module named 'torch'"
    assert "Lightning" in got["missing"]["chopper.lightning"]
    assert "transformers" in got["missing"]["chopper.hf"]


@pytest.mark.slow
def test_markers_from_the_thin_venv_reach_a_real_agent(thin: ThinVenv, tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path, "--sim-gpus", "1").start()
    try:
        done = thin.run("""
            import json, sys, time
            import chopper
            chopper.init(job="thin", rank=0, gpu=0, agent=sys.argv[1])
            for i in range(int(sys.argv[2])):
                with chopper.step(i, flops=1e12, tokens=256):
                    with chopper.phase("forward"):
                        time.sleep(0.02)
                    with chopper.collective("all_reduce", bytes=4096):
                        time.sleep(0.005)
            chopper.shutdown()
            print(json.dumps(chopper.stats()))
        """, agent.target, str(STEPS))
        assert done.returncode == 0, done.stderr
        stats = json.loads(done.stdout)
        assert stats["sent"] == 6 * STEPS and stats["dropped"] == 0, stats

        def received(kind: str) -> int:
            return int(metric_sum(agent.metrics(), "chopper_rank_markers_received_total",
                                  job="thin", rank="0", kind=kind))

        for kind in ("step_begin", "step_end", "phase_begin", "phase_end", "collective_begin", "collective_end"):
            assert wait_until(lambda kind=kind: received(kind) == STEPS), f"{kind}: {received(kind)} of {STEPS}"
        assert wait_until(lambda: metric_sum(agent.metrics(), "chopper_rank_steps_total",
                                             training_job="thin", rank="0") == STEPS)
        assert metric_sum(agent.metrics(), "chopper_agent_markers_rejected_total") == 0
        assert agent.terminate() == 0
    finally:
        if agent.proc is not None and agent.proc.poll() is None:
            agent.kill()
