"""Aggregator settings: precedence, bad values named with their source and fix, generated doc."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from aggregator.config import ConfigError, load_settings, markdown
from aggregator.main import main
from chopper.demo.run import free_port
from tests.support.hazards import HazardOutcome

ROOT = Path(__file__).resolve().parents[2]


def test_precedence_defaults_yaml_env_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "agg.yaml"
    cfg.write_text("step_timeout_s: 20\nrank_series_top_k: 8\nstore_dir: /tmp/x\n")
    env = {"CHOPPER_AGGREGATOR_STEP_TIMEOUT_S": "40", "CHOPPER_AGGREGATOR_MAX_JOBS": "5"}
    s = load_settings(["--config", str(cfg), "--max-jobs", "7"], env=env)
    assert (s.step_timeout_s, s.rank_series_top_k, s.store_dir, s.max_jobs) == (40.0, 8, "/tmp/x", 7)
    d = load_settings([], env={})
    assert (d.listen, d.metrics_listen, d.step_timeout_s, d.rank_series_top_k) == (
        "127.0.0.1:9480", "127.0.0.1:9481", 30.0, 0)


@pytest.mark.parametrize(
    ("argv", "yaml_text", "message"),
    [
        (["--step-timeout-s", "soon"], None, "step_timeout_s: 'soon' (from --step-timeout-s) is not a valid float"),
        (["--step-timeout-s", "0"], None, "step_timeout_s: 0.0 is out of range"),
        (["--rank-expiry-s", "0.5"], None, "rank_expiry_s: 0.5 is out of range; use 1 s to a week"),
        (["--max-ranks-per-job", "0"], None, "max_ranks_per_job: 0 must be at least 1"),
        (["--max-message-bytes", str(2**31)], None, "max_message_bytes: 2147483648 is out of range"),
        (["--listen", "9480"], None, "listen: '9480' is not host:port"),
        (["--metrics-listen", "127.0.0.1:9480"], None, "metrics_listen: '127.0.0.1:9480' is the same address"),
        (["--listen", "127.0.0.1:65536"], None, "listen: '127.0.0.1:65536' is not host:port"),
        (["--rank-series-top-k", "-1"], None, "rank_series_top_k: -1 is negative"),
        (["--flush-rows", "0"], None, "flush_rows: 0 must be at least 1"),
        (["--max-jobs", "1.5"], None, "max_jobs: '1.5' (from --max-jobs) is not a valid int"),
        (["--job-expiry-s", "5"], None, "job_expiry_s: 5.0 is shorter than step_timeout_s"),
        (["--log-level", "loud"], None, "log_level: 'loud' is not one of debug"),
        ([], "flush_rows: [1]\n", "flush_rows: ['1'] (from config file"),
        ([], "step_timout_s: 3\n", "unknown setting(s) step_timout_s; known settings are listen"),
        ([], "- 1\n", "must be a mapping of setting: value, got list"),
    ],
)
def test_bad_values_name_key_and_fix(tmp_path: Path, argv: list[str], yaml_text: str | None, message: str) -> None:
    if yaml_text is not None:
        cfg = tmp_path / "agg.yaml"
        cfg.write_text(yaml_text)
        argv = [*argv, "--config", str(cfg)]
    with pytest.raises(ConfigError) as err:
        load_settings(argv, env={})
    assert message in str(err.value)


def test_store_dir_that_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("")
    with pytest.raises(ConfigError, match=r"store_dir: .* is not a directory"):
        load_settings(["--store-dir", str(f)], env={})


def test_env_bad_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"flush_rows: 'many' \(from env CHOPPER_AGGREGATOR_FLUSH_ROWS\)"):
        load_settings([], env={"CHOPPER_AGGREGATOR_FLUSH_ROWS": "many"})


def test_main_bad_config_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--step-timeout-s", "-3"]) == 2
    assert "chopper-aggregator: bad configuration: step_timeout_s: -3.0 is out of range" in capsys.readouterr().err


def test_port_0_is_any_free_port_for_each_listener() -> None:
    s = load_settings(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"], env={})
    assert (s.listen, s.metrics_listen) == ("127.0.0.1:0", "127.0.0.1:0")


def test_main_listen_in_use_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{free_port()}"]) == 2
    assert f"port {port} is in use by another process" in capsys.readouterr().err


def test_docs_aggregator_config_md_is_current() -> None:
    assert (ROOT / "docs" / "AGGREGATOR_CONFIG.md").read_text() == markdown(), (
        "run: python -m aggregator.config > docs/AGGREGATOR_CONFIG.md")


@pytest.mark.hazard(item=2, input="store_dir: (empty) / store_dir: ~ in YAML, and durations like step_timeout_s: 1:30",
                    promise="a value means what was written, the same in the file, the environment and a flag, "
                    "or is refused naming the key")
def test_yaml_null_and_retyped_values(tmp_path: Path, hazard: HazardOutcome) -> None:
    cfg = tmp_path / "agg.yaml"
    # YAML's null used to arrive as the text "None": a store directory ./None, created silently.
    stores = []
    for line in ("store_dir:", "store_dir: ~", "store_dir: null"):
        cfg.write_text(line + "\n")
        stores.append(load_settings(["--config", str(cfg)], env={}).store_dir)
    assert stores == ["", "", ""]
    cfg.write_text('store_dir: "~"\n')  # quoted: the text written
    assert load_settings(["--config", str(cfg)], env={}).store_dir == "~"
    refused = []
    for line in ("step_timeout_s: 1:30", "job_expiry_s: 15:00", "flush_interval_s: 10s", "flush_rows: 050000",
                 "max_jobs: 0o", "step_timeout_s: ~"):
        cfg.write_text(line + "\n")
        with pytest.raises(ConfigError) as err:
            load_settings(["--config", str(cfg)], env={})
        assert str(err.value).startswith(line.split(":")[0] + ": "), err.value
        refused.append(line)
    hazard.outcome = (f"{len(stores)} empty/null store_dir values read as no store (not ./None); "
                      f"{len(refused)} h:m:s durations, unit suffixes, leading-zero and empty numbers refused "
                      "naming the key")
