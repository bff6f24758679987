"""The checks before a commit are the checks CI runs: the pre-commit hooks call what `make lint` calls."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def make_recipe(target: str) -> list[str]:
    """The command lines of a Makefile target, in order."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", text, re.M)
    assert match, f"Makefile has no {target} target"
    return [line.strip() for line in match.group(1).splitlines()]


def test_make_test_lints_before_pytest() -> None:
    head = re.search(r"^test:(.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert head and "lint" in head.group(1).split(), "make test must depend on make lint (ruff and mypy)"
    assert any("mypy" in line for line in make_recipe("types"))
    assert "$(MAKE) -s types" in make_recipe("lint")


def test_pre_commit_hooks_run_the_make_lint_checks() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    entries = [hook["entry"] for repo in config["repos"] for hook in repo["hooks"]]
    assert any(e.startswith(".venv/bin/ruff check") for e in entries)
    assert "make -s types" in entries
    assert any(line.startswith("$(BIN)/ruff check") for line in make_recipe("lint"))
    done = subprocess.run([sys.executable, "-m", "pre_commit", "validate-config", ".pre-commit-config.yaml"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_linters_are_pinned_exactly() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    for tool in ("ruff", "mypy", "types-PyYAML", "types-psutil", "types-protobuf", "pre-commit"):
        assert re.search(rf'"{re.escape(tool)}==[0-9][^"]*"', text), f"{tool} is not pinned with == in pyproject.toml"
