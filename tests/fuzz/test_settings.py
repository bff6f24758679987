"""Fuzz the daemons' settings loader (``chopper.daemon.settings``): YAML file, ``CHOPPER_*`` environment, flags.

Property, for the agent's and the aggregator's settings alike: loading either returns settings
whose numbers are finite and 64-bit and whose text holds no NUL, or raises ``ConfigError`` whose
message names a setting or the file (``config file ...: ...``), or, for a flag
argparse itself cannot parse, exits with argparse's status 2. Never another exception, never a
hang (a YAML alias bomb quoted in an error message must not expand).

Second property: a text means the same whichever way it is given. Any text for any setting loads
to the same value, or is refused naming the same setting, from the environment, a flag and the
YAML file, both quoted and plain where it can be written plain (YAML 1.1 alone would read a plain
``0660`` as 432 and ``no`` as false).
"""
from __future__ import annotations

import dataclasses
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from agent import config as agent_config
from aggregator import config as aggregator_config
from chopper.daemon.settings import INT64, ConfigError
from tests.support.strategies import fuzz

DAEMONS: dict[str, tuple[Callable[..., Any], type[Any], str]] = {
    "agent": (agent_config.load_settings, agent_config.AgentSettings, agent_config.ENV_PREFIX),
    "aggregator": (aggregator_config.load_settings, aggregator_config.AggregatorSettings,
                   aggregator_config.ENV_PREFIX),
}
CONFIG = Path(tempfile.mkdtemp(prefix="chopper-fuzz-settings-")) / "settings.yaml"
# A billion laughs: nine levels of nine references, 9**9 strings if anything expanded it.
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
) + "node: *i\n"

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(2**70), 2**70), st.floats(),
    st.text(max_size=20), st.sampled_from(["1", "0660", "127.0.0.1:9477", "simulated", "nan", "1e400", "a\x00b"]),
)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5),
                                                                                             inner, max_size=3),
                       max_leaves=6)


def _names(daemon: str) -> list[str]:
    return [f.name for f in dataclasses.fields(DAEMONS[daemon][1])]


@st.composite
def _inputs(draw: st.DrawFn) -> tuple[str, bytes | None, dict[str, str], list[str]]:
    """A daemon, a config file's bytes (None: no file), an environment and flags."""
    daemon = draw(st.sampled_from(sorted(DAEMONS)))
    names, prefix = _names(daemon), DAEMONS[daemon][2]
    keys = st.one_of(st.sampled_from(names), st.text(max_size=8))
    document = draw(st.dictionaries(keys, _values, max_size=4))
    text = yaml.safe_dump(document, allow_unicode=True).encode()
    config = draw(st.one_of(
        st.none(), st.just(text),
        st.tuples(st.just(text), st.integers(0, len(text)), st.binary(max_size=6)).map(
            lambda t: t[0][:t[1]] + t[2] + t[0][t[1]:]),
        st.binary(max_size=64),
    ))
    # Environment values and flags cannot hold NUL: the OS refuses them before we see them.
    plain = st.text(st.characters(exclude_characters="\x00"), max_size=12)
    env = draw(st.dictionaries(st.sampled_from([prefix + n.upper() for n in names]), plain, max_size=3))
    flags = draw(st.lists(st.tuples(st.sampled_from(["--" + n.replace("_", "-") for n in names]), plain),
                          max_size=3))
    argv = [token for pair in flags for token in pair]
    if draw(st.booleans()):
        argv += draw(st.lists(plain, max_size=2))  # stray tokens argparse must refuse
    return daemon, config, env, argv


