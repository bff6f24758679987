"""The systemd units: `systemd-analyze verify` and `security --offline` on them, and their promises checked."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from agent import main as agent_main
from agent.config import BACKENDS, AgentSettings
from agent.config import load_settings as load_agent_settings
from aggregator import main as aggregator_main
from aggregator.config import load_settings as load_aggregator_settings

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
SHIPPED_PREFIX = "/opt/chopper/venv/bin/"
DROP_INS = {"amd": "chopper-agent-amd.conf", "nvidia": "chopper-agent-nvidia.conf"}
# Highest acceptable `systemd-analyze security` exposure (0 best, 10 worst; "OK" is below 4).
MAX_EXPOSURE = {"chopper-agent": 2.5, "chopper-aggregator": 2.0}


def directives(path: Path) -> list[tuple[str, str, str, int, bool]]:
    """``(section, key, value, line number, commented)`` of every ``Key=value`` line.

    ``commented``: the line directly above is a comment (unit files allow no trailing comments).
    """
    out, section, previous = [], "", ""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            section = stripped[1:-1]
        elif stripped and not stripped.startswith(("#", ";")):
            key, _, value = stripped.partition("=")
            out.append((section, key, value, number, previous.startswith("#")))
        previous = stripped
    return out


def values(path: Path, key: str) -> list[str]:
    return [v for _, k, v, _, _ in directives(path) if k == key]


def systemd_analyze(*args: str, unit_path: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("systemd-analyze")
    if binary is None:
        pytest.fail("systemd-analyze is missing: install the Debian package systemd (`make test` does)")
    # SYSTEMD_UNIT_PATH makes verify read the drop-in directory next to the unit; ":" keeps the defaults.
    env = {**os.environ, "SYSTEMD_UNIT_PATH": f"{unit_path}:"}
    return subprocess.run([binary, *args], capture_output=True, text=True, env=env, timeout=60, check=False)


def installed_copy(tmp_path: Path, unit: str, gpu: str | None = None) -> Path:
    """The unit as installed, with ExecStart pointing at this venv (verify wants an executable)."""
    text = (UNITS / f"{unit}.service").read_text()
    assert SHIPPED_PREFIX in text, f"{unit}: ExecStart should use {SHIPPED_PREFIX} (README documents it)"
    copy = tmp_path / f"{unit}.service"
    copy.write_text(text.replace(SHIPPED_PREFIX, str(Path(sys.executable).parent) + "/"))
    if gpu is not None:
        (tmp_path / f"{unit}.service.d").mkdir()
        shutil.copy(UNITS / DROP_INS[gpu], tmp_path / f"{unit}.service.d" / "gpu.conf")
    return copy


@pytest.mark.parametrize(("unit", "gpu"), [("chopper-agent", None), ("chopper-agent", "amd"),
                                           ("chopper-agent", "nvidia"), ("chopper-aggregator", None)])
def test_systemd_analyze_verify_is_silent(tmp_path: Path, unit: str, gpu: str | None) -> None:
    copy = installed_copy(tmp_path, unit, gpu)
    result = systemd_analyze("verify", str(copy), unit_path=tmp_path)
    # verify exits 0 on unknown keys and bad values too; only silence means the unit is clean.
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


def test_verify_would_catch_a_typo_in_a_drop_in(tmp_path: Path) -> None:
    copy = installed_copy(tmp_path, "chopper-agent", "amd")
    drop_in = tmp_path / "chopper-agent.service.d" / "gpu.conf"
    drop_in.write_text(drop_in.read_text().replace("DeviceAllow=/dev/kfd", "DeviceAlow=/dev/kfd"))
    result = systemd_analyze("verify", str(copy), unit_path=tmp_path)
    assert "Unknown key 'DeviceAlow'" in result.stderr


@pytest.mark.parametrize("unit", sorted(MAX_EXPOSURE))
def test_security_exposure_is_low(tmp_path: Path, unit: str) -> None:
    gpu = "nvidia" if unit == "chopper-agent" else None  # the drop-in adds devices and groups: score it too
    copy = installed_copy(tmp_path, unit, gpu)
    result = systemd_analyze("security", "--offline=true", "--no-pager", str(copy), unit_path=tmp_path)
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE[unit], result.stdout


@pytest.mark.parametrize("path", sorted(p.name for p in UNITS.glob("*.service")) + sorted(DROP_INS.values()))
def test_every_setting_has_a_comment_above_it(path: str) -> None:
    bare = [f"{path}:{n}: {k}={v}" for _, k, v, n, commented in directives(UNITS / path) if not commented]
    assert not bare, "settings without a comment saying why:\n" + "\n".join(bare)


@pytest.mark.parametrize("unit", ["chopper-agent", "chopper-aggregator"])
def test_units_keep_their_promises(unit: str) -> None:
    path = UNITS / f"{unit}.service"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert values(path, "ExecStart") == [SHIPPED_PREFIX + unit] and unit in scripts
    assert values(path, "Type") == ["notify"]
    assert values(path, "EnvironmentFile") == [f"-/etc/default/{unit}"]
    assert values(path, "Restart") == ["on-failure"]
    for key, expected in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("ProtectHome", "yes"),
                          ("CapabilityBoundingSet", "")):
        assert values(path, key) == [expected], key
    assert values(path, "CPUQuota") and values(path, "MemoryMax")
    assert values(path, "User") == ["chopper"]
    # The daemon must notice a hung loop before systemd gives up on the pings.
    watchdog_s = float(values(path, "WatchdogSec")[0].removesuffix("s"))
    stale_s = agent_main.SAMPLER_STALE_S if unit == "chopper-agent" else aggregator_main.TICK_STALE_S
    assert stale_s < watchdog_s


def test_agent_runtime_directory_is_where_trainers_look() -> None:
    path = UNITS / "chopper-agent.service"
    socket_dir = Path(AgentSettings().socket_path).parent
    assert socket_dir.parent == Path("/run") and values(path, "RuntimeDirectory") == [socket_dir.name]
    assert values(path, "DevicePolicy") == ["closed"] and not values(path, "DeviceAllow")


@pytest.mark.parametrize(("gpu", "allowed"), [("amd", {"/dev/kfd rw", "char-drm rw"}),
                                              ("nvidia", {"char-nvidia-frontend rw", "char-nvidia-caps r"})])
def test_gpu_drop_ins_allow_exactly_their_vendor_nodes(gpu: str, allowed: set[str]) -> None:
    path = UNITS / DROP_INS[gpu]
    assert set(values(path, "DeviceAllow")) == allowed
    assert values(path, "Environment") == [f"CHOPPER_AGENT_BACKEND={gpu}"] and gpu in BACKENDS


@pytest.mark.parametrize(("name", "prefix", "load"), [("chopper-agent", "CHOPPER_AGENT_", load_agent_settings),
                                                      ("chopper-aggregator", "CHOPPER_AGGREGATOR_",
                                                       load_aggregator_settings)])
def test_environment_files_name_real_settings_with_valid_values(name: str, prefix: str, load) -> None:  # type: ignore[no-untyped-def]
    """Every example in /etc/default/NAME, uncommented, is a setting the daemon accepts."""
    example = {}
    for line in (UNITS / f"{name}.default").read_text().splitlines():
        if m := re.fullmatch(r"#?(CHOPPER_[A-Z_]+)=(.*)", line):
            example[m.group(1)] = m.group(2)
    environment = {k.removeprefix(prefix).lower(): v for k, v in example.items() if k.startswith(prefix)}
    assert len(environment) == len(example) >= 4, example
    # Unit Environment= lines count as examples too; all of it together must load.
    for assignment in values(UNITS / f"{name}.service", "Environment"):
        key, _, value = assignment.partition("=")
        example.setdefault(key, value)
    settings = load([], {k: v for k, v in example.items() if v})
    for key in environment:
        assert hasattr(settings, key), f"{name}.default: {prefix}{key.upper()} is not a setting"


def test_sysusers_creates_the_units_user(tmp_path: Path) -> None:
    binary = shutil.which("systemd-sysusers")
    if binary is None:
        pytest.fail("systemd-sysusers is missing: install the Debian package systemd (`make test` does)")
    (tmp_path / "etc").mkdir()
    subprocess.run([binary, f"--root={tmp_path}", "-"], input=(UNITS / "chopper.sysusers").read_text(), text=True,
                   capture_output=True, check=True, timeout=60)
    passwd = (tmp_path / "etc" / "passwd").read_text()
    user = values(UNITS / "chopper-agent.service", "User")[0]
    assert re.search(rf"^{user}:x:10001:10001:.*:/usr/sbin/nologin$", passwd, re.M), passwd
