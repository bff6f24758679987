"""Every entry point answers ``--version`` with Chopper's version: the console scripts and the ``python -m`` ones."""
from __future__ import annotations

import contextlib
import importlib
import io
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from chopper import __version__

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
MODULES = ["agent", "aggregator", "chopper.cli", "deploy.stack", "deploy.stack.compose"]


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_console_script_prints_its_version(script: str) -> None:
    module, _, function = SCRIPTS[script].partition(":")
    main = getattr(importlib.import_module(module), function)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            status = main(["--version"])
        except SystemExit as exc:  # argparse's --version ends a main() that does not catch it
            status = exc.code
    assert (status or 0) == 0
    assert out.getvalue() == f"{script} {__version__}\n"


@pytest.mark.parametrize("module", MODULES)
def test_python_m_prints_its_version(module: str) -> None:
    done = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60,
                          check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == __version__
