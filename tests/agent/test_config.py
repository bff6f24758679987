"""Agent settings: defaults < YAML < CHOPPER_* env < flags, and every bad value named with its source and fix."""
from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import AgentSettings, ConfigError, load_settings
from tests.support.hazards import HazardOutcome


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
        (["--metrics-listen", "127.0.0.1:65536"], None, "metrics_listen: '127.0.0.1:65536' is not host:port"),
        (["--grpc-listen", "127.0.0.1:-1"], None, "grpc_listen: '127.0.0.1:-1' is not host:port"),
        (["--socket-mode", "rw"], None, "socket_mode: 'rw' (from --socket-mode) is not a valid mode; use octal"),
        (["--socket-mode", "1660"], None, "socket_mode: '1660' (from --socket-mode) is not a valid mode"),
        (["--backend", "replay"], None, "replay_dir: required with backend replay"),
        (["--sim-hot-gpus", "9"], None, "sim_hot_gpus: (9,) names a GPU outside 0..7"),
        (["--sim-power-cap-w", "-5"], None, "sim_power_cap_w: -5.0 is negative; use 0 for the model's TDP"),
        (["--rank-idle-s", "0"], None, "rank_idle_s: 0.0 is out of range; use 1 s to a week"),
        (["--max-ranks", "0"], None, "max_ranks: 0 is out of range; use 1 to 1000000"),
        ([], "sample_hz: [1, 2]\n", "sample_hz: ['1', '2'] (from config file"),
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


def test_port_0_is_any_free_port() -> None:
    s = load_settings(["--metrics-listen", "127.0.0.1:0", "--grpc-listen", "[::1]:0"], env={})
    assert (s.metrics_listen, s.grpc_listen) == ("127.0.0.1:0", "[::1]:0")


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


# Every spelling of "owner and group may connect" a user might write, and where it comes from.
MODE_FORMS = [
    ("yaml", "socket_mode: 0660"),  # YAML 1.1 alone reads this as the integer 432
    ("yaml", 'socket_mode: "0660"'), ("yaml", "socket_mode: 660"), ("yaml", "socket_mode: 0o660"),
    ("yaml", "socket_mode: '0o660'"), ("env", "0660"), ("env", "660"), ("env", "0o660"), ("flag", "0660"),
    ("flag", "660"), ("flag", "0O660"),
]


def _load_from(tmp_path: Path, source: str, text: str) -> AgentSettings:
    if source == "yaml":
        cfg = tmp_path / "agent.yaml"
        cfg.write_text(text + "\n")
        return load_settings(["--config", str(cfg)], env={})
    if source == "env":
        return load_settings([], env={"CHOPPER_AGENT_SOCKET_MODE": text})
    return load_settings(["--socket-mode", text], env={})


@pytest.mark.hazard(item=2, input="socket_mode: 0660 unquoted in YAML (YAML 1.1: the int 432), and 10 other spellings",
                    promise="every form a user writes for a mode means the same bits, or is refused naming the key")
def test_every_spelling_of_a_mode_means_the_same_bits(tmp_path: Path, hazard: HazardOutcome) -> None:
    modes = {f"{source}:{text}": _load_from(tmp_path, source, text).socket_mode for source, text in MODE_FORMS}
    assert set(modes.values()) == {"0660"}, modes
    # Forms that cannot be permission bits, or whose owner could not even connect (a decimal 432).
    refused = {}
    for text in ("432", "0432", "rw", "0999", "7777", "6.6", "u=rw,g=rw", "~", "0"):
        with pytest.raises(ConfigError) as err:
            _load_from(tmp_path, "yaml", f"socket_mode: {text}")
        refused[text] = str(err.value)
        assert str(err.value).startswith("socket_mode: "), err.value
    assert "(r---wx-w-) gives the agent's own user no write permission" in refused["432"]
    hazard.outcome = (f"{len(modes)} spellings from YAML, env and flags (unquoted 0660 included) all gave 0660; "
                      f"{len(refused)} others (432, rw, 0999, ~, ...) refused naming socket_mode and the fix")


@pytest.mark.hazard(item=2, input="unquoted YAML scalars that YAML 1.1 retypes: node: no / 0123 / 12:30, "
                    "sample_buffer: 010000, rank_idle_s: 5:00, store-like paths: ~",
                    promise="a value means what was written, the same in the file, the environment and a flag, "
                    "or is refused naming the key")
