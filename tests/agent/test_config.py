"""Agent settings: defaults < YAML < CHOPPER_* env < flags, and every bad value named with its source and fix."""
from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import ConfigError, load_settings


def test_precedence_defaults_yaml_env_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("sample_hz: 20\nbackend: simulated\nsim_gpus: 4\nsim_hot_gpus: [1, 3]\n")
    env = {"CHOPPER_AGENT_SAMPLE_HZ": "50", "CHOPPER_AGENT_SIM_MODEL": "H200"}
    s = load_settings(["--config", str(cfg), "--sim-gpus", "2", "--sim-hot-gpus", "1"], env=env)
    assert (s.sample_hz, s.backend, s.sim_gpus, s.sim_model, s.sim_hot_gpus) == (50.0, "simulated", 2, "H200", (1,))
    assert load_settings([], env={}).sample_hz == 10.0


def test_config_file_from_env(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("sample_hz: 100\n")
    assert load_settings([], env={"CHOPPER_AGENT_CONFIG": str(cfg)}).sample_hz == 100.0


@pytest.mark.parametrize(
    ("argv", "yaml_text", "message"),
    [
        (["--sample-hz", "fast"], None, "sample_hz: 'fast' (from --sample-hz) is not a valid float"),
        (["--sample-hz", "1000"], None, "sample_hz: 1000.0 is out of range; use 1 to 100"),
        (["--max-message-bytes", str(2**31)], None, "max_message_bytes: 2147483648 is out of range; use 65536 to"),
        (["--marker-buffer", str(10**12)], None, "marker_buffer: 1000000000000 is out of range"),
        (["--backend", "cuda"], None, "backend: 'cuda' is not a backend; choose one of auto, amd, nvidia"),
        (["--metrics-listen", "9477"], None, "metrics_listen: '9477' is not host:port"),
        (["--socket-mode", "rw"], None, "socket_mode: 'rw' is not octal permission bits"),
        (["--backend", "replay"], None, "replay_dir: required with backend replay"),
        (["--sim-hot-gpus", "9"], None, "sim_hot_gpus: (9,) names a GPU outside 0..7"),
        (["--sim-power-cap-w", "-5"], None, "sim_power_cap_w: -5.0 is negative; use 0 for the model's TDP"),
        (["--rank-idle-s", "0"], None, "rank_idle_s: 0.0 is out of range; use 1 s to a week"),
        (["--max-ranks", "0"], None, "max_ranks: 0 is out of range; use 1 to 1000000"),
        ([], "sample_hz: [1, 2]\n", "sample_hz: [1, 2] (from config file"),
        ([], "sampel_hz: 10\n", "unknown setting(s) sampel_hz; known settings are node, backend"),
        ([], "- 1\n- 2\n", "must be a mapping of setting: value, got list"),
        ([], "sample_hz: [\n", "is not valid YAML"),
    ],
)
def test_bad_values_name_key_and_fix(tmp_path: Path, argv: list[str], yaml_text: str | None, message: str) -> None:
    if yaml_text is not None:
        cfg = tmp_path / "agent.yaml"
        cfg.write_text(yaml_text)
        argv = [*argv, "--config", str(cfg)]
    with pytest.raises(ConfigError) as err:
        load_settings(argv, env={})
    assert message in str(err.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot be read .* check the --config path"):
        load_settings(["--config", str(tmp_path / "nope.yaml")], env={})


def test_env_bad_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"sim_gpus: 'two' \(from env CHOPPER_AGENT_SIM_GPUS\)"):
        load_settings([], env={"CHOPPER_AGENT_SIM_GPUS": "two"})


def test_docs_config_md_is_current() -> None:
    from agent.config import markdown

    doc = Path(__file__).resolve().parents[2] / "docs" / "CONFIG.md"
    assert doc.read_text() == markdown(), "run: python -m agent.config > docs/CONFIG.md"


def test_retirement_settings_from_env() -> None:
    s = load_settings([], env={"CHOPPER_AGENT_RANK_IDLE_S": "60", "CHOPPER_AGENT_MAX_RANKS": "64"})
    assert (s.rank_idle_s, s.max_ranks) == (60.0, 64)
    assert (load_settings([], env={}).rank_idle_s, load_settings([], env={}).max_ranks) == (300.0, 1024)
