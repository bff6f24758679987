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
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


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


def _parse(field: dataclasses.Field[Any], raw: Any, source: str) -> Any:
    """Convert one raw value (YAML scalar or string) to the field's type."""
    kind = field.type
    try:
        if kind == "tuple[int, ...]":
            if isinstance(raw, list | tuple):
                return tuple(int(v) for v in raw)
            text = str(raw).strip()
            return tuple(int(v) for v in text.split(",") if v.strip()) if text else ()
        if kind == "int":
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            return int(raw)
        if kind == "float":
            if isinstance(raw, bool):
                raise ValueError
            return float(raw)
        if isinstance(raw, list | dict):
            raise ValueError
        return str(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{field.name}: {raw!r} (from {source}) is not a valid {kind}") from None


def _read_yaml(path: Path, known: Sequence[str]) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot be read ({exc.strerror}); check the --config path") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: is not valid YAML ({exc}); fix the syntax") from None
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