def test_yaml_implicit_types_never_change_a_value(tmp_path: Path, hazard: HazardOutcome) -> None:
    cfg = tmp_path / "agent.yaml"
    # Text settings keep the text written: YAML 1.1 would give False, 83, 750 and "None".
    kept = {}
    for text, expected in (("no", "no"), ("on", "on"), ("0123", "0123"), ("12:30", "12:30"), ("0x1F", "0x1F")):
        cfg.write_text(f"node: {text}\nsim_model: {text}\n")
        s = load_settings(["--config", str(cfg)], env={})
        kept[text] = (s.node, s.sim_model)
        assert kept[text] == (expected, expected)
        assert load_settings(["--node", text], env={"CHOPPER_AGENT_SIM_MODEL": text}).node == s.node
    # An empty or null value is empty text (an optional path turned off), never the text "None".
    cfg.write_text("token_file:\njob_mapping_dir: ~\nsocket_group: null\nsim_hot_gpus:\n")
    s = load_settings(["--config", str(cfg)], env={})
    assert (s.token_file, s.job_mapping_dir, s.socket_group, s.sim_hot_gpus) == ("", "", "", ())
    # Numbers whose YAML 1.1 meaning differs from their environment meaning are refused, named.
    refused = {}
    for line in ("sample_buffer: 010000", "sim_seed: 017", "sample_hz: 010", "rank_idle_s: 5:00",
                 "rank_idle_s: 5m", "delivery_interval_s: 1:30", "sample_buffer: ~", "sample_hz: true",
                 "sample_hz: 10\nsample_hz: 20"):
        cfg.write_text(line + "\n")
        with pytest.raises(ConfigError) as err:
            load_settings(["--config", str(cfg)], env={})
        refused[line] = str(err.value)
        key = line.split(":")[0]
        assert key in refused[line], refused[line]
    assert "leading zero, which YAML 1.1 reads as octal" in refused["sample_buffer: 010000"]
    assert "a number of seconds" in refused["rank_idle_s: 5:00"]
    assert "sets sample_hz more than once" in refused["sample_hz: 10\nsample_hz: 20"]
    with pytest.raises(ConfigError, match="leading zero"):
        load_settings([], env={"CHOPPER_AGENT_SAMPLE_BUFFER": "010000"})
    # The unambiguous number forms agree across the file, the environment and flags.
    for text, value in (("1_000_000", 1_000_000), ("1e6", 1_000_000), ("0x10000", 65536), ('"20000"', 20000)):
        cfg.write_text(f"sample_buffer: {text}\n")
        assert load_settings(["--config", str(cfg)], env={}).sample_buffer == value
        assert load_settings(["--sample-buffer", text.strip('"')], env={}).sample_buffer == value
    hazard.outcome = (f"{len(kept)} retypable texts kept as written (node: no stayed 'no', 0123 stayed '0123'); "
                      f"4 empty/null values read as empty, not 'None'; {len(refused)} ambiguous numbers, "
                      "durations and a repeated key refused naming the key")


@pytest.mark.hazard(item=6, input="daemon text settings holding bytes that are not UTF-8 (socket_path=$'/tmp/x\\xff', "
                    "node from the environment)", promise="refused at start naming the setting and its source; "
                    "never a UnicodeEncodeError traceback later")
def test_text_that_is_not_utf8_is_refused_naming_the_setting(tmp_path: Path, hazard: HazardOutcome) -> None:
    # How Python hands over an argument or variable holding byte 0xff: as a surrogate escape.
    raw = b"/tmp/x\xff/a.sock".decode("utf-8", "surrogateescape")
    said = []
    for argv, env, key in ((["--socket-path", raw], {}, "socket_path"),
                           ([], {"CHOPPER_AGENT_NODE": "n\udcfe"}, "node"),
                           ([], {"CHOPPER_AGENT_TOKEN_FILE": raw}, "token_file")):
        with pytest.raises(ConfigError) as err:
            load_settings(argv, env=env)
        said.append(str(err.value))
        assert said[-1].startswith(f"{key}: ") and "not UTF-8" in said[-1], said[-1]
    hazard.outcome = f"{len(said)} of 3 refused at load, e.g. {said[0]!r}"