@pytest.mark.slow
@fuzz(200, timeout_s=120)
@given(_inputs())
@example(("agent", b"\xff\xfe garbage", {}, []))  # not UTF-8
@example(("agent", b"[" * 5000 + b"]" * 5000, {}, []))  # nested past the parser's recursion limit
@example(("agent", b"peak_flops: .nan\nreplay_speed: .inf", {}, []))  # non-finite floats
@example(("agent", b"sample_buffer: 1000000000000000000000000", {}, []))  # beyond 64 bits
@example(("aggregator", b'store_dir: "/tmp/a\\0b"', {}, []))  # NUL in a path
@example(("agent", b"sim_hot_gpus: [1.5, true]", {}, []))  # list items checked like ints
@example(("agent", ALIAS_BOMB.encode(), {}, []))  # must not expand when quoted in the error
def test_settings_load_or_name_the_problem(case: tuple[str, bytes | None, dict[str, str], list[str]]) -> None:
    daemon, config, env, argv = case
    load, cls, prefix = DAEMONS[daemon]
    if config is not None:
        CONFIG.write_bytes(config)
        env = {**env, prefix + "CONFIG": str(CONFIG)}
    try:
        settings = load(argv, env=env)
    except ConfigError as exc:
        message = str(exc)
        named = [n for n in _names(daemon) if n in message] or message.startswith(f"config file {CONFIG}:")
        assert named, f"the message names no setting and no file: {message}"
        assert len(message) < 2000, "a message quotes values in bounded form"
    except SystemExit as exc:
        assert exc.code == 2  # argparse: an unknown flag, or a flag without its value
    else:
        assert isinstance(settings, cls)
        for f in dataclasses.fields(settings):
            value = getattr(settings, f.name)
            values = value if isinstance(value, tuple) else (value,)
            for v in values:
                if isinstance(v, float):
                    assert math.isfinite(v), f.name
                elif isinstance(v, int):
                    assert INT64[0] <= v <= INT64[1], f.name
                else:
                    assert "\x00" not in v, f.name


@pytest.mark.timeout(60)
def test_oversized_config_file_is_refused_unread(tmp_path: Path) -> None:
    """``--config /dev/zero`` (or a multi-GB file) is refused after 1 MiB, not read to the end."""
    with pytest.raises(ConfigError, match="is larger than 1048576 bytes"):
        agent_config.load_settings(["--config", "/dev/zero"], env={})


# Texts whose YAML 1.1 type differs from their text, and the forms numbers and modes are written in.
_RETYPABLE = st.sampled_from([
    "0660", "660", "0o660", "0O660", "432", "010", "0x1F", "0b101", "1_000", "1e6", "1.0e+6", ".5", "1:30", "5m",
    "no", "on", "yes", "off", "true", "False", "-0", "+10", "00", "1,3", " 12 ", "nan", ".inf", "0777", "7777",
])


_settings = st.sampled_from(sorted(DAEMONS)).flatmap(lambda d: st.tuples(st.just(d), st.sampled_from(_names(d))))


@fuzz(200, timeout_s=120)
@given(_settings, st.one_of(_RETYPABLE, st.text(st.characters(exclude_characters="\x00", codec="utf-8"), max_size=10)))
@example(("agent", "socket_mode"), "0660")  # YAML 1.1 alone reads the plain form as 432
@example(("aggregator", "store_dir"), "no")  # YAML 1.1 alone reads the plain form as False
def test_a_value_means_the_same_from_yaml_env_and_flags(setting: tuple[str, str], text: str) -> None:
    """Any text given to any setting loads to the same value, or the same refusal, from YAML (plain and quoted),
    the environment and a flag."""
    daemon, name = setting
    load, _, prefix = DAEMONS[daemon]

    def outcome(argv: list[str], env: dict[str, str]) -> tuple[str, Any]:
        try:
            return "value", getattr(load(argv, env=env), name)
        except ConfigError as exc:
            return "refused", str(exc).split(" (from ")[0].split(":")[0]
        except SystemExit:
            return "argparse", None

    flag = "--" + name.replace("_", "-")
    expected = outcome([], {prefix + name.upper(): text})
    assert outcome([f"{flag}={text}"], {}) == expected
    forms = [yaml.safe_dump({name: text}, allow_unicode=True)]  # quoted wherever YAML 1.1 would retype it
    try:
        if text.strip() not in {"", "~", "null", "Null", "NULL"} and yaml.load(
                f"{name}: {text}", Loader=yaml.BaseLoader) == {name: text}:
            forms.append(f"{name}: {text}\n")  # plain, as a user would type it
    except yaml.YAMLError:
        pass
    for form in forms:
        CONFIG.write_text(form)
        assert outcome([], {prefix + "CONFIG": str(CONFIG)}) == expected, form
