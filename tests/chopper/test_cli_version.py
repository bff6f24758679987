"""``chopper --version`` prints the release, ``chopper.__version__``."""
from __future__ import annotations

import subprocess
import sys

import pytest

import chopper
from chopper.cli import main


def test_version_prints_the_release_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out == f"chopper {chopper.__version__}\n"


def test_the_console_entry_point_prints_it_too() -> None:
    done = subprocess.run([sys.executable, "-m", "chopper.cli", "--version"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert (done.returncode, done.stdout) == (0, f"chopper {chopper.__version__}\n"), done.stderr