def test_simulated_health_events_and_partitions_from_every_source(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text('sim_model: MI300X\nsim_partition: CPX\nsim_memory_partition: NPS4\n'
                   'sim_health_events: "3:ecc_corrected:20:50, 1:bad_pages:5:2:pending"\n')
    s = load_settings(["--config", str(cfg)], env={})
    assert (s.sim_partition, s.sim_memory_partition) == ("CPX", "NPS4")
    assert s.sim_health_events == ("3:ecc_corrected:20:50", "1:bad_pages:5:2:pending")
    s = load_settings(["--sim-partition", "3g.40gb"], env={"CHOPPER_AGENT_SIM_MODEL": "H100",
                                                           "CHOPPER_AGENT_SIM_HEALTH_EVENTS": "1:xid:30:1:79"})
    assert (s.sim_model, s.sim_partition, s.sim_health_events) == ("H100", "3g.40gb", ("1:xid:30:1:79",))
    assert load_settings([], env={}).sim_partition == ""


# (flags, what the message must say): the setting, the bad entry or value, the valid choices or the fix.
SIM_REFUSALS = [
    (["--sim-model", "H100", "--sim-partition", "CPX"],
     "sim_partition: 'CPX' is not a MIG profile of H100; choose one of \"\" (whole chips), '1g.10gb', '1g.20gb', "
     "'2g.20gb', '3g.40gb', '4g.40gb', '7g.80gb'"),
    (["--sim-partition", "3g.40gb"],
     "sim_partition: '3g.40gb' is not a compute partition of MI300X; choose one of \"\" (whole chips), 'SPX', "
     "'DPX', 'QPX', 'CPX'"),
    (["--sim-memory-partition", "NPS4"],
     "sim_memory_partition: 'NPS4' needs compute partition CPX, not SPX; use NPS1 with SPX, or set the compute "
     "partition to CPX"),
    (["--sim-memory-partition", "NPS4", "--sim-partition", "SPX"], "needs compute partition CPX, not SPX"),
    (["--sim-model", "H100", "--sim-partition", "3g.41gb"], "sim_partition: '3g.41gb' is not a MIG profile of H100"),
    (["--sim-model", "H200", "--sim-memory-partition", "NPS1"],
     "sim_memory_partition: 'NPS1' is an AMD memory partition; H200 has none"),
    (["--sim-model", "A100", "--sim-partition", "3g.40gb"], "is not simulated for A100"),
    (["--sim-model", "B200", "--sim-partition", "CPX"], "sim_model: 'B200' is not a simulated GPU model; choose one"),
    (["--sim-health-events", "1:xid:30:1:79"],
     "entry '1:xid:30:1:79' has KIND 'xid', which a simulated AMD GPU does not report; use one of ecc_corrected"),
    (["--sim-health-events", "3:ecc_correct:20:50"],
     "entry '3:ecc_correct:20:50' has KIND 'ecc_correct', not one of chopper.schema.ERROR_KINDS"),
    (["--sim-health-events", "3:ecc_corrected:20:50,8:pcie_replay:1"],
     "entry '8:pcie_replay:1' names GPU '8', not one of 0..7; write GPU:KIND:AT_S[:COUNT[:DETAIL]]"),
    (["--sim-model", "H100", "--sim-health-events", "1:xid:30"],
     "entry '1:xid:30' has XID code ''; an xid event needs the code as DETAIL, e.g. 79"),
    (["--sim-health-events", "1:ecc_corrected:soon"], "has AT_S 'soon', not a number of seconds from 0 on"),
    (["--sim-health-events", "1:ecc_corrected:-5"], "has AT_S '-5', not a number of seconds from 0 on"),
    (["--sim-health-events", "1:ecc_corrected:5:0"], "has COUNT '0', not a whole number from 1 to 1000000"),
    (["--sim-health-events", "1:ecc_corrected:5:1:dram"], "has ECC block 'dram'; use one of umc, gfx, sdma, mmhub"),
    (["--sim-health-events", "1:pcie_replay:5:1:x"], "has DETAIL 'x', which pcie_replay does not take"),
    (["--sim-health-events", "1:ecc_corrected"], "entry '1:ecc_corrected' has 2 field(s), not 3 to 5"),
]


@pytest.mark.hazard(item=17, input="simulated partitions and health events that cannot exist: CPX on an H100, a MIG "
                    "profile on an MI300X, NPS4 with SPX, unknown profiles and models, events with a kind the "
                    "vendor lacks, a GPU out of range, no XID code, a bad time, count, block or detail",
                    promise="refused at start naming the setting, the bad value or entry, and the valid choices")
def test_impossible_simulated_partitions_and_events_are_refused(hazard: HazardOutcome) -> None:
    said = []
    for argv, message in SIM_REFUSALS:
        with pytest.raises(ConfigError) as err:
            load_settings(argv, env={})
        said.append(str(err.value))
        assert message in said[-1], said[-1]
        assert said[-1].split(":")[0] in {"sim_partition", "sim_memory_partition", "sim_model", "sim_health_events"}
    hazard.outcome = (f"{len(said)} of {len(SIM_REFUSALS)} refused at load naming the setting and the choices, e.g. "
                      f"{said[0]!r}")
