"""Typed daemon settings from code defaults < YAML file < environment < flags (all Chopper daemons).

A daemon declares one frozen dataclass whose fields carry ``metadata={"help": ...}``; this module
gives it a flag per field (``--sample-hz``), an environment variable per field
(``<PREFIX>SAMPLE_HZ``), YAML keys equal to the field names, type conversion with messages that
name the key, the value and its source, and the generated settings table of its docs. Range and
consistency checks stay with each daemon (``check`` below).
"""
from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import math
import os
import reprlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# A settings file is a few dozen lines: anything bigger is the wrong file (or /dev/zero).
MAX_CONFIG_BYTES = 1 << 20
# Largest max_message_bytes of either daemon: gRPC takes message limits as int32, and the servers
# accept up to twice the setting (chopper/serving.py), so 2 × this must stay below 2**31.
MAX_MESSAGE_BYTES = 512 * 1024 * 1024
INT64 = (-(2**63), 2**63 - 1)
# Values are quoted in messages through this: a YAML alias bomb must not expand in a repr.
_shown = reprlib.Repr()
_shown.maxlevel, _shown.maxlist, _shown.maxdict, _shown.maxstring, _shown.maxother = 2, 4, 4, 80, 80
_FORMS = {
    "int": "a whole number in 64-bit range",
    "float": "a finite number",
    "tuple[int, ...]": "whole numbers, comma-separated or as a YAML list",
    "str": "text without NUL characters",
}


class ConfigError(ValueError):
    """A setting is invalid; the message names the key, its source and the fix."""


@dataclasses.dataclass(frozen=True)
class Daemon:
    """How one daemon spells its settings.

    Attributes:
        prog: Program name, e.g. ``chopper-agent``.
        description: One paragraph for ``--help``.
        env_prefix: Environment prefix, e.g. ``CHOPPER_AGENT_``.
        module: Module that prints the docs table, e.g. ``agent.config``.
        doc: The docs file it writes, e.g. ``docs/CONFIG.md``.
        title: Title of that file.
    """

    prog: str
    description: str
    env_prefix: str
    module: str
    doc: str
    title: str


def is_host_port(value: str) -> bool:
    """``host:port`` with a port in 1-65535."""
    host, sep, port = value.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (of ``host:port``, brackets allowed) is a loopback address or ``localhost``."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _int(raw: Any) -> int:
    """A whole number in int64 range from a YAML scalar or string; ValueError otherwise."""
    if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
        raise ValueError
    value = int(raw)
    if not INT64[0] <= value <= INT64[1]:
        raise ValueError
    return value


def _parse(field: dataclasses.Field[Any], raw: Any, source: str) -> Any:
    """Convert one raw value (YAML scalar or string) to the field's type.

    Integers must be whole and fit in 64 bits, floats must be finite, and text must not hold NUL
    (no path, name or address can): each daemon's range checks then see only ordinary values.
    """
    kind = field.type
    try:
        if kind == "tuple[int, ...]":
            if isinstance(raw, list | tuple):
                return tuple(_int(v) for v in raw)
            text = str(raw).strip()
            return tuple(_int(v) for v in text.split(",") if v.strip()) if text else ()
        if kind == "int":
            return _int(raw)
        if kind == "float":
            if isinstance(raw, bool) or not math.isfinite(value := float(raw)):
                raise ValueError
            return value
        if isinstance(raw, list | dict) or "\0" in (text := str(raw)):
            raise ValueError
        return text
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{field.name}: {_shown.repr(raw)} (from {source}) is not a valid {kind}; "
                          f"use {_FORMS.get(str(kind), 'a plain value')}") from None


def _read_yaml(path: Path, known: Sequence[str]) -> dict[str, Any]:
    import yaml

    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot be read ({exc.strerror}); check the --config path") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path}: is larger than {MAX_CONFIG_BYTES} bytes; is --config the settings "
                          "file (a YAML mapping of setting: value)?")
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path}: is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                          "save it as UTF-8 YAML") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: is not valid YAML ({exc}); fix the syntax") from None
    except RecursionError:
        raise ConfigError(f"config file {path}: is nested too deeply to be settings; it must be a flat mapping "
                          "of setting: value") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: must be a mapping of setting: value, got {type(data).__name__}")
    unknown = sorted(set(map(str, data)) - set(known))
    if unknown:
        raise ConfigError(
            f"config file {path}: unknown setting(s) {', '.join(unknown)}; known settings are {', '.join(known)}"
        )
    return data


def build_parser(cls: type, daemon: Daemon) -> argparse.ArgumentParser:
    """The daemon's flags: one per setting, plus ``--config``."""
    parser = argparse.ArgumentParser(
        prog=daemon.prog,
        description=f"{daemon.description} Every flag also reads {daemon.env_prefix}<NAME> from the environment.",
    )
    parser.add_argument("--config", type=Path, help=f"YAML settings file (env {daemon.env_prefix}CONFIG)")
    for f in dataclasses.fields(cls):
        parser.add_argument(
            "--" + f.name.replace("_", "-"), dest=f.name, default=None, metavar=f.name.upper(),
            help=f"{f.metadata['help']} (env {daemon.env_prefix}{f.name.upper()})",
        )
    return parser


def load(
    cls: type[T], daemon: Daemon, check: Callable[[T], None], argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> T:
    """Merge defaults, YAML, environment and flags into settings, then ``check`` them.

    Raises:
        ConfigError: A value is malformed or out of range.
    """
    env = os.environ if env is None else env
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    args = build_parser(cls, daemon).parse_args(argv)
    prefix = daemon.env_prefix
    values: dict[str, Any] = {}
    config_path = args.config or (Path(env[prefix + "CONFIG"]) if env.get(prefix + "CONFIG") else None)
    if config_path is not None:
        for key, raw in _read_yaml(config_path, list(fields)).items():
            values[key] = _parse(fields[key], raw, f"config file {config_path}")
    for name, f in fields.items():
        raw = env.get(prefix + name.upper())
        if raw is not None:
            values[name] = _parse(f, raw, f"env {prefix}{name.upper()}")
    for name, f in fields.items():
        raw = getattr(args, name)
        if raw is not None:
            values[name] = _parse(f, raw, "--" + name.replace("_", "-"))
    settings = cls(**values)
    check(settings)
    return settings


def markdown(cls: type, daemon: Daemon, shown_defaults: Mapping[str, str] | None = None) -> str:
    """The generated settings table of the daemon's docs file."""
    shown = shown_defaults or {}
    lines = [
        f"# {daemon.title}",
        "",
        f"Generated from `{daemon.module.replace('.', '/')}.py` by `python -m {daemon.module} > {daemon.doc}`; a test "
        "keeps it current.",
        "Precedence: code defaults < YAML file (`--config`, keys as in the first column) < environment < flags.",
        "A bad value exits with status 2 and a message naming the key and the fix.",
        "",
        "| setting | flag | environment | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for f in dataclasses.fields(cls):
        default = shown.get(f.name, repr(f.default))
        lines.append(
            f"| `{f.name}` | `--{f.name.replace('_', '-')}` | `{daemon.env_prefix}{f.name.upper()}` | `{default}` "
            f"| {f.metadata['help']} |"
        )
    return "\n".join(lines) + "\n"
